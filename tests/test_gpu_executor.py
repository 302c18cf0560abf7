"""The GPU executor against the NumPy reference executor on whole models: tiny random models of every
architecture and tensor type, and SmolLM2 greedy decoding (real model).

Two arithmetics: the f32 kernels (Arithmetic.F32) against the plain reference, and the int8 route
(Arithmetic.INT8: activations rounded to int8 blocks as llama.cpp's CPU backend does) against the
reference's emulation of exactly that rounding (pyshim.exec.llama_cpp.Int8Ops) — the honest oracle for it."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import tiny_models
from pyshim.exec.gpu_runner import GpuRunner
from pyshim.gpu.kernels import I8_TOKEN_TYPES
from pyshim.plan.settings import Arithmetic
from runners import Drive, assert_greedy_like_reference, gpu, reference

F32, INT8 = Arithmetic.F32, Arithmetic.INT8

# (arch, weight type) pairs: every architecture and every weight type at least once
CASES = [("llama", "Q4_0"), ("qwen2", "Q4_1"), ("qwen3", "Q5_0"), ("gemma3", "Q4_K"), ("phi3", "Q8_0"),
         ("llama", "Q5_K"), ("gemma3", "Q6_K"), ("qwen2", "F16"), ("llama", "F32")]
SMALL_CHUNK = 4           # steps of 4 tokens: Gemma's window-4 rings hold 7 slots and wrap many times


def gpu_runner(loop, device, path, **options) -> Drive:
    return Drive(loop.run_until_complete(gpu(path, context=tiny_models.N_CTX, device=device, **options)), loop)


def ref_logits(path, arithmetic=None):
    return Drive(reference(path, context=tiny_models.N_CTX, arithmetic=arithmetic)).logits(tiny_models.test_ids(), all_logits=True)


def tiny(tmp_path_factory, arch, qtype_name):
    return tiny_models.write_tiny_model(tmp_path_factory.mktemp(arch), arch, QT[qtype_name])


@pytest.mark.parametrize("arch, qtype", CASES, ids=[f"{a}-{q}" for a, q in CASES])
def test_all_logits_match_reference(tmp_path_factory, loop, device, arch, qtype):
    path = tiny(tmp_path_factory, arch, qtype)
    ids = tiny_models.test_ids()
    want = ref_logits(path)
    got = gpu_runner(loop, device, path, arithmetic=F32).logits(ids, all_logits=True)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=2e-4 * np.abs(want).max(), rtol=1e-3)


@pytest.mark.parametrize("arch, qtype", CASES[:7], ids=[f"{a}-{q}" for a, q in CASES[:7]])
def test_int8_all_logits_match_llama_cpp_emulation(tmp_path_factory, loop, device, arch, qtype):
    path = tiny(tmp_path_factory, arch, qtype)
    ids = tiny_models.test_ids()
    want, plain = ref_logits(path, INT8), ref_logits(path)
    drive = gpu_runner(loop, device, path, arithmetic=INT8)
    got = drive.logits(ids, all_logits=True)
    keys = [d.key for p in drive.runner._programs.values() for d in p.dispatches if d.key.family == "matvec_i8"]
    assert keys
    # (on lavapipe 16 invocations a workgroup: these logits hold its grids to covering every row)
    assert {dict(k.defines)["WG"] for k in keys} == {str(drive.runner.policy.matvec_wg)}
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
    `reduce`: the real-GPU options (workgroup-reduction matvec and rmsnorm, attention split over the keys
    in lanes of a workgroup, the key-tiled prefill attention)."""
    path = tiny(tmp_path_factory, arch, qtype)
    ids = tiny_models.test_ids() + [5, 77, 300, 9, 12, 41, 42, 43]
    int8 = not reduce           # the CPU-adapter options take the int8 route (with split tensors too)
    cpu = Drive(reference(path, context=tiny_models.N_CTX, arithmetic=INT8 if int8 else F32))
    want = cpu.logits(ids, all_logits=True)
    plain = Drive(reference(path, context=tiny_models.N_CTX)).logits(ids, all_logits=True) if int8 else None
    policy = dict(reduce=True, attn_splits=5, attn_lanes=32, tiled_attention=True) if reduce else {}
    drive = gpu_runner(loop, device, path, chunk=SMALL_CHUNK, max_binding=40_000, policy=policy, arithmetic=INT8 if int8 else F32)
    assert any(len(w.parts) > 1 for w in drive.runner.ops.slots.slots.values())
    split = 11
    got = [drive.logits(ids[:split])]
    for pos in range(split, len(ids)):
        got.append(drive.logits([ids[pos]], pos))
    if int8:
        assert_like_emulation(np.stack(got), want[split - 1:], plain[split - 1:])
    else:
        np.testing.assert_allclose(np.stack(got), want[split - 1:], atol=2e-4 * np.abs(want).max(), rtol=1e-3)


def test_uploads_reach_their_buffers_as_they_go(loop, device, monkeypatch):
    """Every WRITE_FLUSH_BYTES the staged writes are submitted before more are staged (wgpu would hold a second
    copy of a model's weights until the first step otherwise), and every byte lands where it was written."""
    from pyshim.gpu import native

    monkeypatch.setattr(native, "WRITE_FLUSH_BYTES", 1 << 16)
    data = np.random.default_rng(0).integers(0, 256, 1 << 20, dtype=np.uint8)
    buf = device.buffer(len(data), label="uploaded")
    before = device.write_flushes
    for off in range(0, len(data), 1 << 14):
        device.write(buf, data[off:off + (1 << 14)], off)
    assert device.write_flushes - before == 16
    assert loop.run_until_complete(device.read(buf)) == data.tobytes()


def test_greedy_on_gpu_equals_argmax_of_reference(tmp_path_factory, loop, device):
    path = tiny(tmp_path_factory, "llama", "Q4_K")
    ref = reference(path, context=tiny_models.N_CTX, arithmetic=INT8)
    drive = gpu_runner(loop, device, path, arithmetic=INT8)
    assert_greedy_like_reference(ref, drive.runner, tiny_models.test_ids(), 12, loop)


@pytest.mark.models
@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_greedy_32_tokens_equal_cpu(loop, device, name):
    """The f32 kernels. (The int8 route cannot equal any CPU run token for token on a deep model — see
    tests/test_gpu_llama_cpp.py, which holds it to llama.cpp instead.)"""
    from pyshim.setup.catalog import resolve_model
    from pyshim.text.tokenizer import Tokenizer

    path = resolve_model(name)
    ref = reference(path, context=256)
    runner = loop.run_until_complete(gpu(path, context=256, device=device, arithmetic=F32))
    prompt = Tokenizer.from_metadata(ref.header.metadata).encode("The capital of France is")
    assert_greedy_like_reference(ref, runner, prompt, 32, loop)


def test_upload_plan_lets_the_caller_write_the_weights(tmp_path_factory, loop, device):
    """upload_now=False: the executor writes no quantized weight; following `uploads` gives the same logits."""
    path = tiny(tmp_path_factory, "qwen2", "Q6_K")
    ids = tiny_models.test_ids()
    drive = gpu_runner(loop, device, path, upload_now=False, max_binding=40_000, arithmetic=F32)
    plan = drive.runner.ops.uploads
    assert len(plan) > len([w for w in drive.runner.ops.slots.slots.values() if w.parts])     # some tensors were split
    blob = path.read_bytes()
    for up in plan:
        device.write(up.buffer, blob[up.file_offset:up.file_offset + up.nbytes], up.buffer_offset)
    want = ref_logits(path)
    got = drive.logits(ids, all_logits=True)
    np.testing.assert_allclose(got, want, atol=2e-4 * np.abs(want).max(), rtol=1e-3)


def test_grouped_q8_0_follows_the_upload_plan(tmp_path_factory, loop, device):
    """The int8 route's Q8_0 weights are rearranged on the GPU after the caller's uploads (the browser's
    order): split by rows, with the tied embedding read grouped too, the logits equal those of a load that
    wrote the weights itself, and stay like the llama.cpp emulation."""
    path = tiny(tmp_path_factory, "gemma3", "Q8_0")
    ids = tiny_models.test_ids()
    drive = gpu_runner(loop, device, path, upload_now=False, max_binding=40_000, arithmetic=INT8)
    slots = drive.runner.ops.slots.slots
    grouped = [w for w in slots.values() if w.grouped]
    assert grouped and any(len(w.parts) > 1 for w in grouped)
    assert "token_embd.weight" in slots and slots["token_embd.weight"].grouped
    blob = path.read_bytes()
    for up in drive.runner.ops.uploads:
        device.write(up.buffer, blob[up.file_offset:up.file_offset + up.nbytes], up.buffer_offset)
    got = drive.logits(ids, all_logits=True)
    keys = {d.key for p in drive.runner._programs.values() for d in p.dispatches}
    assert any(dict(k.defines).get("W_Q8_0G") == "" for k in keys if k.family in ("matvec_i8", "embed"))
    np.testing.assert_array_equal(got, gpu_runner(loop, device, path, max_binding=40_000, arithmetic=INT8).logits(ids, all_logits=True))
    assert_like_emulation(got, ref_logits(path, INT8), ref_logits(path))


def test_load_backend_gpu_generates_like_cpu(tmp_path_factory):
    """`pyshim.exec.loading.load(backend="gpu")` (what `generate`/`score --backend gpu` use) gives a runner the
    generation loop drives exactly like the cpu one, in the arithmetic the GPU runner says it runs."""
    from pyshim.exec.loading import load
    from pyshim.plan.settings import RunSettings
    from pyshim.serve.generation import generate
    from pyshim.serve.sampling import SamplingParams

    path = tiny(tmp_path_factory, "gemma3", "Q8_0")
    prompt = tiny_models.test_ids()[:6]

    async def both():
        runner = await load(path, backend="gpu", settings=RunSettings(context=tiny_models.N_CTX))
        await runner.prepare()
        on_gpu = await generate(runner, prompt, SamplingParams(), 20)
        runner.close()
        cpu = await load(path, backend="cpu", settings=RunSettings(context=tiny_models.N_CTX, arithmetic=runner.arithmetic))
        return runner, on_gpu.token_ids, (await generate(cpu, prompt, SamplingParams(), 20)).token_ids

    runner, on_gpu, on_cpu = asyncio.run(both())
    assert isinstance(runner, GpuRunner)
    assert on_gpu == on_cpu and len(on_cpu) == 20


def test_prepare_reports_each_pipeline_it_compiles(tmp_path_factory):
    """prepare(progress) counts the decode programs' distinct pipelines as they compile: (0, total), one more
    per call, (total, total); prepared again, it has none left to compile and says nothing."""
    path = tiny(tmp_path_factory, "llama", "Q8_0")

    async def run():
        runner = await gpu(path, context=tiny_models.N_CTX)      # its own device: no pipeline compiled yet
        try:
            first, again = [], []
            await runner.prepare(lambda done, total: first.append((done, total)))
            keys = {d.key for program in runner._programs.values() for d in program.dispatches}
            await runner.prepare(lambda done, total: again.append((done, total)))
            return first, again, keys
        finally:
            runner.close()

    first, again, keys = asyncio.run(run())
    total = first[0][1]
    assert 0 < total <= len(keys) and first == [(done, total) for done in range(total + 1)]
    assert again == []


@pytest.mark.models
@pytest.mark.slow
def test_smollm2_scores_match_llama_cpp_on_f32_copy():
    """`score --backend gpu` on the passage against llama.cpp run on an F32 copy of the same weights
    (tests/fixtures/real_llamacpp.json): the same arithmetic, so top-1 everywhere and logits to ~1e-5
    (measured 2.6e-5; Gemma 3 0.0077 (llama.cpp's f16 GELU table), Qwen2.5 1.7e-5, all 100% top-1)."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    fx = json.loads((root / "tests" / "fixtures" / "real_llamacpp.json").read_text())["models"]["smollm2"]
    path = root / fx["file"]
    if not path.is_file():
        pytest.skip(f"{path.name} is not in models/")
    loop = asyncio.new_event_loop()
    runner = loop.run_until_complete(gpu(path, arithmetic=F32))        # f32 arithmetic, as llama.cpp on F32 weights
    try:
        top_ids, top_logits = Drive(runner, loop).scores(fx["passage"]["ids"], 10)
    finally:
        runner.close()
        loop.close()
    ref = fx["passage_f32"]
    assert np.mean(top_ids[:, 0] == np.array(ref["top_ids"])[:, 0]) == 1.0
    assert np.abs(top_logits[:, 0] - np.array(ref["top_logits"])[:, 0]).max() < 2e-3


def test_weight_slots_can_be_rebound_and_refilled_between_steps(tmp_path_factory, loop, device):
    """The seam for weights streamed from the store: a program binds weight slots, not buffers. Pointing
    every slot at buffers holding another model's weights (same shapes) and rebinding gives that model's
    logits without recording anything again; refilling the slots from the first model's file gives its
    logits back."""
    from pyshim.gguf.tensors import FileSource, tensor_refs_from_header
    from pyshim.gguf.header import read_header_from_file

    # qwen3: q/k norms and no rope frequency factors (those are folded into the rope table when a program
    # is recorded, so they are not a slot a stream could refill)
    a = tiny_models.write_tiny_model(tmp_path_factory.mktemp("a"), "qwen3", QT.Q4_K, seed=1)
    b = tiny_models.write_tiny_model(tmp_path_factory.mktemp("b"), "qwen3", QT.Q4_K, seed=2)
    ids = tiny_models.test_ids()
    drive = gpu_runner(loop, device, a, arithmetic=F32)
    runner = drive.runner
    first = drive.logits(ids, all_logits=True)
    programs = len(runner._programs)
    b_refs = {r.name: r for r in tensor_refs_from_header(read_header_from_file(b))}
    b_file = FileSource(b)
    slots = runner.ops.slots
    rebound = []
    for w in slots.slots.values():
        if w.f32_buf is not None:                  # norms: their f32 values, written in place
            ref = b_refs[w.name]
            device.write(w.f32_buf, b_file.read(ref.offset, ref.nbytes).view(np.float32))
            continue
        for i, part in enumerate(w.parts):         # (a slot may hold several tensors' rows: q, k and v)
            buf = runner.ops.allocator.buffer(part.rows * w.ref.row_bytes, f"{w.name}.b")
            for ref, offset, nbytes, row in w.pieces(part.row0, part.rows):
                device.write(buf, b_file.read(b_refs[ref.name].offset + offset - ref.offset, nbytes), (row - part.row0) * w.ref.row_bytes)
            rebound.append(slots.rebind(w, i, buf))
    assert runner.rebind(rebound) > 0 and len(runner._programs) == programs
    other = drive.logits(ids, all_logits=True)
    want = ref_logits(b)
    np.testing.assert_allclose(other, want, atol=2e-4 * np.abs(want).max(), rtol=1e-3)
    assert np.abs(other - first).max() > 0.1 * np.abs(first).max()
    a_refs = {r.name: r for r in tensor_refs_from_header(read_header_from_file(a))}
    a_file = FileSource(a)
    for w in slots.slots.values():
        if w.f32_buf is not None:
            device.write(w.f32_buf, a_file.read(a_refs[w.name].offset, a_refs[w.name].nbytes).view(np.float32))
        else:
            slots.refill(w)                        # the slot's own file's rows, into the buffers it holds now
    np.testing.assert_array_equal(drive.logits(ids, all_logits=True), first)
    assert len(runner._programs) == programs
