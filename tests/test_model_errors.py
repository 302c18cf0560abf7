"""Bad input is refused with a specific PyshimError before any tensor data is read."""

from __future__ import annotations

import asyncio

import pytest

from pyshim.errors import (ContextOverflowError, MissingTensorError, PyshimError, TensorShapeError,
                           UnsupportedError)
from pyshim.exec.loading import load_reference as load
from pyshim.exec.runner import Step
from pyshim.plan.settings import RunSettings
from pyshim.serve.generation import generate, score
from pyshim.serve.sampling import SamplingParams
from tiny_models import QT, write_tiny_model


def test_unsupported_architecture(tmp_path):
    path = write_tiny_model(tmp_path, "llama", QT.F32, arch_name="mamba")
    with pytest.raises(UnsupportedError, match="mamba"):
        load(path)


def test_unsupported_tensor_type(tmp_path):
    path = write_tiny_model(tmp_path, "llama", QT.F32, retype={"blk.1.attn_q.weight": QT.Q2_K})
    with pytest.raises(UnsupportedError, match="Q2_K"):
        load(path)


def test_missing_tensor(tmp_path):
    path = write_tiny_model(tmp_path, "qwen2", QT.F32, drop=frozenset({"blk.1.attn_v.bias"}))
    with pytest.raises(MissingTensorError, match="blk.1.attn_v.bias"):
        load(path)


def test_wrong_shape(tmp_path):
    path = write_tiny_model(tmp_path, "gemma3", QT.F32, truncate=frozenset({"blk.0.ffn_up.weight"}))
    with pytest.raises(TensorShapeError, match="blk.0.ffn_up.weight"):
        load(path)


def test_errors_come_before_reading_tensor_data(tmp_path, monkeypatch):
    """Binding reads the header only: a source that refuses every read still loads."""
    from pyshim.gguf import tensors

    def refuse(self, offset, nbytes):
        raise AssertionError("tensor data read while loading")

    monkeypatch.setattr(tensors.FileSource, "read", refuse)
    load(write_tiny_model(tmp_path, "phi3", QT.Q4_K))
    with pytest.raises(TensorShapeError):
        load(write_tiny_model(tmp_path, "phi3", QT.Q4_K, name="bad.gguf", truncate=frozenset({"blk.0.attn_qkv.weight"})))


def test_prompt_longer_than_context(tmp_path):
    runner = load(write_tiny_model(tmp_path, "llama", QT.F32), settings=RunSettings(context=8))
    with pytest.raises(ContextOverflowError):
        asyncio.run(generate(runner, list(range(3, 12)), SamplingParams(), 4))
    with pytest.raises(ContextOverflowError):
        asyncio.run(score(runner, list(range(3, 12))))
    with pytest.raises(ContextOverflowError):
        runner.run(Step.of([5], 8))
    assert issubclass(ContextOverflowError, PyshimError)
