"""The reference executor with llama.cpp's CPU arithmetic: two ops classes beside the plain f32 one.

llama.cpp's CPU backend quantizes the activations of a quantized matmul before the dot products (its
"vec_dot_type": Q8_0 blocks against Q4_0/Q5_0/Q8_0 weights, Q8_1 against Q4_1, Q8_K against the
k-quants, f16 against F16).
- `Int8Ops` (Arithmetic.INT8) rounds the activations the same way, then sums in f64: the oracle of the
  GPU int8 route, whose kernels round that way too but sum in their own order.
- `ExactOps` (Arithmetic.EXACT) moreover repeats llama.cpp's x86 CPU arithmetic bit for bit where
  pyshim.exec.ggml_cpu knows the kernel (these matmuls, attention, norms, rope, GLUs). A quantized model
  is chaotic at the scale of that rounding, so anything less agrees with llama.cpp's top-1 at only ~95%
  of positions; exact, the logits equal llama.cpp's up to the output head (left to BLAS: it feeds no
  later rounding). The kernels it follows are the ones llama.cpp picks on a CPU with AVX-512 VNNI
  (`FOLLOWS`); on a CPU without those, llama.cpp itself takes other kernels, so ExactOps warns.
The GPU f32 kernels keep f32 activations: compare those against the plain reference (ReferenceOps).
"""

from __future__ import annotations

import sys
import warnings

import numpy as np
from gguf import GGMLQuantizationType as QT

from pyshim.exec import ggml_cpu
from pyshim.exec.reference import ReferenceOps, Weight, gelu_tanh
from pyshim.models.ops import AttnSpec
from pyshim.models.rope import RopeSpec
from pyshim.plan.settings import Arithmetic

GELU_TABLE_LIMIT = 10.0
_ACT_Q8_0 = frozenset({QT.Q4_0, QT.Q5_0, QT.Q8_0})
_ACT_Q8_1 = frozenset({QT.Q4_1})       # Q8_0's values plus a per-block sum kept as f16
_ACT_Q8_K = frozenset({QT.Q4_K, QT.Q5_K, QT.Q6_K})
Q8_BLOCK = 32
Q8_K_BLOCK = 256
# Weight types whose matmul pyshim.exec.ggml_cpu repeats bit for bit. The output head is left out: its
# logits feed no later rounding, so its float order cannot change what follows (it is emulated to
# within float error only, which is far faster for a 50k-260k-row matrix).
_EXACT_TYPES = frozenset({QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q8_0, QT.Q4_K, QT.Q6_K})
_HEADS = frozenset({"output.weight", "token_embd.weight"})
# llama.cpp repacks a Q4_K weight (q4_K_8x8, the kernel emulated) only when its rows come in eights
REPACK_COLS = 8
# The x86 features whose kernels ExactOps repeats (/proc/cpuinfo flag names): llama.cpp built for and run
# on such a CPU takes the AVX-512 int8 dot products, 16-lane f32 dots and the Q4_K 8x8 repacking.
FOLLOWS = ("avx512f", "avx512bw", "avx512_vnni")


def _q8_0_roundtrip(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's x86 quantize_row_q8_0 then dequantize; also each block's (q, f32 scale) for Q8_1's sum."""
    blocks = x.reshape(-1, Q8_BLOCK).astype(np.float32)
    amax = np.abs(blocks).max(axis=1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv = np.where(amax == 0, np.float32(0), np.float32(127.0) / amax).astype(np.float32)
    q = np.rint(blocks * inv)                                   # round half to even, like _mm256_round_ps
    d = (amax / np.float32(127.0)).astype(np.float32)
    values = (q * d.astype(np.float16).astype(np.float32)).reshape(x.shape)
    return values, q.sum(axis=1).reshape(*x.shape[:-1], -1) * d.reshape(*x.shape[:-1], -1)


def _q8_k_roundtrip(x: np.ndarray) -> np.ndarray:
    """ggml's quantize_row_q8_K then dequantize: per 256 values, scale so the largest magnitude is -127."""
    blocks = x.reshape(-1, Q8_K_BLOCK).astype(np.float32)
    at = np.argmax(np.abs(blocks), axis=1)
    biggest = blocks[np.arange(len(blocks)), at][:, None]
    with np.errstate(divide="ignore"):
        iscale = np.where(biggest == 0, np.float32(0), np.float32(-127.0) / biggest).astype(np.float32)
        d = np.where(iscale == 0, np.float32(0), np.float32(1.0) / iscale).astype(np.float32)
    q = np.minimum(127, np.rint(iscale * blocks))              # ggml's nearest_int rounds half to even
    return (q * d).astype(np.float32).reshape(x.shape)


def llama_cpp_activations(x: np.ndarray, qtype: QT) -> np.ndarray:
    """x as llama.cpp's CPU matmul sees it against a weight of type `qtype`."""
    if qtype in _ACT_Q8_0 or qtype in _ACT_Q8_1:
        return _q8_0_roundtrip(x)[0]
    if qtype in _ACT_Q8_K:
        return _q8_k_roundtrip(x)
    if qtype == QT.F16:
        return x.astype(np.float16).astype(np.float32)
    return x


def q8_1_sum_correction(x: np.ndarray, mins: np.ndarray) -> np.ndarray:
    """What llama.cpp adds to a Q4_1 matmul beyond dequantized-activations @ dequantized-weights: it
    multiplies each weight block's min by the activation block's sum rounded to f16, not the exact sum.
    x [n, k]; mins [m, k / 32] -> [n, m]."""
    values, sums = _q8_0_roundtrip(x)
    exact = values.reshape(x.shape[0], -1, Q8_BLOCK).sum(axis=2, dtype=np.float64)
    rounded = sums.astype(np.float16).astype(np.float64)
    return ((rounded - exact) @ mins.T.astype(np.float64)).astype(np.float32)


def gelu_llama_cpp(x: np.ndarray) -> np.ndarray:
    """ggml's CPU GELU: a table over f16 inputs with f16 outputs, exact outside (-10, 10)."""
    table = gelu_tanh(x.astype(np.float16).astype(np.float32)).astype(np.float16).astype(np.float32)
    return np.where(x <= -GELU_TABLE_LIMIT, 0.0, np.where(x >= GELU_TABLE_LIMIT, x, table)).astype(np.float32)


def _block_mins(w: Weight) -> np.ndarray:
    """Each Q4_1 block's min (f16 at bytes 2..4 of its 20): [rows, blocks]."""
    blocks = w.raw().reshape(w.shape[0], -1, w.ref.block[1])
    return blocks[:, :, 2:4].copy().view(np.float16)[:, :, 0].astype(np.float32)


class Int8Ops(ReferenceOps):
    """The reference with llama.cpp's activation rounding (the GPU int8 route's oracle)."""

    arithmetic = Arithmetic.INT8

    def _matmul(self, x: np.ndarray, w: Weight) -> np.ndarray:
        out = w.matmul_t(llama_cpp_activations(x, w.ref.qtype))
        if w.ref.qtype in _ACT_Q8_1:
            out += q8_1_sum_correction(x, _block_mins(w))
        return out

    def _gelu_glu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        return gelu_llama_cpp(gate) * up


def _cpu_flags() -> frozenset[str] | None:
    """This CPU's feature flags (Linux), or None where they cannot be read."""
    if sys.platform != "linux":
        return None
    try:
        with open("/proc/cpuinfo") as f:
            line = next((l for l in f if l.startswith("flags")), "")
    except OSError:
        return None
    return frozenset(line.split(":", 1)[-1].split())


def check_cpu_matches() -> list[str]:
    """The FOLLOWS features this CPU lacks (warned about: llama.cpp here takes other kernels, so its
    results differ from what ExactOps repeats); empty when they are all there or cannot be read."""
    flags = _cpu_flags()
    missing = [] if flags is None else [f for f in FOLLOWS if f not in flags]
    if missing:
        warnings.warn(f"the llama.cpp-exact arithmetic repeats llama.cpp's AVX-512 VNNI kernels, but this CPU lacks "
                      f"{', '.join(missing)}: llama.cpp run here takes other kernels, so expect ~95% top-1 agreement "
                      "with it rather than bit-identical logits", RuntimeWarning, stacklevel=3)
    return missing


class ExactOps(Int8Ops):
    """llama.cpp's x86 (AVX-512 VNNI) CPU arithmetic bit for bit, where pyshim.exec.ggml_cpu has the kernel."""

    arithmetic = Arithmetic.EXACT

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        check_cpu_matches()

    def _matmul(self, x: np.ndarray, w: Weight) -> np.ndarray:
        qtype = w.ref.qtype
        exact = qtype in _EXACT_TYPES and w.ref.name not in _HEADS and (qtype != QT.Q4_K or w.shape[0] % REPACK_COLS == 0)
        if not exact:
            return super()._matmul(x, w)
        if qtype == QT.Q4_K:
            return ggml_cpu.matmul_q4_k_repacked(x, w.raw())
        if qtype == QT.Q6_K:
            return ggml_cpu.matmul_q6_k(x, w.raw())
        return ggml_cpu.matmul_legacy(x, w.raw(), qtype)

    def _rmsnorm(self, x: np.ndarray, w: Weight | None, eps: float) -> np.ndarray:
        return ggml_cpu.rmsnorm(x, np.ones(x.shape[-1], np.float32) if w is None else w.dense(), eps)

    def _rotate(self, x: np.ndarray, positions: np.ndarray, spec: RopeSpec, freq_factors: Weight | None) -> np.ndarray:
        if spec.scaling == "yarn" or spec.attn_factor != 1.0:
            return super()._rotate(x, positions, spec, freq_factors)
        ff = freq_factors.dense() if freq_factors is not None else None
        cos, sin = ggml_cpu.rope_cos_sin(positions, spec.dims, spec.base, spec.freq_scale, ff)
        return ggml_cpu.rope(x, cos, sin, spec.neox)

    def _attend(self, qh: np.ndarray, keys: np.ndarray, vals: np.ndarray, visible: np.ndarray, spec: AttnSpec) -> np.ndarray:
        """llama.cpp's CPU attention of a batch (f32 KV cache, no flash attention), bit for bit: q.k by
        ggml_vec_dot_f32 (q is a permuted, non-contiguous view, so no tinyBLAS), soft_max_ext with the
        scale and a 0/-inf mask, then probabilities x values through tinyBLAS — or, for one token (llamafile
        only takes n >= 2), through ggml_vec_dot_f32 too. The key axis is padded with masked keys to whole
        16- (or 64-) value steps, as llama.cpp pads its KV view (they add exact zeros)."""
        hkv, group, n, hd = qh.shape
        if spec.softcap or hd % ggml_cpu.F32_STEP:
            return super()._attend(qh, keys, vals, visible, spec)
        pad = -keys.shape[0] % (ggml_cpu.F32_STEP if n == 1 else ggml_cpu.LANES_512)
        keys = np.concatenate([keys, np.zeros((pad, *keys.shape[1:]), np.float32)])
        vals = np.concatenate([vals, np.zeros((pad, *vals.shape[1:]), np.float32)])
        visible = np.concatenate([visible, np.zeros((n, pad), bool)], axis=1)
        scores = ggml_cpu.dot_f32(qh[:, :, :, None, :], keys.transpose(1, 0, 2)[:, None, None])  # [Hkv, G, n, S]
        probs = ggml_cpu.softmax_rows(np.where(visible, scores, -np.inf), spec.scale)
        if n == 1:
            out = ggml_cpu.dot_f32(vals.transpose(1, 2, 0)[:, None, None], probs[..., None, :])   # [Hkv, G, 1, hd_v]
        else:
            out = ggml_cpu.tinyblas_f32(vals.transpose(1, 2, 0)[:, None], probs)               # [Hkv, G, n, hd_v]
        return out.transpose(2, 0, 1, 3).reshape(n, spec.n_heads * spec.head_dim_v)

    def _silu_glu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        return ggml_cpu.swiglu(gate, up)

    def _gelu_glu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        return ggml_cpu.geglu(gate, up)


OPS_FOR: dict[Arithmetic, type[ReferenceOps]] = {Arithmetic.F32: ReferenceOps, Arithmetic.INT8: Int8Ops, Arithmetic.EXACT: ExactOps}
