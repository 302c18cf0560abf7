"""The real-GPU prefill kernels (tiled matmul, key-tiled attention) forced on the native device (lavapipe
here) on whole models against the NumPy reference, f32 arithmetic: tiny models of every architecture and
weight type, chunked with split tensors, and SmolLM2 and Gemma 3 scoring a ~100-token text in chunks."""

from __future__ import annotations

import numpy as np
import pytest

import tiny_models
from pyshim.plan.settings import Arithmetic
from runners import Drive, gpu, reference

CASES = [("llama", "Q4_0"), ("qwen2", "Q4_1"), ("qwen3", "Q5_0"), ("gemma3", "Q4_K"), ("phi3", "Q8_0"),
         ("llama", "Q5_K"), ("gemma3", "Q6_K"), ("qwen2", "F16"), ("llama", "F32")]
TILED = dict(policy={"tiled_attention": True}, arithmetic=Arithmetic.F32)   # the f32 route tiles every matmul of n > 1
REAL_CHUNK = 24         # the real models' text goes in 3 steps of at most this many tokens


def gpu_runner(loop, device, path, n_ctx=tiny_models.N_CTX, **options) -> Drive:
    return Drive(loop.run_until_complete(gpu(path, context=n_ctx, device=device, **options)), loop)


def families(drive: Drive) -> set[str]:
    return {d.key.family for p in drive.runner._programs.values() for d in p.dispatches}


def close(got, want):
    np.testing.assert_allclose(got, want, atol=2e-4 * np.abs(want).max(), rtol=1e-3)


@pytest.mark.parametrize("arch, qtype", CASES, ids=[f"{a}-{q}" for a, q in CASES])
def test_tiled_all_logits_match_reference(tmp_path_factory, loop, device, arch, qtype):
    from gguf import GGMLQuantizationType as QT

    path = tiny_models.write_tiny_model(tmp_path_factory.mktemp(arch), arch, QT[qtype])
    ids = tiny_models.test_ids()
    want = Drive(reference(path, context=tiny_models.N_CTX)).logits(ids, all_logits=True)
    runner = gpu_runner(loop, device, path, **TILED)
    close(runner.logits(ids, all_logits=True), want)
    assert {"matmul", "attention_prefill"} <= families(runner)
    assert "matvec" not in families(runner)             # one step of many tokens: every matmul is tiled


@pytest.mark.parametrize("arch, qtype", [("gemma3", "Q5_0"), ("qwen2", "Q4_K")])
def test_tiled_chunks_then_decode_with_split_tensors(tmp_path_factory, loop, device, arch, qtype):
    """Steps of 5 (Gemma's window-4 rings wrap), tensors split by rows, then single tokens (the decode
    kernels): the last logits of every step equal the reference's."""
    from gguf import GGMLQuantizationType as QT

    path = tiny_models.write_tiny_model(tmp_path_factory.mktemp(arch), arch, QT[qtype])
    ids = tiny_models.test_ids() + [5, 77, 300, 9, 12, 41]
    want = Drive(reference(path, context=tiny_models.N_CTX)).logits(ids, all_logits=True)
    runner = gpu_runner(loop, device, path, chunk=5, max_binding=40_000, **TILED)
    assert any(len(w.parts) > 1 for w in runner.runner.ops.slots.slots.values())
    got, pos = [], 0
    for size in (5, 5, 3, 1, 1):
        got.append(runner.logits(ids[pos:pos + size], pos, all_logits=True))
        pos += size
    close(np.concatenate(got), want[:pos])


# The tiled route's default cases are the tiny models above; a real model's 60 tokens in f32 on lavapipe
# take over a minute (and SmolLM2's f32 scores are checked against llama.cpp in test_gpu_executor.py).
@pytest.mark.models
@pytest.mark.slow
@pytest.mark.full
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_tiled_score_logits_of_real_models(loop, device, name):
    from pyshim.setup.catalog import resolve_model
    from english_text import long_english_text
    from pyshim.text.tokenizer import Tokenizer

    path = resolve_model(name)
    ref = reference(path, context=128)
    text = long_english_text(2)
    ids = Tokenizer.from_metadata(ref.header.metadata).encode(text)[:60]
    assert len(ids) > 2 * REAL_CHUNK
    want = Drive(ref).logits(ids, all_logits=True)
    runner = gpu_runner(loop, device, path, n_ctx=128, chunk=REAL_CHUNK, **TILED)
    got = runner.logits(ids, all_logits=True)                # in steps of REAL_CHUNK
    assert {"matmul", "attention_prefill"} <= families(runner)
    close(got, want)
    assert np.array_equal(got.argmax(-1), want.argmax(-1))
