"""Routed experts streamed from the store into a GPU cache of a few slots per layer (pyshim.gpu.expert_cache),
natively, on tiny random MoE models: the cache's replacement rule, then a streamed model against the same
model fully resident — every logit equal bit for bit in steps of the same length, greedy tokens equal —
with the cache's hit rate and bytes counted, on both arithmetic routes (the int8 route's Q8_0 experts are
rearranged on the GPU after each upload)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import tiny_models
from pyshim.errors import UnsupportedError
from pyshim.gpu.expert_cache import LayerCache
from pyshim.exec.runner import Want
from pyshim.plan.settings import Arithmetic
from runners import Drive, gpu

F32, INT8 = Arithmetic.F32, Arithmetic.INT8


def test_least_recently_used_expert_goes_never_one_the_step_wants():
    layer = LayerCache("blk.0", n_slots=3, n_experts=8)
    slots, misses = layer.plan(np.array([[5, 2]]))
    assert [e for e, _ in misses] == [5, 2] and slots.tolist() == [[0, 1]]
    slots, misses = layer.plan(np.array([[2, 7]]))          # 2 hits; 7 takes the free slot
    assert misses == [(7, 2)] and slots.tolist() == [[1, 2]]
    slots, misses = layer.plan(np.array([[1, 2]]))          # 5 is the least recently used: 1 takes its slot
    assert misses == [(1, 0)] and slots.tolist() == [[0, 1]]
    slots, misses = layer.plan(np.array([[7], [5]]))        # 2 is now least recent (1 was used later)
    assert misses == [(5, 1)] and slots.tolist() == [[2], [1]]
    with pytest.raises(UnsupportedError, match="4 distinct experts"):
        layer.plan(np.array([[1, 2], [3, 4]]))


CASES = [("qwen2moe", "Q4_K", INT8, 5), ("olmoe", "Q8_0", INT8, 4), ("mixtral", "Q5_K", F32, 4),
         ("qwen3moe", "Q6_K", INT8, 6)]


@pytest.mark.parametrize("arch, qtype, arithmetic, slots", CASES, ids=[f"{a}-{q}-{m.value}" for a, q, m, _ in CASES])
def test_streamed_experts_equal_the_resident_model(tmp_path_factory, loop, device, arch, qtype, arithmetic, slots):
    path = tiny_models.write_tiny_model(tmp_path_factory.mktemp(arch), arch, QT[qtype])
    streamed = Drive(loop.run_until_complete(gpu(path, context=tiny_models.N_CTX, device=device, arithmetic=arithmetic,
                                                 expert_slots=slots)), loop)
    step = streamed.runner.capacity.max_step_tokens
    assert step == max(1, slots // streamed.runner.spec.n_experts_used)
    resident = Drive(loop.run_until_complete(gpu(path, context=tiny_models.N_CTX, device=device, arithmetic=arithmetic,
                                                 chunk=step)), loop)
    cache = streamed.runner.ops.expert_cache
    n_experts = streamed.runner.spec.n_experts
    resident_bytes = sum(w.ref.nbytes for n, w in resident.runner.ops.slots.slots.items() if "_exps." in n)
    assert cache.nbytes < resident_bytes * (slots + 1) / n_experts, "the cache holds more than its slots"

    ids = tiny_models.test_ids()
    got, want = streamed.logits(ids, all_logits=True), resident.logits(ids, all_logits=True)
    np.testing.assert_array_equal(got, want)
    stats = cache.stats
    assert 0 < stats.hits < stats.wanted and stats.uploaded_bytes == (stats.wanted - stats.hits) * cache.expert_bytes

    seq_s, seq_r = list(ids[:6]), list(ids[:6])
    token_s, token_r = streamed.greedy(seq_s), resident.greedy(seq_r)
    decode = None
    for _ in range(24):
        assert token_s == token_r, (seq_s[6:], token_r, token_s)
        seq_s.append(token_s)
        seq_r.append(token_r)
        token_s, token_r = streamed.greedy([token_s], len(seq_s) - 1), resident.greedy([token_r], len(seq_r) - 1)
        decode = decode or streamed.runner._programs[(1, Want.ARGMAX)]
    # one decode program served every token, whatever the cache held: expert choice stays data
    assert streamed.runner._programs[(1, Want.ARGMAX)] is decode and len(decode.stops) == streamed.runner.spec.n_layers
