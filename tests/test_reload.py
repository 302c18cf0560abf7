"""A loaded model under other settings that keep its weights (pyshim.exec.gpu_runner.reload_gpu): another
context, KV type, page count or number of sequences costs a new KV cache, not a new upload. The reloaded
runner answers exactly as one loaded afresh with those settings, holds the same device memory (so the old
cache was freed, not kept beside the new one), and keeps the very weight buffers it had; settings that
change the weights are declined with the model left as it was."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import tiny_models
from pyshim.exec.gpu_runner import reload_gpu
from pyshim.plan.settings import Arithmetic, RunSettings
from runners import Drive, gpu

IDS = tiny_models.test_ids()


def _load(path, arithmetic, parallel: int = 1, **settings):
    return gpu(path, arithmetic=arithmetic, max_seqs=parallel, **settings)


def _answers(runner, loop) -> tuple[np.ndarray, list[int]]:
    """Every prompt position's logits, then 6 greedy tokens after the prompt (a fresh sequence each time)."""
    drive = Drive(runner, loop)
    logits = drive.logits(IDS, all_logits=True)
    runner.reset()
    return logits, drive.greedy_ids(IDS, 6)


@pytest.mark.parametrize("arch, qtype, arithmetic, before, after", [
    # lavapipe's int8 route interleaves Q4_K rows and groups Q6_K blocks once, at the first step: not twice
    ("qwen2", QT.Q4_K, Arithmetic.INT8, dict(context=32), dict(context=64, kv_type="q8")),
    ("gemma3", QT.Q6_K, Arithmetic.INT8, dict(context=64, kv_type="q8"), dict(context=32, kv_type="f32", parallel=2)),
    # q4 keys are scaled and rotated from the key weights, read again from the file
    ("llama", QT.Q8_0, Arithmetic.F32, dict(context=64), dict(context=64, kv_type="q4", kv_pages=3)),
    # weights streamed from the file: the same rotating buffers, the same expert cache
    ("phi3", QT.Q4_0, Arithmetic.INT8, dict(context=32, streamed_layers=1), dict(context=64, streamed_layers=1)),
    ("qwen2moe", QT.Q8_0, Arithmetic.INT8, dict(context=32, expert_slots=5), dict(context=48, kv_type="f16", expert_slots=5)),
])
def test_a_reloaded_model_answers_as_one_loaded_afresh(tmp_path, arch, qtype, arithmetic, before, after):
    path = tiny_models.write_tiny_model(tmp_path, arch, qtype)
    loop = asyncio.new_event_loop()
    try:
        old = loop.run_until_complete(_load(path, arithmetic, **before))
        _answers(old, loop)                 # weights rearranged, programs built, the cache written
        slots, parts = old.ops.slots, [p.buffer for w in old.ops.slots.slots.values() for p in w.parts]
        kernels = len(old.ops.kernels)
        new = loop.run_until_complete(reload_gpu(old, RunSettings(arithmetic=arithmetic, **after)))
        assert new is not None and old.owns_device is False and new.owns_device
        assert new.n_ctx == after["context"] and new.ops.kv_type == after.get("kv_type", "f32")
        assert new.ops.kv.n_seqs == after.get("parallel", 1)
        got = _answers(new, loop)
        assert new.ops.slots is slots and [p.buffer for w in slots.slots.values() for p in w.parts] == parts
        assert len(new.ops.kernels) >= kernels          # the pipelines compiled before are kept
        fresh = loop.run_until_complete(_load(path, arithmetic, **after))
        try:
            want = _answers(fresh, loop)
            assert np.array_equal(got[0], want[0]) and got[1] == want[1]
            assert new.ops.memory() == fresh.ops.memory()
        finally:
            fresh.close()
        old.close()                         # (spent: the device is the new runner's)
        _answers(new, loop)
        new.close()
    finally:
        loop.close()


def test_settings_that_change_the_weights_are_declined_and_the_model_kept(tmp_path):
    path = tiny_models.write_tiny_model(tmp_path, "qwen2", QT.Q4_K)
    loop = asyncio.new_event_loop()
    try:
        runner = loop.run_until_complete(gpu(path, context=32, arithmetic=Arithmetic.INT8))
        want = _answers(runner, loop)
        memory = runner.ops.memory()
        runner.reset()
        # the other arithmetic lays the weights out otherwise; streamed layers bind other buffers
        for settings in (RunSettings(context=64, arithmetic=Arithmetic.F32),
                         RunSettings(context=32, arithmetic=Arithmetic.INT8, streamed_layers=1)):
            assert loop.run_until_complete(reload_gpu(runner, settings)) is None
        got = _answers(runner, loop)
        assert np.array_equal(got[0], want[0]) and got[1] == want[1] and runner.ops.memory() == memory
        runner.close()
    finally:
        loop.close()


def test_a_reload_that_cannot_fit_lets_the_device_go(tmp_path):
    """A KV cache over the binding limit is refused once the old one was freed: the runner is spent and its
    device released, as a failed load leaves nothing."""
    from pyshim.errors import OutOfMemoryError

    path = tiny_models.write_tiny_model(tmp_path, "llama", QT.Q4_0)
    loop = asyncio.new_event_loop()
    try:
        runner = loop.run_until_complete(gpu(path, context=32, max_binding=1 << 20))
        _answers(runner, loop)
        with pytest.raises(OutOfMemoryError, match="storage binding"):
            loop.run_until_complete(reload_gpu(runner, RunSettings(context=32, kv_pages=200)))
        with pytest.raises(Exception, match="closed|destroyed|lost"):
            runner.device.buffer(16, label="after")
    finally:
        loop.close()
