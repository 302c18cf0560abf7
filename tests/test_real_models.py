"""The three real models against llama.cpp (fixtures from tests/fixtures/make_real_logits.py).

Three comparisons, strongest first:
- against llama.cpp on F32 copies of the models: its matmuls then round nothing, and pyshim (which
  dequantizes to f32) must agree almost exactly — this checks each architecture's arithmetic;
- against llama.cpp on the quantized files (issue 4's bar: top-1 equal at >= 97% of positions, llama.cpp's
  top-1 within pyshim's top-5 everywhere), with pyshim repeating llama.cpp's CPU arithmetic bit for bit
  (pyshim.exec.ggml_cpu). That is what it takes: a quantized model is chaotic at the scale of its activation
  rounding, and llama.cpp fed one token at a time instead of in one batch (one f32 kernel differs)
  agrees with its own batch top-1 at only 91–96% (numbers in the fixture). Exact, pyshim's logits equal
  llama.cpp's up to the output head's float order (~1e-5);
- greedy continuations of "The capital of France is".
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

from pyshim.exec.runner import Step
from pyshim.plan.settings import Arithmetic
from runners import Drive, reference

pytestmark = [pytest.mark.models, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
FX = json.loads((ROOT / "tests" / "fixtures" / "real_llamacpp.json").read_text())
NAMES = list(FX["models"])
# The llama.cpp-exact emulation takes a minute on Qwen2.5's passage: its exact cases are `full` ones
# (SmolLM2's and Gemma 3's run by default; tests/test_tiny_llamacpp.py covers the qwen2 architecture).
EXACT_NAMES = [pytest.param(n, marks=pytest.mark.full) if n == "qwen2.5" else n for n in NAMES]
TOP1_BAR = 0.97
F32_TOP1 = 0.99
F32_LOGIT_TOL = 2e-3
F32_LOGIT_TOL_GELU = 2e-2   # gemma3: llama.cpp's GELU is an f16 table (measured 0.008 on logits of ~20)
# Measured (pyshim emulating llama.cpp vs llama.cpp batch): top-1 100% on all three, the same top-10 ids
# at every position, largest |Δ| of a top-10 logit 1.9e-5 / 2.5e-5 / 1.6e-5 (smollm2 / gemma3 / qwen2.5;
# the fixture keeps 5 decimals): only the output head's summation order differs (it feeds no later
# rounding, so pyshim leaves it to BLAS). Before the emulation was exact: 98.1% / 93.1% / 96.9%.
EXACT_LOGIT_TOL = 1e-3
SEQUENTIAL_POSITIONS = 8    # decode is slow in the exact emulation (measured exact over 24-40 positions)


def _path(name: str) -> Path:
    path = ROOT / FX["models"][name]["file"]
    if not path.is_file():
        pytest.skip(f"{path.name} is not in models/ (pyshim setup --test-models)")
    return path


@lru_cache(maxsize=None)
def _runner(name: str, like_llama_cpp: bool):
    return reference(_path(name), arithmetic=Arithmetic.EXACT if like_llama_cpp else None)


@lru_cache(maxsize=None)
def _scores(name: str, like_llama_cpp: bool):
    return Drive(_runner(name, like_llama_cpp)).scores(FX["models"][name]["passage"]["ids"], 10)


def _agreement(top_ids: np.ndarray, reference: dict) -> tuple[float, float]:
    ref = np.array(reference["top_ids"])
    top1 = float(np.mean(top_ids[:, 0] == ref[:, 0]))
    in_top5 = float(np.mean([ref[i, 0] in top_ids[i, :5] for i in range(len(ref))]))
    return top1, in_top5


@pytest.mark.parametrize("name", NAMES)
def test_passage_is_long_enough(name):
    assert len(FX["models"][name]["passage"]["ids"]) >= 90


@pytest.mark.parametrize("name", NAMES)
def test_exact_against_llama_cpp_on_f32_copy(name):
    top_ids, top_logits = _scores(name, False)
    ref = FX["models"][name]["passage_f32"]
    top1, in_top5 = _agreement(top_ids, ref)
    assert top1 >= F32_TOP1 and in_top5 == 1.0
    tol = F32_LOGIT_TOL_GELU if name == "gemma3" else F32_LOGIT_TOL
    assert np.abs(top_logits[:, 0] - np.array(ref["top_logits"])[:, 0]).max() < tol


@pytest.mark.parametrize("name", EXACT_NAMES)
def test_issue_bar_against_llama_cpp_quantized(name):
    top1, in_top5 = _agreement(_scores(name, True)[0], FX["models"][name]["passage"])
    assert in_top5 == 1.0
    assert top1 >= TOP1_BAR, f"top-1 agreement {top1:.4f}"


@pytest.mark.parametrize("name", EXACT_NAMES)
def test_same_logits_as_llama_cpp_batch(name):
    """Bit-exact up to the output head: llama.cpp's top-10 logits, everywhere, to float error."""
    top_ids, top_logits = _scores(name, True)
    ref = FX["models"][name]["passage"]
    assert np.array_equal(top_ids[:, 0], np.array(ref["top_ids"])[:, 0])
    assert np.abs(top_logits - np.array(ref["top_logits"])).max() < EXACT_LOGIT_TOL


@pytest.mark.parametrize("name", EXACT_NAMES)
def test_as_close_to_llama_cpp_as_llama_cpp_is_to_itself(name):
    m = FX["models"][name]
    top1, in_top5 = _agreement(_scores(name, True)[0], m["passage"])
    self_top1 = float(np.mean(np.array(m["passage"]["top_ids"])[:, 0] == np.array(m["passage_sequential"]["top_ids"])[:, 0]))
    assert in_top5 == 1.0
    assert top1 >= self_top1, f"pyshim {top1:.4f} vs llama.cpp batch/sequential {self_top1:.4f}"


@pytest.mark.parametrize("name", EXACT_NAMES)
def test_decode_same_logits_as_llama_cpp_sequential(name):
    """One token at a time, llama.cpp takes other kernels (vec_dot instead of tinyBLAS, which needs 2 rows,
    and of the tiled k-quant kernel; the repacked gemv instead of its gemm): pyshim's decode path repeats
    those too, bit for bit up to the output head."""
    runner = _runner(name, True)
    ref = FX["models"][name]["passage_sequential"]
    ids = ref["ids"][:SEQUENTIAL_POSITIONS]
    runner.reset()
    rows = [runner.logits(ids[:1])] + [runner.run(Step.of([t], pos))[0].logits for pos, t in enumerate(ids) if pos]
    top = np.argsort(-np.stack(rows), axis=1, kind="stable")[:, :1]
    want_ids = np.array(ref["top_ids"])[: len(ids), :1]
    want = np.array(ref["top_logits"])[: len(ids), 0]
    assert np.array_equal(top, want_ids)
    assert np.abs(np.take_along_axis(np.stack(rows), top, axis=1)[:, 0] - want).max() < EXACT_LOGIT_TOL


def _greedy(runner, prompt_ids, n):
    return Drive(runner).greedy_ids(prompt_ids, n)


@pytest.mark.parametrize("name", NAMES)
def test_greedy_continuation(name):
    from pyshim.text.tokenizer import Tokenizer

    greedy = FX["models"][name]["greedy"]
    runner = _runner(name, False)
    tokenizer = Tokenizer.from_metadata(runner.header.metadata)
    assert tokenizer.encode(FX["prompt"], add_special=True) == greedy["prompt_ids"]
    ids = _greedy(runner, greedy["prompt_ids"], len(greedy["ids"]))
    assert ids[:4] == greedy["ids"][:4]
    if name in ("smollm2", "qwen2.5"):
        assert tokenizer.decode(ids).startswith(" Paris.")
