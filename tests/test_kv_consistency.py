"""Prefill then decode gives the logits of feeding tokens one by one, and of one whole-sequence pass:
the KV cache (ring buffers on sliding-window layers) holds exactly what attention needs, also past the
window (the tiny Gemma 3 has a 4-token window; the sequence is 16 + 8 tokens)."""

from __future__ import annotations

import numpy as np
import pytest

from pyshim.exec.loading import load_reference
from pyshim.exec.runner import Step, Want
from pyshim.plan.settings import RunSettings
import tiny_models
from tiny_models import GEMMA_WINDOW, QT, write_tiny_model

IDS = tiny_models.test_ids() + [5, 77, 300, 9, 12, 41, 42, 43]
TOL = dict(rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module", params=["gemma3", "llama", "phi3"])
def runner(request, tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp(request.param), request.param, QT.F32)
    return load_reference(path, settings=RunSettings(context=64))


def _decode(runner, token, pos):
    return runner.run(Step.of([token], pos))[0].logits


def _one_by_one(runner, ids):
    runner.reset()
    return np.stack([_decode(runner, t, pos) for pos, t in enumerate(ids)])


def _whole(runner, ids, chunk=len(IDS)):
    runner.reset()
    return np.concatenate([runner.run(Step.of(ids[at:at + chunk], at, want=Want.ALL_LOGITS))[0].logits
                           for at in range(0, len(ids), chunk)])


def test_window_ring_is_window_sized(runner):
    spec = runner.spec
    for il, layer in enumerate(runner.ops.kv.layers):
        assert layer.capacity == (GEMMA_WINDOW if spec.swa_layers[il] else 64)
    if spec.architecture == "gemma3":
        assert any(spec.swa_layers) and not all(spec.swa_layers)


def test_whole_sequence_equals_one_by_one(runner):
    np.testing.assert_allclose(_whole(runner, IDS), _one_by_one(runner, IDS), **TOL)


@pytest.mark.parametrize("chunk", [1, 3, GEMMA_WINDOW, 5, 9])
def test_chunked_prefill_equals_whole(runner, chunk):
    np.testing.assert_allclose(_whole(runner, IDS, chunk=chunk), _whole(runner, IDS), **TOL)


@pytest.mark.parametrize("n_prefill", [1, 3, 6, 16])
def test_prefill_then_decode_equals_one_by_one(runner, n_prefill):
    want = _one_by_one(runner, IDS)
    runner.reset()
    got = [runner.logits(IDS[:n_prefill])]
    got += [_decode(runner, t, pos) for pos, t in enumerate(IDS) if pos >= n_prefill]
    np.testing.assert_allclose(np.stack(got), want[n_prefill - 1:], **TOL)


def test_window_changes_the_result(tmp_path):
    """The window matters: the same weights with full attention everywhere give other logits past it."""
    from dataclasses import replace

    from pyshim.exec.reference import ReferenceOps, ReferenceRunner
    from pyshim.models import build_model

    windowed = load_reference(write_tiny_model(tmp_path, "gemma3", QT.F32), settings=RunSettings(context=64))
    spec = replace(windowed.spec, sliding_window=64)        # local layers see everything, same rope
    ops = ReferenceOps(windowed.ops.store, spec, 64)
    full = ReferenceRunner(spec, windowed.header, ops, build_model(spec, ops), windowed.settings, 64)
    a, b = _whole(windowed, IDS), _whole(full, IDS)
    np.testing.assert_allclose(a[:GEMMA_WINDOW], b[:GEMMA_WINDOW], **TOL)
    assert np.abs(a[GEMMA_WINDOW:] - b[GEMMA_WINDOW:]).max() > 1e-2
