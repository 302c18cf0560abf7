"""pyshim.exec.ggml_cpu against llama.cpp's own CPU kernels (tests/fixtures/ggml_kernels.json, written by
tests/fixtures/make_ggml_kernels.py through the oracle's libggml): every result must be equal bit for
bit, since one ulp anywhere is enough to make a quantized model drift away from llama.cpp."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from pyshim.exec import ggml_cpu
from pyshim.models.ops import AttnSpec
from pyshim.exec.llama_cpp import ExactOps

FX = json.loads((Path(__file__).parent / "fixtures" / "ggml_kernels.json").read_text())
X = np.array(FX["x"], np.float32).reshape(FX["x_shape"])


def f32(values, shape=None) -> np.ndarray:
    a = np.array(values, np.float32)
    return a.reshape(shape) if shape is not None else a


def assert_bits_equal(got: np.ndarray, want: np.ndarray) -> None:
    got = np.asarray(got, np.float32).reshape(want.shape)
    differ = got.view(np.uint32) != want.view(np.uint32)
    assert not differ.any(), f"{int(differ.sum())} of {want.size} values differ, largest by {np.abs(got - want).max():.3g}"


def test_gelu_table_equals_ggmls():
    pick = np.array(FX["gelu_table"]["index"])
    want = np.array(FX["gelu_table"]["f16_bits"], np.uint16).view(np.float16).astype(np.float32)
    got = ggml_cpu.gelu_table()[pick]
    finite = np.isfinite(want)
    assert_bits_equal(got[finite], want[finite])


def test_expf_and_softmax_sum():
    x = f32(FX["softmax"]["x"])
    assert_bits_equal(ggml_cpu.expf(x), f32(FX["softmax"]["exp"]))
    chunks = ggml_cpu.reduce16(ggml_cpu.expf(x).reshape(-1, 16)).astype(np.float64)
    assert np.cumsum(chunks)[-1] == FX["softmax"]["sum"]


def test_expf_is_not_libm():
    # the polynomial differs from a correctly rounded exp somewhere in this range: if it did not,
    # the test above would not be checking the emulation at all
    x = np.linspace(-20, 20, 4001, dtype=np.float32)
    assert (ggml_cpu.expf(x) != np.exp(x.astype(np.float64)).astype(np.float32)).any()


def test_swiglu_with_libm_tail():
    assert_bits_equal(ggml_cpu.swiglu(X[0:1, :100], X[1:2, :100]), f32(FX["swiglu"], (1, 100)))


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q6_K"])
@pytest.mark.parametrize("rows", [("one", 1), ("three", 3), ("nine", 9)])
def test_quantized_matmul(qtype, rows):
    case = FX["matmul"][qtype]
    raw = np.frombuffer(bytes.fromhex(case["raw"]), np.uint8).reshape(case["rows"], -1)
    key, n = rows
    x = X[:n]
    got = ggml_cpu.matmul_q6_k(x, raw) if qtype == "Q6_K" else ggml_cpu.matmul_legacy(x, raw, QT[qtype])
    assert_bits_equal(got, f32(case[key], (n, case["rows"])))


@pytest.mark.parametrize("mode", ["normal", "neox"])
def test_rope(mode):
    x = f32(FX["rope"]["x"], (5, 3, 64))
    base = 10000.0 if mode == "normal" else 1000000.0
    cos, sin = ggml_cpu.rope_cos_sin(np.array(FX["rope"]["pos"]), 64, base)
    assert_bits_equal(ggml_cpu.rope(x, cos, sin, mode == "neox"), f32(FX["rope"][mode], x.shape))


def test_attention():
    a = FX["attention"]
    q, k, v = f32(a["q"], (6, 4, 64)), f32(a["k"], (6, 2, 64)), f32(a["v"], (6, 2, 64))
    spec = AttnSpec(layer=0, n_heads=4, n_kv_heads=2, head_dim=64, head_dim_v=64, scale=a["scale"])
    qh = q.reshape(6, 2, 2, 64).transpose(1, 2, 0, 3)
    visible = np.arange(6)[None, :] <= np.arange(6)[:, None]
    assert_bits_equal(ExactOps.__new__(ExactOps)._attend(qh, k, v, visible, spec), f32(a["out"], (6, 256)))


def test_fma_rounds_once():
    # 1 + 2^-24 is not a float: a separate multiply would round (1 + 2^-12)^2 and lose the 2^-24
    a = np.float32(1 + 2.0 ** -12)
    assert ggml_cpu.fma(a, a, np.float32(-1.0)) == np.float32(2.0 ** -11 + 2.0 ** -24)
    assert a * a - np.float32(1.0) == np.float32(2.0 ** -11)
