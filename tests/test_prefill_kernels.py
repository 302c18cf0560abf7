"""The prefill kernels for real GPUs — the workgroup-tiled matmul (matmul.wgsl) and the key-tiled causal
attention (attention_prefill.wgsl) — on the native device (lavapipe here) against NumPy: every weight
type, token counts and sizes that are not multiples of the tiles, the three KV cache types, GQA, sliding
window rings and softcap."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from pyshim.gpu.policy import MATMUL_TILE, MATMUL_TILE_CPU
from pyshim.gpu.kernels import (WEIGHT_TYPES, attention_prefill_grid, attention_prefill_key,
                                matmul_grid, matmul_key, shader_block)
from pyshim.exec.kvcache import ROUNDING
from pyshim.models.ops import AttnSpec
from pyshim.plan.settings import KV_TYPES
from pyshim.exec.reference import ReferenceOps, dequantize_rows
from gpu_helpers import GPU, page_params, random_weight


@pytest.fixture(scope="module")
def gpu():
    g = GPU()
    yield g
    g.close()


def f32(data: bytes, shape) -> np.ndarray:
    return np.frombuffer(data, dtype=np.float32)[: int(np.prod(shape))].reshape(shape)


def check_close(got, want, rel=2e-5):
    scale = float(np.max(np.abs(want))) or 1.0
    np.testing.assert_allclose(got, want, rtol=rel, atol=rel * scale)


def run_matmul(gpu, qtype, raw, x, *, bias=None, w_pad=0, x_pad=0, y_pad=0, tile=MATMUL_TILE):
    """raw uint8 (m, row_bytes); x (n, k) -> y (n, m); pads put the tensors at offsets in their buffers."""
    m, row_bytes = raw.shape
    n, k = x.shape
    w = np.concatenate([np.zeros(w_pad, np.uint8), raw.reshape(-1)])
    xs = np.concatenate([np.zeros(x_pad, np.float32), x.reshape(-1)])
    inputs = [w, xs] + ([bias] if bias is not None else [])
    (out,) = gpu.dispatch(matmul_key(qtype, bias=bias is not None, tile=tile), inputs, [(y_pad + n * m) * 4],
                          dict(m=m, k=k, n=n, row_bytes=row_bytes, w_off=w_pad, x_off=x_pad, y_off=y_pad, bias_off=0,
                               y_stride=m), matmul_grid(m, n, tile))
    return f32(out, (y_pad + n * m,))[y_pad:].reshape(n, m)


@pytest.mark.parametrize("tile", [MATMUL_TILE, MATMUL_TILE_CPU], ids=["gpu_tile", "cpu_tile"])
@pytest.mark.parametrize("qtype", list(WEIGHT_TYPES), ids=lambda t: t.name)
def test_matmul_random_blocks(gpu, qtype, tile):
    rng = np.random.default_rng(int(qtype) + 100)
    per = shader_block(qtype)[0]
    # k: not a multiple of the 64-wide k step where the block allows it (odd block counts also put
    # 2-byte-aligned blocks at odd offsets); m and n: a full tile and a ragged one
    k = 3 * max(per, 32) if per < 256 else 512
    m, n = tile[0] + 13, tile[1] + 5
    raw = random_weight(qtype, m, k, rng)
    x = rng.standard_normal((n, k), dtype=np.float32)
    want = x @ dequantize_rows(raw, qtype).reshape(m, k).T
    check_close(run_matmul(gpu, qtype, raw, x, tile=tile), want)


@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q6_K, QT.F16], ids=lambda t: t.name)
def test_matmul_bias_offsets_and_few_tokens(gpu, qtype):
    rng = np.random.default_rng(5)
    k, m = 256, 7
    raw = random_weight(qtype, m, k, rng)
    bias = rng.standard_normal(m, dtype=np.float32)
    for n in (2, 3):
        x = rng.standard_normal((n, k), dtype=np.float32)
        want = x @ dequantize_rows(raw, qtype).reshape(m, k).T + bias
        check_close(run_matmul(gpu, qtype, raw, x, bias=bias, w_pad=36, x_pad=8, y_pad=12), want)


def prefill_attention_case(gpu, *, n_heads, n_kv, hd, window, softcap, steps, cap, kv_type="f32"):
    """Through kv_write and attention_prefill, chunk by chunk (`steps`: token counts), against the
    reference executor's attention over the same chunks. Cache types other than f32 round K and V, so
    the reference sees the rounded values (read back from the cache through the decode path's layout)."""
    rng = np.random.default_rng(n_heads * 100 + hd + window + len(kv_type))
    from pyshim.exec.kvcache import KVCache

    spec_m = SimpleNamespace(sliding_window=window, swa_layers=[bool(window)], n_layers=1, n_kv_heads=n_kv,
                             head_dim_k=hd, head_dim_v=hd, kv_heads=lambda layer: n_kv, head_dims=lambda layer: (hd, hd),
                             kv_row=lambda layer: (n_kv * hd, n_kv * hd))
    ref = ReferenceOps.__new__(ReferenceOps)
    ref.kv = KVCache(spec_m, sum(steps))
    attn = AttnSpec(layer=0, n_heads=n_heads, n_kv_heads=n_kv, head_dim=hd, head_dim_v=hd, scale=hd ** -0.5,
                    window=window, softcap=softcap)
    cell = KV_TYPES[kv_type].bytes_per_value
    kc = gpu.device.buffer(int(cap * n_kv * hd * cell), label="kc")
    vc = gpu.device.buffer(int(cap * n_kv * hd * cell), label="vc")
    key = attention_prefill_key(hd, hd, softcap > 0, kv_type)
    start = 0
    for count in steps:
        positions = np.arange(start, start + count, dtype=np.int64)
        q = rng.standard_normal((count, n_heads, hd), dtype=np.float32)
        k = rng.standard_normal((count, n_kv, hd), dtype=np.float32)
        v = rng.standard_normal((count, n_kv, hd), dtype=np.float32)
        k, v = rounded(k, kv_type), rounded(v, kv_type)
        want = ref.attention(q, k, v, positions, attn)
        pos_buf = gpu.write_kv(k, v, positions, kc, vc, cap, kv_type)
        params = dict(n=count, heads=n_heads, kv_heads=n_kv, window=window, scale=attn.scale,
                      softcap=softcap, pos_off=0, q_off=0, out_off=0, **page_params(count, cap))
        (out,) = gpu.dispatch(key, [q, kc, vc, pos_buf], [want.nbytes], params,
                              attention_prefill_grid(count, n_heads, n_kv))
        check_close(f32(out, want.shape), want, rel=1e-4)
        start += count


def rounded(a: np.ndarray, kv_type: str) -> np.ndarray:
    """K or V as the cache stores them (f16 halves, q8 or q4 blocks)."""
    return ROUNDING[kv_type](a)


def test_prefill_attention_gqa_many_tiles(gpu):
    # 3 query heads per KV head (21 tokens per workgroup), 70 tokens in 2 chunks: many key tiles of 32,
    # ragged workgroups and tiles
    prefill_attention_case(gpu, n_heads=6, n_kv=2, hd=64, window=0, softcap=0.0, steps=[45, 25], cap=80)


def test_prefill_attention_sliding_window_ring_and_softcap(gpu):
    # window 9 over chunks of 12: a ring of two pages (window + chunk - 1 = 20 slots needed) wraps; head 256
    # (8-key tiles)
    prefill_attention_case(gpu, n_heads=4, n_kv=1, hd=256, window=9, softcap=5.0, steps=[12, 12, 12, 7], cap=32)


@pytest.mark.parametrize("kv_type", ["f16", "q8", "q4"])
def test_prefill_attention_kv_types(gpu, kv_type):
    prefill_attention_case(gpu, n_heads=4, n_kv=2, hd=32, window=6, softcap=0.0, steps=[10, 9], cap=16, kv_type=kv_type)
