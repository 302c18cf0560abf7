"""The int8 route's rows interleaved in groups (interleave.wgsl, include/row_group.wgsl): the kernel
rearranges whole groups as numpy's transpose does, and every kernel that reads such a weight (matvec_i8
one token, half a group or a group an invocation, the fused gate-and-up, several tokens with a bias; embed)
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
from pyshim.gpu.kernels import (UNIFORM_X_BYTES, embed_key, groups, interleave_key, matvec_i8_grid, matvec_i8_key, repack_grid,
                                shader_block, xq_row_words)
from pyshim.plan.settings import Arithmetic
from runners import Drive, gpu as gpu_model

G = 8
BLOCK_BYTES = shader_block(QT.Q4_K)[1]


@pytest.fixture(scope="module")
def gpu():
    g = GPU()
    yield g
    g.close()


def interleaved(raw: np.ndarray, g: int = G) -> np.ndarray:
    """raw [m, row_bytes] (m a multiple of g) in the row-grouped layout: block b of a group's rows together."""
    m, row_bytes = raw.shape
    nb = row_bytes // BLOCK_BYTES
    return raw.reshape(m // g, g, nb, BLOCK_BYTES).transpose(0, 2, 1, 3).reshape(m, row_bytes)


def test_interleave_rewrites_whole_groups_from_a_copy(gpu):
    """Groups 2..4 of 6 (a chunk, as the slots do it): copied out, written back interleaved at dst_off;
    the other groups untouched."""
    rng = np.random.default_rng(0)
    m, nb = 6 * G, 3
    raw = rng.integers(0, 256, (m, nb * BLOCK_BYTES), dtype=np.uint8)
    dst = gpu.upload(raw.reshape(-1))
    gb = G * nb * BLOCK_BYTES
    src = raw.reshape(-1)[2 * gb:5 * gb].copy()
    blocks = 3 * G * nb
    pipe = gpu.run(gpu.kernels.get(interleave_key(G)))
    from pyshim.gpu.kernels import PARAMS
    p = gpu.device.buffer(PARAMS["interleave"].nbytes, label="p", uniform=True)
    gpu.device.write(p, PARAMS["interleave"].pack(blocks=blocks, row_blocks=nb, block_words=BLOCK_BYTES // 4, dst_off=2 * gb // 4))
    gpu.device.submit([(pipe, gpu.device.bind_group(pipe, [gpu.upload(src), dst, p]), repack_grid(blocks))])
    got = np.frombuffer(gpu.run(gpu.device.read(dst, raw.nbytes)), np.uint8).reshape(m, -1)
    want = raw.copy()
    want[2 * G:5 * G] = interleaved(raw[2 * G:5 * G])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("variant", ["rows8_uniform", "rows4", "glu_rows8", "tokens8_rows4_bias"])
def test_matvec_i8_reads_row_groups_as_the_file_layout(gpu, variant):
    rng = np.random.default_rng(len(variant))
    k, m, n = 3 * 256, 9 * G, 3 if variant.startswith("tokens") else 1
    glu = variant.startswith("glu")
    raw = random_weight(QT.Q4_K, 2 * m if glu else m, k, rng)
    q, info = emu.quantize(rng.standard_normal((n, k), dtype=np.float32), "q8_k")
    words = emu.pack(q, info)
    rows = 4 if "rows4" in variant else 8
    tokens = 8 if variant.startswith("tokens") else None
    uniform_x = variant.endswith("uniform")
    bias = rng.standard_normal(m, dtype=np.float32) if variant.endswith("bias") else None
    outs = []
    for row_group, data in ((1, raw), (G, interleaved(raw))):
        x_in = words
        if uniform_x:
            x_in = gpu.device.buffer(UNIFORM_X_BYTES, label="x", also_uniform=True)
            gpu.device.write(x_in, words)
            x_in = (x_in, 0, UNIFORM_X_BYTES)
        key = matvec_i8_key(QT.Q4_K, rows=rows, uniform_x=uniform_x, glu="silu" if glu else None, tokens=tokens,
                            bias=bias is not None, row_group=row_group)
        (out,) = gpu.dispatch(key, [data.reshape(-1), x_in] + ([bias] if bias is not None else []), [n * m * 4],
                              dict(m=m, k=k, n=n, row_bytes=raw.shape[1], w_off=0, x_off=0, y_off=0, bias_off=0, y_stride=m,
                                   pair_off=0, x_row_words=xq_row_words(k, "q8_k")),
                              matvec_i8_grid(m, n, rows, tokens or 1))
        outs.append(np.frombuffer(out, np.float32))
    assert np.abs(outs[0]).max() > 0
    np.testing.assert_array_equal(outs[1], outs[0])


def test_embed_reads_row_groups_as_the_file_layout(gpu):
    vocab, d = 5 * G, 2 * 256
    raw = random_weight(QT.Q4_K, vocab, d, np.random.default_rng(3))
    tokens = np.array([5, 39, 0, 5, 17], dtype=np.uint32)
    outs = []
    for row_group, data in ((1, raw), (G, interleaved(raw))):
        (out,) = gpu.dispatch(embed_key(QT.Q4_K, row_group=row_group), [data.reshape(-1), tokens], [len(tokens) * d * 4],
                              dict(d=d, n=len(tokens), row_bytes=raw.shape[1], w_off=0, tok_off=0, out_off=0, row0=0, rows=vocab),
                              (groups(d // 256), len(tokens), 1))
        outs.append(np.frombuffer(out, np.float32))
    np.testing.assert_array_equal(outs[1], outs[0])


def test_row_groups_through_the_slots_change_no_logit(tmp_path, monkeypatch):
    """A Q4_K model interleaved one group a chunk (the scratch buffer's least): its int8 logits equal the
    file layout's exactly; with a binding limit that splits weights off group boundaries those keep the
    file's layout, the rest are still interleaved, and the logits are the same again."""
    monkeypatch.setattr(slots_module, "INTERLEAVE_CHUNK", 1)
    path = tiny_models.write_tiny_model(tmp_path, "qwen2", QT.Q4_K)
    ids = tiny_models.test_ids()
    loop = asyncio.new_event_loop()

    def run(**options):
        drive = Drive(loop.run_until_complete(gpu_model(path, context=tiny_models.N_CTX, arithmetic=Arithmetic.INT8, **options)), loop)
        logits = drive.logits(ids, all_logits=True)
        matrices = [w for w in drive.runner.ops.slots.slots.values() if w.parts]
        groups_of = {w.name: w.row_group for w in matrices}
        drive.runner.close()
        return logits, groups_of

    try:
        plain, flat = run(policy={"row_group": 1})
        got, grouped = run(policy={"row_group": G})
        split, mixed = run(policy={"row_group": G}, max_binding=40_000)     # 277 rows of 144 bytes a part
    finally:
        loop.close()
    assert set(flat.values()) == {1} and set(grouped.values()) == {G}
    np.testing.assert_array_equal(got, plain)
    assert set(mixed.values()) == {1, G}
    np.testing.assert_array_equal(split, plain)
