"""Full-size synthetic models (pyshim.setup.synthetic), checked on a small shape: the file is what the
shape and the tokenizer say, its weights are zero-mean, and it runs (the full-size ones go through the
same code: `pyshim inspect olmoe-1b-7b`, `pyshim bench --models olmoe-1b-7b`)."""

from __future__ import annotations

import numpy as np
import pytest

from pyshim.gguf.header import read_header_from_file
from pyshim.gguf.spec import ModelSpec
from pyshim.gguf.tensors import dequantize_rows
from pyshim.plan.memory import per_token
from pyshim.setup import synthetic
from pyshim.setup.catalog import model_path, resolve_model
from runners import reference

pytestmark = pytest.mark.models

SMALL_MOE = synthetic.Shape(arch="olmoe", tokenizer_from="smollm2", n_layers=2, n_embd=256, n_heads=4, n_kv_heads=4,
                            n_ff=256, context=512, n_experts=8, n_experts_used=2, qk_norm="full")


def test_a_small_mixture_is_written_as_its_shape_says_and_runs(tmp_path):
    path = synthetic.write(SMALL_MOE, model_path("smollm2"), path=tmp_path / "small-moe.gguf")
    (tmp_path / "again").mkdir()
    again = synthetic.write(SMALL_MOE, model_path("smollm2"), path=tmp_path / "again" / "small-moe.gguf")
    assert path.read_bytes() == again.read_bytes()                       # deterministic
    header = read_header_from_file(path)
    spec = ModelSpec.from_header(header)
    smol = read_header_from_file(model_path("smollm2"))
    assert header.metadata["tokenizer.ggml.tokens"] == smol.metadata["tokenizer.ggml.tokens"]
    assert (spec.n_experts, spec.n_experts_used, spec.n_ff_expert, spec.n_vocab) == (8, 2, 256, 49152)
    token = per_token(spec, header.tensors)
    assert token.active_params < token.total_params
    # zero-mean weights at ~1/(4.3 sqrt(fan_in)): no common-mode drift through the layers
    t = header.tensor("blk.0.ffn_up_exps.weight")
    raw = np.frombuffer(path.read_bytes()[t.offset:t.offset + t.nbytes], np.uint8).reshape(-1, 144)
    values = dequantize_rows(raw, t.type)
    assert abs(values.mean()) < 0.01 * values.std()
    assert values.std() == pytest.approx(np.sqrt(56 / 3) / (4.3 * 16), rel=0.05)   # nibbles 1..15: var 56/3
    logits = reference(path, context=64).logits([1, 2, 3, 4, 5, 6, 7, 8], all_logits=True)
    assert len({int(i) for i in logits.argmax(axis=1)}) > 1                # positions do not all predict alike


def test_full_size_shapes_resolve_by_short_name_without_writing_when_present():
    # (the 3.9 GB file is written on first use only: here just the name and its plan)
    shape = synthetic.SHAPES["olmoe-1b-7b"]
    assert shape.n_experts == 64 and shape.n_experts_used == 8
    path = synthetic.path_for("olmoe-1b-7b")
    if path.is_file():
        assert resolve_model("olmoe-1b-7b") == path


def test_a_tokenizer_only_file_writes_the_same_model(tmp_path):
    """What a machine without the shipped models takes along (playwright/device_check.sh --prepare): the
    tokenizer keys alone, a few MB, from which the same synthetic file is written byte for byte."""
    tokenizer = synthetic.write_tokenizer(model_path("smollm2"), tmp_path / "tokenizer-smollm2.gguf")
    assert tokenizer.stat().st_size < 0.05 * model_path("smollm2").stat().st_size
    assert not read_header_from_file(tokenizer).tensors
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    want = synthetic.write(SMALL_MOE, model_path("smollm2"), path=tmp_path / "a" / "m.gguf")
    got = synthetic.write(SMALL_MOE, tokenizer, path=tmp_path / "b" / "m.gguf")
    assert got.read_bytes() == want.read_bytes()


def test_a_written_synthetic_model_resolves_without_its_tokenizers_model(tmp_path, monkeypatch):
    shape = "smollm2-135m"
    monkeypatch.setattr(synthetic, "SYNTHETIC_DIR", tmp_path)
    synthetic.path_for(shape).write_bytes(b"GGUF")     # present: no need for the smollm2 file (nor to read this)
    monkeypatch.setattr("pyshim.setup.catalog.model_path", lambda name: tmp_path / "absent.gguf")
    assert resolve_model(shape) == synthetic.path_for(shape)


SMALL_K = synthetic.Shape(arch="llama", tokenizer_from="smollm2", n_layers=8, n_embd=512, n_heads=8, n_kv_heads=2,
                          n_ff=768, context=256)


def test_a_q4_k_m_mix_is_llama_cpps_and_runs_on_the_gpu_like_the_reference(tmp_path):
    """`-q4_k_m`: Q4_K, with Q6_K for the output head and for attn_v / ffn_down in the layers llama.cpp gives
    more bits (the first and last eighth, every third between: 0, 3, 6, 7 of 8); zero-mean weights at the
    Q4_0 files' spread; the GPU's K-quant kernels give the reference's logits."""
    from pyshim.plan.settings import Arithmetic
    from runners import Drive, gpu
    import asyncio

    assert synthetic.split_name("qwen2.5-7b-q4_k_m") == ("qwen2.5-7b", "q4_k_m") and synthetic.is_known("qwen2.5-7b-q4_k_m")
    assert synthetic.path_for("qwen2.5-7b-q4_k_m").name == "qwen2.5-7b-Q4_K_M-s0.gguf"
    path = synthetic.write(SMALL_K, model_path("smollm2"), path=tmp_path / "k.gguf", quant="q4_k_m")
    header = read_header_from_file(path)
    types = {t.name: t.type.name for t in header.tensors}
    assert types["output.weight"] == "Q6_K" and types["token_embd.weight"] == "Q4_K"
    assert [il for il in range(8) if types[f"blk.{il}.attn_v.weight"] == "Q6_K"] == [0, 3, 6, 7]
    assert [il for il in range(8) if types[f"blk.{il}.ffn_down.weight"] == "Q6_K"] == [0, 3, 6, 7]
    assert {types[f"blk.{il}.{m}.weight"] for il in range(8) for m in ("attn_q", "attn_k", "ffn_up", "ffn_gate")} == {"Q4_K"}
    data = path.read_bytes()
    for name, per in (("blk.1.ffn_up.weight", 144), ("blk.0.ffn_down.weight", 210)):
        t = header.tensor(name)
        values = dequantize_rows(np.frombuffer(data[t.offset:t.offset + t.nbytes], np.uint8).reshape(-1, per), t.type)
        assert abs(values.mean()) < 0.01 * values.std()
        fan_in = 512 if "up" in name else 768
        assert values.std() == pytest.approx(np.sqrt(56 / 3) / (4.3 * np.sqrt(fan_in)), rel=0.05)
    ids = [1, 2, 3, 4, 5, 6, 7, 8]
    want = reference(path, context=64).logits(ids, all_logits=True)
    assert len({int(i) for i in want.argmax(axis=1)}) > 1
    runner = asyncio.run(gpu(path, context=64, arithmetic=Arithmetic.F32))
    try:
        got = Drive(runner).logits(ids, all_logits=True)
    finally:
        runner.close()
    np.testing.assert_allclose(got, want, atol=2e-4 * np.abs(want).max(), rtol=1e-3)
