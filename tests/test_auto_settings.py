"""kv_type "auto" (the default of the CLI, the APIs and the site): the KV type and context picked from the
GPU budget, with the reason said — on a header-only GGUF with Qwen2.5-7B's shape (4.3 GB of Q4_0) and on a
real model loaded through the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter

from pyshim.errors import OutOfMemoryError
from pyshim.gguf.header import read_header
from pyshim.gguf.spec import ModelSpec
from pyshim.plan import auto
from pyshim.plan.memory import estimate
from pyshim.plan.probe import probe
from pyshim.plan.settings import RunSettings
from pyshim.setup import synthetic

ROOT = Path(__file__).parent.parent
QWEN7B = synthetic.Shape(arch="qwen2", tokenizer_from="qwen2.5", n_layers=28, n_embd=3584, n_heads=28, n_kv_heads=4,
                         n_ff=18944, context=32768)
N_VOCAB = 152064
GB = 10 ** 9


@pytest.fixture(scope="module")
def qwen7b(tmp_path_factory) -> tuple[bytes, int]:
    """(header bytes, the full file's size) of a Qwen2.5-7B-shaped Q4_0 GGUF, written without its data."""
    path = tmp_path_factory.mktemp("auto") / "qwen7b-header.gguf"
    s = QWEN7B
    writer = GGUFWriter(str(path), s.arch)
    writer.add_context_length(s.context)
    writer.add_embedding_length(s.n_embd)
    writer.add_block_count(s.n_layers)
    writer.add_feed_forward_length(s.n_ff)
    writer.add_head_count(s.n_heads)
    writer.add_head_count_kv(s.n_kv_heads)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(N_VOCAB)
    data = 0
    for name, shape, kind in synthetic._tensors(s, N_VOCAB):
        if kind == "norm":
            writer.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
            data += int(np.prod(shape)) * 4
        else:
            byte_shape = (*shape[:-1], shape[-1] // 32 * 18)
            writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=GGMLQuantizationType.Q4_0)
            data += int(np.prod(byte_shape))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    header = path.read_bytes()
    return header, len(header) + data + 64


def test_a_7b_model_in_6_gb_gets_a_small_cache_and_a_context_that_fits(qwen7b):
    header, size = qwen7b
    out = probe(header, size, kv_type="auto", budget_bytes=6 * GB, judge=True,
                limits={"max_storage_buffer_binding_size": 1 << 30, "max_buffer_size": 1 << 30})
    assert 4.2 * GB < out["weight_bytes"] < 4.4 * GB
    picked = out["auto"]
    assert picked["kv_type"] in ("q8", "q4") and picked["context"] >= 8192
    assert out["fit"]["ok"] and out["total_bytes"] <= 6 * GB
    assert (out["kv_type"], out["context"]) == (picked["kv_type"], picked["context"])
    # the reason names the pick and what the better types would have needed
    assert f"{picked['kv_type']} KV cache" in picked["reason"] and "f32 would need" in picked["reason"], picked["reason"]
    assert "of the 6.00 GB budget" in picked["reason"]


def test_auto_prefers_the_longest_context_then_the_least_rounding(qwen7b):
    header = read_header(qwen7b[0], file_size=qwen7b[1])
    spec = ModelSpec.from_header(header)
    big = auto.choose(spec, header.tensors, budget_bytes=40 * GB)
    assert (big.context, big.kv_type) == (32768, "f32")
    # a named context is kept and only the type chosen; a named type is kept and only the context chosen
    named = auto.choose(spec, header.tensors, budget_bytes=6 * GB, context=4096)
    assert (named.context, named.kv_type) == (4096, "f32")
    f32 = auto.choose(spec, header.tensors, budget_bytes=6 * GB, kv_type="f32")
    assert f32.kv_type == "f32" and f32.context < 32768
    assert estimate(spec, header.tensors, context=f32.context * 2, kv_type="f32").total_bytes > 6 * GB
    assert auto.choose(spec, header.tensors, budget_bytes=4 * GB) is None          # the weights alone are 4.3 GB
    with pytest.raises(OutOfMemoryError, match="no KV cache type fits"):
        RunSettings(kv_type="auto", budget_bytes=4 * GB).resolve(spec, header.tensors)
    settings, choice = RunSettings(kv_type="auto", budget_bytes=6 * GB).resolve(spec, header.tensors)
    assert (settings.kv_type, settings.context) == (choice.kv_type, choice.context)
    assert RunSettings(kv_type="q4").resolve(spec, header.tensors) == (RunSettings(kv_type="q4"), None)


@pytest.mark.models
def test_the_cli_says_what_auto_picked():
    model = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not model.exists():
        pytest.skip("run `pyshim setup --test-models`")
    done = subprocess.run([sys.executable, "-m", "pyshim.cli", "generate", str(model), "--prompt", "Hi", "--max-tokens", "2",
                           "--budget-mb", "200", "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    # 200 MiB: SmolLM2's 100 MB of weights leave room for a q8 or f16 cache at a shorter context, not f32 at 8192
    assert report["auto"] and (report["kv_type"], report["context"]) == (report["auto"]["kv_type"], report["auto"]["context"])
    assert (report["kv_type"], report["context"]) != ("f32", 8192)
    assert "auto picked" in report["auto"]["reason"]
