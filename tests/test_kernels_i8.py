"""The int8 route on the native device (wgpu: naga + lavapipe here): quantize.wgsl against a NumPy emulation
of llama.cpp's activation rounding, matvec_i8.wgsl against the same arithmetic in f64, and the two chained
against the reference executor's llama.cpp emulation. Odd sizes; one device for the module."""

from __future__ import annotations


import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import quants

import i8_emulation as emu
from gpu_helpers import GPU, random_weight
from pyshim.gpu.kernels import (GROUPED_TYPES, I8_ACTIVATIONS, I8_BLOCKS, I8_LANE_TYPES, I8_PAIR_TYPES, I8_TOKEN_TYPES, I8_VEC4_TYPES,
                                UNIFORM_X_BYTES, groups, i8_pairs, lanes_key, lanes_words, matvec_i8_grid, matvec_i8_key,
                                quantize_key, xq_row_words)

I8_TYPES = list(I8_ACTIVATIONS)


@pytest.fixture(scope="module")
def gpu():
    g = GPU()
    yield g
    g.close()


def activations(rng, n: int, k: int) -> np.ndarray:
    """Rows with the shapes real activations have: a few large outliers, an all-zero block, exact ties."""
    x = rng.standard_normal((n, k), dtype=np.float32)
    x[:, 5] *= 40.0
    x[0, :32] = 0.0                       # a zero block: scale 0, values 0
    x[-1, 40:44] = [1.0, -0.5, 0.25, 127.0]  # 127/127 * 0.5-steps: round-half-even cases
    return x


def run_quantize(gpu, x: np.ndarray, fmt: str, x_pad: int = 0, q_pad: int = 0) -> np.ndarray:
    """x [n, k] at element offset x_pad -> the u32 words from word q_pad on."""
    n, k = x.shape
    per, _ = I8_BLOCKS[fmt]
    row_words = xq_row_words(k, fmt)
    xs = np.concatenate([np.zeros(x_pad, np.float32), x.reshape(-1)])
    (out,) = gpu.dispatch(quantize_key(fmt), [xs], [(q_pad + n * row_words) * 4],
                          dict(k=k, n=n, x_off=x_pad, x_stride=k, q_off=q_pad, row_words=row_words),
                          (groups(k // per), n, 1))
    return np.frombuffer(out, np.uint32)[q_pad:]


def run_matvec_i8(gpu, qtype, raw, words: np.ndarray, n: int, k: int, *, rows=1, uniform_x=False, bias=None,
                  w_pad=0, x_pad=0, y_pad=0, pairs=False, tokens=None, pair_off=None):
    """raw (m, row_bytes), quantized rows `words` -> y (n, m)."""
    m, row_bytes = raw.shape
    if qtype in GROUPED_TYPES:      # read in repack.wgsl's layout, from the start of its buffer (as the executor binds it)
        w_pad, raw = 0, emu.grouped(raw, qtype)
    if qtype in I8_VEC4_TYPES:      # read 16 bytes a load: its tensors start on 16 bytes (whole blocks of it)
        w_pad = -(-w_pad // 16) * 16
    w = np.concatenate([np.zeros(w_pad, np.uint8), raw.reshape(-1)])
    xs = np.concatenate([np.zeros(x_pad, np.uint32), words.reshape(-1)])
    x_in = xs
    if uniform_x:
        buf = gpu.device.buffer(UNIFORM_X_BYTES, label="xq", also_uniform=True)
        gpu.device.write(buf, xs)
        x_in = (buf, 0, UNIFORM_X_BYTES)
    inputs = [w, x_in] + ([bias] if bias is not None else [])
    key = matvec_i8_key(qtype, bias=bias is not None, uniform_x=uniform_x, rows=rows, pairs=pairs, tokens=tokens,
                        lanes=pair_off is not None)
    (out,) = gpu.dispatch(key, inputs, [(y_pad + n * m) * 4],
                          dict(m=m, k=k, n=n, row_bytes=row_bytes, w_off=w_pad, x_off=x_pad, y_off=y_pad, bias_off=0,
                               y_stride=m, x_row_words=xq_row_words(k, I8_ACTIVATIONS[qtype]), pair_off=pair_off or 0),
                          matvec_i8_grid(m, n, rows=rows, tokens=tokens or 1))
    return np.frombuffer(out, np.float32)[y_pad:].reshape(n, m)


def check(got, want, rel=1e-5):
    """f32 summation-order tolerance, relative to the largest output (the integer sums are exact)."""
    scale = float(np.max(np.abs(want))) or 1.0
    np.testing.assert_allclose(got, want, rtol=0, atol=rel * scale)


@pytest.mark.parametrize("fmt, k", [("q8_0", 224), ("q8_k", 768)])
def test_quantize_matches_emulation(gpu, fmt, k):
    rng = np.random.default_rng(len(fmt) + k)
    n = 3
    x = activations(rng, n, k)
    q, info = emu.unpack(run_quantize(gpu, x, fmt, x_pad=8, q_pad=4), n, k, fmt)
    want_q, want_info = emu.quantize(x, fmt)
    np.testing.assert_array_equal(q, want_q)
    if gpu.device.caps.is_fallback:
        np.testing.assert_array_equal(info, want_info)
    else:       # a real GPU's division may be 2.5 ulp off (WGSL allows it; NVIDIA's is): Q8_K's scale 1/iscale
        np.testing.assert_array_max_ulp(info, want_info, maxulp=3)


@pytest.mark.parametrize("variant", ["rows1", "rows3", "uniform_rows4", "uniform_rows8", "bias_offsets"])
@pytest.mark.parametrize("qtype", I8_TYPES, ids=lambda t: t.name)
def test_matvec_i8_random_blocks(gpu, qtype, variant):
    rng = np.random.default_rng(int(qtype) * 7 + len(variant))
    fmt = I8_ACTIVATIONS[qtype]
    k = 96 * 3 if fmt == "q8_0" else 768      # odd block counts put rows at 2-aligned byte offsets
    m, n = 67, 1 if variant.startswith("uniform") else 3
    raw = random_weight(qtype, m, k, rng)
    q, info = emu.quantize(activations(rng, n, k), fmt)
    want = emu.matvec(raw, qtype, q, info)
    words = emu.pack(q, info)
    if variant == "bias_offsets":
        bias = rng.standard_normal(m, dtype=np.float32)
        got = run_matvec_i8(gpu, qtype, raw, words, n, k, rows=2, bias=bias, w_pad=36, x_pad=8, y_pad=12)
        want = want + bias
    else:
        rows = int(variant[-1])
        got = run_matvec_i8(gpu, qtype, raw, words, n, k, rows=rows, uniform_x=variant.startswith("uniform"))
    check(got, want)


@pytest.mark.parametrize("uniform_x", [False, True])
@pytest.mark.parametrize("qtype", sorted(I8_PAIR_TYPES), ids=lambda t: t.name)
def test_matvec_i8_pairs(gpu, qtype, uniform_x):
    """Two blocks per call on rows of an even block count (word-aligned rows), with offsets."""
    rng = np.random.default_rng(int(qtype) + 100)
    m, k, n = 67, 320, 1
    assert i8_pairs(qtype, k)
    raw = random_weight(qtype, m, k, rng)
    q, info = emu.quantize(activations(rng, n, k), "q8_0")
    got = run_matvec_i8(gpu, qtype, raw, emu.pack(q, info), n, k, rows=4, uniform_x=uniform_x, pairs=True,
                        w_pad=8 if not uniform_x else 0, y_pad=4)
    check(got, emu.matvec(raw, qtype, q, info))


@pytest.mark.parametrize("uniform_x", [False, True], ids=["storage", "uniform"])
@pytest.mark.parametrize("tokens, n", [(4, 7), (8, 3)])
@pytest.mark.parametrize("qtype", sorted(I8_TOKEN_TYPES), ids=lambda t: t.name)
def test_matvec_i8_tokens(gpu, qtype, tokens, n, uniform_x):
    """Several tokens per invocation, each block (K-quants: each piece of 32) unpacked once for all: token
    counts not a multiple of TOKENS (and fewer), odd block counts (rows at 2-aligned byte offsets), a bias
    and offsets; the rows in a storage buffer or bound as a uniform (where a step's fit)."""
    rng = np.random.default_rng(int(qtype) + tokens)
    fmt = I8_ACTIVATIONS[qtype]
    m, k = 67, 288 if fmt == "q8_0" else 768       # (Q6_K's 210-byte blocks: rows at 2-aligned offsets too)
    raw = random_weight(qtype, m, k, rng)
    q, info = emu.quantize(activations(rng, n, k), fmt)
    bias = rng.standard_normal(m, dtype=np.float32)
    got = run_matvec_i8(gpu, qtype, raw, emu.pack(q, info), n, k, rows=4, bias=bias, w_pad=36, x_pad=8, y_pad=12,
                        tokens=tokens, uniform_x=uniform_x)
    check(got, emu.matvec(raw, qtype, q, info) + bias)
    # the same integer sums and float steps as one token at a time: equal word for word, where the driver
    # keeps a * b + c as two roundings (SwiftShader, lavapipe); NVIDIA's fuses some into fma, differently in
    # the two loops (WGSL allows it): there within a few ulp of the row's sums (H200: up to 2e-6 absolute
    # where outputs reach ~60, 2.4e-7 of it; more ulp of the small outputs those sums cancel to)
    one = run_matvec_i8(gpu, qtype, raw, emu.pack(q, info), n, k, rows=4, bias=bias, w_pad=36, x_pad=8, y_pad=12)
    if gpu.device.caps.is_fallback:
        np.testing.assert_array_equal(got, one)
    else:
        np.testing.assert_allclose(got, one, rtol=0, atol=1e-6 * np.abs(one).max())


@pytest.mark.parametrize("tokens, n", [(4, 7), (4, 3), (8, 10)])
@pytest.mark.parametrize("qtype", sorted(I8_LANE_TYPES), ids=lambda t: t.name)
def test_matvec_i8_lanes(gpu, qtype, tokens, n):
    """Tokens in pairs (lanes.wgsl's words, one multiply for both): the same numbers as token by token, and
    llama.cpp's arithmetic, with odd token counts (a last pair of one token), and at the bound the pairs
    rely on: a row of all-15 quants against activations all at +-127 (16 products summing to 30480)."""
    rng = np.random.default_rng(int(qtype) + 10 * tokens + n)
    fmt = I8_ACTIVATIONS[qtype]
    per = I8_BLOCKS[fmt][0] if qtype != QT.Q4_K else 256
    m, k = 37, 288 if fmt == "q8_0" else 768
    raw = random_weight(qtype, m, k, rng)
    block = raw.shape[1] // (k // per)
    for b in range(k // per):           # row 0: every quant 15; row 1: every quant 0 (a block's quants end it)
        raw[0, (b + 1) * block - per // 2:(b + 1) * block] = 0xFF
        raw[1, (b + 1) * block - per // 2:(b + 1) * block] = 0x00
    x = activations(rng, n, k)
    x[1 % n] = 3.0                      # all at +-127
    x[2 % n] = -3.0
    words = run_quantize(gpu, x, fmt)
    row_words = xq_row_words(k, fmt)
    pair_off, total = lanes_words(n, k, row_words)
    buf = gpu.upload(np.concatenate([words, np.zeros(total - len(words), np.uint32)]))
    gpu.dispatch(lanes_key(), [buf], [], dict(k=k, n=n, row_words=row_words, pair_off=pair_off), (groups(k // 4), (n + 1) // 2, 1))
    both = np.frombuffer(gpu.run(gpu.device.read(buf, total * 4)), np.uint32)
    q, info = emu.unpack(words, n, k, fmt)
    np.testing.assert_array_equal(both, emu.with_lanes(q, info)[0])      # the rows untouched, the pairs after them
    got = run_matvec_i8(gpu, qtype, raw, both, n, k, rows=4, tokens=tokens, pair_off=pair_off)
    check(got, emu.matvec(raw, qtype, q, info))
    np.testing.assert_array_equal(run_matvec_i8(gpu, qtype, raw, both, n, k, rows=4, tokens=tokens, pair_off=pair_off,
                                                uniform_x=True), got)
    one = run_matvec_i8(gpu, qtype, raw, words, n, k, rows=4, tokens=tokens)
    if gpu.device.caps.is_fallback:
        np.testing.assert_array_equal(got, one)
    else:
        np.testing.assert_allclose(got, one, rtol=0, atol=1e-6 * np.abs(one).max())


def test_lanes_refuse_types_and_counts_they_cannot_take():
    for qtype, tokens in [(QT.Q5_0, 4), (QT.Q8_0, 4), (QT.Q5_K, 4), (QT.Q6_K, 4), (QT.Q4_1, 3), (QT.Q4_1, None)]:
        with pytest.raises(ValueError):
            matvec_i8_key(qtype, tokens=tokens, lanes=True)


@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q8_0], ids=lambda t: t.name)
def test_quantize_then_matvec_is_llama_cpp_arithmetic(gpu, qtype):
    """Real quantized weights (gguf.quants), the GPU's own quantization of x, against the reference
    executor's llama.cpp emulation (written independently of the GPU layout)."""
    rng = np.random.default_rng(int(qtype))
    m, k, n = 45, 160, 2
    raw = quants.quantize(rng.standard_normal((m, k), dtype=np.float32), qtype)
    x = activations(rng, n, k)
    words = run_quantize(gpu, x, I8_ACTIVATIONS[qtype])
    got = run_matvec_i8(gpu, qtype, raw, words, n, k, rows=2)
    check(got, emu.llama_cpp_matvec(raw, qtype, x))


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q5_K, QT.Q6_K], ids=lambda t: t.name)
def test_quantize_then_matvec_k_quants_is_llama_cpp_arithmetic(gpu, qtype):
    rng = np.random.default_rng(int(qtype))
    m, k, n = 37, 512, 2
    raw = random_weight(qtype, m, k, rng)
    x = activations(rng, n, k)
    words = run_quantize(gpu, x, "q8_k")
    got = run_matvec_i8(gpu, qtype, raw, words, n, k, rows=4)
    check(got, emu.llama_cpp_matvec(raw, qtype, x))


def test_glu_gelu_f16_is_llama_cpp_table(gpu):
    """The GELU the int8 route uses (GELU_F16): llama.cpp's f16 table, exact x or 0 past +-10."""
    from pyshim.gpu.kernels import WG
    from pyshim.gpu.shaderc import ShaderKey
    from pyshim.exec.llama_cpp import gelu_llama_cpp

    rng = np.random.default_rng(19)
    n, f = 3, 1000
    g = (rng.standard_normal((n, f)) * 5).astype(np.float32)
    g[0, :4] = [-10.0, 10.0, -10.5, 12.0]
    u = rng.standard_normal((n, f), dtype=np.float32)
    (out,) = gpu.dispatch(ShaderKey.of("glu", WG=WG, ACT_GELU=True, GELU_F16=True), [g, u], [g.nbytes],
                          dict(n=n, f=f, gate_off=0, gate_stride=f, up_off=0, up_stride=f, out_off=0), (groups(f // 4), n, 1))
    got = np.frombuffer(out, np.float32).reshape(n, f)
    want = gelu_llama_cpp(g) * u
    # tanh differs from NumPy's by ulps. Below about -3, 1 + tanh cancels and both f32 results are off
    # (from the f64 value) by far more than an f16 step of the tiny result; elsewhere the f16 rounding
    # hides the ulps except at a rare f16 tie.
    plain = np.abs(g) < 3.0
    assert np.mean(got[plain] == want[plain]) > 0.995
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=1e-6)
