"""How many bytes a model needs: weights by tensor type, the KV cache for a context, the largest tensor.

The KV cache holds, per layer, keys [n_ctx, n_kv_heads, head_dim_k] and values [n_ctx, n_kv_heads,
head_dim_v] (Gemma 4's sliding and full layers differ in both); a sliding-window layer only ever needs
its last `sliding_window` positions (a ring buffer), so its length is capped there (plus the positions
one step writes before it reads: chunk - 1). Weights
stay in their file types on the GPU, so their bytes are the file's bytes. Activations are what a
prefill step of `chunk` tokens holds at its peak (the executor reuses buffers whose values are dead).
The GPU executor reports what it allocated (`GpuOps.memory()`); benchmarks print both, and the plan
is meant to agree within a few percent. `fits` also applies the executor's own layout rules (a weight is
split by rows past a storage binding, `row_parts`) and refuses tensor types no executor decodes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from pyshim.errors import OutOfMemoryError
from pyshim.gguf.header import TensorInfo
from pyshim.gguf.spec import ModelSpec
from pyshim.gguf.types import RUNS_ON, TensorType
from pyshim.plan.settings import AUTO, KV_PAGE, PREFILL_CHUNK, kv_type as kv_type_named

# The GPU's int8 route rearranges Q4_0, Q8_0 and Q6_K weights in groups of this many blocks (repack.wgsl); a
# part of such a tensor rounds up to a whole group, so it may need up to one group more than its rows' bytes.
REPACK_GROUP_BLOCKS = 8
GROUPED_TYPES = frozenset({TensorType.Q4_0, TensorType.Q8_0, TensorType.Q6_K})


def group_bytes(qtype) -> int:
    """Bytes of one repack group of a grouped type (144 for Q4_0, 272 for Q8_0, 1680 for Q6_K)."""
    return REPACK_GROUP_BLOCKS * TensorType(qtype).type_size


def row_parts(rows: int, row_bytes: int, limit: int, pad: int = 0) -> list[tuple[int, int]]:
    """How the GPU executor splits a 2-D weight of `rows` rows into buffers of at most `limit` bytes (the
    smaller of the device's largest storage binding and largest buffer), each `pad` bytes bigger than its
    rows: [(first row, rows)]. Every kernel that reads a weight (matvecs, matmuls, the embedding lookup and
    the output head) takes it part by part, so only one row has to fit a binding."""
    per = (int(limit) - pad) // int(row_bytes)
    if per < 1:
        raise OutOfMemoryError(f"one row of a weight is {row_bytes + pad} bytes, more than the device's largest "
                               f"storage binding ({limit})", hint="this model cannot run on this device")
    return [(r0, min(per, rows - r0)) for r0 in range(0, rows, per)]


def split_unit_bytes(t: TensorInfo) -> int:
    """Bytes of the smallest piece a weight is split into between buffers: one row, or for a 3-D expert
    tensor one expert's whole matrix (the expert matvecs read an expert from one part; pyshim.gpu.slots
    splits by the same unit). `t.shape` is in GGUF order: ne1 is an expert's rows."""
    row_bytes = tensor_rows(t)[1]
    return row_bytes * (int(t.shape[1]) if len(t.shape) == 3 else 1)


def is_expert_tensor(t: TensorInfo) -> bool:
    """A 3-D tensor of a mixture of experts' matrices (blk.N.ffn_{gate,up,down,gate_up}_exps)."""
    return len(t.shape) == 3 and "_exps." in t.name


@dataclass(frozen=True)
class PerToken:
    """What one decode token reads of the weights: every tensor once, but one row of the embedding table
    (unless it is the output head too) and, of each expert tensor, the n_used experts the router picks."""
    total_params: int
    active_params: int
    read_bytes: int
    active_by_type: dict = field(default_factory=dict, hash=False)   # GGML type name -> its part of active_params


def per_token(spec: ModelSpec, tensors: Iterable[TensorInfo]) -> PerToken:
    total = active = read = 0
    by_type: dict[str, int] = {}
    used = spec.n_experts_used / spec.n_experts if spec.n_experts else 1.0
    for t in tensors:
        n, nbytes = t.n_elements, t.nbytes
        total += n
        if t.name == "token_embd.weight" and not spec.tied_output:
            n, nbytes = spec.n_embd, nbytes // max(1, spec.n_vocab)
        elif is_expert_tensor(t):
            n, nbytes = int(n * used), int(nbytes * used)
        active += n
        read += nbytes
        by_type[t.type.name] = by_type.get(t.type.name, 0) + n
    return PerToken(total_params=total, active_params=active, read_bytes=read, active_by_type=by_type)


def tensor_rows(t: TensorInfo) -> tuple[int, int]:
    """(rows, bytes per row) of a tensor as the executors lay it out (a 1-D tensor is one row)."""
    rows = max(1, t.n_elements // t.shape[0]) if t.shape and t.shape[0] else 1
    return rows, t.nbytes // rows


def _position_bytes(spec: ModelSpec, layer: int, kv_type: str):
    """Bytes one position takes in layer `layer`'s cache, keys and values (a Fraction for q8/q4)."""
    return sum(spec.kv_row(layer)) * kv_type_named(kv_type).bytes_per_value


def kv_bytes_per_token(spec: ModelSpec, kv_type: str = "f32") -> int:
    """Bytes one more position adds to the cache of every layer (ignoring sliding-window caps)."""
    return int(sum(_position_bytes(spec, il, kv_type) for il in range(spec.n_layers)))


def kv_layer_bytes(spec: ModelSpec, positions: int, kv_type: str = "f32") -> int:
    """Bytes of the largest single buffer of the KV cache: one full-attention layer's pool of keys for
    `positions` positions, every sequence's (it must fit one storage binding)."""
    widest = max(max(spec.kv_row(il)) for il in range(spec.n_layers))
    return math.ceil(positions * widest * kv_type_named(kv_type).bytes_per_value)


def kv_cache_bytes(spec: ModelSpec, context: int, kv_type: str = "f32", chunk: int = 1) -> int:
    """Bytes of a KV cache for `context` positions; sliding-window layers hold at most their window
    and the `chunk - 1` positions a step of `chunk` tokens writes ahead of the oldest one it reads."""
    ring = spec.sliding_window + chunk - 1
    return math.ceil(sum(_position_bytes(spec, il, kv_type) * (min(context, ring) if local else context)
                         for il, local in enumerate(spec.swa_layers)))   # q8 blocks are never split


def kv_ring_pages(spec: ModelSpec, context: int, chunk: int) -> int:
    """Pages of KV_PAGE positions in a sliding-window layer's ring on the GPU (pyshim.gpu.kv), or 0 when the
    model has none that wraps (the window plus a step's tokens reach the context: a full layer then)."""
    if not (spec.sliding_window and any(spec.swa_layers)):
        return 0
    ring = spec.sliding_window + chunk - 1
    return math.ceil(ring / KV_PAGE) if ring < context else 0


def paged_kv_bytes(spec: ModelSpec, context: int, kv_type: str = "f32", chunk: int = 1, seqs: int = 1,
                   kv_pages: int | None = None) -> int:
    """Bytes of the GPU's paged KV cache (pyshim.gpu.kv): `kv_pages` pages (default: every sequence's whole
    context) of KV_PAGE positions in each full-attention layer, a ring of pages per sequence in each
    sliding-window layer."""
    ring = kv_ring_pages(spec, context, chunk)
    pages = seqs * math.ceil(context / KV_PAGE) if kv_pages is None else kv_pages
    return math.ceil(sum(_position_bytes(spec, il, kv_type) * (seqs * ring if ring and local else pages) * KV_PAGE
                         for il, local in enumerate(spec.swa_layers)))


def activation_bytes(spec: ModelSpec, chunk: int) -> int:
    """Peak f32 activations of a step of `chunk` tokens: per token the gate and up projections and their
    product (3 x n_ff), the residual stream and its norm (2 x n_embd), q, k and v; and one row of logits.
    Attention runs over the KV cache in tiles, so the context does not enter. Measured against the
    executor's pool on the three catalog models: within 5% of the activations, 1% of the total."""
    per_token = 3 * spec.n_ff + 2 * spec.n_embd + _widest_qkv(spec)
    if spec.n_experts:     # router logits, weights and ids; each chosen expert's gate, up, product and output
        used = spec.n_experts_used
        per_token += spec.n_experts + 2 * used + used * (3 * spec.n_ff_expert + spec.n_embd) + 3 * spec.n_ff_shared
        if not spec.moe_beside_dense:        # (gemma4's dense MLP runs beside the experts)
            per_token -= 3 * spec.n_ff
    return 4 * (chunk * per_token + spec.n_vocab)


class TypeTotal(NamedTuple):
    count: int
    nbytes: int


@dataclass(frozen=True)
class MemoryEstimate:
    weights_by_type: dict[str, TypeTotal]   # tensor type name -> tensors of that type and their bytes
    weight_bytes: int
    largest_tensor: TensorInfo
    widest_row: tuple[str, int]             # (tensor, bytes) of the largest weight row a buffer part must hold
    unrunnable: tuple[tuple[str, str], ...]  # (tensor, type name) of tensors the GPU cannot decode
    context: int
    kv_type: str
    kv_bytes: int
    kv_bytes_per_token: int
    kv_layer_bytes: int                     # the largest KV buffer (one layer's keys): one storage binding
    chunk: int                              # tokens per prefill step the activations are sized for
    activation_bytes: int
    largest_activation: int                 # the largest single activation of a step: one storage binding
    expert_slots: int | None = None         # routed experts streamed into a cache of this many per layer
    expert_cache_bytes: int = 0             # that cache (part of weight_bytes), or the streamed layers' rotating buffers
    streamed_layers: int | None = None      # the last this many layers streamed through rotating buffers

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


def _widest_row(tensors: tuple[TensorInfo, ...]) -> tuple[str, int]:
    """The weight whose one row (one expert, of an expert tensor; plus the int8 route's group padding)
    needs the most bytes."""
    best = ("", 0)
    for t in tensors:
        if len(t.shape) >= 2:
            need = split_unit_bytes(t) + (group_bytes(t.type) if t.type in GROUPED_TYPES else 0)
            best = max(best, (t.name, need), key=lambda x: x[1])
    return best


def largest_activation_bytes(spec: ModelSpec, chunk: int) -> int:
    """The largest one activation of a step of `chunk` tokens (f32): the widest projection's output, or a
    row of logits (steps that return every row's logits are split by the runner to fit)."""
    ff = 2 * spec.n_ff if spec.fused_gate_up else spec.n_ff
    if spec.n_experts:      # the chosen experts' gate/up (fused: both) or outputs, for every token
        ff = spec.n_experts_used * max((2 if spec.fused_gate_up_exps else 1) * spec.n_ff_expert, spec.n_embd)
        ff = max(ff, spec.n_ff_shared, spec.n_experts)
        if spec.moe_beside_dense:
            ff = max(ff, 2 * spec.n_ff if spec.fused_gate_up else spec.n_ff)
    return 4 * max(chunk * max(ff, _widest_qkv(spec), spec.n_embd), spec.n_vocab)


def _widest_qkv(spec: ModelSpec) -> int:
    """The most q, k and v values a token's attention projections make in any layer."""
    return max(spec.n_heads * spec.head_dims(il)[0] + sum(spec.kv_row(il)) for il in range(spec.n_layers))


def expert_slot_bytes(spec: ModelSpec, tensors: Iterable[TensorInfo]) -> int:
    """GPU bytes one more slot of an expert cache takes: one expert of every expert tensor of every layer."""
    return sum(t.nbytes // spec.n_experts for t in tensors if is_expert_tensor(t)) if spec.n_experts else 0


def streamed_read_bytes(spec: ModelSpec, tensors: Iterable[TensorInfo], slots: int) -> int:
    """Store bytes a decode token reads with an expert cache of `slots` per layer, if the router picked
    experts at random (hit rate slots / experts); real routers repeat themselves, so this is a ceiling."""
    return int(per_token_expert_bytes(spec, tensors) * (1 - slots / spec.n_experts))


def layer_matrix_bytes(tensors: Iterable[TensorInfo]) -> dict[int, int]:
    """Bytes of each layer's matrices (what layer streaming moves; its norms and biases stay resident)."""
    out: dict[int, int] = {}
    for t in tensors:
        if t.name.startswith("blk.") and len(t.shape) >= 2:
            layer = int(t.name.split(".", 2)[1])
            out[layer] = out.get(layer, 0) + t.nbytes
    return out


STREAM_SETS = 2        # rotating sets of buffers streamed layers go through (pyshim.gpu.layer_stream.SETS)


def stream_buffer_bytes(tensors: Iterable[TensorInfo], streamed: list[int]) -> int:
    """Bytes of the rotating sets that `streamed` layers (in order) go through: streamed layer i uses set
    i % STREAM_SETS, which holds each of its matrices (attn_q, ffn_down, ...) at the largest size that
    matrix has among the set's layers (a Q4_K_M file gives some layers Q6_K where others have Q4_K), one of
    each shape (Gemma 4's sliding and full layers' attention matrices differ)."""
    sets = {layer: i % STREAM_SETS for i, layer in enumerate(streamed)}
    sizes: dict[tuple, int] = {}
    for t in tensors:
        if t.name.startswith("blk.") and len(t.shape) >= 2:
            _, layer, suffix = t.name.split(".", 2)
            if int(layer) in sets:
                key = (sets[int(layer)], suffix, tuple(t.shape))
                sizes[key] = max(sizes.get(key, 0), t.nbytes)
    return sum(sizes.values())


def streamed_bytes_per_token(spec: ModelSpec, tensors: Iterable[TensorInfo], *, expert_slots: int | None = None,
                             streamed_layers: int | None = None) -> int:
    """Store bytes a decode token reads under a streamed plan (experts: at random routing, a ceiling)."""
    tensors = tuple(tensors)
    if expert_slots:
        return streamed_read_bytes(spec, tensors, expert_slots)
    if streamed_layers:
        per_layer = layer_matrix_bytes(tensors)
        return sum(per_layer[i] for i in sorted(per_layer)[-streamed_layers:])
    return 0


def per_token_expert_bytes(spec: ModelSpec, tensors: Iterable[TensorInfo]) -> int:
    """Bytes of the routed experts one decode token uses (n_used of every layer's)."""
    return expert_slot_bytes(spec, tensors) * spec.n_experts_used


def estimate(spec: ModelSpec, tensors: Iterable[TensorInfo], *, context: int | None = None, kv_type: str = "f32",
             chunk: int = PREFILL_CHUNK, expert_slots: int | None = None,
             streamed_layers: int | None = None, seqs: int = 1, kv_pages: int | None = None) -> MemoryEstimate:
    """Memory for running `spec` with the given tensors at `context` positions (default: the training
    context), prefilling `chunk` tokens per step; with `expert_slots`, the routed experts streamed into
    a cache of that many per layer (pyshim.gpu.expert_cache; a step is then at most slots // used tokens);
    with `streamed_layers`, the last that many layers' matrices in STREAM_SETS rotating sets of buffers
    instead of their own (pyshim.gpu.layer_stream); `seqs`: sequences run together; `kv_pages`: the
    GPU KV cache's pages of KV_PAGE positions they share (default: each sequence's whole context)."""
    tensors = tuple(tensors)
    if not tensors:
        raise ValueError("a model with no tensors has nothing to estimate")
    context = spec.context_length if context is None else context
    if context <= 0:
        raise ValueError(f"context must be positive, got {context}")
    by_type = weights_by_type(tensors)
    weight_bytes = sum(t.nbytes for t in by_type.values())
    cache_bytes = 0
    if expert_slots is not None and spec.n_experts:
        chunk = max(1, min(chunk, expert_slots // spec.n_experts_used))
        cache_bytes = expert_slot_bytes(spec, tensors) * expert_slots
        weight_bytes += cache_bytes - sum(t.nbytes for t in tensors if is_expert_tensor(t))
    if streamed_layers:
        per_layer = layer_matrix_bytes(tensors)
        streamed = sorted(per_layer)[-streamed_layers:]
        cache_bytes = stream_buffer_bytes(tensors, streamed)
        weight_bytes += cache_bytes - sum(per_layer[i] for i in streamed)
    step = min(chunk, context)
    return MemoryEstimate(
        weights_by_type=by_type,
        weight_bytes=weight_bytes,
        largest_tensor=max(tensors, key=lambda t: t.nbytes),
        widest_row=_widest_row(tensors),
        unrunnable=tuple((t.name, t.type.name) for t in tensors if "gpu" not in RUNS_ON.get(t.type, ())),
        context=context,
        kv_type=kv_type,
        kv_bytes=(kv_cache_bytes(spec, context, kv_type, chunk=step) * seqs if kv_pages is None
                  else paged_kv_bytes(spec, context, kv_type, step, seqs, kv_pages)),
        kv_bytes_per_token=kv_bytes_per_token(spec, kv_type),
        kv_layer_bytes=kv_layer_bytes(spec, seqs * context if kv_pages is None else kv_pages * KV_PAGE, kv_type),
        chunk=chunk,
        activation_bytes=activation_bytes(spec, step),
        largest_activation=largest_activation_bytes(spec, step),
        expert_slots=expert_slots if spec.n_experts else None,
        streamed_layers=streamed_layers or None,
        expert_cache_bytes=cache_bytes,
    )


@dataclass(frozen=True)
class Fit:
    ok: bool
    reasons: tuple[str, ...]   # why not, each a sentence a user can act on; empty when ok


def unrunnable_reason(unrunnable: tuple[tuple[str, str], ...]) -> str | None:
    if not unrunnable:
        return None
    types = sorted({t for _, t in unrunnable})
    first = unrunnable[0][0]
    return (f"won't run: type {', '.join(types)} ({len(unrunnable)} tensors, e.g. '{first}') is not one pyshim decodes; "
            f"use a GGUF quantized to {', '.join(t.name for t in RUNS_ON)}")


def fits(est: MemoryEstimate, *, budget_bytes: int | None = None, max_binding_bytes: int | None = None,
         max_buffer_bytes: int | None = None) -> Fit:
    """Whether the model runs here: every tensor of a type the GPU decodes; weights, KV cache and
    activations within `budget_bytes`; and every buffer within the device's limits as the executor lays
    them out (weights split by rows into parts of at most a binding: see row_parts)."""
    reasons = []
    unrunnable = unrunnable_reason(est.unrunnable)
    if unrunnable:
        reasons.append(unrunnable)
    if budget_bytes is not None and est.total_bytes > budget_bytes:
        reasons.append(f"weights ({_mib(est.weight_bytes)}), a {est.context}-token {est.kv_type} KV cache "
                       f"({_mib(est.kv_bytes)}) and activations ({_mib(est.activation_bytes)}) need {_mib(est.total_bytes)}, "
                       f"more than the {_mib(budget_bytes)} of GPU memory assumed available; "
                       "try a shorter context, a smaller KV type, or a smaller quantization")
    limit = min(x for x in (max_binding_bytes, max_buffer_bytes, 1 << 62) if x is not None)
    if limit < 1 << 62:
        name, row = est.widest_row
        if row > limit:
            reasons.append(f"one row of tensor '{name}' is {_mib(row)}, more than the device's largest storage binding "
                           f"({_mib(limit)}): this model cannot run on this device")
        if est.kv_layer_bytes > limit:
            reasons.append(f"one layer's {est.kv_type} KV cache (every sequence's {est.context}-token context, or its pages) is "
                           f"{_mib(est.kv_layer_bytes)}, more than the device's largest storage binding ({_mib(limit)}); "
                           "try a shorter context, fewer parallel sequences or KV pages, or a smaller KV type")
        if est.largest_activation > limit:
            reasons.append(f"a {min(est.chunk, est.context)}-token prefill step holds an activation of {_mib(est.largest_activation)}, more than "
                           f"the device's largest storage binding ({_mib(limit)}); try a smaller prefill chunk")
    return Fit(ok=not reasons, reasons=tuple(reasons))


# The CPU engine's memory: a wasm32 module addresses at most 4 GiB (browsers allow all of it); its 64-bit
# build (memory64: Chrome 133+, Firefox 134+) up to the 16 GiB a browser gives a 64-bit memory. The 64-bit
# build runs a model only where the 32-bit one cannot: it checks every access's bounds, which costs speed.
WASM_MEMORY_BYTES = 4 << 30
WASM64_MEMORY_BYTES = 16 << 30
WASM_OVERHEAD_BYTES = 256 << 20     # the module's own: its stack, each step shape's program, matmul scratch


def cpu_engine_wide(need_bytes: int) -> bool:
    """Whether the CPU engine needs its 64-bit build for a model of `need_bytes` (cpu_engine_bytes)."""
    return need_bytes + WASM_OVERHEAD_BYTES > WASM_MEMORY_BYTES


def cpu_engine_limit(wasm64: bool) -> int:
    """The most memory the CPU engine can have: 16 GiB where the browser (or wasmtime) runs memory64."""
    return WASM64_MEMORY_BYTES if wasm64 else WASM_MEMORY_BYTES


def cpu_engine_fit(spec: ModelSpec, est: MemoryEstimate, context: int, kv_type: str = "f32", *, wasm64: bool = True,
                   seqs: int = 1) -> Fit:
    """Whether the model runs on the WebAssembly CPU engine (pyshim.exec.wasm_runner: no WebGPU adapter,
    or the CPU chosen): its tensor types; a mixture of at most 256 experts (its router's limit); weights,
    a `kv_type` KV cache of `context` positions for each of `seqs` sequences and the activations within its
    memory: 4 GiB, or 16 GiB where `wasm64` (the browser runs 64-bit WebAssembly memories: the 64-bit build)."""
    reasons = []
    unrunnable = unrunnable_reason(est.unrunnable)
    if unrunnable:
        reasons.append(unrunnable)
    if spec.n_experts > 256:
        reasons.append(f"the CPU engine routes among at most 256 experts, not {spec.n_experts}, and this browser gives "
                       "no WebGPU adapter")
    kv = kv_cache_bytes(spec, context, kv_type) * seqs
    need = cpu_engine_bytes(spec, est, context, kv_type, seqs)
    limit = cpu_engine_limit(wasm64)
    if need + WASM_OVERHEAD_BYTES > limit:
        smaller = "" if kv_type == "q4" else ", a smaller KV cache type (kv_type q8 or q4)"
        where = ("a 64-bit WebAssembly memory can have" if wasm64 else
                 "a 32-bit WebAssembly engine can address (this browser has no 64-bit WebAssembly memory, memory64: "
                 "Chrome 133+ and Firefox 134+ have it)")
        caches = f"a {context}-token {kv_type} KV cache" + (f" for each of {seqs} sequences" if seqs > 1 else "")
        reasons.append(f"on the CPU engine (no WebGPU adapter here) weights ({_mib(est.weight_bytes)}), {caches} "
                       f"({_mib(kv)}) and activations need {_mib(need)} and the engine "
                       f"{_mib(WASM_OVERHEAD_BYTES)} more, over the {_mib(limit)} {where}; try a shorter context{smaller} "
                       "or a smaller model")
    return Fit(ok=not reasons, reasons=tuple(reasons))


def cpu_engine_plan(spec: ModelSpec, tensors: Iterable[TensorInfo], settings) -> tuple[MemoryEstimate, int, str]:
    """(the estimate, the context, the KV type) the CPU engine runs the model with under `settings`
    (pyshim.plan.settings.RunSettings): "auto" KV is f32 there (choosing cache types is the GPU plan's).
    Raises what `estimate` raises."""
    kv_type = "f32" if settings.kv_type == AUTO else settings.kv_type
    context = settings.context_for(spec.context_length)
    return estimate(spec, tensors, context=context, kv_type=kv_type), context, kv_type


def cpu_engine_bytes(spec: ModelSpec, est: MemoryEstimate, context: int, kv_type: str = "f32", seqs: int = 1) -> int:
    """The CPU engine's memory for the model: weights, a `kv_type` KV cache of `context` positions for each of
    `seqs` sequences, activations."""
    return est.weight_bytes + kv_cache_bytes(spec, context, kv_type) * seqs + est.activation_bytes


MIN_CONTEXT = 512     # shorter than this a chat assistant is not worth loading (pyshim.plan.auto goes no lower)


def _mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.1f} MiB"
