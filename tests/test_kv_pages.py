"""The GPU's paged KV cache (#22, pyshim.gpu.kv): sequences take pages as they grow and give them back, a
freed page holding another sequence's old keys is reused without changing anyone's tokens, a shared
prefix is held by reference and copied on write, sliding-window rings wrap inside their pages, and a cache
short of pages takes back idle sequences' pages or refuses the step with a clear error — never a wrong
token. Tiny random models natively (lavapipe)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import tiny_models
from pyshim.errors import KVCacheFullError
from pyshim.exec.runner import Slice, Step, Want
from pyshim.gpu.kv import NO_PAGE
from pyshim.plan.memory import estimate
from pyshim.plan.settings import KV_PAGE
from pyshim.serve.batching import BatchingRunner
from pyshim.serve.generation import generate
from pyshim.serve.sampling import SamplingParams
from runners import gpu

IDS = tiny_models.test_ids()
LONG = (IDS * 3)[:40]            # three pages' worth of prompt (40 positions)
OTHER = [7, 8, 9, 10, 11]
GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return tiny_models.write_tiny_model(tmp_path_factory.mktemp("llama"), "llama", QT.Q4_0)


def greedy(loop, runner, seq: int, prompt, new: int, start: int = 0) -> list[int]:
    """`prompt` from position `start` of sequence `seq`, then `new` greedy tokens, a step each."""
    (o,) = loop.run_until_complete(runner.step(Step.of(prompt, start, seq=seq, want=Want.ARGMAX)))
    out, pos = [o.token], start + len(prompt)
    for _ in range(new - 1):
        (o,) = loop.run_until_complete(runner.step(Step.of([out[-1]], pos, seq=seq, want=Want.ARGMAX)))
        out.append(o.token)
        pos += 1
    return out


def test_pages_come_and_go_with_the_sequences(loop, device, llama):
    runner = loop.run_until_complete(gpu(llama, context=tiny_models.N_CTX, device=device, max_seqs=3))
    kv = runner.ops.kv
    per_seq = tiny_models.N_CTX // KV_PAGE
    assert kv.n_pages == 3 * per_seq and kv.pages.free == kv.n_pages
    first = greedy(loop, runner, 0, LONG, 6)             # positions 0..44: three pages
    assert kv.pages.held(0) == 3 and kv.pages.free == kv.n_pages - 3
    other = greedy(loop, runner, 1, OTHER, 4)
    assert kv.pages.held(1) == 1
    runner.reset(0)
    assert kv.pages.held(0) == 0 and kv.pages.free == kv.n_pages - 1
    # sequence 2 takes the pages sequence 0 left, its old keys still in them: its tokens are its own
    assert greedy(loop, runner, 2, LONG, 6) == first
    assert set(kv.pages.rows[2][:3]) <= set(range(3))
    assert greedy(loop, runner, 1, OTHER, 4) == other


def test_a_shared_prefix_is_held_by_reference_and_copied_on_write(loop, device, llama):
    runner = loop.run_until_complete(gpu(llama, context=tiny_models.N_CTX, device=device, max_seqs=3))
    kv = runner.ops.kv
    # what each gets with nothing shared: sequence 0 runs LONG and goes on; sequence 1 runs the first 37
    # positions of LONG, then its own tokens (37 ends inside the third page)
    mine = LONG[:37] + OTHER
    alone0 = greedy(loop, runner, 0, LONG, 8)
    alone1 = greedy(loop, runner, 1, mine, 5)
    for seq in (0, 1):
        runner.reset(seq)
    a = greedy(loop, runner, 0, LONG, 4)
    pages0 = kv.pages.rows[0][:3].copy()
    free = kv.pages.free
    assert runner.share(0, 1, 37)
    assert list(kv.pages.rows[1][:3]) == list(pages0) and kv.pages.free == free     # no page taken, none copied yet
    assert list(kv.pages.refs[pages0]) == [2, 2, 2]
    b = greedy(loop, runner, 1, OTHER, 5, start=37)      # writes into the shared third page: its own copy first
    assert list(kv.pages.rows[1][:2]) == list(pages0[:2]) and kv.pages.rows[1][2] != pages0[2]
    assert list(kv.pages.refs[pages0]) == [2, 2, 1]
    # sequence 0 goes on from where it was: its third page is still its own
    a += greedy(loop, runner, 0, [a[-1]], 4, start=len(LONG) + 3)
    assert a == alone0 and b == alone1


def test_sliding_window_rings_wrap_inside_their_pages(tmp_path_factory, loop, device):
    """Gemma 3's 4-token window in steps of 4: each local layer keeps a ring of one page a sequence, which
    wraps three times over a 40-token prompt plus 8 tokens; batched steps give each sequence its tokens."""
    path = tiny_models.write_tiny_model(tmp_path_factory.mktemp("gemma3"), "gemma3", QT.Q8_0)
    runner = loop.run_until_complete(gpu(path, context=tiny_models.N_CTX, chunk=4, device=device, max_seqs=2))
    kv = runner.ops.kv
    assert kv.ring_len == 1
    local = [il for il, swa in enumerate(runner.spec.swa_layers) if swa]
    assert all(kv.layer(il).table_len == 1 for il in local)

    def prompt(seq, ids):
        for at in range(0, len(ids) - 4, 4):
            loop.run_until_complete(runner.step(Step.of(ids[at:at + 4], at, seq=seq, want=Want.NONE)))
        at = (len(ids) - 1) // 4 * 4
        return loop.run_until_complete(runner.step(Step.of(ids[at:], at, seq=seq, want=Want.ARGMAX)))[0].token

    prompts = [LONG, (IDS * 2)[5:33]]
    alone = []
    for seq, ids in enumerate(prompts):
        tokens, pos = [prompt(seq, ids)], len(ids)
        for _ in range(8):
            (o,) = loop.run_until_complete(runner.step(Step.of([tokens[-1]], pos, seq=seq, want=Want.ARGMAX)))
            tokens.append(o.token)
            pos += 1
        alone.append(tokens)
    for seq in (0, 1):
        runner.reset(seq)
    together = [[prompt(seq, ids)] for seq, ids in enumerate(prompts)]
    pos = [len(ids) for ids in prompts]
    for _ in range(8):
        step = Step(tuple(Slice((t[-1],), p, seq) for seq, (t, p) in enumerate(zip(together, pos))), Want.ARGMAX)
        for seq, o in enumerate(loop.run_until_complete(runner.step(step))):
            together[seq].append(o.token)
            pos[seq] += 1
    assert together == alone


def test_sliding_window_rings_are_copied_when_a_prefix_is_shared(tmp_path_factory, loop, device):
    """Gemma 3 with one-page rings: a sequence taking another's first 22 positions gets the full layers'
    pages by reference and a copy of each ring (which still holds the window before 22), and goes on to
    the tokens it gets alone; once the other has written past what its ring keeps, sharing is refused."""
    path = tiny_models.write_tiny_model(tmp_path_factory.mktemp("gemma3"), "gemma3", QT.Q8_0)
    runner = loop.run_until_complete(gpu(path, context=tiny_models.N_CTX, chunk=4, device=device, max_seqs=3))
    kv = runner.ops.kv

    def prompt(seq, ids, start=0):
        for at in range(start, start + len(ids), 4):
            (o,) = loop.run_until_complete(runner.step(Step.of(ids[at - start:at - start + 4], at, seq=seq, want=Want.ARGMAX)))
        return o.token

    mine = LONG[:22] + OTHER
    alone = greedy(loop, runner, 2, [prompt(2, mine)], 6, start=len(mine))
    runner.reset(2)
    prompt(0, LONG[:22])
    assert runner.share(0, 1, 22)
    assert list(kv.pages.rows[1][:2]) == list(kv.pages.rows[0][:2])
    got = greedy(loop, runner, 1, [prompt(1, OTHER, start=22)], 6, start=len(mine))
    assert got == alone
    prompt(0, LONG[22:40], start=22)               # sequence 0 now reaches position 40: its ring moved on
    assert not runner.share(0, 2, 22)


def test_a_cache_short_of_pages_refuses_a_step_and_no_token_changes(loop, device, llama):
    """Five pages for two sequences: the one running keeps its three while another asks for three, which is
    refused before anything is written; the first goes on to exactly its own tokens."""
    runner = loop.run_until_complete(gpu(llama, context=tiny_models.N_CTX, device=device, max_seqs=2, kv_pages=5))
    kv = runner.ops.kv
    want = greedy(loop, runner, 0, LONG, 8)
    runner.reset(0)
    with runner.held.busy(0):                            # a request is running in sequence 0
        got = greedy(loop, runner, 0, LONG, 4)
        with pytest.raises(KVCacheFullError, match="2 free pages of 5 .* needs 3") as info:
            greedy(loop, runner, 1, LONG, 2)
        assert "fewer parallel sequences" in info.value.hint
        assert kv.pages.held(1) == 0 and kv.pages.free == 2
        got += greedy(loop, runner, 0, [got[-1]], 4, start=len(LONG) + 3)
    assert got == want
    # idle now: its pages are taken back for sequence 1, and it forgets what it held
    assert greedy(loop, runner, 1, LONG, 8) == want
    assert kv.reclaimed == 1 and runner.held.tokens(0) == [] and kv.pages.held(0) == 0
    # going on where it was would attend to keys that are gone: refused, not answered wrong
    with pytest.raises(KVCacheFullError, match="taken back"):
        greedy(loop, runner, 0, [1], 1, start=48)


def test_requests_short_of_pages_wait_for_others_to_end(loop, device, llama):
    """Four requests at once with pages for two of them (each takes two): the ones that find none free
    wait for a running one to end and take its pages back, and every one answers exactly what it answers
    alone; a request the whole cache cannot hold fails with KVCacheFullError at once."""
    runner = loop.run_until_complete(gpu(llama, context=tiny_models.N_CTX, device=device, max_seqs=4, kv_pages=4))
    prompts = [LONG[i:i + 20] for i in range(4)]        # 20 + 8 positions: two pages each
    want = [loop.run_until_complete(generate(runner, p, GREEDY, 8, seq=0, reuse=False)).token_ids for p in prompts]
    runner.reset(0)
    batching = BatchingRunner(runner)

    async def together():
        return await asyncio.gather(*(generate(batching, p, GREEDY, 8, seq=seq, reuse=False)
                                      for seq, p in enumerate(prompts)))

    got = loop.run_until_complete(together())
    assert [c.token_ids for c in got] == want
    assert batching.batch_stats.waits >= 2 and runner.ops.kv.reclaimed >= 2
    small = loop.run_until_complete(gpu(llama, context=tiny_models.N_CTX, device=device, max_seqs=2, kv_pages=3))
    with pytest.raises(KVCacheFullError, match="3 free pages of 3 .* needs 4"):
        loop.run_until_complete(generate(BatchingRunner(small), (IDS * 4)[:60], GREEDY, 2, seq=0, reuse=False))


def test_a_request_that_needs_a_page_while_all_others_wait_fails_and_frees_them(loop, device, llama):
    """Two requests holding two of four pages each, both needing a third to go on: one waits for the
    other, which then fails for want of a page (no one else runs to free one) and so frees its pages;
    the waiting one goes on to its own tokens."""
    runner = loop.run_until_complete(gpu(llama, context=tiny_models.N_CTX, device=device, max_seqs=2, kv_pages=4))
    prompts = [LONG[:28], LONG[3:31]]                   # positions 0..27: two pages; a third from position 32 on
    want = loop.run_until_complete(generate(runner, prompts[0], GREEDY, 10, seq=0, reuse=False)).token_ids
    runner.reset(0)
    batching = BatchingRunner(runner)

    async def together():
        return await asyncio.gather(*(generate(batching, p, GREEDY, 10, seq=seq, reuse=False)
                                      for seq, p in enumerate(prompts)), return_exceptions=True)

    a, b = loop.run_until_complete(together())
    outcomes = sorted([a, b], key=lambda r: isinstance(r, Exception))
    assert isinstance(outcomes[1], KVCacheFullError) and not isinstance(outcomes[0], Exception)
    if not isinstance(a, Exception):
        assert a.token_ids == want


def test_the_memory_plan_counts_pages(loop, device, llama):
    runner = loop.run_until_complete(gpu(llama, context=tiny_models.N_CTX, device=device, max_seqs=4, kv_pages=6))
    plan = estimate(runner.spec, runner.header.tensors, context=tiny_models.N_CTX, seqs=4, kv_pages=6)
    assert runner.ops.memory()["kv"] == plan.kv_bytes
    full = estimate(runner.spec, runner.header.tensors, context=tiny_models.N_CTX, seqs=4)
    assert plan.kv_bytes * 16 == full.kv_bytes * 6        # 6 pages of the 4 x 4 a whole context each takes
    assert runner.memory()["planned_gpu_bytes"] == plan.total_bytes
    assert list(runner.ops.kv.pages.rows.reshape(-1)) == [NO_PAGE] * 16


def test_keys_a_step_is_rewriting_are_not_shared():
    """While a step rewrites a sequence from position 5 (a new request kept only its first 5 keys), the
    keys it held past 5 are no one's to share: a prompt extending the old conversation takes 5, not 30."""
    from pyshim.exec.runner import HeldTokens

    held = HeldTokens()
    old = list(range(10, 40))
    held.wrote(Slice(tuple(old), 0, 0))
    assert held.best_source(old + [1], 1) == (0, 30)
    with held.writing(Slice((99, 98), 5, 0)):
        assert held.best_source(old + [1], 1) == (0, 5)
    assert held.best_source(old + [1], 1) == (0, 5) and held.tokens(0) == old[:5] + [99, 98]
