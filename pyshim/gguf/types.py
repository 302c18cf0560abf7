"""GGML tensor types: what each block of bytes holds, how big a tensor is, and which types pyshim runs.

`TensorType` mirrors `gguf.GGMLQuantizationType` value for value (a test checks it), so either can be
passed wherever the other is expected (both are IntEnums); block and byte sizes come from
`gguf.GGML_QUANT_SIZES` so the two never disagree.

Layouts below are per block, in byte order; "f16" is an IEEE half, all multi-byte values little-endian.
A tensor's first dimension (GGUF `ne0`, the contiguous one) is always a whole number of blocks.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from pyshim.errors import UnsupportedError


class TensorType(enum.IntEnum):
    # ---- plain element types (block of 1) ----
    F32 = 0       # 4 B: float32
    F16 = 1       # 2 B: float16
    BF16 = 30     # 2 B: bfloat16 = the high half of a float32
    F64 = 28      # 8 B: float64
    I8 = 24       # 1 B: int8
    I16 = 25      # 2 B: int16
    I32 = 26      # 4 B: int32
    I64 = 27      # 8 B: int64

    # ---- legacy 32-element blocks: x = d * q (+ m) ----
    Q4_0 = 2      # 18 B: d f16 | qs[16]: element j in the low nibble of qs[j], j+16 in the high; x = d*(q-8)
    Q4_1 = 3      # 20 B: d f16 | m f16 | qs[16] (nibbles as Q4_0); x = d*q + m
    Q5_0 = 6      # 22 B: d f16 | qh u32 (bit j = 5th bit of element j) | qs[16] (as Q4_0); x = d*(q-16)
    Q5_1 = 7      # 24 B: d f16 | m f16 | qh u32 | qs[16]; x = d*q + m
    Q8_0 = 8      # 34 B: d f16 | qs[32] int8; x = d*q
    Q8_1 = 9      # 40 B: d f32 | s f32 (= d*sum(qs)) | qs[32] int8: an activation format of dot products, not for weights

    # ---- k-quants: 256-element super-blocks of 16 or 8 sub-blocks with their own scales ----
    Q2_K = 10     # 84 B: scales[16] (4-bit scale | 4-bit min per 16 elements) | qs[64] 2-bit | d f16 | dmin f16
    Q3_K = 11     # 110 B: hmask[32] (3rd bit) | qs[64] low 2 bits | scales[12] (16 x 6-bit, signed) | d f16
    Q4_K = 12     # 144 B: d f16 | dmin f16 | scales[12] (8 x 6-bit scale + 8 x 6-bit min, per 32 elements)
                  #        | qs[128]: 4-bit, each 64 elements = 32 bytes, low nibbles first; x = d*sc*q - dmin*m
    Q5_K = 13     # 176 B: d f16 | dmin f16 | scales[12] (as Q4_K) | qh[32] (5th bits) | qs[128] (as Q4_K)
    Q6_K = 14     # 210 B: ql[128] low 4 bits | qh[64] high 2 bits | scales[16] int8 (per 16) | d f16; x = d*sc*(q-32)
    Q8_K = 15     # 292 B: d f32 | qs[256] int8 | bsums[16] int16: activation format of k-quant dot products

    # ---- importance-matrix / ternary / fp4 types: known, sizes from gguf, not run by pyshim ----
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20   # 32-element blocks: d f16 | qs[16] 4-bit indices into a fixed non-linear table
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    IQ1_M = 29
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39    # 32-element blocks: e8m0 shared exponent | 16 B of 4-bit E2M1 values
    NVFP4 = 40
    Q1_0 = 41

    @property
    def block_size(self) -> int:
        """Elements per block."""
        return GGML_QUANT_SIZES[GGMLQuantizationType(self.value)][0]

    @property
    def type_size(self) -> int:
        """Bytes per block."""
        return GGML_QUANT_SIZES[GGMLQuantizationType(self.value)][1]

    @property
    def gguf(self) -> GGMLQuantizationType:
        return GGMLQuantizationType(self.value)

    @property
    def runnable(self) -> bool:
        return self in RUNNABLE_TYPES

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.type_size / self.block_size


# Which executors decode each type: the one table `inspect`, "will it fit?", both loaders and the GPU's
# kernel catalog read (a test checks that every type listed for "gpu" has a kernel). A tensor of any other
# type is refused by name before a weight is read. BF16 and Q5_1 would be cheap additions (a shift; Q5_0
# plus a min); the IQ*/TQ*/FP4 types need lookup tables not written yet.
EXECUTORS = ("cpu", "gpu", "wasm")
RUNS_ON: dict[TensorType, frozenset[str]] = {t: frozenset(EXECUTORS) for t in (
    TensorType.F32, TensorType.F16,
    TensorType.Q4_0, TensorType.Q4_1, TensorType.Q5_0, TensorType.Q8_0,
    TensorType.Q4_K, TensorType.Q5_K, TensorType.Q6_K,
)}
RUNNABLE_TYPES: frozenset[TensorType] = frozenset(RUNS_ON)


def runnable_names(executor: str = "gpu") -> str:
    return ", ".join(t.name for t in RUNS_ON if executor in RUNS_ON[t])


def check_runnable(tensor: str, ttype: int, executor: str = "gpu") -> None:
    """UnsupportedError naming the tensor and its type when `executor` cannot decode it."""
    t = tensor_type(int(ttype))
    if t is None or executor not in RUNS_ON.get(t, ()):
        type_name = t.name if t is not None else f"#{int(ttype)}"
        raise UnsupportedError(f"won't run: tensor {tensor!r} has type {type_name}, which pyshim does not decode",
                               hint=f"use a GGUF quantized to {runnable_names(executor)}")


_BY_VALUE = {t.value: t for t in TensorType}


def tensor_type(value: int) -> TensorType | None:
    """The TensorType with this GGUF number, or None when the number is unknown."""
    return _BY_VALUE.get(value)


def tensor_nbytes(ttype: TensorType | int, shape: Iterable[int]) -> int:
    """Bytes of a tensor of `shape` (GGUF order: ne0, the contiguous dimension, first).

    Raises ValueError when ne0 is not a whole number of blocks (such a tensor cannot exist)."""
    ttype = TensorType(ttype)
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"negative dimension in shape {dims}")
    block = ttype.block_size
    if (dims[0] if dims else 1) % block:  # a 0-d tensor is one element, like ggml's ne = [1, 1, 1, 1]
        raise ValueError(f"{ttype.name} needs the first dimension to be a multiple of {block}, got shape {dims}")
    return math.prod(dims) // block * ttype.type_size
