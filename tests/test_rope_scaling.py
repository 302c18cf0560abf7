"""Rope scaling past a model's original context, against llama.cpp (fixtures made by
tests/fixtures/make_rope_logits.py): the GGUF's YaRN keys and llama.cpp-style overrides
(--rope-scaling, --rope-scale, --yarn-orig-ctx) on tiny models — reference and GPU —, and YaRN with
factor 4 over an original context of 1024 on SmolLM2 and Qwen2.5-0.5B at positions 1024-2999."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pyshim.errors import BadRequestError
from pyshim.gguf.header import read_header_from_file
from pyshim.gguf.spec import ModelSpec
from pyshim.plan.settings import RunSettings
from runners import Drive, gpu, reference
from tiny_models import QT, sha256, write_tiny_model

ROOT = Path(__file__).parent.parent
FX = json.loads((Path(__file__).parent / "fixtures" / "rope_llamacpp.json").read_text())
TINY = FX["tiny"]
LIMIT = 2e-3          # F32 tiny models: as in test_tiny_llamacpp (gemma3's f16 GELU table is most of it)
GPU_LIMIT = 5e-3      # the GPU's f32 kernels sum in another order


def rope_settings(rope: dict) -> dict:
    names = {"scaling": "rope_scaling", "scale": "rope_scale", "yarn_orig_ctx": "yarn_orig_ctx"}
    return {names[k]: v for k, v in rope.items()}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny-rope")


def _tiny(tiny_dir, name):
    case = TINY["cases"][name]
    path = write_tiny_model(tiny_dir, case["arch"], QT.F32)
    assert sha256(path) == case["sha256"], "the tiny model differs from the one the fixture was made with"
    return path, case, np.array(case["top_ids"]), np.array(case["top_logits"])


def _err(logits, top_ids, top_logits):
    return np.abs(np.take_along_axis(logits, top_ids, axis=1) - top_logits)


@pytest.mark.parametrize("name", list(TINY["cases"]))
def test_tiny_reference_matches_llama_cpp_past_the_original_context(tiny_dir, name):
    path, case, top_ids, top_logits = _tiny(tiny_dir, name)
    ref = reference(path, context=len(TINY["ids"]), **rope_settings(case["rope"]))
    err = _err(Drive(ref).logits(TINY["ids"], all_logits=True), top_ids, top_logits)
    assert err.max() < LIMIT, f"{name}: {err.max():.2e} off llama.cpp"
    if case["rope"]:
        # without the override the same positions differ: the check can fail
        plain = _err(Drive(reference(path, context=len(TINY["ids"]))).logits(TINY["ids"], all_logits=True), top_ids, top_logits)
        assert plain[16:].max() > 20 * LIMIT


@pytest.mark.parametrize("name", ["qwen3-gguf-yarn", "llama-yarn", "gemma3-yarn"])
def test_tiny_gpu_matches_llama_cpp_past_the_original_context(tiny_dir, loop, device, name):
    path, case, top_ids, top_logits = _tiny(tiny_dir, name)
    runner = loop.run_until_complete(gpu(path, context=len(TINY["ids"]), arithmetic="f32", device=device,
                                         rope=rope_settings(case["rope"])))
    try:
        err = _err(Drive(runner, loop).logits(TINY["ids"], all_logits=True), top_ids, top_logits)
    finally:
        runner.close()
    assert err.max() < GPU_LIMIT, f"{name}: {err.max():.2e} off llama.cpp"


def test_override_replaces_only_what_it_names(tiny_dir):
    spec = ModelSpec.from_header(read_header_from_file(write_tiny_model(tiny_dir, "qwen3", QT.F32)))
    assert (spec.rope.scaling, spec.rope.factor, spec.rope.n_ctx_orig) == ("yarn", 4.0, 16)
    assert RunSettings(yarn_orig_ctx=32).spec_for(spec).rope.factor == 4.0
    assert RunSettings(rope_scale=8).spec_for(spec).rope.n_ctx_orig == 16
    assert RunSettings(rope_scaling="none", rope_scale=8).spec_for(spec).rope.factor == 1.0
    assert RunSettings().spec_for(spec) is spec
    gemma = ModelSpec.from_header(read_header_from_file(write_tiny_model(tiny_dir, "gemma3", QT.F32)))
    assert RunSettings(rope_scaling="yarn", rope_scale=4).spec_for(gemma).rope_swa == gemma.rope_swa
    for bad in ({"rope_scaling": "longrope"}, {"rope_scale": 0}, {"rope_scale": float("nan")}, {"yarn_orig_ctx": 0}):
        with pytest.raises(BadRequestError):
            RunSettings(**bad)
    assert RunSettings.from_dict({"rope_scaling": "yarn", "rope_scale": 4, "yarn_orig_ctx": None}).rope_scale == 4.0


def _real_agreement(name: str) -> tuple[float, float, np.ndarray]:
    """(share of positions where llama.cpp's top-1 is in pyshim's top-5, share of equal top-1s, the positions where it is not)."""
    real = FX["real"]
    entry = real["models"][name]
    path = ROOT / "models" / entry["file"]
    if not path.exists():
        pytest.skip(f"{path} is missing: run `pyshim setup --test-models`")
    ref = reference(path, context=len(entry["ids"]), **rope_settings(real["rope"]))
    top_ids, _ = Drive(ref).scores(entry["ids"], k=real["top_k"])
    mine = np.asarray(top_ids)[real["from"]:]
    theirs = np.array(entry["top_ids"])[:, 0]
    inside = (mine == theirs[:, None]).any(axis=1)
    return float(inside.mean()), float((mine[:, 0] == theirs).mean()), np.flatnonzero(~inside) + real["from"]


def test_smollm2_yarn_top1_inside_top5_from_1024_to_3000():
    inside, same, missed = _real_agreement("smollm2")
    assert inside == 1.0, f"llama.cpp's top-1 outside pyshim's top-5 at positions {missed[:20].tolist()}"
    assert same > 0.9


@pytest.mark.full
def test_qwen25_yarn_top1_inside_top5_from_1024_to_3000():
    inside, same, missed = _real_agreement("qwen2.5")
    assert inside == 1.0, f"llama.cpp's top-1 outside pyshim's top-5 at positions {missed[:20].tolist()}"
    assert same > 0.9
