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
    _runs_on_the_gpu_like_the_reference(path)


def _runs_on_the_gpu_like_the_reference(path) -> None:
    """The reference's logits after 8 tokens predict more than one token, and the GPU's f32 kernels give them."""
    from pyshim.plan.settings import Arithmetic
    from runners import Drive, gpu
    import asyncio

    ids = [1, 2, 3, 4, 5, 6, 7, 8]
    want = reference(path, context=64).logits(ids, all_logits=True)
    assert len({int(i) for i in want.argmax(axis=1)}) > 1                # positions do not all predict alike
    runner = asyncio.run(gpu(path, context=64, arithmetic=Arithmetic.F32))
    try:
        got = Drive(runner).logits(ids, all_logits=True)
    finally:
        runner.close()
    np.testing.assert_allclose(got, want, atol=2e-4 * np.abs(want).max(), rtol=1e-3)


# The other families' shapes in small: what each adds to the generator (Gemma 3: 256-wide heads, norms after
# the blocks, sliding-window layers, linear rope scaling; Phi-3: fused q/k/v and gate/up, Q5_K, LongRoPE
# factors, llama.cpp's Phi-3 vocabulary and Phi-3.5's chat template; Llama 3: the rope_freqs tensor)
SMALL_FAMILIES = {
    "gemma3": synthetic.Shape(arch="gemma3", tokenizer_from="smollm2", n_layers=6, n_embd=256, n_heads=2, n_kv_heads=1,
                              n_ff=512, context=1024, rope_base=1e6, eps=1e-6, key_length=256, qk_norm="head",
                              post_norms=4.0, tied=True, keys={"attention.sliding_window": 4, "rope.scaling.type": "linear",
                                                                "rope.scaling.factor": 8.0}),
    "phi3": synthetic.Shape(arch="phi3", tokenizer_from="llama.cpp:phi-3", n_layers=4, n_embd=256, n_heads=4, n_kv_heads=4,
                            n_ff=512, context=8192, fused=True, rope_factors="longrope",
                            chat_template="microsoft-Phi-3.5-mini-instruct",
                            keys={"rope.scaling.original_context_length": 1024, "rope.scaling.attn_factor": 1.1}),
    "llama3": synthetic.Shape(arch="llama", tokenizer_from="smollm2", n_layers=4, n_embd=512, n_heads=8, n_kv_heads=2,
                              n_ff=768, context=8192, rope_base=5e5, tied=True, rope_factors="llama3"),
}


@pytest.mark.parametrize("family", list(SMALL_FAMILIES))
def test_each_familys_shape_is_written_as_llama_cpp_lays_it_out_and_runs_on_the_gpu_like_the_reference(family, tmp_path):
    from pyshim.setup.catalog import tokenizer_file

    shape = SMALL_FAMILIES[family]
    path = synthetic.write(shape, tokenizer_file(shape.tokenizer_from), path=tmp_path / "m.gguf", quant="q4_k_m")
    header = read_header_from_file(path)
    spec = ModelSpec.from_header(header)
    types = {t.name: t.type.name for t in header.tensors}
    if family == "gemma3":
        assert spec.post_norms and spec.qk_norm and (spec.head_dim_k, spec.head_dim_v) == (256, 256)
        assert spec.sliding_window == 4 and spec.swa_layers == (True,) * 5 + (False,)
        assert spec.rope.scaling == "linear" and spec.rope.factor == 8
    elif family == "phi3":
        assert spec.fused_qkv and spec.fused_gate_up and spec.rope.n_ctx_orig == 1024
        assert types["blk.0.attn_qkv.weight"] == "Q5_K" and header.tensor("blk.0.ffn_up.weight").shape[1] == 2 * 512
        assert spec.rope_factor_tensors == ("rope_factors_long.weight", "rope_factors_short.weight")
        phi = read_header_from_file(tokenizer_file("llama.cpp:phi-3"))
        assert header.metadata["tokenizer.ggml.tokens"] == phi.metadata["tokenizer.ggml.tokens"]
        assert "<|assistant|>" in header.metadata["tokenizer.chat_template"]
        assert header.metadata["tokenizer.chat_template"] != phi.metadata["tokenizer.chat_template"]    # 3.5's, not 3's
    else:
        assert spec.rope_factor_tensors == ("rope_freqs.weight",)
        t = header.tensor("rope_freqs.weight")
        factors = np.frombuffer(path.read_bytes()[t.offset:t.offset + t.nbytes], np.float32)
        # Llama 3.1's rule: high frequencies kept (1), low ones slowed by the factor (32), a smooth step between
        assert len(factors) == 32 and np.all(np.diff(factors) >= 0) and factors[0] == 1 and factors[-1] == 32
    _runs_on_the_gpu_like_the_reference(path)


def test_the_full_size_families_have_their_models_parameter_counts():
    """The shapes people run, as their model cards count them (without the rope factor tensors, which the
    cards do not count): Llama-3.2-1B 1,235,814,400, Phi-3.5-mini 3,821,079,552, Gemma-3-4B's text model
    ~3.88 B, Qwen2.5-1.5B 1.54 B and -7B 7.61 B. Counted from the tensor list: nothing is written."""
    from pyshim.setup.catalog import tokenizer_file

    def params(name: str) -> int:
        shape = synthetic.SHAPES[name]
        n_vocab = len(read_header_from_file(tokenizer_file(shape.tokenizer_from)).metadata["tokenizer.ggml.tokens"])
        return sum(int(np.prod(s)) for t, s, kind in synthetic._tensors(shape, n_vocab) if kind != "factors")

    assert params("llama3.2-1b") == 1_235_814_400
    assert params("phi3.5-mini") == 3_821_079_552
    assert params("gemma3-4b") == pytest.approx(3.88e9, rel=0.005)
    assert params("qwen2.5-1.5b") == pytest.approx(1.54e9, rel=0.005)
    assert params("qwen2.5-7b") == pytest.approx(7.61e9, rel=0.005)


def _write_small(path: str) -> bytes:
    return synthetic.write(SMALL_MOE, model_path("smollm2"), path=path).read_bytes()


def test_processes_writing_one_model_at_once_each_replace_it_whole(tmp_path):
    """A benchmark and a test worker may generate the same model together: each writes its own temporary
    file and replaces the model whole (one shared `.partial` interleaved their writes). A temporary file
    left by a writer that was killed is removed by the next one."""
    import concurrent.futures
    import multiprocessing
    import subprocess
    import sys

    (tmp_path / "alone").mkdir()
    want = _write_small(str(tmp_path / "alone" / "small-moe.gguf"))       # (the name is in the file)
    path = tmp_path / "shared" / "small-moe.gguf"
    path.parent.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    stale = path.with_name(f".{path.name}.{dead.stdout.strip()}.0123abcd.partial")
    stale.write_bytes(b"\0" * 1000)
    with concurrent.futures.ProcessPoolExecutor(3, mp_context=multiprocessing.get_context("spawn")) as pool:
        outs = list(pool.map(_write_small, [str(path)] * 3))
    assert all(out == want for out in outs) and path.read_bytes() == want
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]
