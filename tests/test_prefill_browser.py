"""The real-GPU prefill kernels in Chromium (Tint + SwiftShader here) against NumPy: the tiled matmul for
every weight type (ragged tiles, a bias and offsets) and the key-tiled causal attention over f32, f16, q8
and q4 caches (GQA, a wrapped sliding-window ring, softcap). One page runs every case (test_kernels_browser's
runner); one page per module."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from gpu_helpers import kv_slot, page_params, random_weight, step_map
from pyshim.gpu.policy import MATMUL_TILE, MATMUL_TILE_CPU
from pyshim.gpu.kernels import (WEIGHT_TYPES, attention_prefill_grid,
                                attention_prefill_key, matmul_grid, matmul_key, shader_block)
from pyshim.exec.reference import dequantize_rows
from pyshim.plan.settings import KV_TYPES
from test_kernels_browser import Cases, assert_all_pass, close, run_in_chromium


pytestmark = pytest.mark.browser


def causal_attention(q, keys, vals, positions, window, softcap, scale):
    """q [n, heads, hd] at `positions`; keys/vals [positions..., kv_heads, hd] by position -> [n, heads * hd]."""
    n, heads, hd = q.shape
    group = heads // keys.shape[1]
    out = np.zeros((n, heads, vals.shape[-1]), np.float64)
    for t, p in enumerate(positions):
        seen = np.arange(max(0, p - window + 1) if window else 0, p + 1)
        for h in range(heads):
            s = keys[seen, h // group].astype(np.float64) @ q[t, h] * scale
            if softcap:
                s = softcap * np.tanh(s / softcap)
            e = np.exp(s - s.max())
            out[t, h] = (e / e.sum()) @ vals[seen, h // group]
    return out.reshape(n, -1).astype(np.float32)


def cache_bytes(rows: np.ndarray, kv_type: str, rng) -> tuple[np.ndarray, np.ndarray]:
    """Values [slots, kv_heads, hd] as the cache holds them -> (bytes, the values they decode to)."""
    if kv_type == "f32":
        return rows, rows
    if kv_type == "f16":
        half = rows.astype(np.float16)
        return half, half.astype(np.float32)
    blocks = rows.reshape(-1, KV_TYPES[kv_type].block)
    if kv_type == "q4":
        # per block of 32 along the head: 16 bytes of levels (value 2b in the low nibble of byte b, 2b + 1
        # in the high one), then the f32 scale; value (level - 8) * d
        levels = rng.integers(0, 16, size=blocks.shape).astype(np.uint8)
        d = (np.abs(blocks).max(axis=1) / 8).astype(np.float32)
        nibbles = levels[:, 0::2] | (levels[:, 1::2] << 4)
        packed = np.concatenate([nibbles, d[:, None].view(np.uint8)], axis=1)
        return packed, ((levels.astype(np.float32) - 8) * d[:, None]).reshape(rows.shape)
    # q8: per block of 32 along the head, 32 int8 then the f32 scale
    q = rng.integers(-127, 128, size=blocks.shape).astype(np.int8)
    d = (np.abs(blocks).max(axis=1) / 127).astype(np.float32)
    packed = np.concatenate([q.view(np.uint8), d[:, None].view(np.uint8)], axis=1)
    return packed, (q.astype(np.float32) * d[:, None]).reshape(rows.shape)


def add_attention_case(c: Cases, rng, *, heads, kv_heads, hd, window, softcap, first, n, cap, kv_type):
    """Queries at positions first..first+n-1; every key position up to the last one written to its slot in
    page_row(cap)'s pages (the ring after kv_write), the ones a query needs being the last window + n - 1
    (cap >= that)."""
    last = first + n - 1
    keys = rng.standard_normal((last + 1, kv_heads, hd), dtype=np.float32)
    vals = rng.standard_normal((last + 1, kv_heads, hd), dtype=np.float32)
    kc = np.zeros((cap, kv_heads, hd), np.float32)
    vc = np.zeros((cap, kv_heads, hd), np.float32)
    for j in range(last + 1):
        kc[kv_slot(j, cap)], vc[kv_slot(j, cap)] = keys[j], vals[j]
    kc_bytes, kc_seen = cache_bytes(kc, kv_type, rng)
    vc_bytes, vc_seen = cache_bytes(vc, kv_type, rng)
    for j in range(last + 1):
        keys[j], vals[j] = kc_seen[kv_slot(j, cap)], vc_seen[kv_slot(j, cap)]
    positions = np.arange(first, last + 1)
    q = rng.standard_normal((n, heads, hd), dtype=np.float32)
    want = causal_attention(q, keys, vals, positions, window, softcap, hd ** -0.5)
    c.add(f"attention_prefill {kv_type} heads={heads}/{kv_heads} hd={hd} window={window} softcap={softcap}",
          attention_prefill_key(hd, hd, softcap > 0, kv_type), [q, kc_bytes, vc_bytes, step_map(positions, cap)],
          [want.nbytes], dict(n=n, heads=heads, kv_heads=kv_heads, window=window, scale=hd ** -0.5,
                              softcap=softcap, pos_off=0, q_off=0, out_off=0, **page_params(n, cap)),
          attention_prefill_grid(n, heads, kv_heads), close(want, rel=1e-4))


def build_cases() -> Cases:
    c = Cases()
    rng = np.random.default_rng(77)
    for qtype in WEIGHT_TYPES:
        per = shader_block(qtype)[0]
        k = 3 * max(per, 32) if per < 256 else 512
        for tile in (MATMUL_TILE, MATMUL_TILE_CPU):
            m, n = tile[0] + 13, tile[1] + 5
            raw = random_weight(qtype, m, k, rng)
            x = rng.standard_normal((n, k), dtype=np.float32)
            want = x @ dequantize_rows(raw, qtype).reshape(m, k).T
            c.add(f"matmul {qtype.name} tile {tile}", matmul_key(qtype, tile=tile), [raw, x], [want.nbytes],
                  dict(m=m, k=k, n=n, row_bytes=raw.shape[1], w_off=0, x_off=0, y_off=0, bias_off=0, y_stride=m),
                  matmul_grid(m, n, tile), close(want))
    # a bias, and the tensors at offsets in their buffers
    qtype, m, k, n = QT.Q6_K, 7, 256, 3
    raw = random_weight(qtype, m, k, rng)
    x = rng.standard_normal((n, k), dtype=np.float32)
    bias = rng.standard_normal(m, dtype=np.float32)
    want = x @ dequantize_rows(raw, qtype).reshape(m, k).T + bias
    c.add("matmul Q6_K bias offsets", matmul_key(qtype, bias=True),
          [np.concatenate([np.zeros(36, np.uint8), raw.reshape(-1)]), np.concatenate([np.zeros(8, np.float32), x.reshape(-1)]), bias],
          [(12 + n * m) * 4], dict(m=m, k=k, n=n, row_bytes=raw.shape[1], w_off=36, x_off=8, y_off=12, bias_off=0, y_stride=m),
          matmul_grid(m, n), close(np.concatenate([np.zeros(12, np.float32), want.reshape(-1)])))
    add_attention_case(c, rng, heads=6, kv_heads=2, hd=64, window=0, softcap=0.0, first=0, n=45, cap=64, kv_type="f32")
    add_attention_case(c, rng, heads=4, kv_heads=1, hd=256, window=9, softcap=5.0, first=30, n=12, cap=32, kv_type="f16")
    add_attention_case(c, rng, heads=4, kv_heads=2, hd=32, window=6, softcap=0.0, first=10, n=9, cap=16, kv_type="q8")
    add_attention_case(c, rng, heads=8, kv_heads=2, hd=64, window=0, softcap=0.0, first=5, n=7, cap=16, kv_type="q4")
    return c


def test_prefill_kernels_in_chromium(chromium, dev_server):
    cases = build_cases()
    assert_all_pass(cases, run_in_chromium(chromium, dev_server, cases))
    assert len(cases.checks) == 23
