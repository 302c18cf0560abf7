"""`pyshim doctor` on this machine: the adapters it finds (lavapipe natively, SwiftShader in Chromium on a
CPU-only machine), the kernel self-tests on both faces, the real-GPU flags tried and what they got, the
report files — and that a machine without Chromium or without any adapter still gets a report, each
section saying what is missing, with no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

DOCTOR_TIMEOUT_S = 300      # ~25 s here; this only stops a hang
BENCH_TIMEOUT_S = 1800


def _doctor(tmp_path, *args: str, env: dict | None = None, timeout: float = DOCTOR_TIMEOUT_S):
    """`pyshim doctor --json --out tmp_path ARGS` -> (the process, its JSON report)."""
    done = subprocess.run([sys.executable, "-m", "pyshim.cli", "doctor", "--json", "--out", str(tmp_path), *args],
                          capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    print(done.stdout[-4000:], done.stderr[-2000:])
    assert "Traceback" not in done.stdout + done.stderr
    return done, json.loads(done.stdout)


@pytest.fixture(scope="module")
def doctored(tmp_path_factory):
    """One default run, with the real-GPU flags asked for (so the path that reports what they got runs too)."""
    out = tmp_path_factory.mktemp("doctor")
    done, report = _doctor(out, "--chromium-gpu")
    return done, report, out


@pytest.mark.browser
def test_doctor_reports_both_adapters_and_passing_self_tests(doctored):
    done, report, out = doctored
    assert done.returncode == 0
    native, browser = report["sections"]["native"], report["sections"]["browser"]
    assert native["status"] == "ok" and native["selftest"]["ok"] and native["selftest"]["max_abs_err"] <= 1e-6
    caps = native["adapter"]
    assert caps["summary"] and "limits" in caps and caps["limits"]["max_buffer_size"] > 0 and caps["features"]
    assert any(a["backend"] == caps["backend"] for a in native["adapters"])
    if caps["is_fallback"]:       # this machine: Mesa's lavapipe, reported as the CPU adapter it is
        assert "llvmpipe" in f"{caps['vendor']} {caps['description']}".lower()
        assert native["roofline"].get("skipped")
    else:                         # a machine with a GPU: its roofline is measured
        assert native["roofline"]["GBps"] > 0
    assert browser["status"] == "ok", browser
    assert browser["selftest"]["ok"] and browser["python_ready_ms"] > 0 and browser["page_problems"] == []
    worker = browser["worker_adapter"]
    tried = browser["gpu_flags"]
    assert tried["flags"] and "--enable-gpu" in tried["flags"]
    if browser["verdict"] == "software":   # this machine: SwiftShader, said plainly, the default flags used
        assert "swiftshader" in worker["summary"].lower() and worker["is_fallback"] is True
        assert tried["used"] is False and "no GPU reached the browser" in tried["note"]
        assert "--enable-gpu" not in browser["flags"]
        assert "in Chromium a CPU (software) adapter" in report["verdict"]
    else:
        assert tried["used"] is True and "--enable-gpu" in browser["flags"] and not worker["is_fallback"]
    assert report["sections"]["bench"]["status"] == "skipped"


@pytest.mark.browser
def test_doctor_writes_its_report_files(doctored):
    _, report, out = doctored
    files = report["report_files"]
    assert json.loads(open(files["json"]).read())["verdict"] == report["verdict"]
    text = open(files["markdown"]).read()
    assert text.startswith("pyshim doctor") and report["verdict"] in text
    assert "[ok] native WebGPU" in text and "[ok] Chromium WebGPU" in text and "self-test: passed" in text
    for section in ("native", "browser"):           # each check's output is kept beside the report
        assert os.path.isfile(report["sections"][section]["log"])
    assert {p.suffix for p in out.iterdir()} >= {".json", ".md", ".log"}


def test_doctor_without_chromium_or_an_adapter_says_what_is_missing(tmp_path):
    """No Chromium and no Vulkan driver: each section is 'unavailable' with its own reason, the report is
    still written, and that is not a failure (exit 0)."""
    done, report = _doctor(tmp_path, env={"PYSHIM_CHROMIUM": str(tmp_path / "no-chromium"),
                                          "VK_ICD_FILENAMES": str(tmp_path / "no-icd.json"), "WGPU_BACKEND_TYPE": "Vulkan"})
    assert done.returncode == 0
    native, browser = report["sections"]["native"], report["sections"]["browser"]
    assert native["status"] == "unavailable" and native["error"].startswith("no native WebGPU adapter")
    assert "\n" not in native["error"] and "install a Vulkan driver" in native["error"]
    assert browser["status"] == "unavailable" and "Chromium is not installed" in browser["error"]
    assert "natively no adapter pyshim can use" in report["verdict"]
    assert os.path.isfile(report["report_files"]["markdown"])


def test_doctor_bounds_each_section(tmp_path):
    # 50 ms: no process can start Python, import wgpu and open an adapter in it (1 s, once the bound here,
    # was enough for a fast machine)
    done, report = _doctor(tmp_path, "--no-browser", "--timeout", "0.05")
    assert done.returncode == 1                      # a section that did not finish is a failure
    native = report["sections"]["native"]
    assert native["status"] == "failed" and native["error"] == "did not finish within 0.05 s (--timeout sets the bound)"
    assert native["seconds"] < 30 and report["sections"]["browser"]["status"] == "skipped"


@pytest.mark.browser
@pytest.mark.models
@pytest.mark.slow
@pytest.mark.full
def test_doctor_bench_quick_runs_the_benchmarks(tmp_path):
    """`--bench --quick`: the bench on SmolLM2 and Gemma 3 through `pyshim bench`, its reports beside
    doctor's, the rows summarised (the peer on WebGPU refused here, with its reason)."""
    done, report = _doctor(tmp_path, "--bench", "--quick", timeout=BENCH_TIMEOUT_S)
    bench = report["sections"]["bench"]
    assert bench["status"] == "ok", bench.get("error")
    assert set(bench["models"]) == {"smollm2", "gemma3"} and {"browser", "gpu", "cpu"} <= set(bench["backends"])
    assert all(os.path.isfile(p) for p in bench["reports"].values()) and bench["reports"]["html"].endswith(".html")
    rows = {(r["model"], r["engine"]): r for r in bench["rows"]}
    assert rows[("smollm2", "browser")]["decode_tok_s"] > 0 and rows[("smollm2", "gpu")]["cpu_ms_per_step"] > 0
    assert rows[("smollm2", "wllama-webgpu")]["status"].startswith(("ok", "refused"))
    assert "| smollm2 | browser | ok |" in bench["table"]


def test_the_device_check_script_parses_and_knows_its_carried_folders():
    """playwright/device_check.sh runs once per lent GPU machine, far from CI: at least it is valid bash,
    it installs what --prepare gathers (.gl, .whl, .dev), and it checks the browser's pieces that
    --prepare-browser splits over several calls against their sums before it unpacks them."""
    script = Path(__file__).resolve().parent.parent / "playwright" / "device_check.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    assert all(folder in text for folder in (".gl/*.deb", ".whl/*.whl", ".dev/tokenizer-"))
    assert all(part in text for part in ("--prepare-browser", "--receive", "sha256sum --quiet -c", "PYSHIM_CHROMIUM="))
