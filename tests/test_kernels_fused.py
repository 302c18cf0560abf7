"""The fused kernels of a decode step on the native device (wgpu: naga + lavapipe here): against NumPy,
the matvecs' GLU epilogue (gate and up rows in one weight, act(gate) * up stored; f32 route barrier-free,
workgroup-tree and subgroup, and the int8 route), the residual added in a matvec's epilogue (the bias
binding with a per-token stride) and in rmsnorm (RESIDUAL); against the unfused kernels run one after the
other, a norm folded into quantize and rope, the keys' rope (and head norm) folded into kv_write, the
attention's output rounded to int8 blocks by the attention pass. Odd sizes; one device for the module."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import i8_emulation as emu
from gpu_helpers import GPU, page_params, random_weight, step_map
from pyshim.exec.llama_cpp import gelu_llama_cpp
from pyshim.exec.reference import dequantize_rows, gelu_tanh
from pyshim.gpu.kernels import (GROUPED_TYPES, I8_ACTIVATIONS, I8_PAIR_TYPES, UNIFORM_X_BYTES, attention_keys, groups, kv_write_grid,
                                kv_write_key, matvec_grid, matvec_i8_grid, matvec_i8_key, matvec_key, quantize_key, rmsnorm_grid,
                                rmsnorm_key, rope_key, rope_theta, xq_row_words)
from pyshim.models.rope import RopeSpec
from pyshim.plan.settings import KV_TYPES
from pyshim.gpu.policy import subgroups_usable


@pytest.fixture(scope="module")
def gpu():
    g = GPU()
    yield g
    g.close()


def act(g: np.ndarray, name: str, int8: bool = False) -> np.ndarray:
    if name == "silu":
        with np.errstate(over="ignore"):
            return g / (1.0 + np.exp(-g))
    return gelu_llama_cpp(g) if int8 else gelu_tanh(g)


def check(got, want, rel=2e-5):
    scale = float(np.max(np.abs(want))) or 1.0
    np.testing.assert_allclose(got, want, rtol=rel, atol=rel * scale)


def uniform(gpu, data: np.ndarray):
    """`data` in a buffer bound as the 64 KiB uniform array one-token matvecs read."""
    buf = gpu.device.buffer(UNIFORM_X_BYTES, label="x", also_uniform=True)
    gpu.device.write(buf, data)
    return buf, 0, UNIFORM_X_BYTES


@pytest.mark.parametrize("variant", ["rows2", "rows4", "reduce", "subgroup"])
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("qtype", [QT.F16, QT.Q4_1, QT.Q5_0, QT.Q8_0, QT.Q4_K, QT.Q6_K], ids=lambda t: t.name)
def test_matvec_glu(gpu, qtype, activation, variant):
    """One token through [gate; up] (m = 67 rows each, so the last invocation's rows run past m)."""
    if variant == "subgroup" and not subgroups_usable(gpu.device.caps):
        pytest.skip("this adapter has no subgroups")
    rng = np.random.default_rng(int(qtype) + len(activation) + len(variant))
    k = 512 if qtype in (QT.Q4_K, QT.Q6_K) else 160
    m = 67
    raw = random_weight(qtype, 2 * m, k, rng)
    x = rng.standard_normal((1, k), dtype=np.float32)
    w = x @ dequantize_rows(raw, qtype).reshape(2 * m, k).T
    want = act(w[:, :m], activation) * w[:, m:]
    reduce = variant in ("reduce", "subgroup")
    rows = 4 if variant == "rows4" else 2
    key = matvec_key(qtype, glu=activation, reduce=reduce, subgroup=variant == "subgroup", uniform_x=not reduce, rows=rows)
    (out,) = gpu.dispatch(key, [raw.reshape(-1), x if reduce else uniform(gpu, x)], [m * 4],
                          dict(m=m, k=k, n=1, row_bytes=raw.shape[1], w_off=0, x_off=0, y_off=0, bias_off=0, y_stride=m),
                          matvec_grid(m, 1, reduce, rows))
    check(np.frombuffer(out, np.float32).reshape(1, m), want)


@pytest.mark.parametrize("variant", ["rows2", "rows4_uniform", "rows8_uniform", "pairs"])
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("qtype", list(I8_ACTIVATIONS), ids=lambda t: t.name)
def test_matvec_i8_glu(gpu, qtype, activation, variant):
    """The int8 route: act(gate) * up of the same integer dot products as emu.matvec, llama.cpp's f16
    GELU table included."""
    if variant == "pairs" and qtype not in I8_PAIR_TYPES:
        pytest.skip("pairs are for Q5_0 (Q4_0 is grouped)")
    rng = np.random.default_rng(int(qtype) * 3 + len(activation) + len(variant))
    fmt = I8_ACTIVATIONS[qtype]
    k = 320 if fmt == "q8_0" else 768
    m = 67
    raw = random_weight(qtype, 2 * m, k, rng)
    q, info = emu.quantize(rng.standard_normal((1, k), dtype=np.float32), fmt)
    w = emu.matvec(raw, qtype, q, info)
    want = act(w[:, :m].astype(np.float32), activation, int8=True) * w[:, m:]
    rows = int(variant[4]) if variant.startswith("rows") else 2     # (8: lavapipe's short Q4_K rows, 16 accumulators)
    uniform_x = variant.endswith("_uniform")
    words = emu.pack(q, info)
    x_in = uniform(gpu, words) if uniform_x else words
    data = emu.grouped(raw, qtype) if qtype in GROUPED_TYPES else raw
    key = matvec_i8_key(qtype, glu=activation, rows=rows, uniform_x=uniform_x, pairs=variant == "pairs")
    (out,) = gpu.dispatch(key, [data.reshape(-1), x_in], [m * 4],
                          dict(m=m, k=k, n=1, row_bytes=raw.shape[1], w_off=0, x_off=0, y_off=0, bias_off=0, y_stride=m,
                               pair_off=0, x_row_words=xq_row_words(k, fmt)), matvec_i8_grid(m, 1, rows))
    check(np.frombuffer(out, np.float32).reshape(1, m), want, rel=1e-4)


@pytest.mark.parametrize("route", ["f32", "f32_reduce", "int8"])
def test_residual_in_the_matvec_epilogue(gpu, route):
    """The bias binding holding a residual [n, m] at an offset, bias_stride m: y = x @ W.T + r, per token."""
    rng = np.random.default_rng(len(route))
    qtype, m, k, n, off = QT.Q4_1, 67, 160, 3, 12
    raw = random_weight(qtype, m, k, rng)
    r = rng.standard_normal((n, m), dtype=np.float32)
    r_buf = np.concatenate([np.zeros(off, np.float32), r.reshape(-1)])
    common = dict(m=m, k=k, n=n, row_bytes=raw.shape[1], w_off=0, x_off=0, y_off=0, bias_off=off, bias_stride=m, y_stride=m)
    if route == "int8":
        q, info = emu.quantize(rng.standard_normal((n, k), dtype=np.float32), "q8_0")
        want = emu.matvec(raw, qtype, q, info) + r
        (out,) = gpu.dispatch(matvec_i8_key(qtype, bias=True), [raw.reshape(-1), emu.pack(q, info), r_buf], [n * m * 4],
                              dict(common, pair_off=0, x_row_words=xq_row_words(k, "q8_0")), matvec_i8_grid(m, n))
    else:
        x = rng.standard_normal((n, k), dtype=np.float32)
        want = x @ dequantize_rows(raw, qtype).reshape(m, k).T + r
        reduce = route == "f32_reduce"
        (out,) = gpu.dispatch(matvec_key(qtype, bias=True, reduce=reduce), [raw.reshape(-1), x, r_buf], [n * m * 4], common,
                              matvec_grid(m, n, reduce))
    check(np.frombuffer(out, np.float32).reshape(n, m), want)


@pytest.mark.parametrize("reduce", [False, True])
def test_rmsnorm_with_residual(gpu, reduce):
    rng = np.random.default_rng(5 + reduce)
    rows, d, eps, x_off, r_off = 5, 136, 1e-6, 4, 8
    x = rng.standard_normal((rows, d), dtype=np.float32)
    w = rng.standard_normal(d, dtype=np.float32)
    r = rng.standard_normal((rows, d), dtype=np.float32)
    want = r + (x / np.sqrt(np.mean(np.square(x, dtype=np.float64), axis=-1, keepdims=True) + eps)).astype(np.float32) * w
    (out,) = gpu.dispatch(rmsnorm_key(reduce=reduce, residual=True),
                          [np.concatenate([np.zeros(x_off, np.float32), x.reshape(-1)]), w,
                           np.concatenate([np.zeros(r_off, np.float32), r.reshape(-1)])], [rows * d * 4],
                          dict(rows=rows, d=d, eps=eps, x_off=x_off, y_off=0, w_off=0, r_off=r_off), rmsnorm_grid(rows, reduce))
    check(np.frombuffer(out, np.float32).reshape(rows, d), want, rel=1e-5)


# --- the norm and rope folded into their consumers: equal to the unfused kernels run one after the other ---

def rmsnorm_gpu(gpu, x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    d = x.shape[-1]
    rows = x.size // d
    (out,) = gpu.dispatch(rmsnorm_key(), [x.reshape(-1), w], [x.nbytes], dict(rows=rows, d=d, eps=eps, x_off=0, y_off=0, w_off=0),
                          rmsnorm_grid(rows))
    return np.frombuffer(out, np.float32).reshape(x.shape)


def rope_gpu(gpu, x: np.ndarray, positions: np.ndarray, spec, norm_w: np.ndarray | None = None, eps: float = 0.0) -> np.ndarray:
    n, heads, hd = x.shape
    theta, mscale = rope_theta(spec)
    (out,) = gpu.dispatch(rope_key(spec.neox, norm_w is not None),
                          [x, positions.astype(np.uint32), theta] + ([norm_w] if norm_w is not None else []), [x.nbytes],
                          dict(n=n, heads=heads, head_dim=hd, dims=spec.dims, mscale=mscale, x_off=0, y_off=0, pos_off=0, eps=eps),
                          (groups(hd // 2), heads, n))
    return np.frombuffer(out, np.float32).reshape(x.shape)


@pytest.mark.parametrize("fmt", ["q8_0", "q8_k"])
def test_quantize_folds_the_norm_in(gpu, fmt):
    """quantize NORM of x equals quantize of rmsnorm(x): the same int8 values and block metadata."""
    rng = np.random.default_rng(len(fmt))
    n, k, eps = 3, 768, 1e-5
    x = rng.standard_normal((n, k), dtype=np.float32) * 3
    w = rng.standard_normal(k, dtype=np.float32)
    words = xq_row_words(k, fmt)
    per = 32 if fmt == "q8_0" else 256
    common = dict(k=k, n=n, x_off=0, x_stride=k, q_off=0, row_words=words)
    (fused,) = gpu.dispatch(quantize_key(fmt, norm=True), [x, w], [n * words * 4], dict(common, eps=eps), (groups(k // per), n, 1))
    (plain,) = gpu.dispatch(quantize_key(fmt), [rmsnorm_gpu(gpu, x, w, eps)], [n * words * 4], common, (groups(k // per), n, 1))
    np.testing.assert_array_equal(np.frombuffer(fused, np.uint32), np.frombuffer(plain, np.uint32))


@pytest.mark.parametrize("rope", ["normal", "neox_partial"])
def test_rope_folds_the_head_norm_in(gpu, rope):
    spec = RopeSpec(dims=64, base=10000.0, neox=False) if rope == "normal" else RopeSpec(dims=32, base=1e6, neox=True)
    rng = np.random.default_rng(3)
    n, heads, hd, eps = 3, 5, 64, 1e-6
    x = rng.standard_normal((n, heads, hd), dtype=np.float32) * 4
    w = rng.standard_normal(hd, dtype=np.float32)
    positions = np.array([0, 17, 1500])
    check(rope_gpu(gpu, x, positions, spec, w, eps), rope_gpu(gpu, rmsnorm_gpu(gpu, x, w, eps), positions, spec), rel=1e-6)


@pytest.mark.parametrize("kv_type", ["f32", "f16", "q8", "q4"])
@pytest.mark.parametrize("variant", ["rope", "neox_partial", "norm_rope"])
def test_kv_write_folds_the_keys_rope_in(gpu, kv_type, variant):
    """kv_write ROPE (K_NORM) of raw keys stores what kv_write stores of the keys rmsnorm'd and roped by
    their own kernels: the same cache words."""
    spec = RopeSpec(dims=32, base=1e6, neox=True) if variant == "neox_partial" else RopeSpec(dims=64, base=10000.0, neox=False)
    rng = np.random.default_rng(len(variant) + len(kv_type))
    n, n_kv, hd, cap, eps = 3, 2, 64, 16, 1e-6
    k = rng.standard_normal((n, n_kv, hd), dtype=np.float32) * 2
    v = rng.standard_normal((n, n_kv, hd), dtype=np.float32)
    w = rng.standard_normal(hd, dtype=np.float32) if variant == "norm_rope" else None
    positions = np.array([5, 6, 700])
    theta, mscale = rope_theta(spec)
    cell = int(KV_TYPES[kv_type].bytes_per_value * n_kv * hd)
    kc, vc = (gpu.device.buffer(cap * cell, label=name) for name in ("kc", "vc"))
    kc2, vc2 = (gpu.device.buffer(cap * cell, label=name) for name in ("kc2", "vc2"))
    inputs = [k, v, step_map(positions, cap), theta] + ([w] if w is not None else [])
    gpu.dispatch(kv_write_key(kv_type, rope=True, neox=spec.neox, k_norm=w is not None), inputs + [kc, vc], [],
                 dict(n=n, k_row=n_kv * hd, v_row=n_kv * hd, pos_off=0, k_off=0, v_off=0, head_dim=hd,
                      dims=spec.dims, mscale=mscale, eps=eps, **page_params(n, cap)), kv_write_grid(kv_type, n_kv * hd, n_kv * hd, n))
    roped = rope_gpu(gpu, rmsnorm_gpu(gpu, k, w, eps) if w is not None else k, positions, spec)
    gpu.write_kv(roped, v, positions, kc2, vc2, cap, kv_type)
    for got, want in ((kc, kc2), (vc, vc2)):
        np.testing.assert_array_equal(np.frombuffer(gpu.run(gpu.device.read(got)), np.uint32),
                                      np.frombuffer(gpu.run(gpu.device.read(want)), np.uint32))


# --- whole decode steps: what the fusions leave ---

UNFUSED_PER_LAYER = 20     # norm, 2+2 quantize, q/k/v/o/gate/up/down, 2 rope, kv_write, attention, glu, 2 adds


@pytest.mark.models
def test_a_smollm2_decode_step_is_fused(loop, device):
    """SmolLM2's one-token program: one matvec for q, k and v and one for gate and up with the GLU, the skip
    connections in the output projections, the keys' rope in kv_write — no glu, add or separate key rope
    pass left, the attention's output rounded to int8 by the attention pass — and at least 35% fewer
    dispatches than the unfused graph (606: UNFUSED_PER_LAYER a layer,
    embedding, final norm, head and argmax; 50% fewer where the norms fold into quantize, which the policy
    allows on SwiftShader only)."""
    from collections import Counter

    from pyshim.exec.runner import Want
    from runners import gpu as gpu_runner
    from pyshim.setup.catalog import model_path

    runner = loop.run_until_complete(gpu_runner(model_path("smollm2"), context=256, device=device))
    program = runner._record(1, Want.ARGMAX)
    families = Counter(d.key.family for d in program.dispatches)
    layers = runner.spec.n_layers
    assert families["glu"] == families["eltwise"] == 0
    assert families["matvec_i8"] == 4 * layers + 1 and families["rope"] == families["kv_write"] == layers
    assert families["rmsnorm"] == (0 if runner.policy.norm_in_quantize else 2 * layers + 1)
    assert families["quantize"] == 3 * layers + 1       # not after the attention: it writes int8 blocks itself
    unfused = UNFUSED_PER_LAYER * layers + 6
    assert unfused == 606 and len(program.dispatches) <= 0.65 * unfused


@pytest.mark.parametrize("kv_type", ["f32", "q8"])
@pytest.mark.parametrize("fmt, hd", [("q8_0", 64), ("q8_k", 256)])
def test_attention_rounds_its_output_for_the_next_matmul(gpu, fmt, hd, kv_type):
    """attention QUANT writes what quantize writes of the attention's f32 output: the same int8 words and
    metadata (heads of whole blocks: Q8_0's 32, Q8_K's 256), for 3 tokens of a prompt."""
    rng = np.random.default_rng(hd + len(kv_type))
    n, n_heads, n_kv, cap = 3, 4, 2, 16
    k = rng.standard_normal((n, n_kv, hd), dtype=np.float32)
    v = rng.standard_normal((n, n_kv, hd), dtype=np.float32)
    q = rng.standard_normal((n, n_heads, hd), dtype=np.float32)
    row = int(KV_TYPES[kv_type].bytes_per_value * n_kv * hd)
    kc, vc = gpu.device.buffer(cap * row, label="kc"), gpu.device.buffer(cap * row, label="vc")
    pos = gpu.write_kv(k, v, np.arange(n), kc, vc, cap, kv_type)
    width = n_heads * hd
    words = xq_row_words(width, fmt)
    params = dict(n=n, heads=n_heads, kv_heads=n_kv, window=0, scale=hd ** -0.5, softcap=0.0, pos_off=0, q_off=0,
                  out_off=0, row_words=words, **page_params(n, cap))
    grid = (groups(n_heads), n, 1)
    (plain,) = gpu.dispatch(attention_keys(hd, hd, False, 1, kv_type)[0], [q, kc, vc, pos], [n * width * 4], params, grid)
    per = 32 if fmt == "q8_0" else 256
    (want,) = gpu.dispatch(quantize_key(fmt), [np.frombuffer(plain, np.float32)], [n * words * 4],
                           dict(k=width, n=n, x_off=0, x_stride=width, q_off=0, row_words=words), (groups(width // per), n, 1))
    (got,) = gpu.dispatch(attention_keys(hd, hd, False, 1, kv_type, quant=fmt)[0], [q, kc, vc, pos], [n * words * 4], params, grid)
    np.testing.assert_array_equal(np.frombuffer(got, np.uint32), np.frombuffer(want, np.uint32))
