"""llama.cpp's CPU arithmetic, reproduced bit for bit (x86 with AVX512, as the test oracle runs it).

Why bit for bit: a quantized model run by llama.cpp is chaotic at the scale of its activation rounding.
Every matmul rounds its input to 8 bits (Q8_0 / Q8_1 / Q8_K blocks); a difference of one ulp anywhere
moves some value across a rounding boundary, which changes that block by a whole quantum, which moves
more values across boundaries in the next layer, and within a few layers the two runs differ by as much
as two independent quantizations would (measured on SmolLM2: llama.cpp fed one token at a time instead
of in one batch runs its attention through a different f32 kernel; the logits stay bit-identical for
35 positions, then differ by a median 0.5 at every later position, top-1 agreeing at only 95.6%). So to
agree with llama.cpp's top-1 at ~100% of positions rather than ~95%, pyshim has to repeat its float32
operations in the same order: the SIMD lane layout of each dot product, fused multiply-adds, its
vectorized exp, its double-precision sums.

What each function reproduces is named in its docstring (ggml-cpu file and function). FMA is computed
in float64 and rounded once to float32: exact except when the float64 sum rounds to a float32 tie
(about one time in 2^29), which is as close as NumPy gets.
"""

from __future__ import annotations

import sys

import numpy as np
from gguf import GGMLQuantizationType as QT

F32, F64 = np.float32, np.float64
Q8_BLOCK = 32
LANES_256 = 8       # an __m256 of floats: int8 dot products leave 8 lane sums of 4 products each
LANES_512 = 16      # an __m512 of floats: f32 dot products and softmax sums run 16 lanes wide
F32_STEP = 64       # ggml_vec_dot_f32 on AVX512: 4 accumulators x 16 lanes per loop step
LANE_CHUNK_VALUES = 8192    # rows x output columns per lane in one pass of lane_dot (a cache-sized piece)


def fma(a, b, c) -> np.ndarray:
    """float32 fused multiply-add a*b + c, rounded once."""
    return (np.asarray(a, F64) * np.asarray(b, F64) + np.asarray(c, F64)).astype(F32)


# ---------------------------------------------------------------- the C library's float functions

_LIBM: list = []        # [cosf, sinf, expf, tanhf] ufuncs, or [None]: looked up on first use


def _libm():
    """The C library's cosf, sinf, expf and tanhf when ctypes can reach them (CPython on Linux), else None
    (Pyodide: no C library to load, so float64 results rounded to float stand in). llama.cpp calls
    them one value at a time, and glibc's are not correctly rounded (on the angles of a 160-token rope,
    114 of 5120 differ by an ulp from the float64 cos rounded to float)."""
    if not _LIBM:
        _LIBM.append(_load_libm())
    return _LIBM[0]


def _load_libm():
    if sys.platform == "emscripten":
        return None
    try:
        import ctypes
        import ctypes.util

        libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
    except (ImportError, OSError):
        return None
    funcs = []
    for name in ("cosf", "sinf", "expf", "tanhf"):
        f = getattr(libm, name)
        f.restype, f.argtypes = ctypes.c_float, [ctypes.c_float]
        funcs.append(np.frompyfunc(f, 1, 1))
    return funcs


def cos_sin_f32(theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cosf and sinf of float angles: the C library's where reachable, else float64 rounded to float."""
    libm = _libm()
    if libm is None:
        return np.cos(theta.astype(F64)).astype(F32), np.sin(theta.astype(F64)).astype(F32)
    cosf, sinf = libm[:2]
    return cosf(theta).astype(F32), sinf(theta).astype(F32)


def libm_tanhf(x: np.ndarray) -> np.ndarray:
    """The C library's tanhf, value by value, where reachable (else float64 rounded to float)."""
    libm = _libm()
    if libm is None:
        return np.tanh(x.astype(F64)).astype(F32)
    return libm[3](x.astype(F32)).astype(F32)


def libm_expf(x: np.ndarray) -> np.ndarray:
    """The C library's expf, value by value, where reachable (else float64 rounded to float)."""
    libm = _libm()
    if libm is None:
        return np.exp(x.astype(F64)).astype(F32)
    return libm[2](x.astype(F32)).astype(F32)


# ---------------------------------------------------------------- horizontal sums

def hsum8(v: np.ndarray) -> np.ndarray:
    """x86 quants.c hsum_float_8 (and tinyBLAS's hsum of an __m256): [..., 8] -> [...] in f32."""
    s = v[..., 4:8] + v[..., 0:4]                      # _mm256_extractf128_ps + _mm_add_ps
    return (s[..., 0] + s[..., 2]) + (s[..., 1] + s[..., 3])   # movehl, then movehdup


def reduce16(v: np.ndarray) -> np.ndarray:
    """GCC's _mm512_reduce_add_ps: halves added pairwise down to one float. [..., 16] -> [...]."""
    t = v[..., 8:16] + v[..., 0:8]
    u = t[..., 4:8] + t[..., 0:4]
    return (u[..., 0] + u[..., 2]) + (u[..., 1] + u[..., 3])


# ---------------------------------------------------------------- exp, softmax, gated activations

_EXP_C = [F32(float.fromhex(h)) for h in
          ("0x1.0e4020p-7", "0x1.573e2ep-5", "0x1.555e66p-3", "0x1.fffdb6p-2", "0x1.ffffecp-1")]
_EXP_SHIFT = F32(float.fromhex("0x1.8p23"))
_LOG2E = F32(float.fromhex("0x1.715476p+0"))
_LN2_HI = F32(float.fromhex("0x1.62e4p-1"))
_LN2_LO = F32(float.fromhex("0x1.7f7d1cp-20"))
_EXP_OVERFLOW_N = 192.0


def expf(x: np.ndarray) -> np.ndarray:
    """vec.h ggml_v_expf, AVX512 variant (a polynomial, up to ~1.5 ulp from the true exp)."""
    x = np.asarray(x, F32)
    with np.errstate(invalid="ignore", over="ignore"):
        z = fma(x, _LOG2E, _EXP_SHIFT)
        n = z - _EXP_SHIFT                                  # round(x / ln 2)
        b = fma(-n, _LN2_LO, fma(-n, _LN2_HI, x))           # x - n ln 2, in two parts
        u = b * b
        c0, c1, c2, c3, c4 = _EXP_C
        j = fma(fma(fma(c0, b, c1), u, fma(c2, b, c3)), u, fma(c4, b, F32(1.0)))
        big = np.abs(n) > _EXP_OVERFLOW_N
        res = np.ldexp(j, np.where(big, 0, n).astype(np.int32)).astype(F32)    # _mm512_scalef_ps
        return np.where(big, np.where(n <= 0, F32(0.0), F32(np.inf)), res).astype(F32)


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """vec.cpp ggml_vec_swiglu_f32: x / (1 + exp(-x)) * g, with ggml_v_expf over whole 16-lane chunks
    and the C library's expf (ggml_silu_f32) for the last n % 16 values of a row."""
    gate = gate.astype(F32)
    tail = gate.shape[-1] - gate.shape[-1] % LANES_512
    e = expf(F32(0.0) - gate)
    if tail < gate.shape[-1]:
        e[..., tail:] = libm_expf(-gate[..., tail:])
    return (gate / (F32(1.0) + e) * up).astype(F32)


def softmax_rows(scores: np.ndarray, scale: float) -> np.ndarray:
    """ops.cpp soft_max_f32 with a 0/-inf mask already added: x*scale, minus the row max, ggml_v_expf,
    a double-precision sum of each 16-lane chunk's _mm512_reduce_add_ps, then times (float)(1/sum)."""
    w = scores.astype(F32) * F32(scale)
    if w.shape[-1] % LANES_512:
        raise ValueError("softmax emulation needs rows of a multiple of 16 keys (pad with -inf)")
    e = expf(w - w.max(axis=-1, keepdims=True))
    chunks = reduce16(e.reshape(*e.shape[:-1], -1, LANES_512)).astype(F64)
    total = np.cumsum(chunks, axis=-1)[..., -1]            # sequential double sum, chunk by chunk
    return (e * (1.0 / total).astype(F32)[..., None]).astype(F32)


GELU_COEF_A = F32(0.044715)
SQRT_2_OVER_PI = F32(0.79788456080286535587989211986876)
GELU_TABLE_LIMIT = F32(10.0)
_GELU_TABLE: list[np.ndarray] = []


def gelu_table() -> np.ndarray:
    """ggml_table_gelu_f16 as ggml_cpu_init fills it: for every f16 x, f16(ggml_gelu_f32(x)) with
    0.5f*x*(1 + tanhf(SQRT_2_OVER_PI*x*(1 + GELU_COEF_A*x*x))), GCC fusing 1 + (A*x)*x into an FMA.
    (Checked equal, entry for entry, to the table in the oracle's libggml-cpu.) -> f32 [65536]."""
    if not _GELU_TABLE:
        x = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(F32)
        with np.errstate(all="ignore"):
            arg = (SQRT_2_OVER_PI * x) * fma(GELU_COEF_A * x, x, F32(1.0))
            y = (F32(0.5) * x) * (F32(1.0) + libm_tanhf(arg))
            _GELU_TABLE.append(y.astype(np.float16).astype(F32))
    return _GELU_TABLE[0]


def geglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """vec.h ggml_vec_geglu_f32 (GGML_GELU_FP16): 0 below -10, x*g above 10, else table[f16(x)]*g."""
    gate = gate.astype(F32)
    looked_up = gelu_table()[gate.astype(np.float16).view(np.uint16)]
    act = np.where(gate <= -GELU_TABLE_LIMIT, F32(0.0), np.where(gate >= GELU_TABLE_LIMIT, gate, looked_up))
    return (act * up).astype(F32)


# ---------------------------------------------------------------- norms, rope

def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """ops.cpp rms_norm_f32 then the weight's mul: a sequential double sum of float squares,
    mean rounded to float, scale = 1.0f/sqrtf(mean + eps), y = x*scale*w in float."""
    x = x.astype(F32)
    sq = (x * x).astype(F64)
    mean = (np.cumsum(sq, axis=-1)[..., -1:] / x.shape[-1]).astype(F32)
    scale = F32(1.0) / np.sqrt(mean + F32(eps))
    return (x * scale * w.astype(F32)).astype(F32)


def rope_cos_sin(positions: np.ndarray, dims: int, base: float, freq_scale: float = 1.0,
                 freq_factors: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """ops.cpp ggml_rope_cache_init + rope_yarn without YaRN: theta starts at the position and is
    multiplied by theta_scale = powf(base, -2/dims) once per pair, in float; then cosf/sinf of the
    float angle. -> two [n, dims/2] f32."""
    theta_scale = F32(np.power(F64(base), F64(F32(-2.0) / F32(dims))))
    theta = np.empty((len(positions), dims // 2), F32)
    t = np.asarray(positions, F32)
    for i in range(dims // 2):
        theta[:, i] = t
        t = t * theta_scale
    if freq_factors is not None:
        theta = theta / freq_factors.astype(F32)
    return cos_sin_f32((theta * F32(freq_scale)).astype(F32))


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, neox: bool) -> np.ndarray:
    """ops.cpp rotate_pairs: x0*cos - x1*sin and x0*sin + x1*cos, as GCC contracts them (ggml builds
    in GNU mode, where -ffp-contract=fast is the default): fma(x0, cos, -(x1*sin)) and
    fma(x0, sin, x1*cos). Of the three possible roundings only this one matches llama.cpp's logits.
    x [n, heads, hd]; cos/sin [n, dims/2]."""
    d = cos.shape[1] * 2
    c, s = cos[:, None, :], sin[:, None, :]
    out = x.astype(F32).copy()
    first, second = (np.s_[..., : d // 2], np.s_[..., d // 2: d]) if neox else (np.s_[..., 0:d:2], np.s_[..., 1:d:2])
    x0, x1 = x[first], x[second]
    out[first] = fma(x0, c, -(x1 * s))
    out[second] = fma(x0, s, x1 * c)
    return out


# ---------------------------------------------------------------- f32 matmuls of attention

def dot_f32(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """vec.cpp ggml_vec_dot_f32 on AVX512 over the last axis (a multiple of 64), broadcasting:
    4 accumulators of 16 lanes fed by FMA, combined (0+2, 1+3, then 0+1) and _mm512_reduce_add_ps."""
    k = x.shape[-1]
    if k % F32_STEP:
        raise ValueError("dot_f32 emulation needs a multiple of 64 values")
    prod = np.asarray(x, F64) * np.asarray(y, F64)
    prod = prod.reshape(*prod.shape[:-1], k // F32_STEP, 4, LANES_512)
    acc = prod[..., 0, :, :].astype(F32)
    for step in range(1, k // F32_STEP):
        acc = (prod[..., step, :, :] + acc).astype(F32)
    s = (acc[..., 0, :] + acc[..., 2, :]) + (acc[..., 1, :] + acc[..., 3, :])
    return reduce16(s)


def tinyblas_f32(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """llamafile sgemm.cpp tinyBLAS<16, __m512> (a batch's f32 matmul, e.g. probabilities x values):
    C[j, i] = _mm512_reduce_add_ps of 16 lanes, lane l accumulating by FMA the products at k = l + 16t
    in order. a [..., m, k], b [..., n, k] -> [..., n, m]; k is zero-padded to whole 16-lane steps."""
    k = a.shape[-1]
    pad = -k % LANES_512
    if pad:
        a = np.concatenate([a, np.zeros((*a.shape[:-1], pad), a.dtype)], axis=-1)
        b = np.concatenate([b, np.zeros((*b.shape[:-1], pad), b.dtype)], axis=-1)
    a64 = np.asarray(a, F64)[..., None, :, :]          # [..., 1, m, k]
    b64 = np.asarray(b, F64)[..., :, None, :]          # [..., n, 1, k]
    acc = np.zeros(np.broadcast_shapes(a64.shape[:-1], b64.shape[:-1]) + (LANES_512,), F32)
    for start in range(0, a.shape[-1], LANES_512):
        piece = slice(start, start + LANES_512)
        acc = (a64[..., piece] * b64[..., piece] + acc).astype(F32)
    return reduce16(acc)


# ---------------------------------------------------------------- quantized matmuls (legacy blocks)

def quantize_q8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x86 quants.c quantize_row_q8_0 / q8_1: per 32 values d = amax/127, q = round-half-even(x * 127/amax).
    -> (q int8 [n, blocks, 32], d rounded to f16 as f32 [n, blocks], d as f32 [n, blocks])."""
    blocks = x.astype(F32).reshape(x.shape[0], -1, Q8_BLOCK)
    amax = np.abs(blocks).max(axis=2)
    d = (amax / F32(127.0)).astype(F32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax == 0, F32(0.0), F32(127.0) / amax).astype(F32)
    q = np.rint(blocks * inv[..., None]).astype(np.int8)
    return q, d.astype(np.float16).astype(F32), d


def legacy_blocks(raw: np.ndarray, qtype: QT, n_in: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Weight rows of Q4_0 / Q4_1 / Q5_0 / Q8_0 as the integer values the int8 dot products multiply:
    (q int8 [m, blocks, 32], d f32 [m, blocks], min f32 [m, blocks] for Q4_1 else None)."""
    m = raw.shape[0]
    nb = n_in // Q8_BLOCK
    head = {QT.Q4_0: 2, QT.Q4_1: 4, QT.Q5_0: 6, QT.Q8_0: 2}[qtype]
    blocks = raw.reshape(m, nb, -1)
    d = blocks[:, :, 0:2].copy().view(np.float16)[..., 0].astype(F32)
    mins = blocks[:, :, 2:4].copy().view(np.float16)[..., 0].astype(F32) if qtype == QT.Q4_1 else None
    if qtype == QT.Q8_0:
        return blocks[:, :, 2:].copy().view(np.int8), d, None
    qs = blocks[:, :, head:head + 16]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=2).astype(np.int16)      # element j low, j+16 high
    if qtype == QT.Q5_0:
        qh = blocks[:, :, 2:6].copy().view(np.uint32)[..., 0]
        q |= (((qh[..., None] >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.int16)
        q -= 16
    elif qtype == QT.Q4_0:
        q -= 8
    return q.astype(np.int8), d, mins


def lane_dot(xq: np.ndarray, dx: np.ndarray, wq: np.ndarray, dw: np.ndarray) -> np.ndarray:
    """The block loop shared by ggml_vec_dot_{q4_0,q4_1,q5_0,q8_0}_q8_{0,1} (AVX2, VNNI) and llamafile's
    tinyBLAS_Q0_AVX: per 32-value block, 8 int32 lanes each summing 4 adjacent products, converted to
    float and accumulated as acc = fma(dw*dx, lanes, acc); then hsum_float_8.
    xq [n, nb, 32], dx [n, nb], wq [m, nb, 32], dw [m, nb] -> [n, m] f32.
    Output columns go LANE_CHUNK_VALUES // n at a time so the float64 work stays in cache (~30x faster)."""
    n, nb, _ = xq.shape
    m = wq.shape[0]
    xg = xq.astype(F32).reshape(n, nb, LANES_256, 4).transpose(1, 2, 0, 3)   # [nb, 8, n, 4]
    wg = wq.astype(F32).reshape(m, nb, LANES_256, 4).transpose(1, 2, 3, 0)   # [nb, 8, 4, m]
    out = np.empty((n, m), F32)
    chunk = max(16, LANE_CHUNK_VALUES // n)
    for m0 in range(0, m, chunk):
        cols = slice(m0, min(m, m0 + chunk))
        lanes = np.matmul(xg, np.ascontiguousarray(wg[..., cols]))    # [nb, 8, n, mc]; exact: |sum| < 2^24
        scale = (dx.T[:, :, None] * dw[cols].T[:, None, :]).astype(F64)  # [nb, n, mc]; exact (f16 x f16)
        acc = np.zeros(lanes.shape[1:], F32)
        fused = np.empty(lanes.shape[1:], F64)
        for b in range(nb):
            np.multiply(lanes[b], scale[b], out=fused)
            np.add(fused, acc, out=fused)
            acc[...] = fused                                        # one rounding: the FMA's
        out[:, cols] = hsum8(np.moveaxis(acc, 0, -1))
    return out


def matmul_legacy(x: np.ndarray, raw: np.ndarray, qtype: QT) -> np.ndarray:
    """x [n, k] @ W.T for a Q4_0 / Q4_1 / Q5_0 / Q8_0 weight, as ggml computes it on the CPU.
    Q4_1 (activations Q8_1) adds sum over blocks of min * f16(d * sum(q)), summed in float."""
    k = x.shape[1]
    xq, dx, dx32 = quantize_q8(x)
    wq, dw, mins = legacy_blocks(raw, qtype, k)
    out = lane_dot(xq, dx, wq, dw)
    if mins is not None:
        s = (dx32 * xq.astype(np.int32).sum(axis=2).astype(F32)).astype(np.float16).astype(F32)
        summs = np.zeros_like(out)
        for b in range(k // Q8_BLOCK):
            summs = (summs + s[:, b, None] * mins[None, :, b]).astype(F32)   # products exact
        out = (out + summs).astype(F32)
    return out


# ---------------------------------------------------------------- k-quant matmuls (256-value super-blocks)

QK_K = 256
SUB_K = 32          # a Q4_K sub-block (one 6-bit scale and min)
REPACK_ROWS = 4     # repack.cpp runs its gemm on activation rows in groups of 4, the rest through gemv
TILED_MIN_ROWS = 8  # from this many activation rows ggml's mul_mat takes its tiled k-quant kernel (measured)


def quantize_q8_k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """quants.c quantize_row_q8_K (and repack's 4-row ggml_quantize_mat_q8_K_4x8, which rounds the same):
    per 256 values the one of largest magnitude maps to -127, iscale = -127/max, q = round-half-even
    (iscale*x) capped at 127, d = 1/iscale. -> (q int8 [n, sb, 256], d f32 [n, sb])."""
    blocks = x.astype(F32).reshape(x.shape[0], -1, QK_K)
    at = np.argmax(np.abs(blocks), axis=2)
    biggest = np.take_along_axis(blocks, at[..., None], axis=2)[..., 0]
    with np.errstate(divide="ignore"):
        iscale = np.where(biggest == 0, F32(0.0), F32(-127.0) / biggest).astype(F32)
        d = np.where(iscale == 0, F32(0.0), F32(1.0) / iscale).astype(F32)
    q = np.minimum(127, np.rint(blocks * iscale[..., None])).astype(np.int8)
    return q, d


def q4_k_blocks(raw: np.ndarray, n_in: int):
    """Q4_K rows -> (q uint8 0..15 [m, sb, 256], scale and min int [m, sb, 8], d and dmin f32 [m, sb])."""
    from gguf.quants import Q4_K

    m, nsb = raw.shape[0], n_in // QK_K
    blocks = raw.reshape(m * nsb, -1)
    d = blocks[:, 0:2].copy().view(np.float16)[:, 0].astype(F32).reshape(m, nsb)
    dmin = blocks[:, 2:4].copy().view(np.float16)[:, 0].astype(F32).reshape(m, nsb)
    sc, mn = Q4_K.get_scale_min(blocks[:, 4:16])
    qs = blocks[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    q = (qs & 0x0F).reshape(m, nsb, QK_K)
    return q, sc.reshape(m, nsb, 8).astype(np.int32), mn.reshape(m, nsb, 8).astype(np.int32), d, dmin


def matmul_q4_k_repacked(x: np.ndarray, raw: np.ndarray) -> np.ndarray:
    """x [n, k] @ W.T for a Q4_K weight that llama.cpp repacked as q4_K_8x8 (x86 repack.cpp).
    Rows in groups of 4 go through ggml_gemm_q4_K_8x8_q8_K, which per pair of sub-blocks converts
    I = sc0*dot0 + sc1*dot1 and M = min0*bsum0 + min1*bsum1 to float and accumulates
    acc = fma(I, f32(d_w*d_x), acc), accm = fma(M, f32(dmin_w*d_x), accm); the last n % 4 rows go
    through ggml_gemv_q4_K_8x8_q8_K, which sums I and M over the whole super-block first. Result acc - accm."""
    n, k = x.shape
    xq, dx = quantize_q8_k(x)                                   # [n, sb, 256], [n, sb]
    wq, sc, mn, dw, dmin = q4_k_blocks(raw, k)
    m, nsb = wq.shape[0], k // QK_K
    xs = xq.reshape(n, nsb, 8, SUB_K).astype(F32)
    ws = wq.reshape(m, nsb, 8, SUB_K).astype(F32)
    bsum = xq.reshape(n, nsb, 8, SUB_K).astype(np.int32).sum(axis=3)          # [n, sb, 8]
    gemm_rows = n - n % REPACK_ROWS
    acc = np.zeros((n, m), F32)
    accm = np.zeros((n, m), F32)
    for b in range(nsb):
        scale = (dw[None, :, b] * dx[:, b, None]).astype(F32)                  # [n, m], rounded like C
        scale_min = (dmin[None, :, b] * dx[:, b, None]).astype(F32)
        dots = np.einsum("nsk,msk->snm", xs[:, b], ws[:, b]).astype(np.int64)  # [8, n, m], exact
        pair = (dots * sc[:, b].T[:, None, :]).reshape(4, 2, n, m).sum(axis=1)          # I per pair
        mins = (bsum[:, b, :].T[:, :, None] * mn[:, b, :].T[:, None, :]).reshape(4, 2, n, m).sum(axis=1)
        for sb in range(4):                                     # gemm: one FMA per pair of sub-blocks
            acc[:gemm_rows] = fma(pair[sb, :gemm_rows], scale[:gemm_rows], acc[:gemm_rows])
            accm[:gemm_rows] = fma(mins[sb, :gemm_rows], scale_min[:gemm_rows], accm[:gemm_rows])
        tail = slice(gemm_rows, n)                              # gemv: one FMA per super-block
        acc[tail] = fma(pair[:, tail].sum(axis=0).astype(F32), scale[tail], acc[tail])
        accm[tail] = fma(mins[:, tail].sum(axis=0).astype(F32), scale_min[tail], accm[tail])
    return (acc - accm).astype(F32)


def q6_k_blocks(raw: np.ndarray, n_in: int):
    """Q6_K rows -> (q int8 -32..31 [m, sb, 256], scales int8 per 16 values [m, sb, 16], d f32 [m, sb])."""
    m, nsb = raw.shape[0], n_in // QK_K
    blocks = raw.reshape(m * nsb, -1)
    ql = blocks[:, :128].reshape(-1, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    ql = (ql & 0x0F).reshape(-1, 2, 4, 32)
    qh = blocks[:, 128:192].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    qh = (qh & 0x03).reshape(-1, 2, 4, 32)
    q = ((ql | (qh << 4)).astype(np.int16) - 32).reshape(m, nsb, QK_K)
    scales = blocks[:, 192:208].copy().view(np.int8).reshape(m, nsb, 16)
    d = blocks[:, 208:210].copy().view(np.float16)[:, 0].astype(F32).reshape(m, nsb)
    return q, scales, d


def matmul_q6_k(x: np.ndarray, raw: np.ndarray) -> np.ndarray:
    """x [n, k] @ W.T for a Q6_K weight as ggml's CPU mul_mat computes it: from TILED_MIN_ROWS rows of x
    on, its tiled kernel (ggml_compute_forward_mul_mat_tiled); below, ggml_vec_dot_q6_K_q8_K."""
    if x.shape[0] >= TILED_MIN_ROWS:
        return matmul_q6_k_tiled(x, raw)
    return matmul_q6_k_vec_dot(x, raw)


def matmul_q6_k_tiled(x: np.ndarray, raw: np.ndarray) -> np.ndarray:
    """Q6_K through ggml's tiled x86 kernel (arch/x86/tiled-kernel.cpp, VNNI microtile): per 256-value
    super-block the whole integer dot S = sum scale * (q - 32) * y, then in float
    acc = fma(f32(S) * d_w, d_x, acc) (GCC contracts the kernel's mul + add into one FMA)."""
    n, k = x.shape
    xq, dx = quantize_q8_k(x)
    wq, scales, dw = q6_k_blocks(raw, k)
    m, nsb = wq.shape[0], k // QK_K
    weff = (wq.astype(np.int32) * np.repeat(scales.astype(np.int32), 16, axis=2)).astype(F64)
    acc = np.zeros((n, m), F32)
    for b in range(nsb):
        dot = xq[:, b].astype(F64) @ weff[:, b].T                 # exact: |S| < 2^53
        per_row = (dot.astype(F32) * dw[None, :, b]).astype(F32)   # _mm512_cvtepi32_ps, then * d_w
        acc = fma(per_row, dx[:, b, None], acc)
    return acc


def matmul_q6_k_vec_dot(x: np.ndarray, raw: np.ndarray) -> np.ndarray:
    """x [n, k] @ W.T for a Q6_K weight: x86 quants.c ggml_vec_dot_q6_K_q8_K (AVX2), as built here.
    Per super-block, 8 int32 lanes: lane l sums scale * q * y (q unsigned 0..63) over the bytes
    4l..4l+3 of each of the 8 32-value vectors (values 32v + 4l + t), minus 32 * scale * y over the
    values 32l..32l+31 (the -32 offset taken from the Q8_K block sums, which group values differently);
    then acc = fma(f32(d_x * d_w), lanes, acc) and hsum_float_8. Checked against the compiled kernel."""
    n, k = x.shape
    xq, dx = quantize_q8_k(x)
    wq, scales, dw = q6_k_blocks(raw, k)
    m, nsb = wq.shape[0], k // QK_K
    sc = scales.astype(np.int32)
    weff = (wq.astype(np.int32) + 32) * np.repeat(sc, 16, axis=2)                 # [m, sb, 256]
    # value e = 32v + 4l + t  ->  lane l, reduction index (v, t)
    xg = xq.reshape(n, nsb, 8, LANES_256, 4).transpose(1, 3, 0, 2, 4).reshape(nsb, LANES_256, n, 32).astype(F64)
    wg = weff.reshape(m, nsb, 8, LANES_256, 4).transpose(1, 3, 2, 4, 0).reshape(nsb, LANES_256, 32, m).astype(F64)
    bsum16 = xq.reshape(n, nsb, 16, 16).astype(F64).sum(axis=3)                    # Q8_K's bsums
    acc = np.zeros((LANES_256, n, m), F32)
    for b in range(nsb):
        offset = np.einsum("nlt,mlt->lnm", bsum16[:, b].reshape(n, 8, 2), sc[:, b].reshape(m, 8, 2).astype(F64))
        lanes = np.matmul(xg[b], wg[b]) - 32.0 * offset                          # [8, n, m], exact
        d = (dx[:, b, None] * dw[None, :, b]).astype(F32)                        # y.d * x.d, rounded
        acc = fma(d[None], lanes.astype(F32), acc)           # _mm256_cvtepi32_ps rounds past 2^24
    return hsum8(np.moveaxis(acc, 0, -1))
