"""The CPU engine's kernels (shaders/wasm/engine.c) under wasmtime, each against the NumPy reference's
arithmetic: the int8 route's matmuls against pyshim.exec.llama_cpp's activation rounding (summed in f64,
so only the engine's f32 summation order differs), the f32 route and every other op against
pyshim.exec.reference. Odd sizes, outliers, zero blocks; one module for the file."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from gpu_helpers import random_weight
from pyshim.exec import wasm_module
from pyshim.exec.llama_cpp import _q8_0_roundtrip, gelu_llama_cpp, llama_cpp_activations, q8_1_sum_correction
from pyshim.exec.reference import gelu_tanh, rotate
from pyshim.exec.kvcache import ROUNDING, q4_round, q8_round
from pyshim.exec.wasm_ops import F32_ROUTE, GELU_LLAMA_CPP, KV_CODE
from pyshim.gguf.tensors import dequantize_rows
from pyshim.models.key_scales import hadamard, hadamard_norm
from pyshim.models.rope import RopeSpec, cos_sin, pair_tables

TYPES = [QT.F32, QT.F16, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q8_0, QT.Q4_K, QT.Q5_K, QT.Q6_K]


class Engine:
    """The built module with NumPy arrays in and out."""

    def __init__(self, relaxed: bool, wide: bool):
        self.m = wasm_module.NativeModule(wasm_module.build(relaxed=relaxed, wide=wide))
        assert self.m.relaxed == relaxed and self.m.wide == wide
        if wide:        # everything after this lies past 4 GiB: every pointer needs its 64 bits
            self.m.alloc(4 << 30)

    def put(self, a) -> int:
        a = np.ascontiguousarray(a)
        ptr = self.m.alloc(max(a.nbytes, 4))
        self.m.write(ptr, a)
        return ptr

    def empty(self, nbytes: int) -> int:
        return self.m.alloc(max(nbytes, 4))

    def get(self, ptr: int, shape, dtype=np.float32) -> np.ndarray:
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        return np.frombuffer(self.m.read(ptr, n), dtype=dtype).reshape(shape)

    def matmul(self, x, raw, qtype: int, m: int, bias=None, residual=None) -> np.ndarray:
        n, k = x.shape
        y = self.empty(4 * n * m)
        scratch = self.empty(self.m.call("matmul_scratch", qtype, n, k))
        self.m.call("matmul", self.put(x), n, k, self.put(raw), qtype, m, y,
                    0 if bias is None else self.put(bias), 0 if residual is None else self.put(residual), scratch)
        return self.get(y, (n, m))


@pytest.fixture(scope="module", params=[(False, False), (True, False), (False, True), (True, True)],
                ids=["simd128", "relaxed", "simd128-64", "relaxed-64"])
def eng(request):
    """The plain SIMD128 build and its relaxed-SIMD twin (their integer dot products are the same sums), and
    the 64-bit twins of both (memory64) with their data past 4 GiB."""
    return Engine(*request.param)


def activations(rng, n: int, k: int) -> np.ndarray:
    """Rows with the shapes real activations have: a large outlier, an all-zero block, exact ties."""
    x = rng.standard_normal((n, k), dtype=np.float32)
    x[:, 5] *= 40.0
    x[0, :256] = 0.0                          # a zero block of every block size
    x[-1, 40:44] = [1.0, -0.5, 0.25, 127.0]
    return x


def check(got, want, rel=2e-6):
    """f32 summation-order tolerance, relative to the largest output."""
    scale = float(np.max(np.abs(want))) or 1.0
    np.testing.assert_allclose(got, want, rtol=0, atol=rel * scale)


def int8_reference(x: np.ndarray, raw: np.ndarray, qtype: QT) -> np.ndarray:
    """pyshim.exec.llama_cpp.Int8Ops's matmul, summed in f64."""
    m = raw.shape[0]
    w = dequantize_rows(raw, qtype).reshape(m, -1).astype(np.float64)
    out = llama_cpp_activations(x, qtype).astype(np.float64) @ w.T
    if qtype == QT.Q4_1:
        mins = raw.reshape(m, -1, 20)[:, :, 2:4].copy().view(np.float16)[:, :, 0].astype(np.float32)
        out += q8_1_sum_correction(x, mins)
    return out


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_matmul_int8_route(eng, qtype):
    rng = np.random.default_rng(int(qtype))
    n, k, m = 6, 768, 37          # a group of 4 tokens and a remainder of 2 (engine.c TOKENS)
    raw = random_weight(qtype, m, k, rng)
    x = activations(rng, n, k)
    check(eng.matmul(x, raw, int(qtype), m), int8_reference(x, raw, qtype))


@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q4_K], ids=lambda t: t.name)
def test_matmul_bias_and_residual(eng, qtype):
    rng = np.random.default_rng(7)
    n, k, m = 2, 512, 24
    raw, x = random_weight(qtype, m, k, rng), activations(rng, n, k)
    bias, residual = rng.standard_normal(m, dtype=np.float32), rng.standard_normal((n, m), dtype=np.float32)
    check(eng.matmul(x, raw, int(qtype), m, bias=bias, residual=residual), int8_reference(x, raw, qtype) + bias + residual)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_matmul_f32_route(eng, qtype):
    rng = np.random.default_rng(100 + int(qtype))
    n, k, m = 2, 512, 19
    raw, x = random_weight(qtype, m, k, rng), activations(rng, n, k)
    want = x.astype(np.float64) @ dequantize_rows(raw, qtype).reshape(m, k).T.astype(np.float64)
    check(eng.matmul(x, raw, int(qtype) | F32_ROUTE, m), want)


def test_activation_rounding_matches(eng):
    """The Q8_0 rounding itself, through a Q8_0 identity: each output is one activation block's dot with a
    one-hot weight row, so any rounding difference shows whole."""
    rng = np.random.default_rng(3)
    k = 64
    x = activations(rng, 1, k) * 3.7
    eye = np.zeros((k, 34 * (k // 32)), np.uint8)
    for i in range(k):
        block = np.zeros(34, np.uint8)
        block[0:2] = np.array([1.0], np.float16).view(np.uint8)
        block[2 + i % 32] = 1
        eye[i, 34 * (i // 32):34 * (i // 32 + 1)] = block
    got = eng.matmul(x, eye, int(QT.Q8_0), k)
    np.testing.assert_array_equal(got[0], _q8_0_roundtrip(x)[0][0])


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_embed(eng, qtype):
    rng = np.random.default_rng(200 + int(qtype))
    vocab, d = 11, 512
    raw = random_weight(qtype, vocab, d, rng)
    tokens = np.array([3, 0, 10, 3], np.int32)
    y = eng.empty(4 * len(tokens) * d)
    eng.m.call("embed", eng.put(raw), int(qtype), d, eng.put(tokens), len(tokens), y)
    np.testing.assert_array_equal(eng.get(y, (len(tokens), d)), dequantize_rows(raw[tokens], qtype).reshape(len(tokens), d))


def test_rmsnorm_with_residual(eng):
    rng = np.random.default_rng(4)
    rows, d = 5, 96
    x, w, res = (rng.standard_normal((rows, d), dtype=np.float32) * 3, rng.standard_normal(d, dtype=np.float32),
                 rng.standard_normal((rows, d), dtype=np.float32))
    y = eng.empty(4 * rows * d)
    eng.m.call("rmsnorm", eng.put(x), rows, d, eng.put(w), 1e-6, y, eng.put(res))
    ms = np.mean(np.square(x, dtype=np.float64), axis=-1, keepdims=True)
    check(eng.get(y, (rows, d)), res + (x / np.sqrt(ms + 1e-6)).astype(np.float32) * w)


@pytest.mark.parametrize("spec", [
    RopeSpec(dims=64, base=10000.0, neox=True),
    RopeSpec(dims=64, base=500000.0, neox=False),
    RopeSpec(dims=32, base=10000.0, neox=True),                    # partial rotation: the rest passes through
    RopeSpec(dims=64, base=1e6, neox=True, scaling="yarn", factor=4.0, n_ctx_orig=4096),
], ids=["neox", "normal", "partial", "yarn"])
@pytest.mark.parametrize("scaled", [False, True], ids=["plain", "scaled"])
def test_rope(eng, spec, scaled):
    """Rope, and with a table of scales (a q8/q4 cache's key scales) each rotated head times it."""
    rng = np.random.default_rng(5)
    n, heads, hd = 3, 4, 64
    x = rng.standard_normal((n, heads, hd), dtype=np.float32)
    pos = np.array([0, 17, 9000], np.int32)
    inv_freq, mix, mscale = pair_tables(spec)
    per_pair = (inv_freq * (spec.freq_scale * (1.0 - mix) + mix)).astype(np.float64)
    scale = rng.uniform(0.25, 4.0, (heads, hd)).astype(np.float32)
    y = eng.empty(x.nbytes)
    eng.m.call("rope", eng.put(x), y, n, heads, hd, eng.put(pos), eng.put(per_pair), spec.dims, int(spec.neox), float(mscale),
               eng.put(scale) if scaled else 0)
    cos, sin = cos_sin(spec, pos.astype(np.int64))
    want = rotate(x, cos, sin, spec)
    check(eng.get(y, x.shape), want * scale if scaled else want, rel=1e-6)


@pytest.mark.parametrize("width", [32, 64, 256])
def test_hadamard(eng, width):
    """A q4 cache's Hadamard rotation: the reference's bits, into a buffer of its own and in place."""
    rng = np.random.default_rng(width)
    x = rng.standard_normal((3, 2, 256), dtype=np.float32) * 3
    want = hadamard(x, width)
    y = eng.empty(x.nbytes)
    eng.m.call("hadamard", eng.put(x), y, x.size, width, float(hadamard_norm(width)))
    assert np.array_equal(eng.get(y, x.shape), want)
    eng.m.call("hadamard", y, y, x.size, width, float(hadamard_norm(width)))      # its own inverse, to rounding
    check(eng.get(y, x.shape), x, rel=1e-6)


def kv_rows(kv_type: str, x: np.ndarray) -> np.ndarray:
    """x [..., hd] as engine.c's kv_store_row lays a row out (q8/q4: an f32 scale, then the levels), from
    the reference's rounding: what the cache must hold, byte for byte."""
    if kv_type == "f32":
        return x.view(np.uint8)
    if kv_type == "f16":
        return x.astype(np.float16).view(np.uint8)
    blocks = x.reshape(-1, 32)
    if kv_type == "q8":
        d = np.abs(blocks).max(-1, keepdims=True) / np.float32(127)
        q = np.rint(q8_round(blocks) / np.where(d > 0, d, 1)).astype(np.int8)
        packed = q.view(np.uint8)
    else:
        first = np.abs(blocks).argmax(-1)[:, None]
        d = np.take_along_axis(blocks, first, -1) / np.float32(-8)
        q = (np.rint(q4_round(blocks) / np.where(d != 0, d, 1)) + 8).astype(np.uint8)
        packed = q[:, :16] | q[:, 16:] << 4
    return np.concatenate([d.astype(np.float32).view(np.uint8), packed], axis=1).reshape(*x.shape[:-1], -1)


@pytest.mark.parametrize("kv_type", ["f32", "f16", "q8", "q4"])
@pytest.mark.parametrize("hq, hkv, window, softcap", [(4, 2, 0, 0.0), (3, 1, 5, 0.0), (2, 2, 0, 30.0)])
def test_attention(eng, hq, hkv, window, softcap, kv_type):
    """A 3-token step after 9 cached positions: keys stored at their positions as the cache type holds
    them (the reference's rounding, byte for byte), then causal (windowed, soft-capped) softmax attention
    with GQA over the stored values."""
    rng = np.random.default_rng(hq + 10 * window)
    n_ctx, hd, hdv, past, n = 16, 64, 32, 9, 3
    keys = rng.standard_normal((past + n, hkv, hd), dtype=np.float32)
    vals = rng.standard_normal((past + n, hkv, hdv), dtype=np.float32)
    keys[2, 0, :32] = 0.0                     # an all-zero block
    q = rng.standard_normal((n, hq, hd), dtype=np.float32)
    kc = np.zeros((n_ctx, *kv_rows(kv_type, keys[0]).shape), np.uint8)
    vc = np.zeros((n_ctx, *kv_rows(kv_type, vals[0]).shape), np.uint8)
    kc[:past], vc[:past] = kv_rows(kv_type, keys[:past]), kv_rows(kv_type, vals[:past])
    kc_ptr, vc_ptr = eng.put(kc), eng.put(vc)
    pos = np.arange(past, past + n, dtype=np.int32)
    y = eng.empty(4 * n * hq * hdv)
    scale = 1 / np.sqrt(hd)
    eng.m.call("attention", eng.put(q), eng.put(keys[past:]), eng.put(vals[past:]), eng.put(pos), n, hq, hkv, hd, hdv,
               kc_ptr, vc_ptr, float(scale), window, float(softcap), y, eng.empty(4 * n_ctx), n_ctx, KV_CODE[kv_type])
    np.testing.assert_array_equal(eng.get(kc_ptr, kc.shape, np.uint8)[:past + n], kv_rows(kv_type, keys))
    np.testing.assert_array_equal(eng.get(vc_ptr, vc.shape, np.uint8)[:past + n], kv_rows(kv_type, vals))
    keys, vals = ROUNDING[kv_type](keys), ROUNDING[kv_type](vals)
    want = np.zeros((n, hq, hdv))
    for t in range(n):
        for h in range(hq):
            g = h // (hq // hkv)
            s = keys[:pos[t] + 1, g].astype(np.float64) @ q[t, h] * scale
            if softcap:
                s = softcap * np.tanh(s / softcap)
            if window:
                s[:max(0, pos[t] - window + 1)] = -np.inf
            p = np.exp(s - s.max())
            want[t, h] = (p / p.sum()) @ vals[:pos[t] + 1, g]
    check(eng.get(y, (n, hq * hdv)), want.reshape(n, -1), rel=1e-5)


@pytest.mark.parametrize("act", [0, 1, GELU_LLAMA_CPP], ids=["silu", "gelu", "gelu_llama_cpp"])
def test_glu(eng, act):
    rng = np.random.default_rng(6)
    g = rng.standard_normal(300).astype(np.float32) * 4
    g[:4] = [-12.0, 12.0, 0.0, -0.0]
    u = rng.standard_normal(300).astype(np.float32)
    y = eng.empty(4 * g.size)
    eng.m.call("glu", eng.put(g), eng.put(u), g.size, act, y)
    want = {0: g / (1 + np.exp(-g.astype(np.float64))), 1: gelu_tanh(g.astype(np.float64)), GELU_LLAMA_CPP: gelu_llama_cpp(g)}[act] * u
    check(eng.get(y, g.shape), want, rel=1e-6)


def test_topk(eng):
    """The k largest of each row, largest first; equal values in index order (a stable sort's), as the
    runners' top_k_rows picks them."""
    from pyshim.exec.runner import top_k_rows

    rng = np.random.default_rng(9)
    x = rng.standard_normal((3, 1000)).astype(np.float32)
    x[1, 100:120] = 5.0                      # ties across the cut
    x[2, :] = 1.0                            # all equal
    k = 16
    ids, vals = eng.empty(4 * 3 * k), eng.empty(4 * 3 * k)
    eng.m.call("topk", eng.put(x), 3, 1000, k, ids, vals)
    want_ids, want_vals = top_k_rows(x, k)
    np.testing.assert_array_equal(eng.get(ids, (3, k), np.int32), want_ids)
    np.testing.assert_array_equal(eng.get(vals, (3, k)), want_vals)


def test_eltwise_and_argmax(eng):
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal((3, 10), dtype=np.float32), rng.standard_normal((3, 10), dtype=np.float32)
    y = eng.empty(4 * a.size)
    eng.m.call("add", eng.put(a), eng.put(b), a.size, y)
    np.testing.assert_array_equal(eng.get(y, a.shape), a + b)
    eng.m.call("scale", eng.put(a), a.size, 0.5, y)
    np.testing.assert_array_equal(eng.get(y, a.shape), a * np.float32(0.5))
    eng.m.call("softcap", eng.put(a * 40), a.size, 30.0, y)
    check(eng.get(y, a.shape), np.tanh(a * 40 / 30.0) * 30.0, rel=1e-6)
    eng.m.call("copy_cols", eng.put(a), 3, 10, 4, y)
    np.testing.assert_array_equal(eng.get(y, (3, 4)), a[:, :4])
    a[1, 7] = a[1, 2] = a[1].max() + 1           # ties: the first
    out = eng.empty(12)
    eng.m.call("argmax", eng.put(a), 3, 10, out)
    np.testing.assert_array_equal(eng.get(out, (3,), np.int32), [a[0].argmax(), 2, a[2].argmax()])
