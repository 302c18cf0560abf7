"""Top-k sampling with the candidates picked on the GPU (topk.wgsl): the kernel against NumPy (ties,
lengths that are not multiples of its chunk, fewer logits than K), the draw over k candidates against
the draw over the whole vocabulary, and a sampled decode on a tiny model equal to the CPU path's."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import tiny_models
from gpu_helpers import GPU
from pyshim.gpu.kernels import TOPK, TOPK_CHUNK, WG, groups
from pyshim.exec.runner import Step, Want
from runners import gpu as load_gpu
from pyshim.gpu.shaderc import ShaderKey
from pyshim.serve.sampling import SamplingParams, can_sample_top_k, make_rng, sample, sample_top_k


@pytest.fixture(scope="module")
def gpu():
    g = GPU()
    yield g
    g.close()


def reference_top_k(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(-x, kind="stable")[:k]       # stable: equal values keep the lower index first
    return x[order], order


@pytest.mark.parametrize("n", [40, 1000, TOPK_CHUNK * 3 + 17])
def test_kernel_matches_numpy(gpu, n):
    rng = np.random.default_rng(n)
    x = rng.normal(size=n).astype(np.float32)
    x[rng.integers(0, n, size=n // 5)] = 1.5        # many exact ties, some of them among the largest
    x[-1] = x.max() + 1                            # the very last logit wins
    parts = groups(n, TOPK_CHUNK)
    (partial,) = gpu.dispatch(ShaderKey.of("topk", WG=WG, K=TOPK, PASS1=True), [x], [parts * TOPK * 8],
                              dict(len=n, chunk=TOPK_CHUNK, x_off=0), (groups(parts, WG), 1, 1))
    (result,) = gpu.dispatch(ShaderKey.of("topk", WG=WG, K=TOPK, PASS2=True), [np.frombuffer(partial, dtype=np.uint32)],
                             [TOPK * 8], dict(len=parts * TOPK, chunk=0, x_off=0), (1, 1, 1))
    pairs = np.frombuffer(result, dtype=np.uint32).reshape(TOPK, 2)
    k = min(n, TOPK)
    want_v, want_i = reference_top_k(x, k)
    np.testing.assert_array_equal(pairs[:k, 0].view(np.float32), want_v)
    np.testing.assert_array_equal(pairs[:k, 1], want_i)
    assert (pairs[k:, 1] == 0xFFFFFFFF).all()       # fewer logits than K: the rest is marked empty


@pytest.mark.parametrize("top_p, min_p, temperature", [(1.0, 0.0, 1.0), (0.9, 0.0, 0.7), (0.95, 0.05, 1.3)])
def test_draw_over_candidates_equals_draw_over_vocabulary(top_p, min_p, temperature):
    rng = np.random.default_rng(0)
    for trial in range(50):
        logits = (rng.normal(size=3000) * 3).astype(np.float32)
        params = SamplingParams(temperature=temperature, top_k=40, top_p=top_p, min_p=min_p, seed=trial)
        values, ids = reference_top_k(logits, 40)
        full = sample(logits, params, make_rng(trial))
        assert sample_top_k(values, ids, params, make_rng(trial)) == full


def test_when_top_k_may_run_on_the_gpu():
    assert can_sample_top_k(SamplingParams(temperature=0.8, top_k=40), TOPK)
    assert not can_sample_top_k(SamplingParams(temperature=0.8, top_k=0), TOPK)          # all of the vocabulary
    assert not can_sample_top_k(SamplingParams(temperature=0.8, top_k=TOPK + 1), TOPK)
    assert not can_sample_top_k(SamplingParams(temperature=0.0, top_k=40), TOPK)          # greedy: argmax
    assert not can_sample_top_k(SamplingParams(temperature=0.8, top_k=40, repetition_penalty=1.1), TOPK)


def test_sampled_decode_equals_full_logits_path(tmp_path):
    path = tiny_models.write_tiny_model(tmp_path, "qwen2", QT.Q4_1)
    params = SamplingParams(temperature=0.9, top_k=20, top_p=0.95, seed=11)

    async def decode(use_top_k: bool) -> list[int]:
        runner = await load_gpu(path, context=tiny_models.N_CTX)
        rng, ids = make_rng(params.seed), list(tiny_models.test_ids())
        try:
            for _ in range(12):
                if use_top_k:
                    (out,) = await runner.step(Step.of(ids, want=Want.TOP_K, k=params.top_k))
                    token = sample_top_k(out.values, out.ids, params, rng)
                else:
                    token = sample((await runner.step(Step.of(ids)))[0].logits, params, rng)
                ids.append(token)
            return ids
        finally:
            runner.close()

    assert asyncio.run(decode(True)) == asyncio.run(decode(False))
