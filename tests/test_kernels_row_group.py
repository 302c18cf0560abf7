"""The int8 route's rows interleaved in groups (interleave.wgsl, include/row_group.wgsl): the kernel
rearranges whole groups as numpy's transpose does (Q4_K's 144-byte blocks, and Q6_K's 210-byte ones two
at a time), and every kernel that reads such a weight (matvec_i8 one token, half a group or a group an
invocation, the fused gate-and-up, several tokens with a bias; embed; Q6_K then in repack.wgsl's groups)
gives bit for bit what it gives on the file's layout; through the executor's slots, chunk by chunk, a
model's logits do not change, and a weight split where a group would straddle two parts keeps the file's
layout. One device for the module."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import i8_emulation as emu
import tiny_models
from gpu_helpers import GPU, random_weight
from pyshim.gpu import slots as slots_module
from pyshim.gpu.kernels import (GROUPED_TYPES, PARAMS, UNIFORM_X_BYTES, embed_key, groups, interleave_key, matvec_i8_grid,
                                matvec_i8_key, repack_grid, shader_block, xq_row_words)
from pyshim.plan.settings import Arithmetic
from runners import Drive, gpu as gpu_model

TYPES = pytest.mark.parametrize("qtype, g", [(QT.Q4_K, 8), (QT.Q6_K, 4)], ids=["Q4_K", "Q6_K"])


@pytest.fixture(scope="module")
def gpu():
    g = GPU()
    yield g
    g.close()


def interleaved(raw: np.ndarray, qtype, g: int) -> np.ndarray:
    """raw [m, row_bytes] (m a multiple of g) in the row-grouped layout: block b of a group's rows together."""
    m, row_bytes = raw.shape
    bb = shader_block(qtype)[1]
    return raw.reshape(m // g, g, row_bytes // bb, bb).transpose(0, 2, 1, 3).reshape(m, row_bytes)


def as_read(raw: np.ndarray, qtype) -> np.ndarray:
    """What the int8 kernels read: the grouped types in repack.wgsl's layout (tests/i8_emulation.py)."""
    return emu.grouped(raw, qtype) if qtype in GROUPED_TYPES else raw


@TYPES
def test_interleave_rewrites_whole_groups_from_a_copy(gpu, qtype, g):
    """Groups 2..4 of 6 (a chunk, as the slots do it): copied out, written back interleaved at dst_off;
    the other groups untouched."""
    rng = np.random.default_rng(0)
    bb = shader_block(qtype)[1]
    m, nb = 6 * g, 3
    raw = rng.integers(0, 256, (m, nb * bb), dtype=np.uint8)
    dst = gpu.upload(raw.reshape(-1))
    gb = g * nb * bb
    src = np.concatenate([raw.reshape(-1)[2 * gb:5 * gb], np.zeros(16, np.uint8)])
    blocks = 3 * g * nb
    key = interleave_key(g, bb)
    pipe = gpu.run(gpu.kernels.get(key))
    p = gpu.device.buffer(PARAMS["interleave"].nbytes, label="p", uniform=True)
    gpu.device.write(p, PARAMS["interleave"].pack(blocks=blocks, row_blocks=nb, block_bytes=bb, dst_off=2 * gb // 4))
    pairs = "PAIRS" in dict(key.defines)
    assert pairs == (qtype == QT.Q6_K)
    gpu.device.submit([(pipe, gpu.device.bind_group(pipe, [gpu.upload(src), dst, p]), repack_grid(blocks // 2 if pairs else blocks))])
    got = np.frombuffer(gpu.run(gpu.device.read(dst, raw.nbytes)), np.uint8).reshape(m, -1)
    want = raw.copy()
    want[2 * g:5 * g] = interleaved(raw[2 * g:5 * g], qtype, g)
    np.testing.assert_array_equal(got, want)


@TYPES
@pytest.mark.parametrize("variant", ["group_uniform", "half_group", "glu_group", "tokens8_rows2_bias"])
def test_matvec_i8_reads_row_groups_as_the_file_layout(gpu, qtype, g, variant):
    rng = np.random.default_rng(len(variant) + int(qtype))
    k, m, n = 3 * 256, 9 * g, 3 if variant.startswith("tokens") else 1
    glu = variant.startswith("glu")
    raw = random_weight(qtype, 2 * m if glu else m, k, rng)
    q, info = emu.quantize(rng.standard_normal((n, k), dtype=np.float32), "q8_k")
    words = emu.pack(q, info)
    rows = g // 2 if variant == "half_group" else 2 if variant.startswith("tokens") else g
    tokens = 8 if variant.startswith("tokens") else None
    uniform_x = variant.endswith("uniform")
    bias = rng.standard_normal(m, dtype=np.float32) if variant.endswith("bias") else None
    outs = []
    for row_group, data in ((1, as_read(raw, qtype)), (g, as_read(interleaved(raw, qtype, g), qtype))):
        x_in = words
        if uniform_x:
            x_in = gpu.device.buffer(UNIFORM_X_BYTES, label="x", also_uniform=True)
            gpu.device.write(x_in, words)
            x_in = (x_in, 0, UNIFORM_X_BYTES)
        key = matvec_i8_key(qtype, rows=rows, uniform_x=uniform_x, glu="silu" if glu else None, tokens=tokens,
                            bias=bias is not None, row_group=row_group)
        (out,) = gpu.dispatch(key, [data.reshape(-1), x_in] + ([bias] if bias is not None else []), [n * m * 4],
                              dict(m=m, k=k, n=n, row_bytes=raw.shape[1], w_off=0, x_off=0, y_off=0, bias_off=0, y_stride=m,
                                   pair_off=0, x_row_words=xq_row_words(k, "q8_k")),
                              matvec_i8_grid(m, n, rows, tokens or 1))
        outs.append(np.frombuffer(out, np.float32))
    assert np.abs(outs[0]).max() > 0
    np.testing.assert_array_equal(outs[1], outs[0])


@pytest.mark.parametrize("rows, g, n", [(4, 4, 1), (2, 1, 1), (4, 4, 3)], ids=["groups_of_4", "file_layout_2_rows", "tokens"])
def test_spread_invocations_give_the_same_rows(gpu, rows, g, n):
    """matvec_i8 SPREAD (KernelPolicy.phase_spread) only reorders which invocation of a workgroup takes which
    rows: Q6_K rows of an odd block count, three workgroups of 16 (the last partly past m), one token or a
    prompt's (8 an invocation), bit for bit the plain order's results."""
    rng = np.random.default_rng(11)
    k, m, wg = 3 * 256, 33 * 4, 16
    tokens = 8 if n > 1 else None
    raw = random_weight(QT.Q6_K, m, k, rng)
    data = as_read(raw if g == 1 else interleaved(raw, QT.Q6_K, g), QT.Q6_K)
    q, info = emu.quantize(rng.standard_normal((n, k), dtype=np.float32), "q8_k")
    words = emu.pack(q, info)
    outs = []
    for spread in (False, True):
        key = matvec_i8_key(QT.Q6_K, rows=rows, row_group=g, wg=wg, spread=spread, tokens=tokens)
        (out,) = gpu.dispatch(key, [data.reshape(-1), words], [n * m * 4],
                              dict(m=m, k=k, n=n, row_bytes=raw.shape[1], w_off=0, x_off=0, y_off=0, bias_off=0, y_stride=m,
                                   pair_off=0, x_row_words=xq_row_words(k, "q8_k")),
                              matvec_i8_grid(m, n, rows, tokens or 1, wg))
        outs.append(np.frombuffer(out, np.float32))
    assert matvec_i8_grid(m, n, rows, tokens or 1, wg)[0] * wg * rows > m and np.all(outs[0] != 0)
    np.testing.assert_array_equal(outs[1], outs[0])


@TYPES
def test_embed_reads_row_groups_as_the_file_layout(gpu, qtype, g):
    vocab, d = 10 * g, 2 * 256
    raw = random_weight(qtype, vocab, d, np.random.default_rng(3))
    tokens = np.array([5, vocab - 1, 0, 5, 17], dtype=np.uint32)
    outs = []
    for row_group, data in ((1, as_read(raw, qtype)), (g, as_read(interleaved(raw, qtype, g), qtype))):
        (out,) = gpu.dispatch(embed_key(qtype, grouped=qtype in GROUPED_TYPES, row_group=row_group), [data.reshape(-1), tokens],
                              [len(tokens) * d * 4],
                              dict(d=d, n=len(tokens), row_bytes=raw.shape[1], w_off=0, tok_off=0, out_off=0, row0=0, rows=vocab),
                              (groups(d // 256), len(tokens), 1))
        outs.append(np.frombuffer(out, np.float32))
    np.testing.assert_array_equal(outs[1], outs[0])


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q6_K], ids=lambda t: t.name)
def test_row_groups_through_the_slots_change_no_logit(tmp_path, monkeypatch, qtype):
    """A model interleaved one group a chunk (the scratch buffer's least; Q6_K then grouped by repack.wgsl):
    its int8 logits equal the file layout's exactly, also with a binding limit that splits its weights
    (between groups)."""
    monkeypatch.setattr(slots_module, "INTERLEAVE_CHUNK", 1)
    path = tiny_models.write_tiny_model(tmp_path, "qwen2", qtype)
    ids = tiny_models.test_ids()
    loop = asyncio.new_event_loop()
    g = 8 if qtype == QT.Q4_K else 4

    def run(**options):
        drive = Drive(loop.run_until_complete(gpu_model(path, context=tiny_models.N_CTX, arithmetic=Arithmetic.INT8, **options)), loop)
        logits = drive.logits(ids, all_logits=True)
        matrices = [w for w in drive.runner.ops.slots.slots.values() if w.parts]
        assert all(p.row0 % w.row_group == 0 and p.rows % w.row_group == 0 for w in matrices for p in w.parts)
        drive.runner.close()
        return logits, {w.row_group for w in matrices}, max(len(w.parts) for w in matrices)

    try:
        plain, flat, _ = run(policy={"row_group": 1})
        got, grouped, _ = run(policy={"row_group": 8})
        split, split_groups, most_parts = run(policy={"row_group": 8}, max_binding=40_000)
    finally:
        loop.close()
    assert flat == {1} and grouped == split_groups == {g} and most_parts > 1
    np.testing.assert_array_equal(got, plain)
    np.testing.assert_array_equal(split, plain)


def test_a_matrix_that_is_not_whole_groups_keeps_the_file_layout():
    """Rows, or a member's first row, off a group boundary: the file's layout (and its parts as ever)."""
    from pyshim.gguf.tensors import TensorRef
    from pyshim.gpu.slots import WeightSlot, WeightSlots

    class Store:
        def checked(self, name, shape):
            return refs[name]

    class Allocator:
        def buffer(self, nbytes, label):
            return object()

    row_bytes = shader_block(QT.Q4_K)[1]
    refs = {f"w{m}": TensorRef(f"w{m}", QT.Q4_K, (m, 256), 0, m * row_bytes) for m in (16, 12, 20)}
    slots = WeightSlots(None, Allocator(), Store(), limit=1 << 20, row_group=lambda qtype, k: 8, upload_now=False)
    assert slots._bind_2d(WeightSlot(refs["w16"], (16, 256))).row_group == 8
    assert slots._bind_2d(WeightSlot(refs["w12"], (12, 256))).row_group == 1
    joined = TensorRef("w12+w20", QT.Q4_K, (32, 256), 0, 32 * row_bytes)        # 32 rows, the second from row 12
    assert slots._bind_2d(WeightSlot(joined, (32, 256), members=[(refs["w12"], 0), (refs["w20"], 12)])).row_group == 1
