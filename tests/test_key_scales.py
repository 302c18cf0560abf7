"""Scaled keys (pyshim.models.key_scales): a q4/q8 cache stores each rope pair of the keys divided by a
per-model scale and the queries carry it, which leaves q.k alone and lets the 4-bit blocks keep the keys'
small channels. The executors' caches are checked against the reference's in test_kv_types and the
CPU engine's tests (both apply the scales); here: the scales change nothing but the rounding, and they
are what lifts Qwen2.5's q4 cache."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import tiny_models
from pyshim.exec.loading import load_reference
from pyshim.models.key_scales import hadamard, key_scales, rotation_width
from pyshim.plan.settings import KV_TYPES, RunSettings
from runners import Drive
from tiny_models import QT, write_tiny_model

ROOT = Path(__file__).resolve().parent.parent
IDS = tiny_models.test_ids() + [5, 77, 300, 9, 12, 41, 42, 43]


def _scaled(runner, on: bool, rotate: bool = False):
    """`runner`'s model with the scales of its own weights attached (on; `rotate`: and the q4 cache's
    rotation where the model takes it) or taken off."""
    model = runner.model
    scales = (key_scales(runner.spec, runner.ops.store, [b.rope for b in model.blk], rotate) if on
              else [None] * len(model.blk))
    for b, s in zip(model.blk, scales):
        b.key_scales = s
    return runner


def test_only_the_quantized_caches_scale_their_keys_and_only_q4_rotates_them():
    assert [t.name for t in KV_TYPES.values() if t.scaled_keys] == ["q8", "q4"]
    assert [t.name for t in KV_TYPES.values() if t.rotated_keys] == ["q4"]


@pytest.mark.parametrize("rotate", [False, True], ids=["scaled", "rotated"])
@pytest.mark.parametrize("arch", tiny_models.ALL_ARCHS)
def test_scales_leave_the_dot_products_alone(tmp_path, arch, rotate):
    """With an f32 cache the scaled (and rotated) keys and queries give the plain logits to f32 rounding:
    every architecture's pairing (normal, NeoX), head norms, whole-projection norms, fused qkv, biases."""
    path = write_tiny_model(tmp_path, arch, QT.Q8_0)
    settings = RunSettings(context=tiny_models.N_CTX)
    plain = Drive(load_reference(path, settings=settings)).logits(IDS, all_logits=True)
    runner = _scaled(load_reference(path, settings=settings), True, rotate)
    assert any(not np.allclose(b.key_scales.k, 1) for b in runner.model.blk)       # the scales are not all 1
    assert all(b.key_scales.rotation == (rotation_width(runner.spec, il) if rotate else 0)
               for il, b in enumerate(runner.model.blk))
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


def test_a_q4_cache_rotates_keys_without_a_bias():
    """llama's keys are rotated across the head (a power of two), Phi-3's 96 in groups of 32, the widest
    at 256; Qwen2's biased keys and a q8 cache's are not."""
    spec = lambda hd=64, **kw: SimpleNamespace(**{"qkv_bias": False, "head_dims": lambda layer: (hd, hd), **kw})
    assert [rotation_width(spec(hd)) for hd in (64, 96, 128, 256, 512, 80)] == [64, 32, 128, 256, 256, 16]
    assert rotation_width(spec(qkv_bias=True)) == 0


@pytest.mark.parametrize("arch,kv_type,rotated", [("llama", "q4", True), ("qwen2", "q4", False), ("llama", "q8", False)])
def test_which_caches_get_the_rotation(tmp_path, arch, kv_type, rotated):
    path = write_tiny_model(tmp_path, arch, QT.F32)
    runner = load_reference(path, settings=RunSettings(context=tiny_models.N_CTX, kv_type=kv_type))
    width = runner.spec.head_dim_k if rotated else 0
    assert [b.key_scales.rotation for b in runner.model.blk] == [width] * runner.spec.n_layers


@pytest.mark.parametrize("width", [32, 64, 256])
def test_hadamard_is_the_orthonormal_sylvester_matrix(width):
    h = np.ones((1, 1))
    while len(h) < width:
        h = np.block([[h, h], [h, -h]])
    x = np.random.default_rng(width).standard_normal((3, 2, 256)).astype(np.float32)
    want = (x.astype(np.float64).reshape(3, 2, -1, width) @ (h / np.sqrt(width))).reshape(x.shape)
    got = hadamard(x, width)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    np.testing.assert_allclose(hadamard(got, width), x, rtol=0, atol=1e-5)      # its own inverse


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
@pytest.mark.parametrize("arch, qtype", [("phi3", QT.Q8_0), ("qwen2", QT.F32), ("llama", QT.Q8_0)])
def test_key_ranges_are_the_bytes_of_the_key_rows(tmp_path, arch, qtype):
    """What the page reads from its store for the scales: each layer's key_tensors, of a fused attn_qkv
    (phi3) only the key rows, of a bias (qwen2) the whole vector — byte for byte what the file holds there."""
    from pyshim.gguf.header import read_header_from_file
    from pyshim.gguf.spec import ModelSpec
    from pyshim.gguf.tensors import FileSource, WeightStore, tensor_refs_from_header
    from pyshim.models.key_scales import key_ranges, key_tensors

    path = write_tiny_model(tmp_path, arch, qtype)
    header = read_header_from_file(path)
    spec = ModelSpec.from_header(header)
    store = WeightStore(tensor_refs_from_header(header), FileSource(path))
    data = path.read_bytes()
    wanted = [(name, rows) for il in range(spec.n_layers) for name, rows in key_tensors(spec, il)]
    ranges = key_ranges(spec, header)
    assert len(ranges) == len(wanted)
    for (name, rows), (off, n) in zip(wanted, ranges):
        whole = rows is None or len(store.info(name).shape) == 1
        expect = store.raw(name) if whole else store.row_range(name, *rows)
        assert data[off:off + n] == np.asarray(expect).tobytes(), name
    fused = [rows for name, rows in wanted if name.endswith("attn_qkv.weight")]
    assert (arch == "phi3") == bool(fused) and all(rows is not None for rows in fused)
    assert (arch == "qwen2") == any(name.endswith("attn_k.bias") for name, _ in wanted)     # read whole, a vector


@pytest.mark.parametrize("arch, device", [("llama", "gpu"), ("llama", "cpu"), ("phi3", "gpu")])
def test_a_q4_cache_in_the_browser_gets_its_scales_from_the_store(tmp_path, capsys, arch, device):
    """`--backend browser --kv-type q4`: the Worker hands the key projections' bytes from IndexedDB to
    Python, which makes the scales (llama's keys: rotated too; of phi3's fused attn_qkv only the key rows
    are read); WebGPU and the CPU engine give the reference's greedy tokens with that cache."""
    import json

    from pyshim.cli import main

    model = write_tiny_model(tmp_path, arch, QT.F32)
    argv = ["generate", str(model), "--prompt", "hello there", "--max-tokens", "12", "--ignore-eos", "--json",
            "--kv-type", "q4"]
    assert main(argv + ["--backend", "browser", "--device", device]) == 0, capsys.readouterr().err
    browser = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(argv + ["--arithmetic", browser["arithmetic"]]) == 0
    cpu = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert browser["ids"] == cpu["ids"] and len(cpu["ids"]) == 12
