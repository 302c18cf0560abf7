"""The GPU executor against the NumPy reference executor on whole models: tiny random models of every
architecture and tensor type, and SmolLM2 greedy decoding (real model).

Two arithmetics: the f32 kernels (int8=False) against the plain reference, and the int8 route (int8=True:
activations rounded to int8 blocks as llama.cpp's CPU backend does) against the reference's emulation of
exactly that rounding (emulate_llama_cpp=True) — the honest oracle for it."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import tiny_models
from gpu_helpers import assert_greedy_like_reference
from pyshim.gpu.kernels import I8_TOKEN_TYPES
from pyshim.exec.gpu_runner import GpuRunner, load_gpu_async
from pyshim.exec.loading import load

# (arch, weight type) pairs: every architecture and every weight type at least once
CASES = [("llama", "Q4_0"), ("qwen2", "Q4_1"), ("qwen3", "Q5_0"), ("gemma3", "Q4_K"), ("phi3", "Q8_0"),
         ("llama", "Q5_K"), ("gemma3", "Q6_K"), ("qwen2", "F16"), ("llama", "F32")]
SMALL_CHUNK = 4           # steps of 4 tokens: Gemma's window-4 rings hold 7 slots and wrap many times


def gpu_runner(loop, device, path, **options) -> GpuRunner:
    return loop.run_until_complete(load_gpu_async(path, n_ctx=tiny_models.N_CTX, device=device, loop=loop, **options))


def tiny(tmp_path_factory, arch, qtype_name):
    return tiny_models.write_tiny_model(tmp_path_factory.mktemp(arch), arch, QT[qtype_name])


@pytest.mark.parametrize("arch, qtype", CASES, ids=[f"{a}-{q}" for a, q in CASES])
def test_all_logits_match_reference(tmp_path_factory, loop, device, arch, qtype):
    path = tiny(tmp_path_factory, arch, qtype)
    ids = tiny_models.test_ids()
    want = load(path, n_ctx=tiny_models.N_CTX).forward(ids, 0, all_logits=True)
    got = gpu_runner(loop, device, path, int8=False).forward(ids, 0, all_logits=True)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=2e-4 * np.abs(want).max(), rtol=1e-3)


@pytest.mark.parametrize("arch, qtype", CASES[:7], ids=[f"{a}-{q}" for a, q in CASES[:7]])
def test_int8_all_logits_match_llama_cpp_emulation(tmp_path_factory, loop, device, arch, qtype):
    path = tiny(tmp_path_factory, arch, qtype)
    ids = tiny_models.test_ids()
    want = load(path, n_ctx=tiny_models.N_CTX, emulate_llama_cpp=True).forward(ids, 0, all_logits=True)
    plain = load(path, n_ctx=tiny_models.N_CTX).forward(ids, 0, all_logits=True)
    runner = gpu_runner(loop, device, path, int8=True)
    got = runner.forward(ids, 0, all_logits=True)
    keys = [d.key for p in runner._programs.values() for d in p.dispatches if d.key.family == "matvec_i8"]
    assert keys
    if QT[qtype] in I8_TOKEN_TYPES:     # the prompt's step unpacks these types' blocks once for several tokens
        assert any("TOKENS" in dict(k.defines) for k in keys)
    assert_like_emulation(got, want, plain)


def assert_like_emulation(got, want, plain):
    """The int8 route against the reference's llama.cpp emulation. Its kernels equal the emulation exactly
    (tests/test_kernels_i8.py), but on whole models a 1-ulp difference upstream (f32 summation order) now
    and then moves an activation across a rounding boundary: one int8 value changes by one step, and the
    rows after it differ through attention (measured on these tiny models: rows equal to ~1e-6 until such
    a flip, then differences up to ~60% of the whole int8 effect). So: the same greedy tokens, and nowhere
    as far from the emulation as f32 arithmetic (`plain`) is — a wiring error (a wrong activation, scale
    or bias) would be."""
    err, effect = np.abs(got - want), np.abs(plain - want)
    assert np.array_equal(got.argmax(axis=-1), want.argmax(axis=-1))
    assert err.max() < effect.max(), (err.max(), effect.max())


@pytest.mark.parametrize("arch, qtype, reduce", [("gemma3", "Q4_K", False), ("phi3", "Q8_0", False), ("qwen2", "Q4_1", False),
                                                 ("gemma3", "Q5_0", True), ("qwen3", "Q6_K", True)])
def test_chunked_prefill_then_decode_with_split_tensors(tmp_path_factory, loop, device, arch, qtype, reduce):
    """Small steps (rings wrap past Gemma's window), tensors split by rows (a 40 kB binding limit),
    then one token at a time: the last logits of every step equal the reference's all-at-once ones.
    `reduce`: the real-GPU options (workgroup-reduction matvec, many-token matvec for prefill steps,
    attention split over the keys)."""
    path = tiny(tmp_path_factory, arch, qtype)
    ids = tiny_models.test_ids() + [5, 77, 300, 9, 12, 41, 42, 43]
    int8 = not reduce           # the CPU-adapter options take the int8 route (with split tensors too)
    want = load(path, n_ctx=tiny_models.N_CTX, emulate_llama_cpp=int8).forward(ids, 0, all_logits=True)
    plain = load(path, n_ctx=tiny_models.N_CTX).forward(ids, 0, all_logits=True) if int8 else None
    runner = gpu_runner(loop, device, path, max_chunk=SMALL_CHUNK, max_binding=40_000, reduce=reduce, multi_token=reduce,
                        attn_splits=5 if reduce else None, int8=int8)
    assert any(len(w.parts) > 1 for w in runner.ops._bound.values())
    split = 11
    got = [runner.forward(ids[:split], 0)[-1]]
    for pos in range(split, len(ids)):
        got.append(runner.forward([ids[pos]], pos)[-1])
    if int8:
        assert_like_emulation(np.stack(got), want[split - 1:], plain[split - 1:])
    else:
        np.testing.assert_allclose(np.stack(got), want[split - 1:], atol=2e-4 * np.abs(want).max(), rtol=1e-3)


def test_greedy_on_gpu_equals_argmax_of_reference(tmp_path_factory, loop, device):
    path = tiny(tmp_path_factory, "llama", "Q4_K")
    ref = load(path, n_ctx=tiny_models.N_CTX, emulate_llama_cpp=True)
    runner = gpu_runner(loop, device, path, int8=True)
    seq = tiny_models.test_ids()
    ref_seq, gpu_seq = list(seq), list(seq)
    logits = ref.forward(ref_seq, 0)[-1]
    token = runner.greedy(gpu_seq, 0)
    for _ in range(12):
        want = int(np.argmax(logits))
        assert token == want
        ref_seq.append(want)
        gpu_seq.append(token)
        logits = ref.forward([want], len(ref_seq) - 1)[-1]
        token = runner.greedy([token], len(gpu_seq) - 1)


@pytest.mark.models
@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_greedy_32_tokens_equal_cpu(loop, device, name):
    """The f32 kernels. (The int8 route cannot equal any CPU run token for token on a deep model — see
    tests/test_gpu_llama_cpp.py, which holds it to llama.cpp instead.)"""
    from pyshim.setup.catalog import resolve_model
    from pyshim.text.tokenizer import Tokenizer

    path = resolve_model(name)
    ref = load(path, n_ctx=256)
    runner = loop.run_until_complete(load_gpu_async(path, n_ctx=256, device=device, loop=loop, int8=False))
    prompt = Tokenizer.from_metadata(ref.metadata).encode("The capital of France is")
    assert_greedy_like_reference(ref, runner, prompt, 32)


def test_upload_plan_lets_the_caller_write_the_weights(tmp_path_factory, loop, device):
    """upload_now=False: the executor writes no quantized weight; following `uploads` gives the same logits."""
    path = tiny(tmp_path_factory, "qwen2", "Q6_K")
    ids = tiny_models.test_ids()
    runner = gpu_runner(loop, device, path, upload_now=False, max_binding=40_000, int8=False)
    plan = runner.ops.uploads
    assert len(plan) > len([w for w in runner.ops._bound.values() if w.parts])     # some tensors were split
    blob = path.read_bytes()
    for up in plan:
        device.write(up.buffer, blob[up.file_offset:up.file_offset + up.nbytes], up.buffer_offset)
    want = load(path, n_ctx=tiny_models.N_CTX).forward(ids, 0, all_logits=True)
    got = runner.forward(ids, 0, all_logits=True)
    np.testing.assert_allclose(got, want, atol=2e-4 * np.abs(want).max(), rtol=1e-3)


def test_grouped_q8_0_follows_the_upload_plan(tmp_path_factory, loop, device):
    """The int8 route's Q8_0 weights are rearranged on the GPU after the caller's uploads (the browser's
    order): split by rows, with the tied embedding read grouped too, the logits equal those of a load that
    wrote the weights itself, and stay like the llama.cpp emulation."""
    path = tiny(tmp_path_factory, "gemma3", "Q8_0")
    ids = tiny_models.test_ids()
    runner = gpu_runner(loop, device, path, upload_now=False, max_binding=40_000, int8=True)
    grouped = [w for w in runner.ops._bound.values() if w.grouped]
    assert grouped and any(len(w.parts) > 1 for w in grouped)
    assert "token_embd.weight" in runner.ops._bound and runner.ops._bound["token_embd.weight"].grouped
    blob = path.read_bytes()
    for up in runner.ops.uploads:
        device.write(up.buffer, blob[up.file_offset:up.file_offset + up.nbytes], up.buffer_offset)
    got = runner.forward(ids, 0, all_logits=True)
    keys = {d.key for p in runner._programs.values() for d in p.dispatches}
    assert any(dict(k.defines).get("W_Q8_0G") == "" for k in keys if k.family in ("matvec_i8", "embed"))
    np.testing.assert_array_equal(got, gpu_runner(loop, device, path, max_binding=40_000, int8=True).forward(ids, 0, all_logits=True))
    want = load(path, n_ctx=tiny_models.N_CTX, emulate_llama_cpp=True).forward(ids, 0, all_logits=True)
    assert_like_emulation(got, want, load(path, n_ctx=tiny_models.N_CTX).forward(ids, 0, all_logits=True))


def runner_int8_default() -> bool:
    from pyshim.gpu import open_device
    from pyshim.gpu.kernels import default_int8

    loop = asyncio.new_event_loop()
    try:
        device = loop.run_until_complete(open_device())
        int8 = default_int8(device.caps)
        device.destroy()
        return int8
    finally:
        loop.close()


def test_load_backend_gpu_generates_like_cpu(tmp_path_factory):
    """`pyshim.exec.loading.load(backend="gpu")` (what `generate`/`score --backend gpu` use) gives a runner the
    generation loop drives exactly like the cpu one."""
    from pyshim.serve.generation import generate_ids
    from pyshim.serve.sampling import SamplingParams

    path = tiny(tmp_path_factory, "gemma3", "Q8_0")
    prompt = tiny_models.test_ids()[:6]
    out = {}
    for backend in ("cpu", "gpu"):
        # the gpu backend's default arithmetic on this adapter: int8 (llama.cpp's) on CPU adapters
        emulate = backend == "cpu" and runner_int8_default()
        runner = load(path, n_ctx=tiny_models.N_CTX, backend=backend, emulate_llama_cpp=emulate)
        runner.prepare()
        out[backend] = list(generate_ids(runner, prompt, 20, SamplingParams(temperature=0.0)))
    assert isinstance(runner, GpuRunner)
    assert out["gpu"] == out["cpu"] and len(out["cpu"]) == 20


@pytest.mark.models
@pytest.mark.slow
def test_smollm2_scores_match_llama_cpp_on_f32_copy():
    """`score --backend gpu` on the passage against llama.cpp run on an F32 copy of the same weights
    (tests/fixtures/real_llamacpp.json): the same arithmetic, so top-1 everywhere and logits to ~1e-5
    (measured 2.6e-5; Gemma 3 0.0077 (llama.cpp's f16 GELU table), Qwen2.5 1.7e-5, all 100% top-1)."""
    import json
    from pathlib import Path

    from pyshim.serve.generation import score

    root = Path(__file__).resolve().parent.parent
    fx = json.loads((root / "tests" / "fixtures" / "real_llamacpp.json").read_text())["models"]["smollm2"]
    path = root / fx["file"]
    if not path.is_file():
        pytest.skip(f"{path.name} is not in models/")
    top_ids, top_logits = score(load(path, backend="gpu", int8=False), fx["passage"]["ids"], 10)   # f32 arithmetic, as llama.cpp on F32 weights
    ref = fx["passage_f32"]
    assert np.mean(top_ids[:, 0] == np.array(ref["top_ids"])[:, 0]) == 1.0
    assert np.abs(top_logits[:, 0] - np.array(ref["top_logits"])[:, 0]).max() < 2e-3
