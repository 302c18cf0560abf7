"""Every architecture × tensor type, dense and mixture-of-experts, on tiny random models, against
llama.cpp's logits (fixtures made by tests/fixtures/make_tiny_logits.py with the llama.cpp oracle)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pyshim.plan.settings import Arithmetic
from runners import reference
from tiny_models import ALL_ARCHS, FIXTURE, MOE_ARCHS, QTYPES, QT, sha256, write_tiny_model

FX = json.loads(FIXTURE.read_text())
KEYS = [f"{a}-{q.name}" for a in ALL_ARCHS for q in QTYPES]
# |pyshim - llama.cpp| over llama.cpp's top-10 logits (the logits are ~unit scale). F32 is exact up to
# rounding; F16 and the quant types differ because llama.cpp rounds activations before its dot products
# (to f16, Q8_0 or Q8_K) — the limits are ~2x what was measured.
LIMITS = {"F32": 2e-3, "F16": 4e-3}   # (F32: gemma3 differs by llama.cpp's f16 GELU table)
QUANT_LIMIT = 0.15
EXACT = 1e-4                     # the fixture keeps 5 decimals
MIN_EXACT_SHARE = 0.4            # with llama.cpp's rounding emulated: measured 20 of 35


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny")


def _logits(model_dir, key, emulate=False):
    arch, qname = key.split("-")
    entry = FX["models"][key]
    path = write_tiny_model(model_dir, arch, QT[qname])
    assert sha256(path) == entry["sha256"], "the tiny model differs from the one the fixture was made with"
    logits = reference(path, arithmetic=Arithmetic.INT8 if emulate else None).logits(FX["ids"], all_logits=True)   # [n, vocab]
    top_ids, top_logits = np.array(entry["top_ids"]), np.array(entry["top_logits"])
    return logits, top_ids, top_logits


def test_fixture_covers_every_architecture_and_type():
    assert sorted(FX["models"]) == sorted(KEYS)


MOE = {f"{a}-{q.name}" for a in MOE_ARCHS + ("gemma4moe",) for q in QTYPES}


@pytest.mark.parametrize("key", KEYS)
def test_logits_match_llama_cpp(model_dir, key):
    # A router is discontinuous: f32 activations (not rounded as llama.cpp rounds them) now and then pick
    # another expert of a quantized mixture (measured up to 0.48 off on these models); with llama.cpp's
    # rounding emulated the same experts win (0-0.04 off)
    emulate = key in MOE and not key.endswith(("F32", "F16"))
    logits, top_ids, top_logits = _logits(model_dir, key, emulate=emulate)
    err = np.abs(np.take_along_axis(logits, top_ids, axis=1) - top_logits)
    assert err.max() < LIMITS.get(key.split("-")[1], QUANT_LIMIT)
    # where llama.cpp's winner is clear of its runner-up by more than the error, pyshim picks it too
    clear = top_logits[:, 0] - top_logits[:, 1] > 2 * err.max()
    assert np.array_equal(logits.argmax(axis=1)[clear], top_ids[clear, 0])


@pytest.mark.slow
def test_llama_cpp_rounding_emulation_closes_the_gap(model_dir):
    """Rounding activations like llama.cpp makes most quantized models match it to the fixture's 5
    decimals; the rest drift apart where one rounding lands on the other side of a .5 and the next
    layers amplify it (llama.cpp is not bit-stable across its own batch and decode paths either)."""
    # (only entries made by the llama.cpp kernels the emulation follows: AVX-512 VNNI)
    quantized = [k for k in KEYS if not k.endswith(("F32", "F16")) and FX["models"][k]["cpu"] == "avx512_vnni"]
    exact = []
    for key in quantized:
        logits, top_ids, top_logits = _logits(model_dir, key, emulate=True)
        err = np.abs(np.take_along_axis(logits, top_ids, axis=1) - top_logits)
        assert err.max() < QUANT_LIMIT
        exact.append(err.max() < EXACT)
    assert np.mean(exact) >= MIN_EXACT_SHARE, f"only {sum(exact)} of {len(exact)} quantized models match exactly"
