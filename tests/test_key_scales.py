"""Scaled keys (pyshim.models.key_scales): a q4/q8 cache stores each rope pair of the keys divided by a
per-model scale and the queries carry it, which leaves q.k alone and lets the 4-bit blocks keep the keys'
small channels. The executors' caches are checked against the reference's in test_kv_types and the
CPU engine's tests (both apply the scales); here: the scales change nothing but the rounding, and they
are what lifts Qwen2.5's q4 cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tiny_models
from pyshim.exec.loading import load_reference
from pyshim.models.key_scales import key_scales
from pyshim.plan.settings import KV_TYPES, RunSettings
from runners import Drive
from tiny_models import QT, write_tiny_model

ROOT = Path(__file__).resolve().parent.parent
IDS = tiny_models.test_ids() + [5, 77, 300, 9, 12, 41, 42, 43]


def _scaled(runner, on: bool):
    """`runner`'s model with the scales of its own weights attached (on) or taken off."""
    model = runner.model
    scales = key_scales(runner.spec, runner.ops.store, [b.rope for b in model.blk]) if on else [None] * len(model.blk)
    for b, s in zip(model.blk, scales):
        b.key_scales = s
    return runner


def test_only_the_quantized_caches_scale_their_keys():
    assert [t.name for t in KV_TYPES.values() if t.scaled_keys] == ["q8", "q4"]


@pytest.mark.parametrize("arch", tiny_models.ALL_ARCHS)
def test_scales_leave_the_dot_products_alone(tmp_path, arch):
    """With an f32 cache the scaled keys and queries give the plain logits to f32 rounding: every
    architecture's pairing (normal, NeoX), head norms, whole-projection norms, fused qkv, biases."""
    path = write_tiny_model(tmp_path, arch, QT.Q8_0)
    settings = RunSettings(context=tiny_models.N_CTX)
    plain = Drive(load_reference(path, settings=settings)).logits(IDS, all_logits=True)
    runner = _scaled(load_reference(path, settings=settings), True)
    assert any(not np.allclose(b.key_scales.k, 1) for b in runner.model.blk)       # the scales are not all 1
    scaled = Drive(runner).logits(IDS, all_logits=True)
    np.testing.assert_allclose(scaled, plain, atol=2e-4 * np.abs(plain).max(), rtol=0)


def test_a_model_with_a_q4_cache_gets_the_scales_and_one_with_f32_does_not(tmp_path):
    path = write_tiny_model(tmp_path, "qwen2", QT.F32)
    q4 = load_reference(path, settings=RunSettings(context=tiny_models.N_CTX, kv_type="q4"))
    f32 = load_reference(path, settings=RunSettings(context=tiny_models.N_CTX))
    assert all(b.key_scales is not None for b in q4.model.blk)
    assert all(b.key_scales is None for b in f32.model.blk)
    s = q4.model.blk[0].key_scales
    # a query head carries its KV head's scale, the keys its f32 reciprocal; each rope pair one scale
    group = q4.spec.n_heads // q4.spec.n_kv_heads
    np.testing.assert_allclose(s.q[::group] * s.k, 1, rtol=1e-6)
    half = q4.spec.head_dim_k // 2          # qwen2: NeoX pairs (i, i + half)
    np.testing.assert_array_equal(s.k[:, :half], s.k[:, half:])


@pytest.mark.models
def test_scaled_keys_lift_qwen25s_q4_cache():
    """Qwen2.5-0.5B's key biases made q4's blocks lose the small channels: next-token top-1 agreement with
    the f32 cache over 96 tokens of English was 40-50% (400 tokens: 46%); with the scales it is 80-85%."""
    from english_text import long_english_text
    from pyshim.text.tokenizer import Tokenizer

    path = ROOT / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    if not path.is_file():
        pytest.skip(f"{path.name} is not in models/ (pyshim setup --test-models)")
    settings = RunSettings(context=128)
    f32 = load_reference(path, settings=settings)
    ids = Tokenizer.from_metadata(f32.header.metadata).encode(long_english_text(4))[:96]
    top = Drive(f32).logits(ids, all_logits=True).argmax(-1)
    agreement = {}
    for on in (False, True):
        runner = _scaled(load_reference(path, settings=RunSettings(context=128, kv_type="q4")), on)
        agreement[on] = float((Drive(runner).logits(ids, all_logits=True).argmax(-1) == top).mean())
    assert agreement[True] >= 0.7 and agreement[True] > agreement[False] + 0.15, agreement


@pytest.mark.browser
@pytest.mark.parametrize("device", ["gpu", "cpu"])
def test_a_q4_cache_in_the_browser_gets_its_scales_from_the_store(tmp_path, capsys, device):
    """`--backend browser --kv-type q4`: the Worker hands the key projections' bytes from IndexedDB to
    Python, which makes the scales; WebGPU and the CPU engine give the reference's greedy tokens with that
    cache."""
    import json

    from pyshim.cli import main

    model = write_tiny_model(tmp_path, "qwen2", QT.F32)
    argv = ["generate", str(model), "--prompt", "hello there", "--max-tokens", "12", "--ignore-eos", "--json",
            "--kv-type", "q4"]
    assert main(argv + ["--backend", "browser", "--device", device]) == 0, capsys.readouterr().err
    browser = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(argv + ["--arithmetic", browser["arithmetic"]]) == 0
    cpu = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert browser["ids"] == cpu["ids"] and len(cpu["ids"]) == 12
