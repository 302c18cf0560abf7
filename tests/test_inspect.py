"""`pyshim inspect`: text and JSON reports, on a small written file and on the real models."""

from __future__ import annotations

import json

import pytest

from ggufgen import writer_file
from pyshim.setup.catalog import MODELS, model_path
from pyshim.cli import main


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return writer_file(tmp_path_factory.mktemp("inspect") / "small.gguf")


def run_json(capsys, *argv) -> dict:
    assert main(["inspect", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_report(small, capsys):
    report = run_json(capsys, str(small), "--context", "100", "--kv-type", "f16")
    assert report["spec"]["architecture"] == "llama" and report["spec"]["n_layers"] == 2
    assert report["file_type"] == "Q4_K_M" and report["tensor_count"] == 4
    types = report["tensor_types"]
    assert set(types) == {"F16", "F32", "Q8_0", "Q4_K"} and types["Q4_K"] == {"count": 1, "bytes": 288, "runs": True}
    mem = report["memory"]
    assert mem["weight_bytes"] == sum(t["bytes"] for t in types.values())
    assert mem["kv_bytes_per_token"] == 2 * 2 * (64 + 64) * 2 and mem["kv_bytes"] == 100 * mem["kv_bytes_per_token"]
    assert mem["largest_tensor"]["name"] == "token_embd.weight" and mem["largest_tensor"]["shape"] == [256, 40]


def test_text_report(small, capsys):
    assert main(["inspect", str(small)]) == 0
    out = capsys.readouterr().out
    for fragment in ("[llama]", "layers      2", "rope        normal", "Q4_K", "largest     token_embd.weight", "KV cache    f32"):
        assert fragment in out, out


def test_errors_are_reported_not_raised(tmp_path, capsys):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"PK\x03\x04" + b"\0" * 100)
    assert main(["inspect", str(bad)]) == 2
    assert "not a GGUF file" in capsys.readouterr().err
    assert main(["inspect", "no-such-model"]) == 2
    assert main(["inspect", str(bad), "--kv-type", "bf8"]) == 2
    assert "--kv-type" in capsys.readouterr().err


@pytest.mark.models
@pytest.mark.parametrize("name", list(MODELS))
def test_real_models(name, capsys):
    if not model_path(name).is_file():
        pytest.fail(f"{name} is missing: run `pyshim setup --test-models`")
    report = run_json(capsys, name)
    assert report["file_size"] == MODELS[name].size
    assert all(t["runs"] for t in report["tensor_types"].values())   # every type in the three models is runnable
    assert report["memory"]["weight_bytes"] < MODELS[name].size
    assert main(["inspect", name]) == 0 and report["spec"]["name"] in capsys.readouterr().out


def test_best_fit_for_a_budget(small, capsys):
    roomy = run_json(capsys, str(small), "--context", "100", "--budget-mb", "100")
    assert roomy["best_fit"]["context"] == 100 and roomy["best_fit"]["kv_type"] == "f32"
    f16 = run_json(capsys, str(small), "--context", "100", "--kv-type", "f16")["memory"]["total_bytes"]
    tight = run_json(capsys, str(small), "--context", "100", "--budget-mb", str(f16 / 1e6))
    assert {k: tight["best_fit"][k] for k in ("context", "kv_type", "total_bytes")} == {"context": 100, "kv_type": "f16", "total_bytes": f16}
    assert "auto picked an f16 KV cache" in tight["best_fit"]["reason"]
    assert run_json(capsys, str(small), "--budget-mb", "0.0001")["best_fit"] is None
    assert main(["inspect", str(small), "--budget-mb", "1"]) == 0
    assert "best fit" in capsys.readouterr().out
