"""The real-GPU matvec variants forced on this machine's CPU adapter (lavapipe), end to end: the
workgroup-reduction matvec (`reduce`) and its subgroup form (`subgroup`, the default on GPUs with
subgroups) on tiny models of several architectures against the NumPy reference, and SmolLM2 greedy
decoding equal to the cpu backend token for token. The f32 arithmetic throughout: the
variants change only how a row's partial sums are added."""

from __future__ import annotations

import numpy as np
import pytest

import tiny_models
from pyshim.gpu.policy import subgroups_usable
from pyshim.plan.settings import Arithmetic
from runners import Drive, assert_greedy_like_reference, gpu, reference

VARIANTS = {"reduce": dict(reduce=True, subgroup=False), "subgroup": dict(subgroup=True)}
CASES = [("llama", "Q4_0"), ("gemma3", "Q4_K"), ("qwen2", "F16"), ("phi3", "Q8_0"), ("qwen3", "Q6_K")]


@pytest.fixture(scope="module")
def device(device):
    if not subgroups_usable(device.caps):
        pytest.skip("this adapter has no subgroups")
    return device


def runner_for(loop, device, path, n_ctx, variant, **options):
    return loop.run_until_complete(gpu(path, context=n_ctx, device=device, arithmetic=Arithmetic.F32,
                                       policy=VARIANTS[variant], **options))


def matvec_defines(runner) -> set[str]:
    return {name for p in runner._programs.values() for d in p.dispatches if d.key.family == "matvec" for name, _ in d.key.defines}


@pytest.mark.parametrize("arch, qtype", CASES, ids=[f"{a}-{q}" for a, q in CASES])
def test_subgroup_variant_logits_match_reference(tmp_path_factory, loop, device, arch, qtype):
    """Chunked prefill then decode steps with tensors split by rows (a 40 kB binding limit)."""
    from gguf import GGMLQuantizationType as QT

    path = tiny_models.write_tiny_model(tmp_path_factory.mktemp(arch), arch, QT[qtype])
    ids = tiny_models.test_ids() + [5, 77, 300, 9]
    want = Drive(reference(path, context=tiny_models.N_CTX)).logits(ids, all_logits=True)
    runner = runner_for(loop, device, path, tiny_models.N_CTX, "subgroup", chunk=4, max_binding=40_000)
    assert any(len(w.parts) > 1 for w in runner.ops.slots.slots.values())
    drive = Drive(runner, loop)
    split = 9
    got = [drive.logits(ids[:split])]
    for pos in range(split, len(ids)):
        got.append(drive.logits([ids[pos]], pos))
    assert {"SUBGROUP", "REDUCE"} <= matvec_defines(runner)
    np.testing.assert_allclose(np.stack(got), want[split - 1:], atol=2e-4 * np.abs(want).max(), rtol=1e-3)


def test_subgroup_greedy_equals_argmax_of_reference(tmp_path_factory, loop, device):
    """The subgroup argmax in a whole greedy loop (SmolLM2's test below covers a vocabulary of many chunks)."""
    from gguf import GGMLQuantizationType as QT

    path = tiny_models.write_tiny_model(tmp_path_factory.mktemp("llama"), "llama", QT.Q4_1)
    ref = reference(path, context=tiny_models.N_CTX)
    runner = runner_for(loop, device, path, tiny_models.N_CTX, "subgroup")
    assert_greedy_like_reference(ref, runner, tiny_models.test_ids(), 8, loop)
    argmax = [d.key for p in runner._programs.values() for d in p.dispatches if d.key.family == "argmax"]
    assert argmax and all(("SUBGROUP", "") in k.defines for k in argmax)


def test_forcing_subgroups_without_them_is_refused(loop, device, tmp_path_factory):
    from dataclasses import replace

    from gguf import GGMLQuantizationType as QT

    from pyshim.errors import UnsupportedError

    path = tiny_models.write_tiny_model(tmp_path_factory.mktemp("llama"), "llama", QT.Q8_0)

    class NoSubgroups:          # the device as one without the feature would describe itself
        caps = replace(device.caps, features=frozenset(f for f in device.caps.features if "subgroup" not in f))

        def __getattr__(self, name):
            return getattr(device, name)

    with pytest.raises(UnsupportedError, match="subgroups"):
        loop.run_until_complete(gpu(path, context=tiny_models.N_CTX, device=NoSubgroups(), policy={"subgroup": True}))


@pytest.mark.models
@pytest.mark.slow
# a real model with --full; by default the tiny models hold both variants to the reference
@pytest.mark.full
@pytest.mark.parametrize("variant", ["reduce", "subgroup"])
def test_smollm2_greedy_32_tokens_equal_cpu(loop, device, variant):
    from pyshim.setup.catalog import resolve_model
    from pyshim.text.tokenizer import Tokenizer

    path = resolve_model("smollm2")
    ref = reference(path, context=128)
    runner = runner_for(loop, device, path, 128, variant)
    prompt = Tokenizer.from_metadata(ref.header.metadata).encode("The capital of France is")
    assert_greedy_like_reference(ref, runner, prompt, 32, loop)
    assert ("SUBGROUP" in matvec_defines(runner)) == (variant == "subgroup")
