"""pyshim.serve.runs natively (wgpu on lavapipe), on a tiny random model: a raw-prompt completion on the GPU
executor gives the CPU reference's tokens; stop ids, stop strings, ignore_eos; timings hold together;
teacher-forced scores agree with the reference. (In the browser: tests/test_browser_backend.py.)"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from pyshim.errors import BadRequestError
from pyshim.serve.generation import generate_ids, score
from pyshim.exec.loading import load
from pyshim.serve.runs import complete_ids, request_ids, sampling_params, score_ids
from pyshim.serve.sampling import SamplingParams
from pyshim.text.tokenizer import Tokenizer
import tiny_models
from tiny_models import N_VOCAB, write_tiny_model

MAX_TOKENS = 10


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("runs"), "llama", QT.Q8_0)


@pytest.fixture(scope="module")
def gpu(model):
    """(loop, runner): one native device for the module, on its own event loop."""
    from pyshim.exec.gpu_runner import load_gpu_async

    loop = asyncio.new_event_loop()
    runner = loop.run_until_complete(load_gpu_async(model, n_ctx=64))
    yield loop, runner
    runner.device.destroy()
    loop.close()


def _reference(model, gpu):
    """The CPU reference in the executor's arithmetic (on CPU adapters its int8 route rounds activations
    as llama.cpp does; the reference emulates exactly that)."""
    return load(model, emulate_llama_cpp=gpu[1].ops.int8)


def _complete(gpu, prompt, params=SamplingParams(), max_tokens=MAX_TOKENS, **kw):
    loop, runner = gpu
    tok = Tokenizer.from_metadata(runner.metadata)
    return loop.run_until_complete(complete_ids(runner, tok, prompt, params, max_tokens, **kw))


def test_greedy_completion_equals_the_cpu_reference_and_ignores_eos_on_request(model, gpu):
    prompt = tiny_models.test_ids()[:6]
    cpu = list(generate_ids(_reference(model, gpu), prompt, MAX_TOKENS, SamplingParams()))
    done = _complete(gpu, prompt)
    assert done.token_ids == cpu and done.finish_reason == "length" and len(cpu) == MAX_TOKENS
    # Make the third greedy token an end-of-generation id: generation stops there and leaves it out.
    stopped = _complete(gpu, prompt, stop_ids=[cpu[2]])
    assert stopped.token_ids == cpu[:2] and stopped.finish_reason == "stop"
    # Without stop ids (ignore_eos) the run is the full length again, as the benchmark needs.
    assert _complete(gpu, prompt, stop_ids=()).token_ids == cpu


def test_sampled_completion_matches_the_cpu_sampler_with_the_same_seed(model, gpu):
    prompt = tiny_models.test_ids()[:6]
    params = SamplingParams(temperature=1.2, top_k=40, seed=11)
    cpu = list(generate_ids(_reference(model, gpu), prompt, MAX_TOKENS, params))
    assert _complete(gpu, prompt, params).token_ids == cpu


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
    t = done.as_dict(load_ms=5.0)["timings"]
    assert t["load_ms"] == 5.0 and t["ttft_ms"] == t["prefill_ms"] > 0
    assert 0 < t["cpu_ms"] <= t["decode_ms"] and t["decode_tok_per_s"] > 0
    assert done.as_dict()["usage"] == {"prompt_tokens": 6, "completion_tokens": MAX_TOKENS, "total_tokens": 6 + MAX_TOKENS}


def test_gpu_bytes_are_the_allocation_and_the_plan(gpu):
    from pyshim.serve.runs import gpu_bytes

    _, runner = gpu
    got = gpu_bytes(runner)
    assert got["peak_gpu_bytes"] == runner.ops.memory()["total"] > runner.weight_bytes
    assert got["planned_gpu_bytes"] > runner.weight_bytes      # weights, plus the KV cache and activations


def test_abort_between_tokens(gpu):
    done = _complete(gpu, tiny_models.test_ids()[:6], should_stop=lambda: True)
    assert done.finish_reason == "abort" and len(done.token_ids) == 1


def test_scores_agree_with_the_reference(model, gpu):
    loop, runner = gpu
    ids = tiny_models.test_ids()
    got = loop.run_until_complete(score_ids(runner, ids, 3))
    want_ids, want_logits = score(_reference(model, gpu), ids, 3)
    assert [r[0] for r in got["top_ids"]] == want_ids[:, 0].tolist()
    np.testing.assert_allclose(got["top_logits"], want_logits, atol=2e-3 * np.abs(want_logits).max())
    probs = np.exp(np.array(got["top_logprobs"]))
    assert np.all(probs <= 1 + 1e-6) and np.all(np.diff(got["top_logprobs"], axis=1) <= 0)


def test_requests_are_checked(gpu):
    _, runner = gpu
    tok = Tokenizer.from_metadata(runner.metadata)
    assert request_ids(tok, {"prompt_ids": [1, 2, 3]}, N_VOCAB) == [1, 2, 3]
    assert request_ids(tok, {"prompt": "hello"}, N_VOCAB) == tok.encode("hello", add_special=True)
    for bad in ({}, {"prompt_ids": [1, N_VOCAB]}, {"prompt_ids": "1 2"}, {"prompt_ids": []}, {"prompt": 3}):
        with pytest.raises(BadRequestError):
            request_ids(tok, bad, N_VOCAB)
    params, max_tokens, stops, ignore_eos = sampling_params({"temperature": 0.5, "max_tokens": 7, "stop": "\n", "ignore_eos": True})
    assert params.temperature == 0.5 and max_tokens == 7 and stops == ["\n"] and ignore_eos
    with pytest.raises(BadRequestError):
        sampling_params({"max_tokens": 0})
    params, max_tokens, stops, ignore_eos = sampling_params({"temperature": None, "top_p": None, "max_tokens": None, "stop": None})
    assert params.greedy and params.top_p == 1.0 and max_tokens == 256 and stops == [] and not ignore_eos
