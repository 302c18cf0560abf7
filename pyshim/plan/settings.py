"""The settings a model runs with, each defined once: KV cache types, the arithmetic, the prefill chunk
and the default context — and `RunSettings`, the object a load is asked for with (by the CLI, the Python
API and the page: the page sends it as a JSON object, see pyshim.serve.protocol).
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass
from fractions import Fraction

from pyshim.errors import BadRequestError, UnsupportedError

# Most tokens one step runs (a prompt is prefilled in chunks of this): bounds the [n, S] attention scores
# and the activations a step holds; the GPU executor records its programs for at most this many.
PREFILL_CHUNK = 256
# KV cache positions when the caller names none (the model may allow more; its training context caps it).
DEFAULT_CONTEXT = 4096


@dataclass(frozen=True)
class KVType:
    """How the KV cache stores a value (the reference rounds to it; include/kv.wgsl stores it so)."""

    name: str
    bytes_per_value: Fraction     # q8/q4: blocks of 32 int8 / 4-bit values along the head with an f32 scale
    block: int = 1                # values per quantization block along a head: head sizes must be multiples
    note: str = ""

    def check_heads(self, head_dim_k: int, head_dim_v: int) -> None:
        if head_dim_k % self.block or head_dim_v % self.block:
            raise UnsupportedError(f"a {self.name} KV cache needs head sizes that are multiples of {self.block} (this "
                                   f"model's: {head_dim_k}/{head_dim_v})", hint="use kv_type f16")


# Least rounding first: the order "will it fit?" tries them in (q8 measured 98.3-100% top-1 agreement
# with f32 on SmolLM2 and Gemma 3).
KV_TYPES: dict[str, KVType] = {t.name: t for t in (
    KVType("f32", Fraction(4), note="exact"),
    KVType("f16", Fraction(2), note="half the memory"),
    KVType("q8", Fraction(36, 32), block=32, note="int8 blocks, 28% of f32"),
    KVType("q4", Fraction(20, 32), block=32, note="4-bit blocks, 16% of f32"),
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
    `arithmetic` None: the executor's default (the GPU's int8 route on CPU adapters, f32 elsewhere)."""

    context: int | None = None
    kv_type: str = "f32"
    arithmetic: Arithmetic | None = None
    prefill_chunk: int = PREFILL_CHUNK

    def __post_init__(self):
        kv_type(self.kv_type)
        object.__setattr__(self, "arithmetic", Arithmetic.parse(self.arithmetic))
        if self.context is not None and (isinstance(self.context, bool) or not isinstance(self.context, int) or self.context < 1):
            raise BadRequestError(f"the context must be a positive number of tokens, got {self.context!r}")
        if isinstance(self.prefill_chunk, bool) or not isinstance(self.prefill_chunk, int) or not 1 <= self.prefill_chunk <= PREFILL_CHUNK:
            raise BadRequestError(f"the prefill chunk must be in [1, {PREFILL_CHUNK}], got {self.prefill_chunk!r}")

    def context_for(self, training_context: int) -> int:
        return min(training_context, DEFAULT_CONTEXT) if self.context is None else self.context

    def as_dict(self) -> dict:
        d = asdict(self)
        d["arithmetic"] = None if self.arithmetic is None else self.arithmetic.value
        return d

    @classmethod
    def from_dict(cls, d: dict | None) -> "RunSettings":
        d = dict(d or {})
        unknown = set(d) - {"context", "kv_type", "arithmetic", "prefill_chunk"}
        if unknown:
            raise BadRequestError(f"unknown load settings {sorted(unknown)}")
        return cls(**{k: v for k, v in d.items() if v is not None or k == "arithmetic"})
