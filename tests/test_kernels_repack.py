"""The grouped Q4_0, Q8_0 and Q6_K layouts of the int8 route (repack.wgsl), natively: the in-place rearrangement
against a NumPy statement of the layout (i8_emulation.grouped), then the int8 matvec and the embedding reading it
against the same arithmetic on the file layout. Block counts that leave the last group partial; one device
for the module."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import i8_emulation as emu
from gpu_helpers import GPU, random_weight
from pyshim.gpu.kernels import (GROUPED_TYPES, I8_ACTIVATIONS, MAX_GROUPS, UNIFORM_X_BYTES, WG, embed_key, groups,
                                matvec_i8_grid, matvec_i8_key, repack_bytes, repack_grid, repack_key, xq_row_words)
from pyshim.plan.memory import group_bytes
from pyshim.exec.reference import dequantize_rows
from test_kernels_i8 import activations, check

@pytest.fixture(scope="module")
def gpu():
    g = GPU()
    yield g
    g.close()


TYPES = pytest.mark.parametrize("qtype", sorted(GROUPED_TYPES), ids=lambda t: t.name)
BLOCK = {QT.Q4_0: 32, QT.Q8_0: 32, QT.Q6_K: 256}
K = {QT.Q4_0: 288, QT.Q8_0: 288, QT.Q6_K: 768}     # 9 and 3 blocks a row: rows start mid-group


def repacked_buffer(gpu, raw: np.ndarray, qtype):
    """raw (rows, row_bytes) uploaded as the file's bytes, then rearranged in place on the GPU."""
    nbytes = repack_bytes(*raw.shape, qtype)
    buf = gpu.device.buffer(nbytes, label="w")
    gpu.device.write(buf, raw.reshape(-1))      # the padding stays zero, as in a fresh buffer
    n_groups = nbytes // group_bytes(qtype)
    gpu.dispatch(repack_key(qtype), [buf], [], dict(groups=n_groups, first=0), repack_grid(n_groups))
    return buf, nbytes


@TYPES
@pytest.mark.parametrize("rows, blocks", [(67, 9), (1, 1), (16, 2)])
def test_repack_is_the_grouped_layout(gpu, qtype, rows, blocks):
    k = blocks * BLOCK[qtype]
    raw = random_weight(qtype, rows, k, np.random.default_rng(rows + k))
    buf, nbytes = repacked_buffer(gpu, raw, qtype)
    got = np.frombuffer(gpu.run(gpu.device.read(buf, nbytes)), np.uint8)
    np.testing.assert_array_equal(got, emu.grouped(raw, qtype))


@TYPES
def test_repack_of_some_groups_leaves_the_others_as_they_were(gpu, qtype):
    """An expert cache rearranges only the slot a streamed expert was written into (groups first..)."""
    expert_rows, experts = 16, 3                # an expert: 32 blocks, 4 whole groups
    k = 2 * BLOCK[qtype]
    raw = random_weight(qtype, expert_rows * experts, k, np.random.default_rng(7))
    nbytes = repack_bytes(*raw.shape, qtype)
    buf = gpu.device.buffer(nbytes, label="w")
    gpu.device.write(buf, raw.reshape(-1))
    per = expert_rows * raw.shape[1] // group_bytes(qtype)
    gpu.dispatch(repack_key(qtype), [buf], [], dict(groups=per, first=per), repack_grid(per))
    got = np.frombuffer(gpu.run(gpu.device.read(buf, nbytes)), np.uint8)
    flat, at = raw.reshape(-1), per * group_bytes(qtype)
    np.testing.assert_array_equal(got[:at], flat[:at])
    np.testing.assert_array_equal(got[at:2 * at], emu.grouped(raw[expert_rows:2 * expert_rows], qtype))
    np.testing.assert_array_equal(got[2 * at:], flat[2 * at:])


def test_repack_grid_wraps_past_the_dispatch_limit():
    x, y, z = repack_grid(MAX_GROUPS * WG * 3 + 5)
    assert x <= MAX_GROUPS and z == 1 and x * y * WG >= MAX_GROUPS * WG * 3 + 5
    assert repack_grid(10) == (1, 1, 1)


@TYPES
@pytest.mark.parametrize("variant", ["rows1", "rows4", "uniform_rows4", "bias", "tokens4"])
def test_matvec_i8_grouped(gpu, qtype, variant):
    rng = np.random.default_rng(len(variant))
    m, k, fmt = 67, K[qtype], I8_ACTIVATIONS[qtype]
    n = {"uniform_rows4": 1, "tokens4": 7}.get(variant, 3)
    raw = random_weight(qtype, m, k, rng)
    q, info = emu.quantize(activations(rng, n, k), fmt)
    want = emu.matvec(raw, qtype, q, info)
    buf, _ = repacked_buffer(gpu, raw, qtype)
    words = emu.pack(q, info)
    x_in = words
    if variant.startswith("uniform"):
        x_in = gpu.device.buffer(UNIFORM_X_BYTES, label="xq", also_uniform=True)
        gpu.device.write(x_in, words)
        x_in = (x_in, 0, UNIFORM_X_BYTES)
    bias = rng.standard_normal(m, dtype=np.float32) if variant == "bias" else None
    rows = 1 if variant == "rows1" else 4
    tokens = 4 if variant == "tokens4" else None
    key = matvec_i8_key(qtype, bias=bias is not None, uniform_x=variant.startswith("uniform"), rows=rows, tokens=tokens)
    (out,) = gpu.dispatch(key, [buf, x_in] + ([bias] if bias is not None else []), [n * m * 4],
                          dict(m=m, k=k, n=n, row_bytes=raw.shape[1], w_off=0, x_off=0, y_off=0, bias_off=0, y_stride=m,
                               pair_off=0, x_row_words=xq_row_words(k, fmt)), matvec_i8_grid(m, n, rows=rows, tokens=tokens or 1))
    check(np.frombuffer(out, np.float32).reshape(n, m), want + (bias if bias is not None else 0))


@TYPES
def test_embed_grouped(gpu, qtype):
    vocab, d = 37, 3 * BLOCK[qtype]
    raw = random_weight(qtype, vocab, d, np.random.default_rng(3))
    buf, _ = repacked_buffer(gpu, raw, qtype)
    tokens = np.array([5, 36, 0, 5, 17], dtype=np.uint32)
    (out,) = gpu.dispatch(embed_key(qtype, grouped=True), [buf, tokens], [len(tokens) * d * 4],
                          dict(d=d, n=len(tokens), row_bytes=raw.shape[1], w_off=0, tok_off=0, out_off=0, row0=0, rows=vocab),
                          (groups(d // BLOCK[qtype]), len(tokens), 1))
    want = dequantize_rows(raw[tokens.astype(np.int64)], qtype).reshape(len(tokens), d)
    np.testing.assert_array_equal(np.frombuffer(out, np.float32).reshape(len(tokens), d), want)
