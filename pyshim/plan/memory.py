"""How many bytes a model needs: weights by tensor type, the KV cache for a context, the largest tensor.

The KV cache holds, per layer, keys [n_ctx, n_kv_heads, head_dim_k] and values [n_ctx, n_kv_heads,
head_dim_v]; a sliding-window layer only ever needs its last `sliding_window` positions (a ring buffer),
so its length is capped there (plus the positions one step writes before it reads: chunk - 1). Weights
stay in their file types on the GPU, so their bytes are the file's bytes. Activations are what a
prefill step of `chunk` tokens holds at its peak (the executor reuses buffers whose values are dead).
The GPU executor reports what it allocated (`GpuOps.memory()`); benchmarks print both, and the plan
is meant to agree within a few percent.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction
from typing import NamedTuple

from pyshim.serve.generation import PREFILL_CHUNK
from pyshim.gguf.header import TensorInfo
from pyshim.gguf.spec import ModelSpec

# KV cache types -> bytes per value, as the GPU stores them (include/kv.wgsl): f16 as packed halves, q8 as
# blocks of 32 int8 values along the head with an f32 scale (36 bytes per 32 values).
KV_TYPES: dict[str, Fraction] = {
    "f32": Fraction(4),
    "f16": Fraction(2),
    "q8": Fraction(36, 32),
}


def _kv_element_bytes(kv_type: str) -> Fraction:
    try:
        return KV_TYPES[kv_type]
    except KeyError:
        raise ValueError(f"unknown KV cache type {kv_type!r}; choose one of {', '.join(KV_TYPES)}") from None


def kv_bytes_per_token(spec: ModelSpec, kv_type: str = "f32") -> int:
    """Bytes one more position adds to the cache of every layer (ignoring sliding-window caps)."""
    per_layer = spec.n_kv_heads * (spec.head_dim_k + spec.head_dim_v) * _kv_element_bytes(kv_type)
    return int(per_layer * spec.n_layers)


def kv_cache_bytes(spec: ModelSpec, context: int, kv_type: str = "f32", chunk: int = 1) -> int:
    """Bytes of a KV cache for `context` positions; sliding-window layers hold at most their window
    and the `chunk - 1` positions a step of `chunk` tokens writes ahead of the oldest one it reads."""
    per_position = spec.n_kv_heads * (spec.head_dim_k + spec.head_dim_v) * _kv_element_bytes(kv_type)
    ring = spec.sliding_window + chunk - 1
    positions = sum(min(context, ring) if local else context for local in spec.swa_layers)
    return math.ceil(per_position * positions)   # q8 blocks are never split


def activation_bytes(spec: ModelSpec, chunk: int) -> int:
    """Peak f32 activations of a step of `chunk` tokens: per token the gate and up projections and their
    product (3 x n_ff), the residual stream and its norm (2 x n_embd), q, k and v; and one row of logits.
    Attention runs over the KV cache in tiles, so the context does not enter. Measured against the
    executor's pool on the three catalog models: within 5% of the activations, 1% of the total."""
    per_token = 3 * spec.n_ff + 2 * spec.n_embd + spec.n_heads * spec.head_dim_k + spec.n_embd_k_gqa + spec.n_embd_v_gqa
    return 4 * (chunk * per_token + spec.n_vocab)


class TypeTotal(NamedTuple):
    count: int
    nbytes: int


@dataclass(frozen=True)
class MemoryEstimate:
    weights_by_type: dict[str, TypeTotal]   # tensor type name -> tensors of that type and their bytes
    weight_bytes: int
    largest_tensor: TensorInfo              # must fit one GPU storage binding
    context: int
    kv_type: str
    kv_bytes: int
    kv_bytes_per_token: int
    chunk: int                              # tokens per prefill step the activations are sized for
    activation_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes + self.activation_bytes


def weights_by_type(tensors: Iterable[TensorInfo]) -> dict[str, TypeTotal]:
    """Tensor count and bytes per tensor type, largest total first."""
    totals: dict[str, list[int]] = {}
    for t in tensors:
        entry = totals.setdefault(t.type.name, [0, 0])
        entry[0] += 1
        entry[1] += t.nbytes
    return {name: TypeTotal(c, b) for name, (c, b) in sorted(totals.items(), key=lambda kv: -kv[1][1])}


def estimate(spec: ModelSpec, tensors: Iterable[TensorInfo], *, context: int | None = None, kv_type: str = "f32",
             chunk: int = PREFILL_CHUNK) -> MemoryEstimate:
    """Memory for running `spec` with the given tensors at `context` positions (default: the training
    context), prefilling `chunk` tokens per step."""
    tensors = tuple(tensors)
    if not tensors:
        raise ValueError("a model with no tensors has nothing to estimate")
    context = spec.context_length if context is None else context
    if context <= 0:
        raise ValueError(f"context must be positive, got {context}")
    by_type = weights_by_type(tensors)
    return MemoryEstimate(
        weights_by_type=by_type,
        weight_bytes=sum(t.nbytes for t in by_type.values()),
        largest_tensor=max(tensors, key=lambda t: t.nbytes),
        context=context,
        kv_type=kv_type,
        kv_bytes=kv_cache_bytes(spec, context, kv_type, chunk=min(chunk, context)),
        kv_bytes_per_token=kv_bytes_per_token(spec, kv_type),
        chunk=chunk,
        activation_bytes=activation_bytes(spec, min(chunk, context)),
    )


@dataclass(frozen=True)
class Fit:
    ok: bool
    reasons: tuple[str, ...]   # why not, each a sentence a user can act on; empty when ok


def fits(est: MemoryEstimate, *, budget_bytes: int, max_binding_bytes: int | None = None) -> Fit:
    """Whether weights + KV cache fit `budget_bytes`, and the largest tensor one storage binding.

    A tensor larger than the binding limit is not fatal in principle (it can be split by rows), but
    until the planner splits tensors it is reported as not fitting."""
    reasons = []
    if est.total_bytes > budget_bytes:
        reasons.append(f"weights ({_mib(est.weight_bytes)}), a {est.context}-token {est.kv_type} KV cache "
                       f"({_mib(est.kv_bytes)}) and activations ({_mib(est.activation_bytes)}) need {_mib(est.total_bytes)}, "
                       f"more than the {_mib(budget_bytes)} available; "
                       "try a shorter context, a smaller KV type, or a smaller quantization")
    if max_binding_bytes is not None and est.largest_tensor.nbytes > max_binding_bytes:
        reasons.append(f"tensor '{est.largest_tensor.name}' is {_mib(est.largest_tensor.nbytes)}, more than the device's "
                       f"largest storage binding ({_mib(max_binding_bytes)})")
    return Fit(ok=not reasons, reasons=tuple(reasons))


MIN_CONTEXT = 512     # shorter than this a chat assistant is not worth loading


def best_fit(spec: ModelSpec, tensors: Iterable[TensorInfo], *, budget_bytes: int, context: int | None = None,
             chunk: int = PREFILL_CHUNK) -> MemoryEstimate | None:
    """The most faithful setting that fits `budget_bytes`, or None: the wanted `context` (default: the
    training context) with the KV type of least rounding that fits (f32, then f16, then q8, which
    measured 100% / 98.3% top-1 agreement with f32 on SmolLM2 and Gemma 3); failing all three, the
    longest context (halving, down to MIN_CONTEXT) that fits with q8."""
    tensors = tuple(tensors)
    context = spec.context_length if context is None else context
    for kv_type in KV_TYPES:
        est = estimate(spec, tensors, context=context, kv_type=kv_type, chunk=chunk)
        if est.total_bytes <= budget_bytes:
            return est
    while context > MIN_CONTEXT:
        context = max(MIN_CONTEXT, context // 2)
        est = estimate(spec, tensors, context=context, kv_type="q8", chunk=chunk)
        if est.total_bytes <= budget_bytes:
            return est
    return None


def _mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.1f} MiB"
