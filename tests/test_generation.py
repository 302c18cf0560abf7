"""The one generation loop (pyshim.serve.generation) natively, on the GPU runner (wgpu on lavapipe) and a
tiny random model: a completion gives the CPU reference's tokens; stop ids, stop strings, ignore_eos;
timings hold together; each decode step reads back only what sampling needs; teacher-forced scores agree
with the reference. (In the browser: tests/test_browser_backend.py.)"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from pyshim.errors import BadRequestError
from pyshim.exec.loading import load_reference
from pyshim.exec.runner import Step, Want
from pyshim.plan.settings import RunSettings
from pyshim.serve.generation import generate, score
from pyshim.serve.protocol import Sampling
from pyshim.serve.sampling import SamplingParams
from pyshim.serve.session import Session
from pyshim.text.tokenizer import Tokenizer
import tiny_models
from runners import reference
from tiny_models import N_VOCAB, write_tiny_model

MAX_TOKENS = 10
PREFILL_CHUNK = 7         # a 40-token prompt runs in 6 chunks


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("runs"), "llama", QT.Q8_0)


@pytest.fixture(scope="module")
def gpu(model):
    """(loop, runner): one native device for the module, on its own event loop."""
    from pyshim.exec.gpu_runner import load_gpu

    loop = asyncio.new_event_loop()
    runner = loop.run_until_complete(load_gpu(model, settings=RunSettings(context=64)))
    yield loop, runner
    runner.close()
    loop.close()


def _reference(model, gpu):
    """The CPU reference in the executor's arithmetic (on CPU adapters its int8 route rounds activations
    as llama.cpp does; the reference emulates exactly that)."""
    return load_reference(model, settings=RunSettings(arithmetic=gpu[1].arithmetic))


def _cpu(model, gpu, prompt, params=SamplingParams(), max_tokens=MAX_TOKENS):
    return asyncio.run(generate(_reference(model, gpu), prompt, params, max_tokens)).token_ids


def _complete(gpu, prompt, params=SamplingParams(), max_tokens=MAX_TOKENS, **kw):
    loop, runner = gpu
    tok = Tokenizer.from_metadata(runner.header.metadata)
    return loop.run_until_complete(generate(runner, prompt, params, max_tokens, decoder=tok.stream(), **kw))


def test_greedy_completion_equals_the_cpu_reference_and_ignores_eos_on_request(model, gpu):
    prompt = tiny_models.test_ids()[:6]
    cpu = _cpu(model, gpu, prompt)
    done = _complete(gpu, prompt)
    assert done.token_ids == cpu and done.finish_reason == "length" and len(cpu) == MAX_TOKENS
    # Make the third greedy token an end-of-generation id: generation stops there and leaves it out.
    stopped = _complete(gpu, prompt, stop_ids=[cpu[2]])
    assert stopped.token_ids == cpu[:2] and stopped.finish_reason == "stop"
    # Without stop ids (ignore_eos) the run is the full length again, as the benchmark needs.
    assert _complete(gpu, prompt, stop_ids=()).token_ids == cpu


def test_each_decode_step_reads_back_only_what_sampling_needs(gpu):
    """Greedy: the argmax, 4 bytes a token; top-k sampling: k (value, id) pairs; penalties: the logits."""
    prompt = tiny_models.test_ids()[:6]
    assert _complete(gpu, prompt).bytes_per_decode_step == 4
    assert _complete(gpu, prompt, SamplingParams(temperature=1.0, top_k=8, seed=1)).bytes_per_decode_step == 8 * 8
    penalized = _complete(gpu, prompt, SamplingParams(repetition_penalty=1.3))
    assert penalized.bytes_per_decode_step == 4 * N_VOCAB


def test_sampled_completion_matches_the_cpu_sampler_with_the_same_seed(model, gpu):
    prompt = tiny_models.test_ids()[:6]
    params = SamplingParams(temperature=1.2, top_k=40, seed=11)
    assert _complete(gpu, prompt, params).token_ids == _cpu(model, gpu, prompt, params)


def test_long_prompts_run_in_chunks_and_give_the_same_tokens(model, gpu, tmp_path):
    """A prompt longer than the largest step is prefilled in chunks (earlier ones read nothing back)."""
    loop, _ = gpu
    from pyshim.exec.gpu_runner import load_gpu

    prompt = (tiny_models.test_ids() * 3)[:40]
    small = loop.run_until_complete(load_gpu(model, settings=RunSettings(context=64, prefill_chunk=7)))
    try:
        read = small.stats.bytes_read
        done = loop.run_until_complete(generate(small, prompt, SamplingParams(), 4))
        assert done.token_ids == _cpu(model, gpu, prompt, max_tokens=4)
        assert small.stats.bytes_read - read == 4 * 4          # one argmax per generated token, none per chunk
    finally:
        small.close()


def test_prefill_reports_the_prompt_tokens_read_chunk_by_chunk(model):
    """on_prefill(done, total) sees (0, n) before the first chunk, then each chunk's end, then (n, n) with
    the first token; an awaitable it returns (a JS callback's promise) is awaited."""
    prompt = (tiny_models.test_ids() * 3)[:40]
    seen = []

    async def on_prefill(done, total):
        seen.append((done, total))

    asyncio.run(generate(reference(model, context=64, chunk=PREFILL_CHUNK), prompt, SamplingParams(), 2, on_prefill=on_prefill))
    n = len(prompt)
    assert seen == [(done, n) for done in (0, *range(PREFILL_CHUNK, n, PREFILL_CHUNK), n)]


def test_session_passes_on_prefill_to_chat_and_complete(model):
    session = Session(reference(model, context=64))
    sampling = Sampling.parse({"temperature": 0, "max_tokens": 2})
    kept = []
    for ask in (lambda on_prefill: session.chat([{"role": "user", "content": "hi"}], sampling, on_prefill=on_prefill),
                lambda on_prefill: session.complete(tiny_models.test_ids()[:6], sampling, on_prefill=on_prefill)):
        seen = []
        done = asyncio.run(ask(lambda d, t: seen.append((d, t))))
        n = done.prompt_tokens
        assert seen == [(done.cached_tokens, n), (n, n)]          # one chunk: the prompt fits the largest step
        kept.append(done.cached_tokens)
    assert kept == [0, 1]           # the second prompt shares the first one's BOS, whose key it keeps


def test_text_streams_and_stop_strings_cut_it(gpu):
    prompt = tiny_models.test_ids()[:6]
    pieces = []
    full = _complete(gpu, prompt, on_text=lambda piece, token: pieces.append(piece))
    assert "".join(pieces) == full.text and full.text
    cut = full.text[len(full.text) // 2:][:2]
    stopped = _complete(gpu, prompt, stop_strings=[cut])
    assert stopped.finish_reason == "stop" and stopped.text == full.text[:full.text.index(cut)]


def test_timings_hold_together(gpu):
    done = _complete(gpu, tiny_models.test_ids()[:6])
    t = done.timings()
    assert t["ttft_ms"] == t["prefill_ms"] > 0
    assert 0 < t["cpu_ms"] <= t["decode_ms"] and t["decode_tok_per_s"] > 0
    # each decode step's own time: as many as the steps, inside decode_ms, their median reported
    assert len(done.decode_step_ms) == t["decode_steps"] == MAX_TOKENS - 1
    assert 0 < sum(done.decode_step_ms) <= t["decode_ms"]
    assert min(done.decode_step_ms) <= t["decode_median_step_ms"] <= max(done.decode_step_ms)
    assert done.usage() == {"prompt_tokens": 6, "completion_tokens": MAX_TOKENS, "total_tokens": 6 + MAX_TOKENS,
                            "prompt_tokens_details": {"cached_tokens": done.cached_tokens}}


def test_gpu_bytes_are_the_allocation_and_the_plan(gpu):
    _, runner = gpu
    got = runner.memory()
    assert got["peak_gpu_bytes"] == runner.ops.memory()["total"] > runner.weight_bytes
    assert got["planned_gpu_bytes"] > runner.weight_bytes      # weights, plus the KV cache and activations


def test_abort_between_tokens(gpu):
    done = _complete(gpu, tiny_models.test_ids()[:6], should_stop=lambda: True)
    assert done.finish_reason == "abort" and len(done.token_ids) == 1


def test_scores_agree_with_the_reference(model, gpu):
    loop, runner = gpu
    ids = tiny_models.test_ids()
    got = loop.run_until_complete(score(runner, ids, 3))
    want = asyncio.run(score(_reference(model, gpu), ids, 3))
    assert got.top_ids[:, 0].tolist() == want.top_ids[:, 0].tolist()
    np.testing.assert_allclose(got.top_logits, want.top_logits, atol=2e-3 * np.abs(want.top_logits).max())
    probs = np.exp(got.top_logprobs)
    assert np.all(probs <= 1 + 1e-6) and np.all(np.diff(got.top_logprobs, axis=1) <= 0)


def test_requests_are_checked(gpu):
    _, runner = gpu
    session = Session(runner)
    assert session.prompt_ids(ids=[1, 2, 3]) == [1, 2, 3]
    assert session.prompt_ids("hello") == session.tokenizer.encode("hello", add_special=True)
    with pytest.raises(BadRequestError, match="outside the vocabulary"):
        session.prompt_ids(ids=[1, N_VOCAB])
    s = Sampling.parse({"temperature": 0.5, "max_tokens": 7, "stop": "\n", "ignore_eos": True})
    assert s.params.temperature == 0.5 and s.max_tokens == 7 and s.stop == ("\n",) and s.ignore_eos
    for bad in ({"max_tokens": 0}, {"temperature": -1}, {"top_p": 0}, {"stop": [""]}, {"seed": "x"}):
        with pytest.raises(BadRequestError):
            Sampling.parse(bad)
    s = Sampling.parse({"temperature": None, "top_p": None, "max_tokens": None, "stop": None})
    assert s.params.temperature == 1.0 and s.params.top_p == 1.0 and s.max_tokens == 256 and s.stop == () and not s.ignore_eos
    with pytest.raises(BadRequestError):
        asyncio.get_event_loop_policy().new_event_loop().run_until_complete(generate(runner, [], SamplingParams(), 4))


class ScriptedGrammar:
    """A Matcher that forces `script[i]` at reply token i where it is an id, and allows any token where it
    is None (past the script: anything)."""

    def __init__(self, script, vocab):
        self.script, self.vocab, self.at = script, vocab, 0

    async def mask(self):
        words = np.zeros((self.vocab + 31) // 32, np.uint32)
        forced = self.script[self.at] if self.at < len(self.script) else None
        if forced is None:
            words[:] = 0xFFFFFFFF
        else:
            words[forced >> 5] = np.uint32(1 << (forced & 31))
        return words

    def accept(self, token):
        self.at += 1

    def close(self):
        pass


class Recorded:
    """A runner whose steps are recorded; `one_by_one`: a reply's steps of several tokens run a token at a
    time (what the loop did before runs of forced tokens were written in one step)."""

    def __init__(self, runner, prompt_len, one_by_one=False):
        self.runner, self.prompt_len, self.one_by_one, self.steps = runner, prompt_len, one_by_one, []

    def __getattr__(self, name):
        return getattr(self.runner, name)

    async def step(self, step):
        (one,) = step.slices
        tokens, start = list(one.tokens), one.start
        if self.one_by_one and start >= self.prompt_len and len(tokens) > 1:
            for i, t in enumerate(tokens[:-1]):
                await self.step(Step.of([t], start + i, seq=one.seq, want=Want.NONE))
            return await self.step(Step.of(tokens[-1:], start + len(tokens) - 1, seq=one.seq, want=step.want, k=step.k))
        self.steps.append((start, len(tokens)))
        return await self.runner.step(step)


def test_forced_tokens_are_written_in_one_step_with_the_same_reply(model):
    """Jump-forward: a run of tokens the grammar forces costs one step (their keys written with the next
    step that reads), and the reply is the one of writing them a token at a time."""
    prompt = list(range(3, 23))
    script = [None, 40, 41, 42, 43, None, None, 50, 51, None]

    def run(one_by_one):
        runner = Recorded(reference(model, context=64), len(prompt), one_by_one)
        done = asyncio.run(generate(runner, prompt, SamplingParams(temperature=0), 10,
                                    constraint=ScriptedGrammar(script, N_VOCAB)))
        return done, runner.steps

    fast, fast_steps = run(False)
    slow, slow_steps = run(True)
    assert fast.token_ids == slow.token_ids
    assert [fast.token_ids[i] for i in (1, 2, 3, 4, 7, 8)] == [40, 41, 42, 43, 50, 51] and fast.forced == 6
    reply_steps = [n for start, n in fast_steps if start >= len(prompt)]
    assert max(reply_steps) == 5 and len(fast_steps) == len(slow_steps) - 6     # 40..43 + the free token: one step
