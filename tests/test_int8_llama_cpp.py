"""The int8 route on whole real models, against llama.cpp itself (tests/fixtures/real_llamacpp.json).

Its kernels equal a NumPy emulation of llama.cpp's activation rounding exactly (tests/test_kernels_i8.py),
but a whole model cannot equal the reference's emulation token for token: rounding to int8 turns a 1-ulp
difference upstream (summation order) into a whole int8 step now and then, and through 18-30 layers those
steps decorrelate the rounding noise (measured: the GPU's logits differ from the emulation's about as
much as the emulation differs from f32 arithmetic). llama.cpp's own batch and one-by-one paths differ the
same way. So the bar is issue 4's: as close to llama.cpp's quantized logits as llama.cpp is to itself,
and llama.cpp's top-1 always within the top 5.
Measured (top-1 vs llama.cpp batch; llama.cpp batch vs sequential): SmolLM2 95.6% (95.6%), Gemma 3 93.1%
(91.2%), Qwen2.5 96.3% (95.0%); the f32 kernels: 96.2%, 92.5%, 96.9%.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.models, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
FX = json.loads((ROOT / "tests" / "fixtures" / "real_llamacpp.json").read_text())


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_int8_scores_as_close_to_llama_cpp_as_llama_cpp_is_to_itself(name):
    from pyshim.generate import score
    from pyshim.gpu.kernels import DOT4_FEATURE
    from pyshim.gpu.runner import load_gpu

    m = FX["models"][name]
    path = ROOT / m["file"]
    if not path.is_file():
        pytest.skip(f"{path.name} is not in models/ (pyshim setup --test-models)")
    runner = load_gpu(path, int8=True)
    if DOT4_FEATURE not in runner.device.caps.features:
        pytest.skip("this adapter's WGSL has no packed_4x8_integer_dot_product")
    assert runner.ops.int8
    top_ids, _ = score(runner, m["passage"]["ids"], 10)
    want = np.array(m["passage"]["top_ids"])[:, 0]
    top1 = float(np.mean(top_ids[:, 0] == want))
    self_top1 = float(np.mean(want == np.array(m["passage_sequential"]["top_ids"])[:, 0]))
    assert all(want[i] in top_ids[i, :5] for i in range(len(want)))
    assert top1 >= self_top1, f"int8 route {top1:.4f} vs llama.cpp batch/sequential {self_top1:.4f}"
