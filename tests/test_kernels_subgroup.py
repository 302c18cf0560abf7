"""The subgroup-reduction matvec (matvec.wgsl SUBGROUP, the default on real GPUs with subgroups) forced on
the native device (lavapipe here: its subgroups are CPU SIMD lanes) against NumPy: every weight type, odd
sizes, bias and offsets, the z-folded grid, and workgroups of several subgroups; the one-workgroup-per-row
rmsnorm (tree and subgroup sums); the subgroup argmax; the per-compiler `enable` lines. Speed is not
measured here: lavapipe is a CPU."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from pyshim.gpu.kernels import (REDUCE_ROWS, WEIGHT_TYPES, argmax_keys, argmax_pass1, groups, matvec_grid, matvec_key, rmsnorm_grid, rmsnorm_key,
                                shader_block)
from pyshim.gpu.policy import subgroups_usable
from pyshim.gpu.shaderc import Preprocessor, ShaderKey
from pyshim.exec.reference import dequantize_rows
from gpu_helpers import GPU, random_weight


@pytest.fixture(scope="module")
def gpu():
    g = GPU()
    if not subgroups_usable(g.device.caps):
        g.close()
        pytest.skip("this adapter has no subgroups")
    yield g
    g.close()


def check_close(got, want, rel=2e-5):
    scale = float(np.max(np.abs(want))) or 1.0
    np.testing.assert_allclose(got, want, rtol=rel, atol=rel * scale)


def run(gpu, key, raw, x, grid, *, bias=None, w_pad=0, x_pad=0, y_pad=0):
    m, row_bytes = raw.shape
    n, k = x.shape
    w = np.concatenate([np.zeros(w_pad, np.uint8), raw.reshape(-1)])
    xs = np.concatenate([np.zeros(x_pad, np.float32), x.reshape(-1)])
    (out,) = gpu.dispatch(key, [w, xs] + ([bias] if bias is not None else []), [(y_pad + n * m) * 4],
                          dict(m=m, k=k, n=n, row_bytes=row_bytes, w_off=w_pad, x_off=x_pad, y_off=y_pad, bias_off=0, y_stride=m),
                          grid)
    return np.frombuffer(out, np.float32)[y_pad:].reshape(n, m)


def subgroup_shape(gpu, wg: int) -> tuple[int, int]:
    """(subgroup size, subgroups per workgroup) this device gives a workgroup of `wg` invocations."""
    code = ("@group(0) @binding(0) var<storage, read_write> o: array<u32>;\n"
            f"@compute @workgroup_size({wg}) fn main(@builtin(local_invocation_index) i: u32, "
            "@builtin(subgroup_size) s: u32, @builtin(num_subgroups) n: u32) { if (i == 0u) { o[0] = s; o[1] = n; } }")
    pre = Preprocessor({"probe.wgsl": "#enable subgroups\n" + code}, compiler="naga")
    pipeline = gpu.run(gpu.device.pipeline(pre.expand("probe.wgsl"), label="probe"))
    out = gpu.device.buffer(16, label="o")
    gpu.device.submit([(pipeline, gpu.device.bind_group(pipeline, [out]), (1, 1, 1))])
    size, count = np.frombuffer(gpu.run(gpu.device.read(out, 8)), np.uint32)
    return int(size), int(count)


@pytest.mark.parametrize("qtype", list(WEIGHT_TYPES), ids=lambda t: t.name)
def test_subgroup_matvec_random_blocks(gpu, qtype):
    rng = np.random.default_rng(int(qtype) + 100)
    per = shader_block(qtype)[0]
    k = 3 * max(per, 32) if per < 256 else 768         # odd block counts put rows at 2-aligned offsets
    m, n = 67, 3
    raw = random_weight(qtype, m, k, rng)
    x = rng.standard_normal((n, k), dtype=np.float32)
    want = x @ dequantize_rows(raw, qtype).reshape(m, k).T
    key = matvec_key(qtype, reduce=True, subgroup=True)
    assert ("SUBGROUP", "") in key.defines
    check_close(run(gpu, key, raw, x, matvec_grid(m, n, reduce=True)), want)


@pytest.mark.parametrize("qtype", [QT.Q4_1, QT.Q6_K, QT.F16], ids=lambda t: t.name)
def test_subgroup_matvec_bias_offsets_and_many_blocks(gpu, qtype):
    """k of 40+ blocks: each invocation sums several blocks before the subgroup sum."""
    rng = np.random.default_rng(5)
    k = 2560 if shader_block(qtype)[0] == 256 else 1344
    m, n = 131, 2
    raw = random_weight(qtype, m, k, rng)
    x = rng.standard_normal((n, k), dtype=np.float32)
    bias = rng.standard_normal(m, dtype=np.float32)
    want = x @ dequantize_rows(raw, qtype).reshape(m, k).T + bias
    key = matvec_key(qtype, bias=True, reduce=True, subgroup=True)
    check_close(run(gpu, key, raw, x, matvec_grid(m, n, reduce=True), bias=bias, w_pad=36, x_pad=8, y_pad=12), want)


@pytest.mark.parametrize("wg, rows", [(4, 1), (128, 3), (256, 2)])
def test_subgroup_matvec_any_workgroup_to_subgroup_ratio(gpu, wg, rows):
    """Workgroups of one subgroup or less (4) and of several (128, 256 over lavapipe's 4-128 lanes): the
    slots indexed by subgroup_id and the num_subgroups-long final sum."""
    rng = np.random.default_rng(wg)
    size, count = subgroup_shape(gpu, wg)
    assert count == groups(wg, size)
    m, k = 29, 32 * 37
    raw = random_weight(QT.Q8_0, m, k, rng)
    x = rng.standard_normal((2, k), dtype=np.float32)
    want = x @ dequantize_rows(raw, QT.Q8_0).reshape(m, k).T
    key = ShaderKey.of("matvec", W_Q8_0=True, WG=wg, ROWS=rows, REDUCE=True, SUBGROUP=True)
    check_close(run(gpu, key, raw, x, (groups(m, rows), 2, 1)), want)


def test_subgroup_matvec_folds_the_grid_past_65535_workgroups(gpu):
    rng = np.random.default_rng(1)
    m, k = 140_001, 8
    w = rng.standard_normal((m, k), dtype=np.float32)
    x = rng.standard_normal((1, k), dtype=np.float32)
    grid = matvec_grid(m, 1, reduce=True)
    assert grid[2] > 1 and grid[0] <= 65535 and m > 65535 * REDUCE_ROWS
    check_close(run(gpu, matvec_key(QT.F32, reduce=True, subgroup=True), w.view(np.uint8), x, grid), x @ w.T)


@pytest.mark.parametrize("subgroup", [False, True], ids=["tree", "subgroup"])
@pytest.mark.parametrize("rows, d", [(71, 68), (3, 2052), (70_000, 4)])
def test_rmsnorm_one_workgroup_per_row(gpu, rows, d, subgroup):
    """Rows shorter and longer than the workgroup, and more rows than 65535 workgroups (the z fold)."""
    rng = np.random.default_rng(rows + d)
    x = rng.standard_normal((rows, d), dtype=np.float32) * 3
    w = rng.standard_normal(d, dtype=np.float32)
    pad = 8
    (out,) = gpu.dispatch(rmsnorm_key(reduce=True, subgroup=subgroup), [np.concatenate([np.zeros(pad, np.float32), x.ravel()]), w],
                          [(pad + x.size) * 4], dict(rows=rows, d=d, eps=1e-6, x_off=pad, y_off=pad, w_off=0),
                          rmsnorm_grid(rows, reduce=True))
    want = x / np.sqrt(np.mean(np.square(x, dtype=np.float64), axis=-1, keepdims=True) + 1e-6) * w
    check_close(np.frombuffer(out, np.float32)[pad:].reshape(rows, d), want.astype(np.float32))


@pytest.mark.parametrize("length, ties", [(1, ()), (1000, (3, 700)), (1000, (130, 129)), (49_153, (17, 40_000)),
                                          (262_144, (262_143, 100_001, 100_000))])
def test_argmax_subgroup_passes(gpu, length, ties):
    """Ties in one subgroup, across subgroups and across workgroups (the lowest index wins), -inf logits."""
    rng = np.random.default_rng(length)
    x = rng.standard_normal(length, dtype=np.float32)
    x[: length // 2: 7] = -np.inf
    for i in ties:
        x[i] = 10.0
    chunk, parts, grid = argmax_pass1(length, subgroup=True)
    pass1, pass2 = argmax_keys(subgroup=True)
    (partial,) = gpu.dispatch(pass1, [x], [parts * 8], dict(len=length, chunk=chunk, x_off=0), grid)
    (result,) = gpu.dispatch(pass2, [np.frombuffer(partial, np.uint32)], [4], dict(len=parts, chunk=0, x_off=0), (1, 1, 1))
    assert int(np.frombuffer(result, np.uint32)[0]) == int(np.argmax(x))


def test_enable_line_per_compiler():
    """Tint needs `enable subgroups;` (first, before any declaration); naga rejects it."""
    key = matvec_key(QT.Q4_0, reduce=True, subgroup=True)
    tint, naga = Preprocessor(compiler="tint").build(key), Preprocessor(compiler="naga").build(key)
    assert tint.splitlines()[0] == "enable subgroups;" and tint.count("enable subgroups;") == 1
    assert "enable subgroups" not in naga and "subgroupAdd" in naga
    assert "enable" not in Preprocessor().build(matvec_key(QT.Q4_0, reduce=True))
