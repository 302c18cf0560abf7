"""Sampling functions, stop strings and the generation loop's stopping rules."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from pyshim.errors import BadRequestError
from pyshim.serve.generation import generate
from pyshim.text.stops import StopStrings
from pyshim.serve.sampling import (SamplingParams, apply_penalties, make_rng, min_p_filter, sample, top_k_filter,
                             top_p_filter)

LOGITS = np.array([1.0, 3.0, 2.0, -1.0, 0.5], dtype=np.float32)


def test_greedy_is_argmax():
    assert sample(LOGITS, SamplingParams(), make_rng(0)) == 1


def test_top_k_keeps_the_k_best():
    kept = np.isfinite(top_k_filter(LOGITS, 2))
    assert kept.tolist() == [False, True, True, False, False]


def test_top_p_keeps_the_smallest_set_reaching_p():
    probs = np.exp(LOGITS) / np.exp(LOGITS).sum()          # [.08, .61, .22, .01, .05]
    assert np.isfinite(top_p_filter(LOGITS, 0.5)).tolist() == [False, True, False, False, False]
    assert np.isfinite(top_p_filter(LOGITS, 0.7)).sum() == 2
    assert probs[1] + probs[2] > 0.7


def test_min_p_drops_the_unlikely():
    # p(token) >= 0.2 * p(best): exp(x - 3) >= 0.2  <=>  x >= 3 + ln 0.2 = 1.39
    assert np.isfinite(min_p_filter(LOGITS, 0.2)).tolist() == [False, True, True, False, False]


def test_penalties():
    out = apply_penalties(LOGITS, [1, 1, 3], repetition=2.0, presence=0.5, frequency=0.25)
    assert out[1] == pytest.approx(3.0 / 2 - 2 * 0.25 - 0.5)
    assert out[3] == pytest.approx(-1.0 * 2 - 0.25 - 0.5)
    assert out[0] == LOGITS[0]
    assert LOGITS[1] == 3.0                                # input untouched


def test_repetition_penalty_can_change_the_greedy_choice():
    assert sample(LOGITS, SamplingParams(repetition_penalty=2.0), make_rng(0), history=[1]) == 2


def test_same_seed_same_draws_and_temperature_spreads():
    params = SamplingParams(temperature=1.0, seed=7)
    a = [sample(LOGITS, params, rng) for rng in [make_rng(7)] for _ in range(50)]
    b = [sample(LOGITS, params, rng) for rng in [make_rng(7)] for _ in range(50)]
    assert a == b and len(set(a)) > 2
    cold = [sample(LOGITS, SamplingParams(temperature=0.05), make_rng(1)) for _ in range(20)]
    assert set(cold) == {1}


def test_top_k_one_is_greedy_at_any_temperature():
    rng = make_rng(3)
    assert {sample(LOGITS, SamplingParams(temperature=5.0, top_k=1), rng) for _ in range(30)} == {1}


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0), dict(min_p=2), dict(top_k=-1),
                                 dict(repetition_penalty=0)])
def test_bad_params(bad):
    with pytest.raises(BadRequestError):
        SamplingParams(**bad)


def test_stop_strings_hold_back_a_possible_start():
    w = StopStrings(["</end>"])
    assert w.feed("Hello <") == "Hello "
    assert w.feed("/e") == ""
    assert w.feed("x") == "</ex"
    assert w.feed(" then </en") == " then "
    assert w.feed("d> more") == "" and w.stopped
    assert w.flush() == ""


def test_stop_strings_flush_what_was_held():
    w = StopStrings(["STOP"])
    assert w.feed("abcST") == "abc"
    assert w.flush() == "ST"


class _FixedRunner:
    """A runner whose logits always favour the next id of a script: the Runner contract's smallest
    implementation (tests the loop, not a model)."""

    def __init__(self, script, n_ctx=100, vocab=10):
        from pyshim.exec.runner import Capacity, HeldTokens, RunnerStats

        self.script, self.vocab, self.calls = script, vocab, 0
        self.capacity, self.stats, self.held = Capacity(n_ctx=n_ctx), RunnerStats(), HeldTokens()    # (holds nothing)

    def reset(self, seq=0):
        self.calls = 0

    async def step(self, step):
        from pyshim.exec.runner import answer

        logits = np.zeros(self.vocab, dtype=np.float32)
        logits[self.script[min(self.calls, len(self.script) - 1)]] = 1.0
        self.calls += 1
        return [answer(logits, step) for _ in step.slices]


def _ids(runner, prompt, max_tokens, **kw):
    return asyncio.run(generate(runner, prompt, SamplingParams(), max_tokens, **kw))


def test_loop_stops_at_stop_token_max_tokens_and_context():
    done = _ids(_FixedRunner([4, 5, 2, 6]), [1, 1], 10, stop_ids=[2])
    assert done.token_ids == [4, 5] and done.finish_reason == "stop"       # the stop id ends it, unreturned
    assert _ids(_FixedRunner([4, 5, 2, 6]), [1, 1], 2).token_ids == [4, 5]
    # context of 4 with a 2-token prompt: tokens at positions 2 and 3 are fed back, the one after is the last
    done = _ids(_FixedRunner([3] * 9, n_ctx=4), [1, 1], 10)
    assert len(done.token_ids) == 3 and done.finish_reason == "length"
