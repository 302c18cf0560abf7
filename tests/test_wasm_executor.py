"""The CPU engine (pyshim.exec.wasm_runner, under wasmtime) against the NumPy reference on whole models:
tiny random models of every architecture and weight type, and the real test models' greedy tokens and
scores (llama.cpp's fixtures); the Runner contract's other answers; what it refuses, and how.

The same two arithmetics as the GPU executor: f32 against the plain reference, the int8 route against
the reference's emulation of llama.cpp's rounding (pyshim.exec.llama_cpp.Int8Ops)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import tiny_models
from pyshim.errors import BadRequestError, UnsupportedError
from pyshim.exec.runner import Slice, Step, Want
from pyshim.exec.wasm_module import NativeModule
from pyshim.exec.wasm_runner import load_wasm
from pyshim.plan.settings import Arithmetic, RunSettings
from runners import Drive, assert_greedy_like_reference, reference
from test_gpu_executor import CASES, assert_like_emulation, ref_logits
from test_gpu_llama_cpp import FX, _model

F32, INT8 = Arithmetic.F32, Arithmetic.INT8
# every MoE architecture and the weight types among them (test_moe.py's, less the ones it repeats)
MOE_CASES = [("qwen2moe", "Q4_0"), ("qwen3moe", "Q4_K"), ("olmoe", "Q8_0"), ("mixtral", "Q5_K"), ("qwen3moe", "Q6_K"),
             ("qwen2moe", "F16")]


def wasm(path, *, arithmetic=INT8, context=tiny_models.N_CTX, chunk=None, relaxed=None, **settings) -> Drive:
    """`relaxed`: the relaxed-SIMD build or the plain one (None: the default, relaxed where built)."""
    extra = {} if chunk is None else {"prefill_chunk": chunk}
    module = None if relaxed is None else NativeModule(relaxed=relaxed)
    return Drive(load_wasm(path, settings=RunSettings(context=context, arithmetic=arithmetic, **extra, **settings), module=module))


def tiny(tmp_path_factory, arch, qtype_name):
    return tiny_models.write_tiny_model(tmp_path_factory.mktemp(arch), arch, QT[qtype_name])


@pytest.mark.parametrize("arch, qtype", CASES, ids=[f"{a}-{q}" for a, q in CASES])
def test_f32_all_logits_match_reference(tmp_path_factory, arch, qtype):
    path = tiny(tmp_path_factory, arch, qtype)
    want = ref_logits(path)
    got = wasm(path, arithmetic=F32).logits(tiny_models.test_ids(), all_logits=True)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=2e-4 * np.abs(want).max(), rtol=1e-3)


@pytest.mark.parametrize("arch, qtype", CASES, ids=[f"{a}-{q}" for a, q in CASES])
def test_int8_all_logits_match_llama_cpp_emulation(tmp_path_factory, arch, qtype):
    path = tiny(tmp_path_factory, arch, qtype)
    want, plain = ref_logits(path, INT8), ref_logits(path)
    got = wasm(path).logits(tiny_models.test_ids(), all_logits=True)
    if qtype == "F32":          # nothing to round: the int8 route is the f32 one
        np.testing.assert_allclose(got, want, atol=2e-4 * np.abs(want).max(), rtol=1e-3)
    else:
        assert_like_emulation(got, want, plain)


@pytest.mark.parametrize("arch, qtype", [("gemma3", "Q4_K"), ("phi3", "Q8_0"), ("qwen2", "Q4_1")])
def test_small_steps_then_decode_equal_one_step(tmp_path_factory, arch, qtype):
    """Prompt chunks of 4 (Gemma's window of 4 passed many times), then one token at a time: each step's
    last logits equal those of the whole sequence run at once."""
    path = tiny(tmp_path_factory, arch, qtype)
    ids = tiny_models.test_ids() + [5, 77, 300, 9, 12, 41, 42, 43]
    whole = wasm(path, arithmetic=F32).logits(ids, all_logits=True)
    drive = wasm(path, arithmetic=F32, chunk=4)
    got = [drive.logits(ids[:11])] + [drive.logits([t], i) for i, t in enumerate(ids[11:], 11)]
    np.testing.assert_allclose(np.stack(got), whole[10:], atol=2e-4 * np.abs(whole).max(), rtol=1e-3)


@pytest.mark.parametrize("name, arithmetic", [("smollm2", F32), ("gemma3", F32)])
def test_greedy_32_like_reference(name, arithmetic):
    """32 greedy tokens, each the reference's argmax in the same arithmetic. f32 only: on a deep model the
    int8 route cannot equal any other run token for token (a 1-ulp difference upstream moves an activation
    across a rounding boundary, and the step after it differs by up to what int8 rounding itself does; the
    relaxed-SIMD build's other summation order turns SmolLM2's 0.14-logit near-tie at token 23 of this
    prompt), so the int8 route is held to llama.cpp below, as the GPU's is."""
    _, path = _model(name)
    prompt = FX["models"][name]["passage"]["ids"][:24]
    ref = reference(path, context=256, arithmetic=arithmetic)
    assert_greedy_like_reference(ref, wasm(path, arithmetic=arithmetic, context=256).runner, prompt, n=32)


@pytest.mark.parametrize("relaxed", [False, True], ids=["simd128", "relaxed"])
@pytest.mark.parametrize("name", ["smollm2", "gemma3", "qwen2.5"])
def test_int8_scores_as_close_to_llama_cpp_as_llama_cpp_is_to_itself(name, relaxed):
    """The issue's bar for the int8 route, as the GPU's: top-1 agreement with llama.cpp's batch run at
    least llama.cpp's own batch-vs-sequential agreement, llama.cpp's top-1 always in the top 5; both builds."""
    m, path = _model(name)
    top_ids, _ = wasm(path, context=512, relaxed=relaxed).scores(m["passage"]["ids"], 10)
    want = np.array(m["passage"]["top_ids"])[:, 0]
    top1 = float(np.mean(top_ids[:, 0] == want))
    self_top1 = float(np.mean(want == np.array(m["passage_sequential"]["top_ids"])[:, 0]))
    assert all(want[i] in top_ids[i, :5] for i in range(len(want)))
    assert top1 >= self_top1, f"wasm int8 {top1:.4f} vs llama.cpp batch/sequential {self_top1:.4f}"


def test_answers_and_sequences(tmp_path_factory):
    """Top-k, argmax and nothing agree with the logits; two sequences interleaved keep their own caches;
    a step of two slices answers each."""
    path = tiny(tmp_path_factory, "llama", "Q4_0")
    drive = wasm(path)
    runner = drive.runner
    a, b = [5, 9, 77, 12, 3], [300, 2, 41]
    alone_a = wasm(path).logits(a, all_logits=True)
    alone_b = wasm(path).logits(b, all_logits=True)
    got_a0 = runner.run(Step.of(a[:3], 0, seq=0))[0].logits
    got_b = runner.run(Step.of(b, 0, seq=1, want=Want.ALL_LOGITS))[0].logits
    out = runner.run(Step((Slice(tuple(a[3:]), 3, 0), Slice((7,), 3, 1)), Want.TOP_K, k=5))
    np.testing.assert_allclose(got_a0, alone_a[2], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_b, alone_b, rtol=1e-5, atol=1e-5)
    want_ids = np.argsort(-alone_a[-1], kind="stable")[:5]
    np.testing.assert_array_equal(out[0].ids, want_ids)
    np.testing.assert_allclose(out[0].values, alone_a[-1][want_ids], rtol=1e-5, atol=1e-5)
    assert runner.run(Step.of([7], 4, seq=1, want=Want.NONE))[0].logits is None
    assert runner.run(Step.of([8], 5, seq=1, want=Want.ARGMAX))[0].token == int(np.argmax(wasm(path).logits(b + [7, 7, 8])))
    assert runner.held.tokens(1) == b + [7, 7, 8]


def test_answers_after_the_arena_grows(tmp_path_factory):
    """The one-token programs recorded first (prepare), a longer prompt's then (a larger arena): each program
    keeps its own arena, and each answer — logits, top-k picked in the module, argmax — is the one a runner
    that never recorded the small ones gives."""
    import asyncio

    path = tiny(tmp_path_factory, "qwen2", "Q8_0")
    prompt = tiny_models.test_ids()
    fresh, warmed = wasm(path).runner, wasm(path).runner
    asyncio.run(warmed.prepare())
    for runner in (fresh, warmed):
        runner.run(Step.of(prompt, 0, want=Want.NONE))
    for i, want in enumerate((Want.LOGITS, Want.TOP_K, Want.ARGMAX)):
        step = Step.of([7 + i], len(prompt) + i, want=want, k=5 if want is Want.TOP_K else 0)
        got, alone = warmed.run(step)[0], fresh.run(step)[0]
        assert got.token == alone.token
        for field in ("logits", "ids", "values"):
            a, b = getattr(got, field), getattr(alone, field)
            assert (a is None) == (b is None) and (a is None or np.array_equal(a, b)), (want, field)
    assert warmed.program(len(prompt), Want.NONE, 0).arena_ptr != warmed.program(1, Want.LOGITS, 0).arena_ptr


def test_activations_share_the_arena(tmp_path_factory):
    """A prefill program's tensors are laid out by lifetime: its arena is a small part of what they add up to."""
    path = tiny(tmp_path_factory, "qwen2", "Q8_0")
    runner = wasm(path).runner
    program = runner.program(32, Want.ALL_LOGITS, 0)
    total = sum(a.buf.nbytes for op in program.ops for a in op[1:] if hasattr(a, "buf"))
    assert program.arena_bytes < total / 4, (program.arena_bytes, total)
    assert runner.ops.arena_bytes >= program.arena_bytes


@pytest.mark.parametrize("kv_type", ["f16", "q8", "q4"])
@pytest.mark.parametrize("arch", ["gemma3", "qwen2", "llama"])
def test_kv_cache_types_match_reference(tmp_path_factory, arch, kv_type):
    """The smaller caches as tests/test_kv_types.py checks the GPU's: prompt chunks of 4, then one token at
    a time, nearer the reference with this cache than the f32 reference is, and the same greedy tokens."""
    path = tiny(tmp_path_factory, arch, "F32")
    ids = tiny_models.test_ids() + [5, 77, 300, 9, 12, 41, 42, 43]
    want = Drive(reference(path, context=tiny_models.N_CTX, kv_type=kv_type)).logits(ids, all_logits=True)
    f32 = Drive(reference(path, context=tiny_models.N_CTX)).logits(ids, all_logits=True)
    drive = wasm(path, arithmetic=F32, chunk=4, kv_type=kv_type)
    runner = drive.runner
    rows = [runner.run(Step.of(ids[at:min(at + 4, 9)], at, want=Want.ALL_LOGITS))[0].logits for at in range(0, 9, 4)]
    rows += [runner.run(Step.of([ids[pos]], pos))[0].logits[None] for pos in range(9, len(ids))]
    got = np.concatenate(rows)
    err, effect = np.abs(got - want).max(), np.abs(f32 - want).max()
    assert err < effect * 0.5, (err, effect)
    assert np.array_equal(got.argmax(-1), want.argmax(-1))
    f32_bytes = wasm(path, context=64).runner.memory()["kv_bytes"]
    assert wasm(path, context=64, kv_type=kv_type).runner.memory()["kv_bytes"] == f32_bytes * {"f16": 64, "q8": 36, "q4": 20}[kv_type] // 128


@pytest.mark.parametrize("settings, error, match", [
    (dict(arithmetic=Arithmetic.EXACT), UnsupportedError, "int8 route or f32"),
    (dict(kv_type="q3"), BadRequestError, "unknown KV cache type"),
])
def test_refuses_what_it_does_not_run(tmp_path_factory, settings, error, match):
    path = tiny(tmp_path_factory, "llama", "Q4_0")
    with pytest.raises(error, match=match):
        load_wasm(path, settings=RunSettings(context=64, **settings))


@pytest.mark.parametrize("arch, qtype", MOE_CASES, ids=[f"{a}-{q}" for a, q in MOE_CASES])
def test_mixtures_of_experts_match_reference(tmp_path_factory, arch, qtype):
    """Every MoE architecture (Qwen2-MoE's gated shared expert, qwen3moe, OLMoE, Mixtral-style llama): the
    router, each pair's expert and the weighted sums, f32 against the reference and the int8 route
    against its llama.cpp emulation, over the whole prompt and then one token at a time."""
    path = tiny(tmp_path_factory, arch, qtype)
    want = ref_logits(path)
    got = wasm(path, arithmetic=F32).logits(tiny_models.test_ids(), all_logits=True)
    np.testing.assert_allclose(got, want, atol=2e-4 * np.abs(want).max(), rtol=1e-3)
    want8, plain = ref_logits(path, INT8), ref_logits(path)
    drive = wasm(path)
    assert_like_emulation(drive.logits(tiny_models.test_ids(), all_logits=True), want8, plain)
    drive.runner.reset()
    steps = np.stack([drive.step([t], pos).logits for pos, t in enumerate(tiny_models.test_ids())])
    assert_like_emulation(steps, want8, plain)


def test_threads_give_the_same_logits(tmp_path_factory):
    """Two threads (the threaded build over a shared memory, a helper on a Python thread): each row is
    computed as one thread computes it, so the logits are identical; closing ends the helper."""
    import threading

    path = tiny(tmp_path_factory, "gemma3", "Q4_K")
    ids = tiny_models.test_ids()
    want = wasm(path).logits(ids, all_logits=True)
    drive = wasm(path, threads=2)
    assert drive.runner.module.threads == 2
    got = drive.logits(ids, all_logits=True)
    token = drive.greedy(ids[:5])
    np.testing.assert_array_equal(got, want)
    assert token == int(np.argmax(want[4]))
    drive.runner.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("pyshim-cpu-")]


def test_a_helper_that_starts_late_still_joins_the_first_run(tmp_path_factory, monkeypatch):
    """A helper thread slower to reach the module's worker loop than the first run is to start (a busy
    machine: CI once hung here for good) joins that run instead of waiting for the next one."""
    import threading
    import time

    from pyshim.exec import wasm_module

    helper = wasm_module._helper

    def late(*args):
        time.sleep(0.5)
        helper(*args)

    monkeypatch.setattr(wasm_module, "_helper", late)
    path = tiny(tmp_path_factory, "llama", "Q8_0")
    drive = wasm(path, threads=2)
    done = []
    runner = threading.Thread(target=lambda: done.append(drive.logits(tiny_models.test_ids()[:4])), daemon=True)
    runner.start()
    runner.join(timeout=30)
    assert done, "the first threaded run waited for ever on a helper that started late"
    drive.runner.close()


def test_missing_module_says_how_to_build_it(tmp_path):
    from pyshim.exec.wasm_module import NativeModule

    with pytest.raises(UnsupportedError, match="pyshim setup"):
        NativeModule(tmp_path / "pyshim-cpu.wasm")


LONG_CONTEXT = (4 << 30) // (2 * 2 * 2 * tiny_models.HEAD_DIM * 4) + 4096   # tiny llama: an f32 cache past 4 GiB


@pytest.mark.parametrize("threads", [1, 2])
def test_a_model_past_4_gib_runs_on_the_64_bit_build(tmp_path_factory, threads):
    """A context whose f32 cache passes wasm32's 4 GiB: the engine takes its 64-bit build (memory64) by
    itself, the cache lies past 4 GiB, and every logit equals the 32-bit build's at a short context (the
    same arithmetic: attention reads only the positions written)."""
    from pyshim.plan.memory import WASM_MEMORY_BYTES

    path = tiny_models.write_tiny_model(tmp_path_factory.mktemp("long"), "llama", QT.Q4_0, n_ctx=LONG_CONTEXT)
    ids = tiny_models.test_ids()
    short = wasm(path, context=tiny_models.N_CTX, threads=threads)
    want = short.logits(ids, all_logits=True)
    assert not short.runner.wasm64
    long = wasm(path, context=LONG_CONTEXT, threads=threads)
    np.testing.assert_array_equal(long.logits(ids, all_logits=True), want)
    memory = long.runner.memory()
    assert memory["wasm64"] and memory["kv_bytes"] > WASM_MEMORY_BYTES and memory["module_bytes"] > WASM_MEMORY_BYTES
    for drive in (short, long):
        drive.runner.close()


PROMPTS = [[5, 77, 300, 9, 12], [41, 42], [7, 8, 9, 10, 11, 12, 13, 14, 15]]



@pytest.mark.parametrize("arch, qtype, arithmetic", [("llama", "Q4_0", INT8), ("gemma3", "Q8_0", INT8),
                                                     ("qwen2", "Q4_K", INT8), ("llama", "Q4_1", F32)])
def test_a_batched_step_gives_each_sequence_what_it_gets_alone(tmp_path_factory, arch, qtype, arithmetic):
    """One token of each of three sequences in one program (continuous batching on the CPU engine): each
    sequence's greedy tokens and logits are word for word the ones it gets alone, in a program of 3."""
    runner = wasm(tiny(tmp_path_factory, arch, qtype), arithmetic=arithmetic).runner

    def run(step):
        return runner.run(step)

    def alone(want):
        out = []
        for seq, prompt in enumerate(PROMPTS):
            runner.reset(seq)
            (first,) = run(Step.of(prompt, 0, seq=seq, want=Want.ARGMAX))
            got, token, pos = [], first.token, len(prompt)
            for _ in range(6):
                (o,) = run(Step.of([token], pos, seq=seq, want=want))
                got.append(o.token if want is Want.ARGMAX else o.logits)
                token, pos = (o.token if want is Want.ARGMAX else int(np.argmax(o.logits))), pos + 1
            out.append(got)
        return out

    def batched(want):
        tokens, positions, out = [], [], [[] for _ in PROMPTS]
        for seq, prompt in enumerate(PROMPTS):
            runner.reset(seq)
            tokens.append(run(Step.of(prompt, 0, seq=seq, want=Want.ARGMAX))[0].token)
            positions.append(len(prompt))
        for _ in range(6):
            answers = run(Step(tuple(Slice((t,), p, seq) for seq, (t, p) in enumerate(zip(tokens, positions))), want))
            for seq, o in enumerate(answers):
                out[seq].append(o.token if want is Want.ARGMAX else o.logits)
                tokens[seq] = o.token if want is Want.ARGMAX else int(np.argmax(o.logits))
                positions[seq] += 1
        return out

    assert batched(Want.ARGMAX) == alone(Want.ARGMAX)
    for one, many in zip(alone(Want.LOGITS), batched(Want.LOGITS)):
        for a, b in zip(one, many):
            np.testing.assert_array_equal(a, b)
    assert (3, Want.ARGMAX, (0, 1, 2)) in runner._programs and (3, Want.LOGITS, (0, 1, 2)) in runner._programs


@pytest.mark.parametrize("kv_type", ["f32", "q4"])
def test_a_shared_prefix_is_copied_not_run_again(tmp_path_factory, kv_type):
    """A sequence taking another's first 20 positions (a system prompt) goes on to the tokens it gets when
    it runs them itself: the copied keys are the computed ones, in every cache type."""
    runner = wasm(tiny(tmp_path_factory, "gemma3", "Q8_0"), kv_type=kv_type).runner
    ids = tiny_models.test_ids() * 2
    mine = ids[:20] + [7, 8, 9]

    def greedy(seq, tokens, start, n=6):
        out = [runner.run(Step.of(tokens, start, seq=seq, want=Want.ARGMAX))[0].token]
        for i in range(n - 1):
            out.append(runner.run(Step.of([out[-1]], start + len(tokens) + i, seq=seq, want=Want.ARGMAX))[0].token)
        return out

    alone = greedy(2, mine, 0)
    greedy(0, ids[:24], 0, 1)
    assert runner.share(0, 1, 20) and runner.held.tokens(1) == ids[:20]
    assert greedy(1, mine[20:], 20) == alone
