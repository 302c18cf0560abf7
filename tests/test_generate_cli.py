"""`pyshim generate` and `pyshim score` on a tiny model (the real models: tests/test_real_models.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pyshim.cli import main
from runners import Drive, reference
from tiny_models import QT, write_tiny_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return str(write_tiny_model(tmp_path_factory.mktemp("cli"), "qwen3", QT.Q8_0))


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_generate_json_greedy_is_deterministic(model, capsys):
    argv = ["generate", model, "--prompt", "hello", "--max-tokens", "6", "--json"]
    a, b = _json(capsys, argv), _json(capsys, argv)
    assert a["ids"] == b["ids"] and a["text"] == b["text"]
    assert set(a) >= {"text", "ids", "prompt_ids", "prefill_tok_s", "decode_tok_s"}
    assert len(a["ids"]) <= 6 and a["prompt_ids"][0] == 1          # BOS, as the tiny vocab says
    # the ids are the model's greedy choices
    assert a["ids"][0] == int(np.argmax(reference(model).logits(a["prompt_ids"])))


def test_generate_seed_reproduces_sampling(model, capsys):
    argv = ["generate", model, "--prompt", "hello", "--max-tokens", "8", "--temperature", "1.5", "--json"]
    a = _json(capsys, argv + ["--seed", "3"])
    b = _json(capsys, argv + ["--seed", "3"])
    c = _json(capsys, argv + ["--seed", "4"])
    assert a["ids"] == b["ids"] and a["text"] == b["text"]
    assert a["ids"] != c["ids"]


def test_generate_streams_text(model, capsys):
    assert main(["generate", model, "--prompt", "hello", "--max-tokens", "4"]) == 0
    captured = capsys.readouterr()
    assert "tok/s" in captured.err


def test_score_rows_are_predictions_after_each_prefix(model, capsys):
    out = _json(capsys, ["score", model, "--text", "hello world", "--top-k", "3", "--json"])
    assert len(out["top_ids"]) == len(out["ids"]) and all(len(r) == 3 for r in out["top_ids"])
    top_ids, top_logits = Drive(reference(model)).scores(out["ids"], 3)
    assert out["top_ids"] == top_ids.tolist()
    np.testing.assert_allclose(out["top_logits"], top_logits, atol=1e-4)
    assert all(r[0] >= r[1] >= r[2] for r in out["top_logits"])


def test_prompt_longer_than_context_is_a_clean_error(model, capsys):
    assert main(["generate", model, "--prompt", "hello " * 40, "--ctx", "8"]) == 2
    assert "context" in capsys.readouterr().err


def test_ignore_eos_runs_past_an_end_of_generation_id(model, capsys, monkeypatch):
    """Make one of the tiny model's greedy ids its end-of-generation id: generation stops before it, and
    with --ignore-eos runs on to --max-tokens through it (what fixed-length benchmark runs need)."""
    from pyshim.text.tokenizer import Tokenizer

    argv = ["generate", model, "--prompt", "hello", "--max-tokens", "8", "--json"]
    free = _json(capsys, argv)
    assert len(free["ids"]) == 8
    k = next(i for i in range(1, 8) if free["ids"][i] not in free["ids"][:i])   # its first appearance
    monkeypatch.setattr(Tokenizer, "eog_ids", property(lambda self: frozenset({free["ids"][k]})))
    stopped = _json(capsys, argv)
    assert stopped["finish_reason"] == "stop" and stopped["ids"] == free["ids"][:k]
    full = _json(capsys, argv + ["--ignore-eos"])
    assert full["finish_reason"] == "length" and full["ids"] == free["ids"]


def test_browser_backend_without_chromium_is_a_clear_error(model, capsys, monkeypatch):
    monkeypatch.setenv("PYSHIM_CHROMIUM", "/nonexistent/chromium")
    import sys

    from pyshim.paths import PLAYWRIGHT_DIR

    sys.path.insert(0, str(PLAYWRIGHT_DIR))
    import harness

    monkeypatch.setattr(harness, "CHROMIUM", "/nonexistent/chromium")
    assert main(["generate", model, "--prompt", "hello", "--backend", "browser", "--json"]) == 2
    err = capsys.readouterr().err
    assert "Chromium" in err and "/nonexistent/chromium" in err


def test_gpu_backend_reports_its_arithmetic_and_the_cpu_side_of_decode(model, capsys):
    argv = ["generate", model, "--prompt", "hello", "--max-tokens", "6", "--ignore-eos", "--json"]
    gpu = _json(capsys, argv + ["--backend", "gpu"])
    assert 0 < gpu["cpu_share_pct"] < 100 and gpu["arithmetic"] in ("int8", "f32")
    cpu = _json(capsys, argv + ["--arithmetic", gpu["arithmetic"]])
    assert cpu["cpu_share_pct"] is None and cpu["arithmetic"] == gpu["arithmetic"]


def test_greedy_gpu_decode_reads_back_at_most_8_bytes_a_token(model, capsys):
    """The one generation loop asks the GPU for the argmax when decoding greedily: 4 bytes come back per
    decode step natively, as in the browser (not a row of the vocabulary's logits)."""
    out = _json(capsys, ["generate", model, "--prompt", "hello", "--max-tokens", "8", "--ignore-eos", "--backend", "gpu", "--json"])
    assert len(out["ids"]) == 8 and 0 < out["bytes_per_decode_step"] <= 8


def test_kv_type_and_prefill_chunk(tmp_path, capsys):
    """--kv-type reaches the cpu reference and the gpu executor alike (same greedy ids here), and
    --prefill-chunk splits the prefill into small steps (on every backend) without changing the answer."""
    from gguf import GGMLQuantizationType as QT

    import tiny_models
    from pyshim.cli import main

    path = str(tiny_models.write_tiny_model(tmp_path, "llama", QT.F32))
    runs = {}
    for name, extra in {"cpu": ["--backend", "cpu"], "cpu-chunk3": ["--backend", "cpu", "--prefill-chunk", "3"],
                        "gpu": ["--backend", "gpu", "--arithmetic", "f32"],
                        "gpu-chunk3": ["--backend", "gpu", "--arithmetic", "f32", "--prefill-chunk", "3"]}.items():
        assert main(["generate", path, "--prompt", "hello world, once more", "--max-tokens", "6", "--kv-type", "q8", "--json",
                     "--ignore-eos", *extra]) == 0
        runs[name] = json.loads(capsys.readouterr().out)["ids"]
    assert runs["cpu"] == runs["cpu-chunk3"] == runs["gpu"] == runs["gpu-chunk3"] and len(runs["cpu"]) == 6
    assert main(["generate", path, "--prompt", "hi", "--backend", "gpu", "--prefill-chunk", "0"]) == 2
    assert "prefill chunk" in capsys.readouterr().err
    assert main(["generate", path, "--prompt", "hi", "--backend", "gpu", "--arithmetic", "llama.cpp-exact"]) == 2
    assert "cpu" in capsys.readouterr().err


@pytest.mark.models
def test_score_like_llama_cpp_is_llama_cpp_bit_for_bit(capsys):
    """`score --arithmetic llama.cpp-exact` is the bit-exact emulation of llama.cpp's CPU arithmetic: on the passage's
    first sentence it gives llama.cpp's own top-10 logits (tests/fixtures/real_llamacpp.json, one batch)."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    fx = json.loads((root / "tests" / "fixtures" / "real_llamacpp.json").read_text())["models"]["smollm2"]
    path = root / fx["file"]
    if not path.is_file():
        pytest.skip(f"{path.name} is not in models/ (pyshim setup --test-models)")
    sentence = (root / "tests" / "fixtures" / "passage.txt").read_text().split(". ")[0] + "."
    got = _json(capsys, ["score", str(path), "--text", sentence, "--arithmetic", "llama.cpp-exact", "--json"])
    n = len(got["ids"])
    assert got["ids"] == fx["passage"]["ids"][:n]          # the same tokens: rows are comparable
    assert got["top_ids"] == [row for row in fx["passage"]["top_ids"][:n]]
    assert np.abs(np.array(got["top_logits"]) - np.array(fx["passage"]["top_logits"][:n])).max() < 1e-3
    rounded = _json(capsys, ["score", str(path), "--text", sentence, "--arithmetic", "int8", "--json"])
    assert np.abs(np.array(rounded["top_logits"])[:, 0] - np.array(fx["passage"]["top_logits"][:n])[:, 0]).max() > 1e-3


def test_the_flags_choices_are_the_settings():
    """The command's choice lists (kept free of imports so `pyshim --help` is fast) name what the settings accept."""
    from pyshim.cli import generate
    from pyshim.plan import settings

    assert set(generate.KV_TYPES) == {settings.AUTO, *settings.KV_TYPES}
    assert set(generate.ROPE_SCALINGS) == set(settings.ROPE_SCALINGS)
    assert set(generate.DEVICES) == set(settings.DEVICES)
    assert set(generate.ARITHMETIC) == {a.value for a in settings.Arithmetic}
