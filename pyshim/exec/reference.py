"""The reference executor: the ops interface computed immediately with NumPy, in float32.

Weights stay as GGUF blocks in their `ByteSource` and are dequantized with `gguf.quants`:
- `cache_weights=True` (default in CPython): each matmul weight is dequantized once, on first use, and
  kept as f32 (Qwen2.5-0.5B: ~2.4 GB) — fast decode;
- `cache_weights=False` (Pyodide's 2–4 GB wasm heap): dequantized per matmul, `DEQUANT_CHUNK_ROWS` rows
  at a time, so the peak is one chunk — slow but small.
Embedding lookups dequantize only the rows asked for. This executor is the oracle every GPU kernel is
checked against, so it favours plain, obviously right NumPy over speed.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import quants

from pyshim.exec import ggml_cpu
from pyshim.errors import TensorShapeError, UnsupportedError
from pyshim.exec.kvcache import KVCache
from pyshim.models.ops import ACTIVATIONS, AttnSpec
from pyshim.models.rope import RopeSpec, cos_sin
from pyshim.gguf.tensors import TensorRef, WeightStore

# The tensor types pyshim runs (the GPU executor has a kernel for each).
SUPPORTED_TYPES = frozenset({QT.F32, QT.F16, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q8_0, QT.Q4_K, QT.Q5_K, QT.Q6_K})
# Rows dequantized at once when weights are not cached: 4096 rows x 4096 f32 = 64 MiB at most.
DEQUANT_CHUNK_ROWS = 4096
GELU_COEF_A = 0.044715
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
GELU_TABLE_LIMIT = 10.0


def dequantize_rows(raw: np.ndarray, qtype: QT) -> np.ndarray:
    """uint8 blocks (rows, row_bytes) -> f32 (rows, n_in)."""
    if qtype == QT.F32:
        return raw.view(np.float32)
    if qtype == QT.F16:
        return raw.view(np.float16).astype(np.float32)
    return quants.dequantize(raw, qtype).astype(np.float32, copy=False)


# llama.cpp's CPU backend quantizes the activations of a quantized matmul before the dot products
# (its "vec_dot_type"). `emulate_llama_cpp`:
# - True: round the activations the same way, then sum in f64 (the oracle of the GPU int8 route, whose
#   kernels round that way too but sum in their own order);
# - EXACT: moreover repeat llama.cpp's x86 CPU arithmetic bit for bit where pyshim.exec.ggml_cpu knows the
#   kernel (these matmuls, attention, norms, rope, GLUs). A quantized model is chaotic at the scale of
#   that rounding, so anything less agrees with llama.cpp's top-1 at only ~95% of positions; exact, the
#   logits equal llama.cpp's up to the output head (left to BLAS: it feeds no later rounding).
# The GPU f32 kernels keep f32 activations, so compare those against the reference with it off.
EXACT = "exact"
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


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)))


def _gelu_llama_cpp(x: np.ndarray) -> np.ndarray:
    """ggml's CPU GELU: a table over f16 inputs with f16 outputs, exact outside (-10, 10)."""
    table = _gelu_tanh(x.astype(np.float16).astype(np.float32)).astype(np.float16).astype(np.float32)
    return np.where(x <= -GELU_TABLE_LIMIT, 0.0, np.where(x >= GELU_TABLE_LIMIT, x, table)).astype(np.float32)


class Weight:
    """A bound GGUF tensor: its place in the file, and its f32 values once asked for (cached or not)."""

    def __init__(self, store: WeightStore, ref: TensorRef, cache: bool, emulate_llama_cpp: bool | str = False):
        self.store, self.ref, self.cache = store, ref, cache
        self.emulate_llama_cpp = bool(emulate_llama_cpp)
        self.exact = emulate_llama_cpp == EXACT
        self.shape = ref.shape
        self._dense: np.ndarray | None = None

    def dense(self) -> np.ndarray:
        """All values as f32 in `shape` (cached after the first call when caching)."""
        if self._dense is not None:
            return self._dense
        values = dequantize_rows(self.store.raw(self.ref.name), self.ref.qtype).reshape(self.shape)
        if self.cache:
            self._dense = values
        return values

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` of a 2-D weight as f32 [len(ids), n_in]."""
        if self._dense is not None:
            return self._dense[ids]
        return dequantize_rows(self.store.raw_rows(self.ref.name, ids), self.ref.qtype)

    def matmul_t(self, x: np.ndarray) -> np.ndarray:
        """x [n, k] @ self.T -> [n, m]."""
        if self._exact():
            raw = self.store.raw(self.ref.name)
            if self.ref.qtype == QT.Q4_K:
                return ggml_cpu.matmul_q4_k_repacked(x, raw)
            if self.ref.qtype == QT.Q6_K:
                return ggml_cpu.matmul_q6_k(x, raw)
            return ggml_cpu.matmul_legacy(x, raw, self.ref.qtype)
        if self.emulate_llama_cpp:
            out = self._matmul_t(llama_cpp_activations(x, self.ref.qtype))
            if self.ref.qtype in _ACT_Q8_1:
                out += q8_1_sum_correction(x, self._block_mins())
            return out
        return self._matmul_t(x)

    def _exact(self) -> bool:
        """Whether this matmul is one pyshim.exec.ggml_cpu repeats bit for bit."""
        if not self.exact or self.ref.qtype not in _EXACT_TYPES or self.ref.name in _HEADS:
            return False
        return self.ref.qtype != QT.Q4_K or self.shape[0] % REPACK_COLS == 0

    def _block_mins(self) -> np.ndarray:
        """Each Q4_1 block's min (f16 at bytes 2..4 of its 20): [rows, blocks]."""
        blocks = self.store.raw(self.ref.name).reshape(self.shape[0], -1, self.ref.block[1])
        return blocks[:, :, 2:4].copy().view(np.float16)[:, :, 0].astype(np.float32)

    def _matmul_t(self, x: np.ndarray) -> np.ndarray:
        if self.cache or self.ref.qtype == QT.F32:
            return x @ self.dense().T
        raw = self.store.raw(self.ref.name)
        out = np.empty((x.shape[0], self.shape[0]), dtype=np.float32)
        for start in range(0, self.shape[0], DEQUANT_CHUNK_ROWS):
            chunk = dequantize_rows(raw[start:start + DEQUANT_CHUNK_ROWS], self.ref.qtype)
            out[:, start:start + chunk.shape[0]] = x @ chunk.T
        return out


def _attention_llama_cpp(qh: np.ndarray, keys: np.ndarray, vals: np.ndarray, visible: np.ndarray,
                         spec: AttnSpec) -> np.ndarray:
    """llama.cpp's CPU attention of a batch (f32 KV cache, no flash attention), bit for bit: q.k by
    ggml_vec_dot_f32 (q is a permuted, non-contiguous view, so no tinyBLAS), soft_max_ext with the
    scale and a 0/-inf mask, then probabilities x values through tinyBLAS — or, for one token (llamafile
    only takes n >= 2), through ggml_vec_dot_f32 too. The key axis is padded with masked keys to whole
    16- (or 64-) value steps, as llama.cpp pads its KV view (they add exact zeros).
    qh [Hkv, G, n, hd], keys [S, Hkv, hd], vals [S, Hkv, hd_v], visible [n, S] -> [n, Hq * hd_v]."""
    hkv, group, n, _ = qh.shape
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


class NumpyOps:
    """`pyshim.models.ops.Ops` in NumPy. Tensors are float32 ndarrays; tokens and positions int64 arrays."""

    def __init__(self, store: WeightStore, spec, n_ctx: int, cache_weights: bool = True,
                 emulate_llama_cpp: bool | str = False, kv_type: str = "f32"):
        self.store = store
        self.cache_weights = cache_weights
        self._emulate = emulate_llama_cpp        # False, True or EXACT, passed on to each Weight
        self.emulate_llama_cpp = bool(emulate_llama_cpp)
        self.exact = emulate_llama_cpp == EXACT
        self.kv = KVCache(spec, n_ctx, kv_type)
        self._bound: dict[str, Weight] = {}

    # --- handles made by the executor for the model ---
    def tokens(self, ids: Sequence[int]) -> np.ndarray:
        return np.asarray(ids, dtype=np.int64)

    def positions(self, start: int, n: int) -> np.ndarray:
        return np.arange(start, start + n, dtype=np.int64)

    def read(self, x: np.ndarray) -> np.ndarray:
        """An activation as a NumPy array (the GPU executor reads back here)."""
        return x

    def reset(self) -> None:
        self.kv.reset()

    def prepare(self) -> None:
        """Dequantize every cached weight now (else the first forward pays for it); no-op when not caching."""
        if self.cache_weights:
            for w in self._bound.values():
                if len(w.shape) == 2:
                    w.dense()

    @property
    def bound_bytes(self) -> int:
        return sum(w.ref.nbytes for w in self._bound.values())

    # --- weights ---
    def has_weight(self, name: str) -> bool:
        return name in self.store

    def weight(self, name: str, shape: Sequence[int]) -> Weight:
        ref = self.store.info(name)
        if ref.qtype not in SUPPORTED_TYPES:
            raise UnsupportedError(f"tensor {name!r} has type {ref.qtype.name}, which pyshim does not run",
                                   hint="supported: " + ", ".join(sorted(t.name for t in SUPPORTED_TYPES)))
        if tuple(ref.shape) != tuple(shape):
            raise TensorShapeError(f"tensor {name!r} has shape {tuple(ref.shape)}, expected {tuple(shape)} "
                                   "(NumPy order)", hint="the file does not match its own hyperparameters")
        if name not in self._bound:
            self._bound[name] = Weight(self.store, ref, self.cache_weights, self._emulate)
        return self._bound[name]

    # --- ops ---
    def embed(self, table: Weight, tokens: np.ndarray) -> np.ndarray:
        return table.rows(tokens)

    def matmul(self, x: np.ndarray, w: Weight, bias: Weight | None = None) -> np.ndarray:
        out = w.matmul_t(x)
        if bias is not None:
            out += bias.dense()
        return out

    def rmsnorm(self, x: np.ndarray, w: Weight, eps: float) -> np.ndarray:
        if self.exact:
            return ggml_cpu.rmsnorm(x, w.dense(), eps)
        ms = np.mean(np.square(x, dtype=np.float64), axis=-1, keepdims=True)
        return (x / np.sqrt(ms + eps)).astype(np.float32) * w.dense()

    def view(self, x: np.ndarray, shape: Sequence[int]) -> np.ndarray:
        return x.reshape(tuple(shape))

    def split(self, x: np.ndarray, sizes: Sequence[int]) -> list[np.ndarray]:
        return np.split(x, np.cumsum(sizes)[:-1], axis=-1)

    def rope(self, x: np.ndarray, positions: np.ndarray, spec: RopeSpec, freq_factors: Weight | None = None) -> np.ndarray:
        ff = freq_factors.dense() if freq_factors is not None else None
        if self.exact and spec.scaling != "yarn" and spec.attn_factor == 1.0:
            cos, sin = ggml_cpu.rope_cos_sin(positions, spec.dims, spec.base, spec.freq_scale, ff)
            return ggml_cpu.rope(x, cos, sin, spec.neox)
        cos, sin = cos_sin(spec, positions, ff)                 # [n, dims/2]
        cos, sin = cos[:, None, :], sin[:, None, :]             # broadcast over heads
        out = x.copy()
        d = spec.dims
        if spec.neox:
            x1, x2 = x[..., : d // 2], x[..., d // 2: d]
            out[..., : d // 2] = x1 * cos - x2 * sin
            out[..., d // 2: d] = x2 * cos + x1 * sin
        else:
            x1, x2 = x[..., 0:d:2], x[..., 1:d:2]
            out[..., 0:d:2] = x1 * cos - x2 * sin
            out[..., 1:d:2] = x2 * cos + x1 * sin
        return out

    def attention(self, q, k, v, positions, spec: AttnSpec) -> np.ndarray:
        n, hq, hd = q.shape
        hkv, group = spec.n_kv_heads, spec.n_heads // spec.n_kv_heads
        layer = self.kv[spec.layer]
        # keys = what the cache held before this step, then this step's own (a ring smaller than the
        # chunk would otherwise lose keys the chunk's first queries still need)
        ck, cv, cpos = layer.contents()
        k, v = layer.as_stored(k), layer.as_stored(v)      # this step's keys too: the GPU reads them from the cache
        keys = np.concatenate([ck, k]) if len(ck) else k                      # [S, Hkv, hd]
        vals = np.concatenate([cv, v]) if len(cv) else v                      # [S, Hkv, hd_v]
        kpos = np.concatenate([cpos, positions]) if len(cpos) else positions  # [S]
        layer.update(positions, k, v)

        qh = q.reshape(n, hkv, group, hd).transpose(1, 2, 0, 3)               # [Hkv, G, n, hd]
        visible = (kpos[None, :] <= positions[:, None]) & (kpos[None, :] >= 0)   # [n, S]
        if spec.window:
            visible &= positions[:, None] - kpos[None, :] < spec.window
        if self.exact and not spec.softcap and hd % ggml_cpu.F32_STEP == 0:
            return _attention_llama_cpp(qh, keys, vals, visible, spec)
        scores = qh @ keys.transpose(1, 2, 0)[:, None]                        # [Hkv, G, n, S]
        scores *= spec.scale
        if spec.softcap > 0:
            scores = spec.softcap * np.tanh(scores / spec.softcap)
        scores = np.where(visible, scores, -np.inf)
        scores -= scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        out = probs @ vals.transpose(1, 0, 2)[:, None]                        # [Hkv, G, n, hd_v]
        return out.transpose(2, 0, 1, 3).reshape(n, spec.n_heads * spec.head_dim_v).astype(np.float32)

    def glu(self, gate: np.ndarray, up: np.ndarray, act: str) -> np.ndarray:
        if act == "silu":
            if self.exact:
                return ggml_cpu.swiglu(gate, up)
            return gate / (1.0 + np.exp(-gate)) * up
        if act == "gelu_tanh":
            if self.exact:
                return ggml_cpu.geglu(gate, up)
            if self.emulate_llama_cpp:
                return _gelu_llama_cpp(gate) * up
            return _gelu_tanh(gate) * up
        raise UnsupportedError(f"activation {act!r} is not one of {ACTIVATIONS}")

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return a + b

    def scale(self, x: np.ndarray, s: float) -> np.ndarray:
        return x * np.float32(s)

    def softcap(self, x: np.ndarray, cap: float) -> np.ndarray:
        return (np.tanh(x / np.float32(cap)) * np.float32(cap)).astype(np.float32)

    def last(self, x: np.ndarray) -> np.ndarray:
        return x[-1:]
