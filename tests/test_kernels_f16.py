"""The f16 kernels (chosen on GPUs with shader-f16: F16 matvec, tiled matmul, decode attention, the gated
activation) against the f32 ones on the same inputs, natively on lavapipe, which has shader-f16. Their
products are halves, so the tolerance is f16's: F16_REL of the largest output,
where the f32 kernel tests use 2e-5 (f16 keeps 11 significant bits: half an ulp is 2.4e-4 of a value, and a
dot product's rounding grows with the square root of its length). A tiny model of each family run with the
f16 kernels stays within the same tolerance of the f32 reference's logits."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import tiny_models
from gpu_helpers import GPU, page_params, random_weight, step_map
from pyshim.gpu.kernels import (MATMUL_TILE, attention_grid, attention_keys, attention_record_bytes, glu_key, groups,
                                matmul_grid, matmul_key, matvec_grid, matvec_key)
from pyshim.gpu.policy import subgroups_usable
from pyshim.plan.settings import Arithmetic, KV_TYPES
from runners import Drive, gpu as gpu_runner, reference

F16_REL = 4e-3
# every weight type; the default run takes one of each decoder family (the `full` run the others)
TYPES = [QT.F16, QT.Q4_0, QT.Q4_K, QT.Q6_K] + [pytest.param(t, marks=pytest.mark.full)
                                               for t in (QT.F32, QT.Q4_1, QT.Q5_0, QT.Q8_0, QT.Q5_K)]


@pytest.fixture(scope="module")
def gpu():
    g = GPU()
    if not g.device.caps.has_f16:
        g.close()
        pytest.skip("this adapter has no shader-f16")
    yield g
    g.close()


def close(got, want, rel=F16_REL):
    scale = float(np.max(np.abs(want))) or 1.0
    np.testing.assert_allclose(got, want, rtol=0, atol=rel * scale)


def both(gpu, keys, inputs, size, params, grid):
    """The outputs of the f32 and f16 variants of one kernel on the same inputs."""
    return [np.frombuffer(gpu.dispatch(key, inputs, [size], params, grid)[0], np.float32) for key in keys]


@pytest.mark.parametrize("variant", ["rows2", "reduce", "subgroup", "glu"])
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: getattr(t, "name", t))
def test_matvec_f16(gpu, qtype, variant):
    if variant == "subgroup" and not subgroups_usable(gpu.device.caps):
        pytest.skip("this adapter has no subgroups")
    rng = np.random.default_rng(int(qtype) + len(variant))
    k = 512 if qtype in (QT.Q4_K, QT.Q5_K, QT.Q6_K) else 320
    m = 67
    glu = "silu" if variant == "glu" else None
    raw = random_weight(qtype, 2 * m if glu else m, k, rng)
    x = rng.standard_normal((1, k), dtype=np.float32)
    reduce = variant != "rows2"
    keys = [matvec_key(qtype, reduce=reduce, subgroup=variant == "subgroup", glu=glu, f16=f16) for f16 in (False, True)]
    want, got = both(gpu, keys, [raw.reshape(-1), x], m * 4,
                     dict(m=m, k=k, n=1, row_bytes=raw.shape[1], w_off=0, x_off=0, y_off=0, bias_off=0, y_stride=m),
                     matvec_grid(m, 1, reduce))
    close(got, want)


@pytest.mark.parametrize("qtype", [QT.F16, QT.Q4_0, QT.Q8_0, QT.Q4_K, QT.Q6_K], ids=lambda t: t.name)
def test_tiled_matmul_f16(gpu, qtype):
    rng = np.random.default_rng(int(qtype))
    k = 512 if qtype in (QT.Q4_K, QT.Q6_K) else 320
    m, n = 70, 37
    raw = random_weight(qtype, m, k, rng)
    x = rng.standard_normal((n, k), dtype=np.float32)
    keys = [matmul_key(qtype, f16=f16) for f16 in (False, True)]
    want, got = both(gpu, keys, [raw.reshape(-1), x], n * m * 4,
                     dict(m=m, k=k, n=n, row_bytes=raw.shape[1], w_off=0, x_off=0, y_off=0, bias_off=0, y_stride=m),
                     matmul_grid(m, n, MATMUL_TILE))
    close(got.reshape(n, m), want.reshape(n, m))


@pytest.mark.parametrize("lanes", [0, 32])
@pytest.mark.parametrize("splits", [1, 16])
@pytest.mark.parametrize("kv_type", ["f32", "f16", "q8"])
def test_decode_attention_f16(gpu, kv_type, splits, lanes):
    """One query per head over 40 cached keys (GQA 6:2), the split variant combined in f32; one invocation
    a head, or a workgroup's lanes (real GPUs)."""
    rng = np.random.default_rng(len(kv_type) + splits)
    n_heads, n_kv, hd, cap, history = 6, 2, 64, 48, 40
    k = rng.standard_normal((history, n_kv, hd), dtype=np.float32)
    v = rng.standard_normal((history, n_kv, hd), dtype=np.float32)
    q = rng.standard_normal((1, n_heads, hd), dtype=np.float32)
    row = int(KV_TYPES[kv_type].bytes_per_value * n_kv * hd)
    kc, vc = gpu.device.buffer(cap * row, label="kc"), gpu.device.buffer(cap * row, label="vc")
    gpu.write_kv(k, v, np.arange(history), kc, vc, cap, kv_type)
    pos = gpu.upload(step_map(np.array([history - 1]), cap))
    params = dict(n=1, heads=n_heads, kv_heads=n_kv, window=0, scale=hd ** -0.5, softcap=0.0, pos_off=0, q_off=0, out_off=0,
                  **page_params(1, cap))
    outs = []
    for f16 in (False, True):
        key, combine = attention_keys(hd, hd, False, splits, kv_type, f16=f16, lanes=lanes)
        size = n_heads * hd * 4 if combine is None else n_heads * splits * attention_record_bytes(hd)
        (out,) = gpu.dispatch(key, [q, kc, vc, pos], [size], params, attention_grid(n_heads, 1, splits, lanes))
        if combine is not None:
            (out,) = gpu.dispatch(combine, [np.frombuffer(out, np.float32)], [n_heads * hd * 4], params, (groups(n_heads), 1, 1))
        outs.append(np.frombuffer(out, np.float32))
    close(outs[1], outs[0])


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_glu_f16(gpu, act):
    rng = np.random.default_rng(5)
    n, f = 3, 96
    gate = rng.standard_normal((n, f), dtype=np.float32) * 6
    gate[0, :4] = [-30.0, -12.0, 20.0, 0.0]           # SiLU's exp(-g) overflows to inf in halves: g / inf -> 0
    up = rng.standard_normal((n, f), dtype=np.float32)
    keys = [glu_key(act, f16=f16) for f16 in (False, True)]
    want, got = both(gpu, keys, [gate, up], n * f * 4,
                     dict(n=n, f=f, gate_off=0, gate_stride=f, up_off=0, up_stride=f, out_off=0), (groups(f // 4), n, 1))
    assert np.all(np.isfinite(got))
    close(got, want)


@pytest.mark.parametrize("arch, qtype", [("llama", "Q4_K"), ("gemma3", "Q5_0")] + [
    pytest.param(a, q, marks=pytest.mark.full) for a, q in (("qwen2", "Q8_0"), ("qwen3moe", "Q4_0"))])
def test_whole_model_with_f16_kernels(tmp_path_factory, loop, device, arch, qtype):
    """Every position's logits of a tiny model with the f16 kernels (and the real-GPU reductions they come
    with) stay within f16's tolerance of the f32 reference, and mostly agree on the top token."""
    if not device.caps.has_f16:
        pytest.skip("this adapter has no shader-f16")
    path = tiny_models.write_tiny_model(tmp_path_factory.mktemp(arch), arch, QT[qtype])
    ids = tiny_models.test_ids()
    want = Drive(reference(path, context=tiny_models.N_CTX)).logits(ids, all_logits=True)
    runner = loop.run_until_complete(gpu_runner(path, context=tiny_models.N_CTX, device=device, arithmetic=Arithmetic.F32,
                                                policy={"f16": True, "reduce": True, "attn_lanes": 32}))
    got = Drive(runner, loop).logits(ids, all_logits=True)
    keys = {d.key for p in runner._programs.values() for d in p.dispatches}
    assert any(dict(k.defines).get("F16") is not None for k in keys), "no f16 kernel ran"
    close(got, want, rel=2 * F16_REL)
    assert np.mean(got.argmax(-1) == want.argmax(-1)) >= 0.9
