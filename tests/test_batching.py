"""Continuous batching over the one generation loop (pyshim.serve.batching): concurrent `generate` calls,
each in its own sequence, have their decode steps run together, and each gets exactly the reply it gets
alone — with other prompt lengths and max_tokens, a request joining the running ones, one aborted."""

from __future__ import annotations

import asyncio

import pytest
from gguf import GGMLQuantizationType as QT

import tiny_models
from pyshim.serve.batching import BatchingRunner
from pyshim.serve.generation import generate
from pyshim.serve.sampling import SamplingParams
from runners import gpu

PROMPTS = [[5, 77, 300, 9, 12, 40, 41], [41, 42], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17], [300, 200, 100]]
MAX_TOKENS = [9, 6, 12, 8]
GREEDY = SamplingParams(temperature=0.0)


def load(tmp_path, loop, device, seqs: int = 4, kv_type: str = "f32"):
    path = tiny_models.write_tiny_model(tmp_path, "llama", QT.Q4_0)
    return loop.run_until_complete(gpu(path, context=tiny_models.N_CTX, device=device, max_seqs=seqs, kv_type=kv_type))


def alone(loop, runner) -> list[list[int]]:
    return [loop.run_until_complete(generate(runner, p, GREEDY, n, seq=seq, reuse=False)).token_ids
            for seq, (p, n) in enumerate(zip(PROMPTS, MAX_TOKENS))]


def test_concurrent_requests_each_get_their_reply_alone(tmp_path, loop, device):
    runner = load(tmp_path, loop, device)
    want = alone(loop, runner)
    batching = BatchingRunner(runner)

    async def together():
        return await asyncio.gather(*(generate(batching, p, GREEDY, n, seq=seq, reuse=False)
                                      for seq, (p, n) in enumerate(zip(PROMPTS, MAX_TOKENS))))

    done = loop.run_until_complete(together())
    assert [c.token_ids for c in done] == want
    # each request's decode timings are its own: the word per step its argmax read back, not the others'
    assert all(c.decode_bytes_read == 4 * c.decode_steps for c in done)
    stats = batching.batch_stats
    # the four ran together until the shortest ended, then three, ... : most decode tokens came in batches
    assert stats.steps >= min(MAX_TOKENS) - 1 and stats.tokens >= 4 * (min(MAX_TOKENS) - 1)
    batched_programs = [key for key in runner._programs if key[2]]
    assert {key[0] for key in batched_programs} >= {4, 3, 2}


def test_a_late_request_and_an_aborted_one_leave_the_others_unchanged(tmp_path, loop, device):
    runner = load(tmp_path, loop, device)
    want = alone(loop, runner)
    batching = BatchingRunner(runner)

    async def scene():
        started = asyncio.Event()
        seen = [0]

        def on_text(piece, token):          # request 0's third token lets request 3 in
            seen[0] += 1
            if seen[0] == 3:
                started.set()

        class Ids:                          # a decoder that yields a piece per token (on_text sees each)
            def add(self, token):
                return "x"

            def finish(self):
                return ""

        first = generate(batching, PROMPTS[0], GREEDY, MAX_TOKENS[0], seq=0, reuse=False, decoder=Ids(), on_text=on_text)
        aborted = generate(batching, PROMPTS[1], GREEDY, 50, seq=1, reuse=False,
                           should_stop=lambda: batching.batch_stats.steps >= 3)
        third = generate(batching, PROMPTS[2], GREEDY, MAX_TOKENS[2], seq=2, reuse=False)

        async def late():
            await started.wait()
            return await generate(batching, PROMPTS[3], GREEDY, MAX_TOKENS[3], seq=3, reuse=False)

        return await asyncio.gather(first, aborted, third, late())

    a, b, c, d = loop.run_until_complete(scene())
    assert a.token_ids == want[0] and c.token_ids == want[2] and d.token_ids == want[3]
    assert b.finish_reason == "abort" and b.token_ids == want[1][:len(b.token_ids)] and len(b.token_ids) < 50


@pytest.mark.parametrize("kv_type", ["f32", "f16", "q8", "q4"])
def test_a_prompt_another_sequence_holds_is_copied_not_run_again(tmp_path, loop, device, kv_type):
    """A request whose prompt starts with what a running request's sequence holds (a shared system
    prompt) holds those keys' pages too (the whole ones by reference, the one it writes into copied): it
    runs only its own tail, and its reply and the running one's are what they are alone."""
    runner = load(tmp_path, loop, device, seqs=2, kv_type=kv_type)
    system = [(7 * i + 3) % 300 + 1 for i in range(40)]
    first, second = system + [5, 77, 300], system + [41, 42, 43, 44]
    want = [loop.run_until_complete(generate(runner, p, GREEDY, 10, seq=0, reuse=False)).token_ids for p in (first, second)]
    batching = BatchingRunner(runner)
    runner.reset(0)

    async def scene():
        started = asyncio.Event()

        class Ids:
            def add(self, token):
                started.set()
                return "x"

            def finish(self):
                return ""

        async def late():
            await started.wait()
            return await generate(batching, second, GREEDY, 10, seq=1)

        return await asyncio.gather(generate(batching, first, GREEDY, 10, seq=0, reuse=False, decoder=Ids()), late())

    a, b = loop.run_until_complete(scene())
    assert a.token_ids == want[0] and b.token_ids == want[1]
    assert b.cached_tokens == len(system) and b.prompt_tokens == len(second)
    assert runner.held.tokens(1)[:len(system)] == system
    rows = runner.ops.kv.pages.rows
    assert list(rows[1][:len(system) // 16]) == list(rows[0][:len(system) // 16]) and rows[1][2] != rows[0][2]


def test_requests_arriving_together_under_one_system_prompt_run_it_once(tmp_path, loop, device):
    """Three requests at once under the same 40-token opening: the first runs it, the others wait for its
    keys and share its pages (their prompts' own tails only), and every reply is what it is alone."""
    runner = load(tmp_path, loop, device, seqs=3)
    system = [(11 * i + 5) % 300 + 1 for i in range(40)]
    prompts = [system + [5, 77, 300], system + [41, 42, 43, 44], system + [9]]
    want = [loop.run_until_complete(generate(runner, p, GREEDY, 8, seq=0, reuse=False)).token_ids for p in prompts]
    for seq in range(3):
        runner.reset(seq)
    batching = BatchingRunner(runner)

    async def together():
        return await asyncio.gather(*(generate(batching, p, GREEDY, 8, seq=seq) for seq, p in enumerate(prompts)))

    done = loop.run_until_complete(together())
    assert [c.token_ids for c in done] == want
    assert [c.cached_tokens for c in done] == [0, len(system), len(system)]
    assert batching.batch_stats.steps >= 5
