"""Every WGSL kernel on the native device (wgpu, lavapipe here) against NumPy: the reference executor
and gguf.quants. Sizes are deliberately not multiples of the workgroup; one device for the module."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import quants

from pyshim.gpu.kernels import (ARGMAX_CHUNK, PARAMS, UNIFORM_X_BYTES, WEIGHT_TYPES, WG,
                                attention_combine_grid, attention_grid, attention_keys, attention_record_bytes, groups,
                                matvec_grid, matvec_key, rope_theta, shader_block)
from pyshim.gpu.shaderc import Preprocessor, ShaderKey
from gpu_helpers import page_params
from pyshim.models.key_scales import hadamard_norm
from pyshim.models.ops import AttnSpec
from pyshim.exec.reference import ReferenceOps, dequantize_rows
from pyshim.models.rope import RopeSpec
from gpu_helpers import GPU, random_weight

ALL_TYPES = list(WEIGHT_TYPES)
# the reference executor's per-op methods, plain f32 math (no weights, no cache: the ops that need neither)
REF = ReferenceOps.__new__(ReferenceOps)
QUANTIZABLE = [QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q8_0]      # what gguf.quants.quantize implements


@pytest.fixture(scope="module")
def gpu():
    g = GPU()
    yield g
    g.close()


def f32(data: bytes, shape=None) -> np.ndarray:
    a = np.frombuffer(data, dtype=np.float32)
    return a if shape is None else a[: int(np.prod(shape))].reshape(shape)


class Dense:
    """A reference-executor weight stand-in holding f32 values."""

    def __init__(self, values):
        self.values = np.asarray(values, dtype=np.float32)
        self.shape = self.values.shape

    def dense(self):
        return self.values


def run_matvec(gpu, qtype, raw, x, *, bias=None, w_pad=0, x_pad=0, y_pad=0, rows_per_thread=1, reduce=False,
               uniform_x=False):
    """raw uint8 (m, row_bytes); x (n, k) -> y (n, m). Pads put the tensors at offsets in their buffers."""
    m, row_bytes = raw.shape
    n, k = x.shape
    w = np.concatenate([np.zeros(w_pad, np.uint8), raw.reshape(-1)])
    xs = np.concatenate([np.zeros(x_pad, np.float32), x.reshape(-1)])
    define = {WEIGHT_TYPES[qtype][0]: True}
    x_in = xs
    if uniform_x:       # x bound as the 64 KiB uniform array the executor binds for one-token steps
        x_in = gpu.device.buffer(UNIFORM_X_BYTES, label="x", also_uniform=True)
        gpu.device.write(x_in, xs)
        x_in = (x_in, 0, UNIFORM_X_BYTES)
    inputs = [w, x_in] + ([bias] if bias is not None else [])
    key = ShaderKey.of("matvec", **define, WG=16 if reduce else WG, BIAS=bias is not None, ROWS=rows_per_thread, REDUCE=reduce)
    grid = (groups(m, rows_per_thread), n, 1) if reduce else (groups(m, WG * rows_per_thread), n, 1)
    if uniform_x:
        key, grid = matvec_key(qtype, bias=bias is not None, uniform_x=True), matvec_grid(m, n)
    (out,) = gpu.dispatch(key, inputs, [(y_pad + n * m) * 4],
                          dict(m=m, k=k, n=n, row_bytes=row_bytes, w_off=w_pad, x_off=x_pad, y_off=y_pad, bias_off=0, y_stride=m),
                          grid)
    return f32(out)[y_pad:].reshape(n, m)


def check_close(got, want, rel=2e-5):
    scale = float(np.max(np.abs(want))) or 1.0
    np.testing.assert_allclose(got, want, rtol=rel, atol=rel * scale)


@pytest.mark.parametrize("variant", ["rows1", "rows3", "reduce_rows3", "uniform_x"])
@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_matvec_random_blocks(gpu, qtype, variant):
    rng = np.random.default_rng(int(qtype))
    per = shader_block(qtype)[0]
    k = 3 * max(per, 32) if per < 256 else 512          # odd block counts put rows at 2-aligned offsets
    m, n = 67, 11 if variant == "rows1" else 3        # many tokens in one dispatch (the grid's y)
    raw = random_weight(qtype, m, k, rng)
    x = rng.standard_normal((n, k), dtype=np.float32)
    want = x @ dequantize_rows(raw, qtype).reshape(m, k).T
    rows = int(variant[-1]) if variant[-1].isdigit() else 1
    check_close(run_matvec(gpu, qtype, raw, x, rows_per_thread=rows, reduce=variant.startswith("reduce"),
                           uniform_x=variant == "uniform_x"), want)


def test_matvec_reduce_folds_the_grid_past_65535_workgroups(gpu):
    rng = np.random.default_rng(1)
    m, k = 140_001, 8
    w = rng.standard_normal((m, k), dtype=np.float32)
    x = rng.standard_normal((1, k), dtype=np.float32)
    grid = matvec_grid(m, 1, reduce=True)
    assert grid[2] > 1 and grid[0] <= 65535
    (out,) = gpu.dispatch(matvec_key(QT.F32, reduce=True), [w.view(np.uint8), x], [m * 4],
                          dict(m=m, k=k, n=1, row_bytes=k * 4, w_off=0, x_off=0, y_off=0, bias_off=0, y_stride=m), grid)
    check_close(f32(out, (1, m)), x @ w.T)


@pytest.mark.parametrize("qtype", QUANTIZABLE, ids=lambda t: t.name)
def test_matvec_quantized_data(gpu, qtype):
    rng = np.random.default_rng(7)
    m, k = 45, 160
    raw = quants.quantize(rng.standard_normal((m, k), dtype=np.float32), qtype)
    x = rng.standard_normal((1, k), dtype=np.float32)
    want = x @ quants.dequantize(raw, qtype).T
    check_close(run_matvec(gpu, qtype, raw, x), want)


@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q6_K, QT.F16], ids=lambda t: t.name)
def test_matvec_bias_and_offsets(gpu, qtype):
    rng = np.random.default_rng(11)
    k = 256
    m, n = 130, 2
    raw = random_weight(qtype, m, k, rng)
    x = rng.standard_normal((n, k), dtype=np.float32)
    bias = rng.standard_normal(m, dtype=np.float32)
    want = x @ dequantize_rows(raw, qtype).reshape(m, k).T + bias
    check_close(run_matvec(gpu, qtype, raw, x, bias=bias, w_pad=36, x_pad=8, y_pad=12, rows_per_thread=2), want)
    check_close(run_matvec(gpu, qtype, raw, x, bias=bias, w_pad=36, x_pad=8, y_pad=12, rows_per_thread=2, reduce=True), want)
    check_close(run_matvec(gpu, qtype, raw, x[:1], bias=bias, w_pad=36, x_pad=8, y_pad=12, uniform_x=True), want[:1])


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_embed(gpu, qtype):
    rng = np.random.default_rng(3)
    per = shader_block(qtype)[0]
    d = 512 if per == 256 else 96
    vocab = 37
    raw = random_weight(qtype, vocab, d, rng)
    tokens = np.array([5, 36, 0, 5, 17], dtype=np.uint32)
    key = ShaderKey.of("embed", **{WEIGHT_TYPES[qtype][0]: True}, WG=WG)
    pad = 8
    (out,) = gpu.dispatch(key, [raw, np.concatenate([np.zeros(1, np.uint32), tokens])], [(pad + len(tokens) * d) * 4],
                          dict(d=d, n=len(tokens), row_bytes=raw.shape[1], w_off=0, tok_off=1, out_off=pad, row0=0, rows=vocab),
                          (groups(d // per), len(tokens), 1))
    want = dequantize_rows(raw[tokens.astype(np.int64)], qtype).reshape(len(tokens), d)
    np.testing.assert_array_equal(f32(out)[pad:].reshape(len(tokens), d), want)


def test_rmsnorm(gpu):
    rng = np.random.default_rng(5)
    rows, d = 71, 68
    x = rng.standard_normal((rows, d), dtype=np.float32) * 3
    w = rng.standard_normal(d, dtype=np.float32)
    (out,) = gpu.dispatch(ShaderKey.of("rmsnorm", WG=WG), [x, w], [x.nbytes],
                          dict(rows=rows, d=d, eps=1e-6, x_off=0, y_off=0, w_off=0), (groups(rows), 1, 1))
    want = REF.rmsnorm(x, Dense(w), 1e-6)
    check_close(f32(out, x.shape), want)


ROPES = {
    "normal": RopeSpec(dims=64, base=10000.0, neox=False),
    "neox_partial": RopeSpec(dims=32, base=1e6, neox=True),
    "yarn": RopeSpec(dims=64, base=10000.0, neox=True, scaling="yarn", factor=4.0, n_ctx_orig=512, attn_factor=1.0),
}


@pytest.mark.parametrize("name", ROPES)
def test_rope(gpu, name):
    spec = ROPES[name]
    rng = np.random.default_rng(9)
    n, heads, hd = 3, 5, 64
    x = rng.standard_normal((n, heads, hd), dtype=np.float32)
    positions = np.array([0, 17, 1500], dtype=np.int64)
    theta, mscale = rope_theta(spec)
    key = ShaderKey.of("rope", WG=WG, NEOX=spec.neox)
    (out,) = gpu.dispatch(key, [x, positions.astype(np.uint32), theta], [x.nbytes],
                          dict(n=n, heads=heads, head_dim=hd, dims=spec.dims, mscale=mscale, x_off=0, y_off=0, pos_off=0),
                          (groups(hd // 2), heads, n))
    want = REF.rope(x, positions, spec)
    # angles up to 1500 rad in f32: the GPU's angle differs from the f64 one by ~1e-4 rad
    np.testing.assert_allclose(f32(out, x.shape), want, atol=5e-4 * np.abs(x).max())


@pytest.mark.parametrize("hd,width", [(64, 64), (128, 128), (256, 256), (96, 32), (512, 256)])
def test_rope_with_scales_and_rotation(gpu, hd, width):
    """A q4 cache's keys: rope, the scales, then the Hadamard rotation, a workgroup a head. At position 0
    (no turn: cos 1, sin 0 in both) the reference's bits, the butterflies in its order; elsewhere within
    the angles' f32 error, as test_rope."""
    spec = RopeSpec(dims=hd, base=10000.0, neox=True)
    rng = np.random.default_rng(hd + width)
    n, heads = 3, 2
    x = rng.standard_normal((n, heads, hd), dtype=np.float32)
    scale = rng.uniform(0.25, 4.0, (heads, hd)).astype(np.float32)
    theta, mscale = rope_theta(spec)
    table = np.concatenate([theta, scale.reshape(-1)]).astype(np.float32)
    for positions in (np.zeros(n, np.int64), np.array([0, 17, 1500], np.int64)):
        (out,) = gpu.dispatch(ShaderKey.of("rope", WG=WG, NEOX=True, SCALE=True, ROTATE=True),
                              [x, positions.astype(np.uint32), table], [x.nbytes],
                              dict(n=n, heads=heads, head_dim=hd, dims=spec.dims, mscale=mscale, x_off=0, y_off=0,
                                   pos_off=0, scale_off=spec.dims // 2, rot=width, rnorm=float(hadamard_norm(width))),
                              (1, heads, n))
        want = REF.rope(x, positions, spec, scale=scale, rotation=width)
        if not positions.any():
            assert np.array_equal(f32(out, x.shape), want)
        else:
            np.testing.assert_allclose(f32(out, x.shape), want, atol=5e-4 * np.abs(want).max())


def attention_case(gpu, *, n_heads, n_kv, hd, window, softcap, history, n, cap, splits=1, lanes=0):
    """Fill a cache of `cap` positions (its pages in scrambled order; a ring past cap) with `history`
    earlier positions through kv_write, then attend for n new tokens (`lanes`: the real-GPU form, a
    workgroup per head, token and split)."""
    rng = np.random.default_rng(n_heads * 100 + hd + window)
    spec_m = SimpleNamespace(sliding_window=window, swa_layers=[bool(window)], n_layers=1, n_kv_heads=n_kv,
                             head_dim_k=hd, head_dim_v=hd, kv_heads=lambda layer: n_kv, head_dims=lambda layer: (hd, hd),
                             kv_row=lambda layer: (n_kv * hd, n_kv * hd))
    ref = ReferenceOps.__new__(ReferenceOps)
    from pyshim.exec.kvcache import KVCache

    ref.kv = KVCache(spec_m, history + n)
    attn = AttnSpec(layer=0, n_heads=n_heads, n_kv_heads=n_kv, head_dim=hd, head_dim_v=hd, scale=hd ** -0.5,
                    window=window, softcap=softcap)
    kc = gpu.device.buffer(cap * n_kv * hd * 4, label="kc")
    vc = gpu.device.buffer(cap * n_kv * hd * 4, label="vc")
    # the history goes in chunks the ring can take (window + chunk - 1 <= cap), then the n new tokens
    chunk = cap - window + 1 if window else history
    steps = [(s, min(chunk, history - s)) for s in range(0, history, max(chunk, 1))] + [(history, n)]
    for start, count in steps:
        positions = np.arange(start, start + count, dtype=np.int64)
        q = rng.standard_normal((count, n_heads, hd), dtype=np.float32)
        k = rng.standard_normal((count, n_kv, hd), dtype=np.float32)
        v = rng.standard_normal((count, n_kv, hd), dtype=np.float32)
        want = ref.attention(q, k, v, positions, attn)
        pos_buf = gpu.write_kv(k, v, positions, kc, vc, cap)
        key, combine = attention_keys(hd, hd, softcap > 0, splits, lanes=lanes)
        params = dict(n=count, heads=n_heads, kv_heads=n_kv, window=window, scale=attn.scale,
                      softcap=softcap, pos_off=0, q_off=0, out_off=0, **page_params(count, cap))
        size = want.nbytes if combine is None else count * n_heads * splits * attention_record_bytes(hd)
        (out,) = gpu.dispatch(key, [q, kc, vc, pos_buf], [size], params, attention_grid(n_heads, count, splits, lanes))
        if combine is not None:
            (out,) = gpu.dispatch(combine, [np.frombuffer(out, np.float32)], [want.nbytes], params,
                                  attention_combine_grid(n_heads, hd, count))
        check_close(f32(out, want.shape), want, rel=1e-4)


def test_attention_gqa_prefill_then_decode(gpu):
    attention_case(gpu, n_heads=6, n_kv=2, hd=32, window=0, softcap=0.0, history=20, n=1, cap=48)
    attention_case(gpu, n_heads=6, n_kv=2, hd=32, window=0, softcap=0.0, history=0, n=7, cap=16)


def test_attention_sliding_window_ring_and_softcap(gpu):
    # rings that wrap: window 4 in two pages (chunks of 29, 11, then 5), window 3 in one (14, 14, 12, then 1)
    attention_case(gpu, n_heads=4, n_kv=1, hd=16, window=4, softcap=5.0, history=40, n=5, cap=32)
    attention_case(gpu, n_heads=4, n_kv=2, hd=64, window=3, softcap=0.0, history=40, n=1, cap=16)


@pytest.mark.parametrize("lanes", [0, 32])
@pytest.mark.parametrize("splits", [3, 16])
def test_attention_split_over_keys_then_combined(gpu, splits, lanes):
    # 16 splits of at most 17 keys leave some splits empty (and every split empty for early queries)
    attention_case(gpu, n_heads=6, n_kv=2, hd=32, window=0, softcap=0.0, history=9, n=1, cap=16, splits=splits, lanes=lanes)
    attention_case(gpu, n_heads=6, n_kv=2, hd=32, window=0, softcap=0.0, history=0, n=7, cap=16, splits=splits, lanes=lanes)
    attention_case(gpu, n_heads=4, n_kv=1, hd=16, window=4, softcap=5.0, history=40, n=5, cap=32, splits=splits, lanes=lanes)


@pytest.mark.parametrize("lanes", [4, 32])
def test_attention_in_lanes_of_a_workgroup(gpu, lanes):
    """The real-GPU form in one split: a head's 64 dims over 4 lanes (4 vec4s each) or 32 (half of them idle
    for a head of 16), a long history (many keys a workgroup walks), a window and soft-capping."""
    attention_case(gpu, n_heads=4, n_kv=2, hd=64, window=0, softcap=0.0, history=40, n=1, cap=48, lanes=lanes)
    attention_case(gpu, n_heads=4, n_kv=1, hd=16, window=4, softcap=5.0, history=40, n=5, cap=32, lanes=lanes)
    attention_case(gpu, n_heads=6, n_kv=2, hd=128, window=0, softcap=0.0, history=0, n=3, cap=16, lanes=lanes)


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_glu_strided(gpu, act):
    rng = np.random.default_rng(13)
    n, f = 3, 84
    fused = rng.standard_normal((n, 2 * f), dtype=np.float32) * 4     # gate | up, as phi3's fused tensor
    key = ShaderKey.of("glu", WG=WG, ACT_SILU=act == "silu", ACT_GELU=act == "gelu_tanh")
    (out,) = gpu.dispatch(key, [fused, fused], [n * f * 4],
                          dict(n=n, f=f, gate_off=0, gate_stride=2 * f, up_off=f, up_stride=2 * f, out_off=0),
                          (groups(f // 4), n, 1))
    want = REF.glu(fused[:, :f], fused[:, f:], act)
    check_close(f32(out, (n, f)), want)


@pytest.mark.parametrize("op", ["OP_ADD", "OP_SCALE", "OP_SOFTCAP", "OP_COPY"])
def test_eltwise(gpu, op):
    rng = np.random.default_rng(17)
    n, width = 2, 300
    a = rng.standard_normal((n, width), dtype=np.float32) * 40
    b = rng.standard_normal((n, width), dtype=np.float32)
    inputs = [a, b] if op == "OP_ADD" else [a]
    (out,) = gpu.dispatch(ShaderKey.of("eltwise", WG=WG, **{op: True}), inputs, [a.nbytes],
                          dict(n=n, width=width, a_off=0, a_stride=width, b_off=0, b_stride=width, y_off=0, s=30.0),
                          (groups(width // 4), n, 1))
    want = {"OP_ADD": a + b, "OP_SCALE": a * np.float32(30.0), "OP_SOFTCAP": REF.softcap(a, 30.0),
            "OP_COPY": a}[op]
    check_close(f32(out, a.shape), want)


@pytest.mark.parametrize("length", [1, 1000, 49153])
def test_argmax_two_pass(gpu, length):
    rng = np.random.default_rng(length)
    x = rng.standard_normal(length, dtype=np.float32)
    x[length // 3] = x[(2 * length) // 3] = 10.0          # a tie: the lower index wins
    parts = groups(length, ARGMAX_CHUNK)
    (partial,) = gpu.dispatch(ShaderKey.of("argmax", WG=WG, PASS1=True), [x], [parts * 8],
                              dict(len=length, chunk=ARGMAX_CHUNK, x_off=0), (groups(parts), 1, 1))
    (result,) = gpu.dispatch(ShaderKey.of("argmax", WG=WG, PASS2=True), [np.frombuffer(partial, np.uint32)], [4],
                             dict(len=parts, chunk=0, x_off=0), (1, 1, 1))
    assert int(np.frombuffer(result, np.uint32)[0]) == int(np.argmax(x))


STRUCT = re.compile(r"struct\s+Params\s*\{(.*?)\}", re.S)
FIELD = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*:\s*(u32|f32|i32)\s*,")


def test_params_layouts_match_wgsl():
    pre = Preprocessor()
    for family, layout in PARAMS.items():
        variants = {"matvec": {"W_F32": "", "ROWS": "2"}, "matvec_i8": {"ROWS": "2"}, "embed": {"W_F32": ""}, "argmax": {"PASS1": ""}}
        src = pre.expand(f"{family}.wgsl", {"WG": "64", "HD4": "16", "HDV4": "16", "SPLITS": "1", **variants.get(family, {})})
        body = STRUCT.search(src)
        assert body, family
        fields = tuple(FIELD.findall(re.sub(r"//[^\n]*", "", body.group(1))))
        assert fields == layout.fields, family
        assert layout.nbytes % 16 == 0


def test_every_variant_compiles_natively(gpu):
    from pyshim.gpu.variants import shader_variants

    for key in shader_variants():
        gpu.run(gpu.kernels.get(key))


def test_device_errors_become_pyshim_errors(gpu):
    from pyshim.errors import PyshimError, ShaderError

    with pytest.raises(ShaderError):
        gpu.run(gpu.device.pipeline("fn main( {", label="broken"))
    pipeline = gpu.run(gpu.kernels.get(ShaderKey.of("rmsnorm", WG=WG)))
    with pytest.raises(PyshimError, match="bind group"):
        gpu.device.bind_group(pipeline, [gpu.upload(np.zeros(4, np.float32))], label="too_few")
