"""A prompt that starts with what a sequence's cache already holds runs only the rest (pyshim.exec.runner.
HeldTokens, pyshim.serve.generation): the next turn of a chat keeps the keys of the turns before it, and its
reply is the one a fresh run of the whole prompt gives — on the reference and natively on the GPU, for a
full-attention model and for Gemma 3's sliding-window rings (4 tokens, so every prompt here wraps them),
where only a prompt that extends everything held may keep it."""

from __future__ import annotations

import asyncio

import pytest
from gguf import GGMLQuantizationType as QT

from pyshim.exec.runner import HeldTokens, Slice
from pyshim.plan.settings import RunSettings
from pyshim.serve.generation import generate
from pyshim.serve.sampling import SamplingParams
from pyshim.serve.session import Session
from pyshim.serve.protocol import Sampling
import tiny_models
from runners import reference
from tiny_models import write_tiny_model

REPLY = 6
CHUNK = 5                 # prompts of 16-30 tokens run in several chunks, from wherever the kept prefix ends


# --- the bookkeeping alone ---

def test_full_attention_keeps_any_common_prefix():
    held = HeldTokens()
    held.wrote(Slice((1, 2, 3, 4), 0))
    held.wrote(Slice((5,), 4))
    assert held.tokens() == [1, 2, 3, 4, 5]
    assert held.reusable([1, 2, 3, 4, 5, 6]) == 5            # an extension keeps everything
    assert held.reusable([1, 2, 9, 9]) == 2                   # a different turn keeps the shared start
    assert held.reusable([1, 2, 3, 4, 5]) == 4                # the same prompt again: its last token runs
    assert held.reusable([7, 2]) == 0
    held.wrote(Slice((9, 9), 2))                              # a write below the end forgets what followed
    assert held.tokens() == [1, 2, 9, 9]
    held.wrote(Slice((8,), 7))                                # a gap: the keys before it stay a prefix
    assert held.tokens() == [1, 2, 9, 9]
    held.forget()
    assert held.tokens() == [] and held.reusable([1, 2, 3]) == 0


def test_a_wrapped_ring_keeps_only_an_extension():
    held = HeldTokens(window=4)
    held.wrote(Slice((1, 2, 3), 0))
    assert held.reusable([1, 2, 9, 9]) == 2                   # nothing went past the window yet: rings are whole
    held.wrote(Slice((4, 5, 6), 3))
    assert held.reusable([1, 2, 3, 4, 5, 6, 7]) == 6          # extending everything held: kept
    assert held.reusable([1, 2, 3, 4, 5, 9, 9]) == 0          # a shorter prefix: its window's slots may be gone
    held.wrote(Slice((6,), 5))                                # the same last token again (a re-run step): kept
    assert held.tokens() == [1, 2, 3, 4, 5, 6]
    held.wrote(Slice((9,), 3))                                # below the top of a wrapped ring: all forgotten
    assert held.tokens() == []
    held.wrote(Slice((1, 2), 0))                              # a new run from 0 is a prefix again
    assert held.tokens() == [1, 2] and held.reusable([1, 2, 3]) == 2 and held.reusable([1, 9]) == 0


# --- the generation loop over real executors ---

def _turns() -> tuple[list[int], list[int]]:
    ids = tiny_models.test_ids()
    return ids, [int(t) for t in (ids[5:13] + ids[1:5])]


async def _conversation(runner, fresh, *, reuse=True):
    """Three requests on `runner`: a prompt, then it with the reply and a new message, then a different
    second message; each reply checked against `fresh` (a runner reset before every request)."""
    first, more = _turns()
    done = await generate(runner, first, SamplingParams(), REPLY, reuse=reuse)
    second = first + done.token_ids + more
    again = await generate(runner, second, SamplingParams(), REPLY, reuse=reuse)
    third = first + done.token_ids + more[::-1]
    other = await generate(runner, third, SamplingParams(), REPLY, reuse=reuse)
    for prompt, got in ((first, done), (second, again), (third, other)):
        want = await generate(fresh, prompt, SamplingParams(), REPLY, reuse=False)
        assert got.token_ids == want.token_ids, (len(prompt), got.cached_tokens)
    return done, again, other


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_reference_replies_are_those_of_a_fresh_run(tmp_path, arch):
    path = write_tiny_model(tmp_path, arch, QT.Q8_0)
    runner, fresh = reference(path, context=64, chunk=CHUNK), reference(path, context=64, chunk=CHUNK)
    first, again, other = asyncio.run(_conversation(runner, fresh))
    held = len(tiny_models.test_ids()) + REPLY - 1            # the last reply token was never run
    assert first.cached_tokens == 0 and again.cached_tokens == held
    # the third prompt shares all but the new message with the second; Gemma's wrapped rings forbid it
    assert other.cached_tokens == (0 if arch == "gemma3" else len(tiny_models.test_ids()) + REPLY)
    assert runner.stats.steps < fresh.stats.steps - 2        # (fresh ran every prompt whole)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_gpu_replies_are_those_of_a_fresh_run(tmp_path, arch):
    """Natively on lavapipe: the rings of the GPU cache, prefill from an unaligned position; the fresh run
    is the same runner with reuse=False (the reference's greedy ids may differ from the GPU's at a near-tie)."""
    from pyshim.exec.gpu_runner import load_gpu

    path = write_tiny_model(tmp_path, arch, QT.Q8_0)

    async def run():
        gpu = await load_gpu(path, settings=RunSettings(context=64, prefill_chunk=CHUNK))
        try:
            _, again, _ = await _conversation(gpu, gpu)      # (the same runner, the whole prompt each time)
            assert again.cached_tokens > 0
        finally:
            gpu.close()

    asyncio.run(run())


def test_a_chat_turn_reports_its_cached_tokens_and_bench_runs_whole(tmp_path):
    """Session.chat: usage says which tokens were kept (OpenAI's cached_tokens), progress starts there;
    Session.bench (what the benchmarks time) runs the whole prompt however much is held."""
    session = Session(reference(write_tiny_model(tmp_path, "llama", QT.Q8_0), context=64))
    sampling = Sampling.parse({"temperature": 0, "max_tokens": 3})
    messages = [{"role": "user", "content": "a"}]
    first = asyncio.run(session.chat(messages, sampling))
    messages += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "b"}]
    seen = []
    second = asyncio.run(session.chat(messages, sampling, on_prefill=lambda d, t: seen.append((d, t))))
    assert 0 < second.cached_tokens < second.prompt_tokens
    assert second.usage()["prompt_tokens_details"] == {"cached_tokens": second.cached_tokens}
    assert seen[0] == (second.cached_tokens, second.prompt_tokens) and seen[-1] == (second.prompt_tokens,) * 2
    ids = session.chat_ids(messages)
    assert asyncio.run(session.bench(ids, 2)).cached_tokens == 0


def test_two_questions_under_one_system_prompt_prefill_it_once(tmp_path):
    """Requests one after another that share a long system prompt (#22's shared prefix, in one sequence):
    the second runs only from where the conversations differ."""
    session = Session(reference(write_tiny_model(tmp_path, "llama", QT.Q8_0), context=64))
    sampling = Sampling.parse({"temperature": 0, "max_tokens": 2})
    system = {"role": "system", "content": "w1 w2 w3"}       # (the tiny vocabulary spells it byte by byte)
    first = asyncio.run(session.chat([system, {"role": "user", "content": "a"}], sampling))
    second = asyncio.run(session.chat([system, {"role": "user", "content": "b"}], sampling))
    shared = session.chat_ids([system, {"role": "user", "content": "a"}])
    ids = session.chat_ids([system, {"role": "user", "content": "b"}])
    common = next(i for i, (x, y) in enumerate(zip(shared, ids)) if x != y)
    assert first.cached_tokens == 0 and second.cached_tokens == common > len(ids) // 2


def test_a_step_cut_short_forgets_its_sequence():
    held = HeldTokens()
    held.wrote(Slice((1, 2, 3), 0))
    with pytest.raises(RuntimeError):
        with held.writing(Slice((4, 5), 3)):
            raise RuntimeError("the device was lost")     # some of its keys may be written, some not
    assert held.tokens() == [] and held.reusable([1, 2, 3, 4]) == 0
    with held.writing(Slice((7, 8), 0)):
        pass
    assert held.tokens() == [7, 8]
