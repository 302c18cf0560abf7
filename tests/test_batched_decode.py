"""A batched decode step (continuous batching's first piece, #22): one token of each of several sequences
in one program, the weights read once for all of them, gives each sequence exactly the tokens and the
logits it gets alone. Tiny random models natively, on both arithmetics and the real-GPU kernel forms."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import tiny_models
from pyshim.errors import UnsupportedError
from pyshim.exec.runner import Slice, Step, Want
from pyshim.plan.settings import Arithmetic
from runners import gpu

PROMPTS = [[5, 77, 300, 9, 12], [41, 42], [7, 8, 9, 10, 11, 12, 13, 14, 15]]   # each sequence's, of other lengths
NEW = 6
# (arch, weight type, arithmetic, kernel policy): sliding-window rings (gemma3), the int8 route's token
# kernels (in pairs: SwiftShader's), and the real-GPU forms (workgroup reductions, key splits with the combine pass, lanes)
CASES = [("llama", "Q4_0", Arithmetic.F32, {}),
         ("gemma3", "Q6_K", Arithmetic.F32, {}),
         ("qwen2", "Q4_K", Arithmetic.INT8, {}),
         ("llama", "Q4_1", Arithmetic.INT8, dict(i8_lanes=True)),        # tokens in pairs (lanes.wgsl)
         ("qwen2", "Q4_K", Arithmetic.INT8, dict(i8_lanes=True)),
         ("llama", "Q8_0", Arithmetic.F32, dict(reduce=True, attn_splits=5, attn_lanes=32))]


def alone(loop, runner, want: Want) -> list[list]:
    """Each sequence's prompt, then NEW greedy tokens one step at a time: its tokens, or its logits."""
    out = []
    for seq, prompt in enumerate(PROMPTS):
        runner.reset(seq)
        got, (first,) = [], loop.run_until_complete(runner.step(Step.of(prompt, 0, seq=seq, want=Want.LOGITS)))
        token, pos = int(np.argmax(first.logits)), len(prompt)
        for _ in range(NEW):
            (o,) = loop.run_until_complete(runner.step(Step.of([token], pos, seq=seq, want=want)))
            got.append(o.token if want is Want.ARGMAX else o.logits)
            token, pos = (o.token if want is Want.ARGMAX else int(np.argmax(o.logits))), pos + 1
        out.append(got)
    return out


def batched(loop, runner, want: Want) -> list[list]:
    """The same prompts, then every decode step one batched step over all the sequences."""
    tokens, positions, out = [], [], [[] for _ in PROMPTS]
    for seq, prompt in enumerate(PROMPTS):
        runner.reset(seq)
        (first,) = loop.run_until_complete(runner.step(Step.of(prompt, 0, seq=seq, want=Want.LOGITS)))
        tokens.append(int(np.argmax(first.logits)))
        positions.append(len(prompt))
    for _ in range(NEW):
        step = Step(tuple(Slice((t,), p, seq) for seq, (t, p) in enumerate(zip(tokens, positions))), want)
        answers = loop.run_until_complete(runner.step(step))
        for seq, o in enumerate(answers):
            out[seq].append(o.token if want is Want.ARGMAX else o.logits)
            tokens[seq] = o.token if want is Want.ARGMAX else int(np.argmax(o.logits))
            positions[seq] += 1
    return out


@pytest.mark.parametrize("arch, qtype, arithmetic, policy", CASES, ids=[f"{c[0]}-{c[1]}-{c[2].value}" + ("-lanes" if c[3].get("i8_lanes") else "") for c in CASES])
def test_a_batched_step_gives_each_sequence_what_it_gets_alone(tmp_path_factory, loop, device, arch, qtype, arithmetic,
                                                                policy):
    path = tiny_models.write_tiny_model(tmp_path_factory.mktemp(arch), arch, QT[qtype])
    runner = loop.run_until_complete(gpu(path, context=tiny_models.N_CTX, device=device, arithmetic=arithmetic,
                                         policy=policy, max_seqs=len(PROMPTS)))
    assert alone(loop, runner, Want.ARGMAX) == batched(loop, runner, Want.ARGMAX)
    # the logits word for word: every token row is computed by the one-token kernels' arithmetic
    for one, many in zip(alone(loop, runner, Want.LOGITS), batched(loop, runner, Want.LOGITS)):
        for a, b in zip(one, many):
            np.testing.assert_array_equal(a, b)
    # one program a step shape, whichever sequences run in it (the step map says: pyshim.gpu.kv)
    assert sorted(runner._programs, key=str) == sorted([(1, Want.ARGMAX, False), (1, Want.LOGITS, False),
                                                        (3, Want.ARGMAX, True), (3, Want.LOGITS, True)]
                                                       + [(len(p), Want.LOGITS, False) for p in PROMPTS], key=str)
    dispatches = runner._programs[(3, Want.ARGMAX, True)].dispatches
    # its argmax reads back a word per sequence; each layer writes every sequence's keys and attends for
    # all of them in one dispatch each (the attention's split records merged by one combine pass)
    assert sum(d.key.family == "argmax" for d in dispatches) == 2
    assert sum(d.key.family == "kv_write" for d in dispatches) == runner.spec.n_layers
    assert sum(d.key.family == "attention" for d in dispatches) == runner.spec.n_layers * (2 if policy.get("attn_splits", 1) > 1 else 1)


def test_sequences_beyond_what_the_runner_holds_are_refused(tmp_path_factory, loop, device):
    path = tiny_models.write_tiny_model(tmp_path_factory.mktemp("llama"), "llama", QT.Q4_0)
    runner = loop.run_until_complete(gpu(path, context=tiny_models.N_CTX, device=device, max_seqs=2))
    step = Step(tuple(Slice((1,), 0, seq) for seq in range(3)), Want.ARGMAX)
    with pytest.raises(UnsupportedError, match="sequence 2 is beyond the 2"):
        loop.run_until_complete(runner.step(step))
