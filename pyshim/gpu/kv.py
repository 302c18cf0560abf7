"""The GPU KV cache, addressed per sequence: for each sequence it holds, per layer a K and a V ring.

A ring holds `cap` positions (slot = position % cap): the context for full-attention layers, the window
plus one step's tokens less one for sliding-window layers (a step never evicts a key its own queries
still need). Values are stored as the KV type says (pyshim.plan.settings.KV_TYPES; include/kv.wgsl).
A recorded program binds the rings of the sequence it runs, or, for a batched decode step, each token's
sequence's (pyshim.gpu.ops GpuOps.begin); pages shared between sequences are still to come.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyshim.gpu.pool import Allocator
from pyshim.plan.settings import kv_type as kv_type_named


@dataclass(frozen=True)
class LayerKV:
    k: Any          # buffer: [cap, kv_heads, head_dim] values of the KV type
    v: Any          # buffer: [cap, kv_heads, head_dim_v]
    cap: int        # positions the ring holds


class GpuKV:
    def __init__(self, allocator: Allocator, spec, n_ctx: int, max_chunk: int, kv_type: str = "f32", n_seqs: int = 1):
        kind = kv_type_named(kv_type)
        kind.check_heads(spec.head_dim_k, spec.head_dim_v)
        self.kv_type, self.n_seqs = kv_type, n_seqs
        self._seqs: list[list[LayerKV]] = []
        for seq in range(n_seqs):
            layers = []
            for il in range(spec.n_layers):
                window = spec.sliding_window if spec.swa_layers[il] else 0
                cap = min(n_ctx, window + max_chunk - 1) if window else n_ctx
                k = allocator.buffer(int(cap * spec.n_kv_heads * spec.head_dim_k * kind.bytes_per_value), f"k{il}.{seq}")
                v = allocator.buffer(int(cap * spec.n_kv_heads * spec.head_dim_v * kind.bytes_per_value), f"v{il}.{seq}")
                layers.append(LayerKV(k, v, cap))
            self._seqs.append(layers)

    def layer(self, il: int, seq: int = 0) -> LayerKV:
        return self._seqs[seq][il]

    @property
    def nbytes(self) -> int:
        return sum(int(l.k.size) + int(l.v.size) for layers in self._seqs for l in layers)
