"""The settings a model runs with, each defined once: KV cache types, the arithmetic, the prefill chunk
and the default context — and `RunSettings`, the object a load is asked for with (by the CLI, the Python
API and the page: the page sends it as a JSON object, see pyshim.serve.protocol).
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, fields, replace
from fractions import Fraction

from pyshim.errors import BadRequestError, UnsupportedError

# Most tokens one step runs (a prompt is prefilled in chunks of this): bounds the [n, S] attention scores
# and the activations a step holds; the GPU executor records its programs for at most this many.
PREFILL_CHUNK = 256
MAX_PARALLEL = 16      # sequences decoded together at most (sharing one paged KV cache)
KV_PAGE = 16          # positions in a page of the GPU's KV cache (pyshim.gpu.kv; shaders/include/kv.wgsl)
# KV cache positions when the caller names none (the model may allow more; its training context caps it).
DEFAULT_CONTEXT = 4096
# GPU memory a load may use when the caller names none (WebGPU does not tell; the site assumes the same:
# web/engine/fit.js): what kv_type "auto" plans against.
DEFAULT_BUDGET_BYTES = 4 << 30
AUTO = "auto"         # kv_type "auto": the KV type and context chosen from the budget (pyshim.plan.auto)
ROPE_SCALINGS = ("none", "linear", "yarn")   # what a rope override may ask for (llama.cpp's --rope-scaling)
# Where the page runs a model: "gpu" (WebGPU), "cpu" (the WebAssembly engine), or "auto" (the GPU when the
# browser gives an adapter, else the CPU engine)
DEVICES = ("auto", "gpu", "cpu")
MAX_THREADS = 8        # the CPU engine's threads at most (shaders/wasm/engine.c)


@dataclass(frozen=True)
class KVType:
    """How the KV cache stores a value (the reference rounds to it; include/kv.wgsl stores it so)."""

    name: str
    bytes_per_value: Fraction     # q8/q4: blocks of 32 int8 / 4-bit values along the head with an f32 scale
    block: int = 1                # values per quantization block along a head: head sizes must be multiples
    note: str = ""
    # keys stored divided pair by pair by a per-model scale, queries multiplied by it (pyshim.models.key_scales):
    # the dot products are unchanged while the few large channels no longer set the blocks' steps
    scaled_keys: bool = False
    # scaled keys (and queries) then turned by a Hadamard rotation within each head, where the model's keys
    # carry no bias (pyshim.models.key_scales.rotation_width): no channel then sets a block's step alone
    rotated_keys: bool = False

    def check_heads(self, head_dim_k: int, head_dim_v: int) -> None:
        if head_dim_k % self.block or head_dim_v % self.block:
            raise UnsupportedError(f"a {self.name} KV cache needs head sizes that are multiples of {self.block} (this "
                                   f"model's: {head_dim_k}/{head_dim_v})", hint="use kv_type f16")


# Least rounding first: the order "will it fit?" tries them in (q8 measured 98.3-100% top-1 agreement
# with f32 on SmolLM2 and Gemma 3).
KV_TYPES: dict[str, KVType] = {t.name: t for t in (
    KVType("f32", Fraction(4), note="exact"),
    KVType("f16", Fraction(2), note="half the memory"),
    KVType("q8", Fraction(36, 32), block=32, note="int8 blocks, 28% of f32", scaled_keys=True),
    KVType("q4", Fraction(20, 32), block=32, note="4-bit blocks, 16% of f32", scaled_keys=True,
           rotated_keys=True),
)}


def kv_type(name: str) -> KVType:
    try:
        return KV_TYPES[name]
    except (KeyError, TypeError):
        raise BadRequestError(f"unknown KV cache type (kv_type) {name!r}", hint=f"use one of: {', '.join(KV_TYPES)}",
                              param="kv_type") from None


class Arithmetic(str, enum.Enum):
    """How the matmuls round. F32: activations kept in f32 (the plain reference, the GPU's f32 kernels).
    INT8: each quantized matmul's input rounded to int8 blocks as llama.cpp's CPU backend does (the GPU's
    int8 route, and the reference's emulation of that rounding). EXACT: llama.cpp's x86 CPU arithmetic
    repeated bit for bit (the reference only: an oracle, slow)."""

    F32 = "f32"
    INT8 = "int8"
    EXACT = "llama.cpp-exact"

    @classmethod
    def parse(cls, value) -> "Arithmetic | None":
        """None (the backend's default) or one of the values; anything else is a BadRequestError."""
        if value is None or isinstance(value, cls):
            return value
        try:
            return cls(value)
        except ValueError:
            raise BadRequestError(f"unknown arithmetic {value!r}", hint=f"use one of: {', '.join(a.value for a in cls)}") from None


@dataclass(frozen=True)
class RunSettings:
    """What a model is loaded with. `context` None: the model's training context, capped at DEFAULT_CONTEXT;
    `arithmetic` None: the executor's default (the GPU's int8 route on CPU adapters, f32 elsewhere).
    `rope_scaling`, `rope_scale` and `yarn_orig_ctx` override the GGUF's rope scaling keys as llama.cpp's
    flags of those names do (None: the file's); see pyshim.gguf.spec.with_rope_override. `kv_type` "auto":
    the loader picks the type (and, when `context` is None, the context) that fit `budget_bytes` (None:
    DEFAULT_BUDGET_BYTES) — see `pyshim.plan.auto.resolve`."""

    context: int | None = None
    kv_type: str = "f32"
    arithmetic: Arithmetic | None = None
    prefill_chunk: int = PREFILL_CHUNK
    rope_scaling: str | None = None
    rope_scale: float | None = None
    yarn_orig_ctx: int | None = None
    budget_bytes: int | None = None
    expert_slots: int | None = None     # routed experts streamed into a GPU cache of this many per MoE layer
    streamed_layers: int | None = None  # the last this many layers' matrices streamed through two rotating sets
    parallel: int = 1                   # sequences run together (continuous batching), sharing the KV cache
    kv_pages: int | None = None         # the GPU KV cache's pages of 16 positions (None: each sequence's whole context)
    device: str = "auto"                # where the page runs it (DEVICES); natively the backend decides
    threads: int | None = None          # the CPU engine's threads (None: the page's cores, or 1 natively)

    def __post_init__(self):
        if self.kv_type != AUTO:
            kv_type(self.kv_type)
        object.__setattr__(self, "arithmetic", Arithmetic.parse(self.arithmetic))
        if self.context is not None and (isinstance(self.context, bool) or not isinstance(self.context, int) or self.context < 1):
            raise BadRequestError(f"the context must be a positive number of tokens, got {self.context!r}")
        if isinstance(self.prefill_chunk, bool) or not isinstance(self.prefill_chunk, int) or not 1 <= self.prefill_chunk <= PREFILL_CHUNK:
            raise BadRequestError(f"the prefill chunk must be in [1, {PREFILL_CHUNK}], got {self.prefill_chunk!r}")
        if self.rope_scaling is not None and self.rope_scaling not in ROPE_SCALINGS:
            raise BadRequestError(f"unknown rope scaling {self.rope_scaling!r}", hint=f"use one of: {', '.join(ROPE_SCALINGS)}",
                                  param="rope_scaling")
        if self.rope_scale is not None:
            if isinstance(self.rope_scale, bool) or not isinstance(self.rope_scale, (int, float)) or not 0 < self.rope_scale <= 1024:
                raise BadRequestError(f"the rope scale is the context extension factor (freq_scale = 1/scale), in (0, 1024]; got {self.rope_scale!r}",
                                      param="rope_scale")
            object.__setattr__(self, "rope_scale", float(self.rope_scale))
        if self.yarn_orig_ctx is not None and (isinstance(self.yarn_orig_ctx, bool) or not isinstance(self.yarn_orig_ctx, int)
                                               or self.yarn_orig_ctx < 1):
            raise BadRequestError(f"yarn_orig_ctx must be a positive number of tokens, got {self.yarn_orig_ctx!r}",
                                  param="yarn_orig_ctx")
        if self.expert_slots is not None and (isinstance(self.expert_slots, bool) or not isinstance(self.expert_slots, int)
                                              or self.expert_slots < 1):
            raise BadRequestError(f"expert_slots must be a positive number of experts per layer, got {self.expert_slots!r}",
                                  param="expert_slots")
        if self.streamed_layers is not None and (isinstance(self.streamed_layers, bool) or not isinstance(self.streamed_layers, int)
                                                 or self.streamed_layers < 1):
            raise BadRequestError(f"streamed_layers must be a positive number of layers, got {self.streamed_layers!r}",
                                  param="streamed_layers")
        if isinstance(self.parallel, bool) or not isinstance(self.parallel, int) or not 1 <= self.parallel <= MAX_PARALLEL:
            raise BadRequestError(f"parallel must be a number of sequences in [1, {MAX_PARALLEL}], got {self.parallel!r}",
                                  param="parallel")
        if self.kv_pages is not None and (isinstance(self.kv_pages, bool) or not isinstance(self.kv_pages, int)
                                          or self.kv_pages < 1):
            raise BadRequestError(f"kv_pages must be a positive number of KV cache pages, got {self.kv_pages!r}",
                                  param="kv_pages")
        if self.threads is not None and (isinstance(self.threads, bool) or not isinstance(self.threads, int)
                                         or not 1 <= self.threads <= MAX_THREADS):
            raise BadRequestError(f"threads must be in [1, {MAX_THREADS}], got {self.threads!r}", param="threads")
        if self.device not in DEVICES:
            raise BadRequestError(f"unknown device {self.device!r}", hint=f"use one of: {', '.join(DEVICES)}", param="device")
        if self.budget_bytes is not None and (isinstance(self.budget_bytes, bool) or not isinstance(self.budget_bytes, int)
                                              or self.budget_bytes < 1):
            raise BadRequestError(f"the GPU memory budget must be a positive number of bytes, got {self.budget_bytes!r}",
                                  param="budget_bytes")

    def spec_for(self, spec):
        """The model's spec with this load's rope override applied (the spec itself when there is none)."""
        from pyshim.gguf.spec import with_rope_override

        return with_rope_override(spec, self.rope_scaling, self.rope_scale, self.yarn_orig_ctx)

    @property
    def scaled_keys(self) -> bool:
        """Whether the KV cache stores keys divided by per-model scales (KVType.scaled_keys; "auto" is resolved
        by the loader before it asks)."""
        return self.kv_type in KV_TYPES and KV_TYPES[self.kv_type].scaled_keys

    @property
    def rotated_keys(self) -> bool:
        """Whether the cache's keys are also Hadamard-rotated, model permitting (KVType.rotated_keys)."""
        return self.kv_type in KV_TYPES and KV_TYPES[self.kv_type].rotated_keys

    def context_for(self, training_context: int) -> int:
        return min(training_context, DEFAULT_CONTEXT) if self.context is None else self.context

    def as_dict(self) -> dict:
        d = asdict(self)
        d["arithmetic"] = None if self.arithmetic is None else self.arithmetic.value
        return d

    @classmethod
    def from_dict(cls, d: dict | None) -> "RunSettings":
        d = dict(d or {})
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise BadRequestError(f"unknown load settings {sorted(unknown)}")
        return cls(**{k: v for k, v in d.items() if v is not None or k == "arithmetic"})
