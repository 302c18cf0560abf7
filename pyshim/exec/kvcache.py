"""The KV cache of the reference executor: per layer, one sequence's keys and values by position.

Full-attention layers hold `n_ctx` slots (slot = position). Sliding-window layers hold only `window`
slots used as a ring (slot = position % window): a query never looks further back than the window, so
older entries can be overwritten. Each slot remembers its position (-1: empty), which is what the
attention mask is computed from. Entries are stored as the GPU's cache of that type holds them, and
kept as f32 for the arithmetic: "f16" rounds to half precision; "q8" rounds blocks of 32 values along
the head to int8 times an f32 scale (amax / 127); "q4" rounds blocks of 32 to 4 bits as llama.cpp's
q4_0 does (16 levels around the block's largest-magnitude value, an f32 scale) — both in f32 arithmetic,
the kernel's order.
"""

from __future__ import annotations

import numpy as np

from pyshim.plan.settings import KV_TYPES
from pyshim.plan.settings import kv_type as kv_type_named

Q8_BLOCK = KV_TYPES["q8"].block
Q4_BLOCK = KV_TYPES["q4"].block


def q8_round(x: np.ndarray) -> np.ndarray:
    """x [..., head_dim] as a q8 cache holds it: per block of 32, q = round(x * (1 / d)) in [-127, 127],
    d = amax / 127, value q * d (all f32; round half to even, as WGSL's round)."""
    blocks = x.astype(np.float32).reshape(*x.shape[:-1], x.shape[-1] // Q8_BLOCK, Q8_BLOCK)
    d = np.abs(blocks).max(axis=-1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d > 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    q = np.clip(np.round(blocks * inv), -127, 127).astype(np.float32)
    return (q * d).reshape(x.shape)


def q4_round(x: np.ndarray) -> np.ndarray:
    """x [..., head_dim] as a q4 cache holds it: per block of 32, m = the value of largest magnitude (the
    first such), d = m / -8, q = clamp(floor(x * (1 / d) + 8.5), 0, 15), value (q - 8) * d — llama.cpp's
    q4_0 rounding, all f32 (m itself maps to q = 0, value exactly m)."""
    blocks = x.astype(np.float32).reshape(*x.shape[:-1], x.shape[-1] // Q4_BLOCK, Q4_BLOCK)
    first = np.abs(blocks).argmax(axis=-1)[..., None]
    d = np.take_along_axis(blocks, first, axis=-1) / np.float32(-8)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    q = np.clip(np.floor(blocks * inv + np.float32(8.5)), 0, 15).astype(np.float32)
    return ((q - np.float32(8)) * d).reshape(x.shape)


ROUNDING = {"f32": lambda x: x, "f16": lambda x: x.astype(np.float16).astype(np.float32), "q8": q8_round, "q4": q4_round}


class LayerKV:
    def __init__(self, capacity: int, n_kv_heads: int, head_dim: int, head_dim_v: int, kv_type: str = "f32"):
        self.capacity = capacity
        self.kv_type = kv_type
        self.k = np.zeros((capacity, n_kv_heads, head_dim), dtype=np.float32)
        self.v = np.zeros((capacity, n_kv_heads, head_dim_v), dtype=np.float32)
        self.pos = np.full(capacity, -1, dtype=np.int64)
        self.filled = 0             # slots [0, filled) may hold entries

    def update(self, positions: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        """Store k [n, Hkv, hd], v [n, Hkv, hd_v] at `positions` [n]; with n > capacity only the last fit."""
        if len(positions) > self.capacity:
            positions, k, v = positions[-self.capacity:], k[-self.capacity:], v[-self.capacity:]
        slots = positions % self.capacity
        self.k[slots] = k
        self.v[slots] = v
        self.pos[slots] = positions
        self.filled = max(self.filled, int(slots.max()) + 1)

    def as_stored(self, x: np.ndarray) -> np.ndarray:
        """`x` as the cache holds it (then used as f32)."""
        return ROUNDING[self.kv_type](x)

    def contents(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(k, v, positions) of the slots that may be in use."""
        n = self.filled
        return self.k[:n], self.v[:n], self.pos[:n]

    def reset(self) -> None:
        self.pos[:] = -1
        self.filled = 0


class KVCache:
    def __init__(self, spec, n_ctx: int, kv_type: str = "f32"):
        """`spec`: a ModelSpec; `n_ctx`: the longest sequence the cache will hold; `kv_type`: a name of
        pyshim.plan.settings.KV_TYPES. One sequence's keys: the runner keeps one cache per sequence."""
        for il in range(spec.n_layers):
            kv_type_named(kv_type).check_heads(*spec.head_dims(il))
        self.n_ctx = n_ctx
        windows = [spec.sliding_window if spec.swa_layers[il] else 0 for il in range(spec.n_layers)]
        self.layers = [LayerKV(min(w, n_ctx) if w else n_ctx, spec.kv_heads(il), *spec.head_dims(il), kv_type)
                       for il, w in enumerate(windows)]

    def __getitem__(self, layer: int) -> LayerKV:
        return self.layers[layer]

    @property
    def nbytes(self) -> int:
        return sum(layer.k.nbytes + layer.v.nbytes for layer in self.layers)

    def reset(self) -> None:
        for layer in self.layers:
            layer.reset()
