"""The reference executor's ops against plain loop-by-loop formulas (the GPU kernels are checked against
these ops), and its two memory modes and byte sources against each other."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from pyshim.gguf.header import read_header
from pyshim.exec.loading import load_reference
from pyshim.exec.reference import ReferenceOps
from pyshim.models.ops import AttnSpec
from pyshim.models.rope import RopeSpec, cos_sin
from pyshim.gguf.tensors import BufferSource
from tiny_models import QT, test_ids as tiny_ids, write_tiny_model

RNG = np.random.default_rng(0)


def _ops(n_ctx=32, window=0, n_layers=1, n_kv=2, hd=8):
    class Spec:     # the few fields KVCache reads
        sliding_window = window
        swa_layers = (window > 0,) * n_layers
        n_kv_heads, head_dim_k, head_dim_v = n_kv, hd, hd

        def kv_heads(self, layer):
            return n_kv

        def head_dims(self, layer):
            return hd, hd
    Spec.n_layers = n_layers
    return ReferenceOps(store=None, spec=Spec(), n_ctx=n_ctx)


def _ggml_angles(spec: RopeSpec, pos: int) -> list[float]:
    """ggml's rope_yarn angles for one position, scalar by scalar (theta *= theta_scale per pair)."""
    theta_scale = spec.base ** (-2.0 / spec.dims)
    freq_scale = 1.0 / spec.factor if spec.scaling in ("linear", "yarn") else 1.0
    out, theta = [], float(pos)
    if spec.scaling == "yarn":
        def corr(n_rot):
            return spec.dims * math.log(spec.n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(spec.base))
        low, high = max(0.0, math.floor(corr(32.0))), min(spec.dims - 1.0, math.ceil(corr(1.0)))
    for i0 in range(0, spec.dims, 2):
        interp = freq_scale * theta
        if spec.scaling == "yarn":
            y = (i0 // 2 - low) / max(0.001, high - low)
            mix = 1 - min(1.0, max(0.0, y))
            interp = interp * (1 - mix) + theta * mix
        out.append(interp)
        theta *= theta_scale
    return out


@pytest.mark.parametrize("spec", [
    RopeSpec(dims=16, base=10000.0, neox=True),
    RopeSpec(dims=16, base=500000.0, neox=False, scaling="linear", factor=4.0),
    RopeSpec(dims=16, base=10000.0, neox=True, scaling="yarn", factor=8.0, n_ctx_orig=64),
])
def test_rope_angles_follow_ggml(spec):
    positions = np.array([0, 1, 7, 300])
    cos, sin = cos_sin(spec, positions)
    mscale = (1 + 0.1 * math.log(spec.factor)) if spec.scaling == "yarn" else 1.0
    for row, pos in enumerate(positions):
        angles = np.array(_ggml_angles(spec, int(pos)))
        np.testing.assert_allclose(cos[row], np.cos(angles) * mscale, atol=1e-5)
        np.testing.assert_allclose(sin[row], np.sin(angles) * mscale, atol=1e-5)


@pytest.mark.parametrize("neox", [True, False])
def test_rope_rotates_the_right_pairs_and_leaves_the_rest(neox):
    spec = RopeSpec(dims=4, base=100.0, neox=neox)
    x = RNG.standard_normal((2, 3, 6)).astype(np.float32)        # [n, heads, head_dim]: 2 dims pass through
    out = _ops().rope(x, np.array([3, 5]), spec)
    cos, sin = cos_sin(spec, np.array([3, 5]))
    pairs = [(0, 2), (1, 3)] if neox else [(0, 1), (2, 3)]
    for t in range(2):
        for i, (a, b) in enumerate(pairs):
            np.testing.assert_allclose(out[t, :, a], x[t, :, a] * cos[t, i] - x[t, :, b] * sin[t, i], atol=1e-6)
            np.testing.assert_allclose(out[t, :, b], x[t, :, b] * cos[t, i] + x[t, :, a] * sin[t, i], atol=1e-6)
    np.testing.assert_array_equal(out[..., 4:], x[..., 4:])


def _naive_attention(q, k, v, qpos, kpos, spec: AttnSpec):
    n, hq, hd = q.shape
    out = np.zeros((n, hq, v.shape[2]))
    for t in range(n):
        for h in range(hq):
            kv = h // (spec.n_heads // spec.n_kv_heads)
            seen = [j for j in range(len(kpos)) if kpos[j] <= qpos[t] and (not spec.window or qpos[t] - kpos[j] < spec.window)]
            s = np.array([q[t, h] @ k[j, kv] * spec.scale for j in seen])
            if spec.softcap:
                s = spec.softcap * np.tanh(s / spec.softcap)
            p = np.exp(s - s.max())
            out[t, h] = (p / p.sum()) @ v[seen, kv]
    return out.reshape(n, -1)


@pytest.mark.parametrize("window,softcap", [(0, 0.0), (3, 0.0), (0, 5.0), (5, 2.0)])
def test_attention_against_naive_loops(window, softcap):
    spec = AttnSpec(layer=0, n_heads=4, n_kv_heads=2, head_dim=8, head_dim_v=8, scale=0.3, window=window, softcap=softcap)
    ops = _ops(window=window)
    n1, n2 = 6, 4
    q, k, v = (RNG.standard_normal((n1 + n2, h, 8)).astype(np.float32) for h in (4, 2, 2))
    pos = np.arange(n1 + n2)
    first = ops.attention(q[:n1], k[:n1], v[:n1], pos[:n1], spec)       # prefill, then a second chunk
    second = ops.attention(q[n1:], k[n1:], v[n1:], pos[n1:], spec)
    want = _naive_attention(q, k, v, pos, pos, spec)
    np.testing.assert_allclose(np.concatenate([first, second]), want, atol=1e-5)
    if window:
        assert ops.kv[0].capacity == window


def test_glu_and_rmsnorm():
    ops = _ops()
    g, u = RNG.standard_normal((3, 5)).astype(np.float32), RNG.standard_normal((3, 5)).astype(np.float32)
    np.testing.assert_allclose(ops.glu(g, u, "silu"), g / (1 + np.exp(-g)) * u, rtol=1e-6)
    gelu = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))
    np.testing.assert_allclose(ops.glu(g, u, "gelu_tanh"), gelu * u, rtol=1e-5, atol=1e-6)

    class W:
        shape = (5,)

        @staticmethod
        def dense():
            return np.arange(1, 6, dtype=np.float32)
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    want = x / np.sqrt((x.astype(np.float64) ** 2).mean(axis=1, keepdims=True) + 1e-6) * W.dense()
    np.testing.assert_allclose(ops.rmsnorm(x, W, 1e-6), want, rtol=1e-5)


def test_per_call_dequantization_and_in_memory_bytes_match_the_cached_mmap(tmp_path):
    path = write_tiny_model(tmp_path, "qwen2", QT.Q4_K)
    ids = tiny_ids()
    want = load_reference(path).logits(ids, all_logits=True)
    per_call = load_reference(path, cache_weights=False).logits(ids, all_logits=True)
    data = Path(path).read_bytes()          # as in Pyodide: the bytes came from elsewhere, no file, no mmap
    in_memory = load_reference(header=read_header(data, file_size=len(data)), source=BufferSource(data)).logits(ids, all_logits=True)
    np.testing.assert_allclose(per_call, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(in_memory, want)
