"""The benchmark never rots: `pyshim bench --quick` runs end to end in headless Chromium (pyshim's
engines and the wllama peer) and writes its three reports with the right shape. Its numbers are
printed, never asserted as speeds. The pieces (prompts, medians, derived figures, rendering) are
checked on their own first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import bench
import bench_engines
import bench_report
from pyshim.setup.catalog import model_path

QUICK_TIMEOUT_S = 600   # the quick run takes ~1.5 min on the loaded 2-core machine; this only stops a hang


def _fake_report() -> dict:
    facts = {"name": "smollm2", "file": "m.gguf", "file_bytes": 98e6, "architecture": "llama", "bytes_per_token": 1e8,
             "weight_elems_per_token": 1.6e8, "workload": [{"name": "p32", "token_count": 32}]}
    results = [
        {"model": "smollm2", "engine": "browser", "peer": False, "status": "ok", "samples": [],
         "median": {"ready_ms": 9000.0, "header_ms": 250.0, "decode_tok_s": 20.0, "prefill_32_tok_s": 80.0, "roofline_GBps": 2.0,
                    "peak_gpu_bytes": 194.9e6, "planned_gpu_bytes": 198.0e6, "peak_js_heap_bytes": 312.4e6,
                    "cpu_ms_per_step": 12.34, "dispatches_per_token": 412}},
        {"model": "smollm2", "engine": "gpu", "peer": False, "status": "n/a (not built yet)", "samples": [], "median": {}},
        {"model": "smollm2", "engine": "wllama-1t", "peer": True, "status": "ok", "samples": [],
         "median": {"decode_tok_s": 8.0, "prefill_32_tok_s": 40.0, "load_ms": 3000.0}},
        {"model": "smollm2", "engine": "wllama-webgpu", "peer": True, "samples": [], "median": {},
         "status": "refused: the adapter (google swiftshader) has no shader-f16, which llama.cpp's WebGPU backend requires",
         "refused": "the adapter (google swiftshader) has no shader-f16, which llama.cpp's WebGPU backend requires"},
    ]
    for r in results:
        if r["median"]:
            bench.derive(r["median"], facts, None)
    report = {"started_at": "2026-11-30T12:00:00+00:00", "config": {"quick": True, "settings": {"prompt_tokens": [32], "runs": 1, "decode_tokens": 8}},
              "machine": {"cpu_count": 2, "memory_bytes": 24 * 2**30, "platform": "Linux", "load_average_start": [1.0, 1, 1],
                          "load_average_end": [2.0, 1, 1], "git_commit": "abc"},
              "browser": {"version": "156"}, "adapter": {"summary": "google swiftshader", "is_fallback": True},
              "models": {"smollm2": facts}, "results": results, "rooflines": {"host": {"GBps": 15.0}}}
    bench._peer_ratios(report)
    return report


def test_derived_figures_follow_from_decode_speed_and_the_roofline():
    report = _fake_report()
    browser, gpu, peer, _ = report["results"]
    assert browser["median"]["achieved_GBps"] == pytest.approx(20.0 * 1e8 / 1e9)
    # the higher of bytes (2 GB/s of 2 GB/s = 100%) and elements (none measured) wins
    assert browser["median"]["roofline_pct"] == pytest.approx(100.0)
    assert browser["vs_peer"]["decode_tok_s_vs_wllama-1t"] == pytest.approx(2.5)
    assert browser["vs_peer"]["prefill_32_tok_s_vs_wllama-1t"] == pytest.approx(2.0)
    assert peer["median"]["roofline_pct"] == pytest.approx(100 * 0.8 / 15.0)   # the peer's ceiling is the host's
    assert "achieved_GBps" not in gpu["median"]


def test_a_figure_over_the_roofline_is_flagged_not_printed():
    """A roofline that read low (a busy machine) would put decode over 100%: the row says so instead of
    printing it as an efficiency (the issue's 141% and 165% on lavapipe)."""
    facts = {"bytes_per_token": 1e8, "weight_elems_per_token": 1.6e8}
    over = {"decode_tok_s": 30.0, "roofline_GBps": 2.0, "roofline_Gelem_s": 4.0}     # 3 GB/s of 2
    bench.derive(over, facts, None)
    assert over["roofline_pct"] is None and over["roofline_over_pct"] == pytest.approx(150.0)
    assert "over 100% (150%)" in bench_report._roofline_cell(over)
    fine = {"decode_tok_s": 10.0, "roofline_GBps": 2.0, "roofline_Gelem_s": 4.0}     # 1 GB/s of 2, 1.6 G of 4 elements
    bench.derive(fine, facts, None)
    assert fine["roofline_pct"] == pytest.approx(50.0) and fine["roofline_over_pct"] is None
    assert bench_report._roofline_cell(fine) == "50.0"


def test_q6_k_weights_are_held_to_the_six_bit_probe_and_the_rest_to_the_best_rate():
    """A token of 1e8 Q4_K and 6e7 Q6_K elements at 10 tok/s against a best rate of 4 G elements/s and a
    6-bit one of 2: the probes need 0.025 + 0.03 s a token, so 55% (40% with every element at the best
    rate, kept beside it); with no 6-bit rate measured, the best rate stands for it."""
    facts = {"bytes_per_token": 1e7, "weight_elems_per_token": 1.6e8,
             "weight_elems_by_type_per_token": {"Q4_K": 1e8, "Q6_K": 6e7}}
    m = {"decode_tok_s": 10.0, "roofline_GBps": 100.0, "roofline_Gelem_s": 4.0,
         "roofline_Gelem_s_by_bits": {"4": 4.0, "6": 2.0}}
    bench.derive(m, facts, None)
    assert m["roofline_pct"] == pytest.approx(55.0) and m["roofline_one_rate_pct"] == pytest.approx(40.0)
    plain = {"decode_tok_s": 10.0, "roofline_GBps": 100.0, "roofline_Gelem_s": 4.0}
    bench.derive(plain, facts, None)
    assert plain["roofline_pct"] == pytest.approx(40.0)


def test_the_median_step_gives_a_steady_figure_beside_the_mean():
    """decode_tok_s is a mean over every step (a neighbour's burst included); the median step gives the same
    efficiency figures once more, flagged alike over 100%, and absent where no engine reported it."""
    facts = {"bytes_per_token": 1e8, "weight_elems_per_token": 1.6e8}
    m = {"decode_tok_s": 4.0, "decode_median_step_ms": 200.0, "roofline_GBps": 2.0, "roofline_Gelem_s": 4.0}
    bench.derive(m, facts, None)
    assert m["roofline_pct"] == pytest.approx(20.0)                 # 0.4 GB/s of 2; 0.64 G of 4 elements: 16%
    assert m["steady_tok_s"] == pytest.approx(5.0) and m["roofline_steady_pct"] == pytest.approx(25.0)
    assert bench_report._roofline_cell(m, "roofline_steady") == "25.0"
    fast = {"decode_tok_s": 15.0, "decode_median_step_ms": 40.0, "roofline_GBps": 2.0}   # 25 tok/s: 2.5 GB/s of 2
    bench.derive(fast, facts, None)
    assert fast["roofline_pct"] == pytest.approx(75.0)
    assert fast["roofline_steady_pct"] is None and fast["roofline_steady_over_pct"] == pytest.approx(125.0)
    assert "over 100% (125%)" in bench_report._roofline_cell(fast, "roofline_steady")
    plain = {"decode_tok_s": 4.0, "roofline_GBps": 2.0}
    bench.derive(plain, facts, None)
    assert "roofline_steady_pct" not in plain and bench_report._roofline_cell(plain, "roofline_steady") == "–"


def test_two_measurements_of_a_roofline_keep_the_best_of_each_figure():
    busy = {"GBps": 7.0, "Gelem_s": 8.8, "Gelem_s_by_bits": {"4": 8.8, "6": 10.7}, "ms_per_pass": {"contiguous i4": 15.0}}
    quiet = {"GBps": 9.6, "Gelem_s": 13.1, "Gelem_s_by_bits": {"4": 13.1, "6": 10.1}, "ms_per_pass": {"contiguous i4": 10.2}}
    best = bench.best_roofline(busy, quiet)
    assert (best["GBps"], best["Gelem_s"]) == (9.6, 13.1)
    assert best["Gelem_s_by_bits"] == {"4": 13.1, "6": 10.7} and best["ms_per_pass"] == {"contiguous i4": 10.2}
    assert bench.best_roofline(busy, {"error": "lost"}) is busy and bench.best_roofline({"error": "x"}, quiet) is quiet


def test_the_roofline_measures_each_element_width_and_keeps_the_best():
    """Natively (lavapipe here): f32, int8, 4-bit and 6-bit probes each give a rate, the best is Gelem_s."""
    import asyncio

    from bench_roofline import measure_roofline

    r = asyncio.run(measure_roofline(8))
    assert set(r["Gelem_s_by_bits"]) == {"32", "8", "4", "6"}
    assert all(v > 0 for v in r["Gelem_s_by_bits"].values())
    assert r["Gelem_s"] == max(r["Gelem_s_by_bits"].values())
    assert {"contiguous i6", "strided i6"} <= set(r["ms_per_pass"])


def test_medians_take_numbers_per_figure_and_keep_other_values():
    m = bench.medians([{"a": 1.0, "b": "x"}, {"a": 3.0}, {"a": 2.0, "c": True}])
    assert m == {"a": 2.0, "b": "x", "c": True}


def test_text_agreement_marks_the_engine_whose_greedy_text_differs():
    report = _fake_report()
    for r, text in zip(report["results"], [" Paris is the capital of France and", None, " Paris is the capital of France and", None]):
        if text:
            r["median"]["text"] = text
    report["results"].append({"model": "smollm2", "engine": "cpu", "peer": False, "status": "ok", "samples": [],
                              "median": {"text": " London is the capital of England"}})
    assert bench_report.text_agreement(report) == {("smollm2", "browser"): "yes", ("smollm2", "wllama-1t"): "yes",
                                                   ("smollm2", "cpu"): "no"}


def test_markdown_and_html_reports_have_every_engine_and_open_offline():
    report = _fake_report()
    md = bench_report.markdown(report)
    table = [line for line in md.splitlines() if line.startswith("|")]
    assert len(table) == 2 + len(report["results"])
    assert all(line.count("|") == table[0].count("|") for line in table)
    assert "n/a (not built yet)" in md and "| 2.50 |" in md    # gpu not built; browser = 2.5× the peer
    assert "| 194.9 (198.0, -1.6%) | 312 |" in md               # the GPU's peak, the plan's and how far apart; JS heap
    assert "| 12.34 | 412 |" in md                               # CPU ms per decode step, dispatches per token
    # the refused peer says why, in its row and under the table, with what the refusal means
    assert "| wllama-webgpu | refused: the adapter (google swiftshader) has no shader-f16" in md
    assert "wllama-webgpu refused (smollm2): the adapter (google swiftshader) has no shader-f16" in md
    assert "pyshim is the only GGUF engine in the browser that runs on the GPU" in md
    page = bench_report.html_report(report)
    assert "<script" not in page and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "<strong>wllama-webgpu refused (smollm2): the adapter (google swiftshader) has no shader-f16" in page
    assert "<th>CPU ms/step</th>" in page and "<td>12.34</td>" in page
    assert page.count("<svg") == 4
    report["results"][0]["median"].update({"kernel_ms:matvec_i8 q4_1": 30.0, "kernel_ms:attention": 2.0, "kernel_step_ms": 33.0})
    page = bench_report.html_report(report)
    assert page.count("<svg") == 5 and "a decode step by kernel" in page and "matvec_i8 q4_1" in page
    for svg in page.split("<svg")[1:]:
        ET.fromstring("<svg" + svg.split("</svg>")[0] + "</svg>")  # each chart is well-formed XML


def test_html_report_charts_speed_and_efficiency_against_model_size():
    """With models of more than one size, tok/s and % of the roofline are drawn against the GB a token reads
    (log scale), a line per engine through its models, smallest first; one size alone draws no such chart."""
    report = _fake_report()
    big = dict(report["models"]["smollm2"], name="qwen2.5-7b", weight_bytes_per_token=4.37e9, bytes_per_token=4.4e9)
    report["models"]["qwen2.5-7b"] = big
    report["models"]["smollm2"]["weight_bytes_per_token"] = 0.1e9
    row = {"model": "qwen2.5-7b", "engine": "browser", "peer": False, "status": "ok", "samples": [],
           "median": {"decode_tok_s": 0.12, "roofline_GBps": 2.0}}
    bench.derive(row["median"], big, None)
    report["results"].append(row)
    series = bench_report.size_points(report, "decode_tok_s")
    assert series["browser"] == [(0.1, 20.0, "smollm2"), (4.37, 0.12, "qwen2.5-7b")]
    assert series["wllama-1t"] == [(0.1, 8.0, "smollm2")] and "gpu" not in series     # measured rows only
    page = bench_report.html_report(report)
    assert page.count("<svg") == 6 and "against model size" in page
    charts = [svg for svg in page.split("<svg")[1:] if "against model size" in svg]
    assert len(charts) == 2 and "% of the device" in charts[1]
    for svg in charts:
        root = ET.fromstring("<svg" + svg.split("</svg>")[0] + "</svg>")
        ns = "{http://www.w3.org/2000/svg}"
        line = next(p for p in root.iter(ns + "polyline"))          # the browser's line: small model left, big right
        (x0, y0), (x1, y1) = (tuple(map(float, pt.split(","))) for pt in line.get("points").split())
        assert x0 < x1 and y0 < y1                                  # the big model is slower (lower on the chart)
    assert ">qwen2.5-7b<" in charts[0] and "qwen2.5-7b · browser: 0.12 tok/s" in charts[0]
    one = _fake_report()
    assert bench_report.size_charts(one) == []


@pytest.mark.models
def test_prompts_have_the_token_counts_asked_for():
    if not model_path("smollm2").is_file():
        pytest.fail("smollm2 is missing: run `pyshim setup`")
    facts = bench.model_facts("smollm2", bench.FULL)
    counts = [w["token_count"] for w in facts["workload"]]
    assert [abs(c - n) <= 2 for c, n in zip(counts, bench.FULL.prompt_tokens)] == [True, True]
    assert facts["tied_output"] and facts["weight_bytes_per_token"] == facts["weight_bytes"]
    assert facts["bytes_per_token"] > facts["weight_bytes_per_token"]   # the KV cache is read too


def test_unknown_backend_is_refused():
    with pytest.raises(SystemExit, match="unknown backend"):
        bench.parse_args(["--backends", "browser,tpu"])


def test_tokens_set_the_decode_length_of_a_quick_or_full_run():
    """`--tokens`: a full-size model's steady decode measured over more steps than --quick's 8 (of which the
    first, on lavapipe, takes 75-100 ms more than the rest at 1.5B), without the full run's 512-token prompt."""
    quick = bench.parse_args(["--quick", "--tokens", "48"]).settings
    assert (quick.prompt_tokens, quick.decode_tokens) == (bench.QUICK.prompt_tokens, 48)
    assert bench.parse_args(["--quick"]).settings.decode_tokens == bench.QUICK.decode_tokens
    assert bench.parse_args(["--tokens", "24"]).settings == bench.Settings(bench.FULL.prompt_tokens, 24, bench.FULL.roofline_mib, bench.FULL.runs)
    assert bench.parse_args(["--stream", "--tokens", "8"]).tokens == 8         # the benchmarks of their own keep theirs


def test_a_budget_reaches_the_native_engines(monkeypatch):
    """`--budget-mb` (a big GPU's memory, which WebGPU does not tell) goes to every `pyshim generate` run."""
    assert bench.parse_args(["--budget-mb", "120000"]).budget_mb == 120000
    seen = []
    auto = {"mode": "layers streamed", "streamed_layers": 12, "expert_slots": None}

    def run(cmd, **_):
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout=json.dumps({"ids": [1], "decode_tok_s": 1.0, "auto": auto}), stderr="")

    monkeypatch.setattr(bench_engines.subprocess, "run", run)
    workload = [{"name": "p", "text": "hi", "tokens": 1, "max_tokens": 2, "decode": True}]
    sample = bench_engines.cli_run("gpu", Path("m.gguf"), workload, {"backends": {"gpu"}, "flags": set()}, budget_mb=120000)
    assert seen and seen[0][-2:] == ["--budget-mb", "120000"]
    # a model over the budget streams: its row says so, beside the memory figures
    assert sample["memory_mode"] == "12 layers streamed"
    assert bench_report._memory_cell({"peak_gpu_bytes": 2e9, "planned_gpu_bytes": 2e9, "memory_mode": "12 layers streamed"}) \
        == "2,000.0 (2,000.0, +0.0%; 12 layers streamed)"
    assert bench_report._memory_cell({"peak_gpu_bytes": 2e9, "memory_mode": "resident"}) == "2,000.0"


def test_a_budget_reaches_the_page_as_its_load_settings(monkeypatch):
    """In the page the same `--budget-mb` is what a visitor's GPU-memory setting gives the engine: every bench
    request carries it (kv_type auto plans against it); without it the requests carry no settings at all."""
    sent = []

    def engine_request(page, kind, payload, **_):
        sent.append((kind, payload))
        return {"prompt_tokens": 1, "prefill_ms": 1.0, "decode_tokens": 2, "decode_ms": 1.0}

    monkeypatch.setattr(bench_engines.harness, "engine_request", engine_request)
    workload = [{"name": "p", "text": "hi", "tokens": 1, "max_tokens": 2, "decode": True}]
    bench_engines._worker_generation(None, "/m.gguf", workload, {"kv_type": "auto", "budget_bytes": 120000 * 2**20})
    bench_engines._worker_generation(None, "/m.gguf", workload)
    assert [payload.get("settings") for _, payload in sent] == [{"kv_type": "auto", "budget_bytes": 120000 * 2**20}, None]
    assert all(kind == bench_engines.BENCH_KIND for kind, _ in sent)


def _bench_cli(tmp_path, *args: str):
    """`pyshim bench ARGS --out tmp_path` in a process of its own -> (the run, its files by suffix, the JSON)."""
    done = subprocess.run([sys.executable, "-m", "pyshim.cli", "bench", *args, "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=QUICK_TIMEOUT_S)
    print(done.stdout[-6000:], done.stderr[-3000:])
    assert done.returncode == 0
    files = {p.suffix: p for p in tmp_path.iterdir()}
    assert set(files) == {".json", ".html", ".md"}
    return done, files, json.loads(files[".json"].read_text())


@pytest.mark.browser
@pytest.mark.models
@pytest.mark.slow
def test_quick_bench_writes_reports_of_the_right_shape(tmp_path):
    if not model_path("smollm2").is_file():
        pytest.fail("smollm2 is missing: run `pyshim setup`")
    done, files, report = _bench_cli(tmp_path, "--quick")
    assert report["machine"]["cpu_count"] >= 1 and report["browser"]["version"]
    engines = {r["engine"]: r for r in report["results"]}
    assert set(engines) == {"browser", "wasm-1t", "wasm-2t", "gpu", "cpu", "wllama-1t", "wllama-2t", "wllama-webgpu"}
    # What exists today must have measured: Python ready in the Worker, the header, the adapter's roofline
    # in a cross-origin-isolated page (WebGPU still works there), and the peer's speeds on both thread counts.
    browser = engines["browser"]["median"]
    assert browser["ready_ms"] > 0 and browser["header_ms"] > 0 and browser["cross_origin_isolated"] is True
    assert browser["gpu_selftest_ok"] is True and browser["roofline_GBps"] > 0
    # ... and the GPU executor in the Worker produced the tokens the figures come from.
    assert engines["browser"]["status"] == "ok" and browser["decode_tokens"] == 8 and browser["decode_tok_s"] > 0
    assert browser["text"] and browser["load_ms"] > 0 and browser["prefill_32_tok_s"] > 0
    assert 0 < browser["cpu_share_pct"] < 100          # the Worker's bench request measures the CPU side
    assert browser["cpu_ms_per_step"] == pytest.approx(browser["cpu_ms"] / (browser["decode_tokens"] - 1))
    assert 0 < browser["encode_ms_per_step"] < browser["cpu_ms_per_step"]     # a step's JavaScript encoding, part of it
    # a SmolLM2 decode step was 606 dispatches before the fused kernels (tests/test_kernels_fused.py): >= 35% fewer
    assert 0 < browser["dispatches_per_token"] <= 0.65 * 606
    # every pyshim row carries the CPU time per step: measured on the GPU executors, None on the NumPy one
    assert engines["gpu"]["median"]["cpu_ms_per_step"] > 0 and engines["cpu"]["median"]["cpu_ms_per_step"] is None
    # and its median decode step, from which bench.derive gives the steady efficiency beside the mean's
    for engine in ("browser", "gpu"):
        m = engines[engine]["median"]
        assert 0 < m["decode_median_step_ms"] and m["steady_tok_s"] > 0, (engine, m)
        assert (m.get("roofline_steady_pct") or m.get("roofline_steady_over_pct")), (engine, m)
    kernels = {k: v for k, v in browser.items() if k.startswith("kernel_ms:")}
    assert any(k.startswith("kernel_ms:matvec") for k in kernels) and all(v >= 0 for v in kernels.values())
    assert browser["kernel_step_ms"] > 0
    # the page's and its Workers' JS memory at its peak while SmolLM2 (0.1 GB) loaded and read its prompt: measured
    assert browser["peak_js_heap_bytes"] > 0, browser.get("js_heap_error")
    # ... and not while decode was timed (the eager measurements cost SwiftShader's decode 10%)
    assert browser["js_heap_paused_for_decode"] is True
    for engine in ("browser", "gpu"):     # the GPU executor's peak allocation is what the memory plan predicted
        m = engines[engine]["median"]
        assert abs(m["peak_gpu_bytes"] - m["planned_gpu_bytes"]) <= 0.05 * m["planned_gpu_bytes"], (engine, m)
    # the CPU engine in the same page, on 1 and 2 threads: its tokens, ratios to the peer at the same threads
    for threads in (1, 2):
        row = engines[f"wasm-{threads}t"]
        assert row["status"] == "ok", row["status"]
        m = row["median"]
        assert m["decode_tokens"] == 8 and m["decode_tok_s"] > 0 and m["prefill_32_tok_s"] > 0 and m["text"]
        assert m["cross_origin_isolated"] is True and m["roofline_GBps"] > 0       # the host's, for a CPU engine
        assert row["vs_peer"][f"decode_tok_s_vs_wllama-{threads}t"] > 0
    for peer in ("wllama-1t", "wllama-2t"):
        assert engines[peer]["status"] == "ok", engines[peer]["status"]
        m = engines[peer]["median"]
        assert m["decode_tok_s"] > 0 and m["prefill_32_tok_s"] > 0 and m["load_ms"] > 0
        assert m["decode_tokens"] >= 8
    assert engines["wllama-2t"]["median"]["threads"] == 2
    # llama.cpp's WebGPU backend runs where the adapter has shader-f16 and says why not elsewhere (SwiftShader here)
    webgpu = engines["wllama-webgpu"]
    if browser["adapter"]["f16"]:
        assert webgpu["status"] == "ok" and webgpu["median"]["gpu_layers"] > 0, webgpu["status"]
    else:
        assert webgpu["status"].startswith("refused: ") and "shader-f16" in webgpu["refused"], webgpu["status"]
        assert "wllama-webgpu refused (smollm2)" in files[".md"].read_text()
        assert "wllama-webgpu refused (smollm2)" in files[".html"].read_text()
    for r in report["results"]:
        assert r["status"] == "ok" or r["status"].startswith(("n/a", "partial", "refused")), (r["engine"], r["status"])
    # The Markdown table printed to the terminal is the one written to the .md file.
    assert files[".md"].read_text().splitlines()[0] in done.stdout


def test_haystack_places_the_needle_at_its_depth():
    import bench_needle
    from pyshim.gguf.header import read_header_from_file
    from pyshim.text.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_metadata(read_header_from_file(model_path("smollm2")).metadata)
    paragraphs = bench_needle.filler_paragraphs()
    for depth in bench_needle.DEPTHS:
        ids, key = bench_needle.haystack(tokenizer, paragraphs, 1024, depth, seed=3)
        text = tokenizer.decode(ids)
        assert 1000 <= len(ids) <= 1024 and text.endswith(bench_needle.QUESTION.strip())
        where = text.index(f"archive is {key}.") / len(text)
        assert abs(where - depth) < 0.05, (depth, where)
    ids, key = bench_needle.haystack(tokenizer, paragraphs, 1024, 0.5, seed=3)
    assert bench_needle.haystack(tokenizer, paragraphs, 1024, 0.5, seed=3) == (ids, key)      # deterministic
    assert bench_needle.haystack(tokenizer, paragraphs, 1024, 0.5, seed=4)[1] != key


@pytest.mark.models
@pytest.mark.slow
def test_needle_bench_writes_its_tables(tmp_path):
    """The smallest needle run (256 tokens, the needle half way, f32 and q4): the reports' shape, and the f32
    cache retrieving a fact from 120 tokens back (the kernels' attention working at all)."""
    _, files, report = _bench_cli(tmp_path, "--needle", "--models", "smollm2", "--contexts", "256", "--depths", "0.5",
                                  "--seeds", "1", "--kv-types", "f32,q4")
    cells = report["cells"]
    assert len(cells) == 2 and {c["kv_type"] for c in cells} == {"f32", "q4"} and cells[0]["depth"] == 0.5
    assert all(c["found"] for c in cells if c["kv_type"] == "f32"), cells
    assert all(0 <= c["agreement_with_f32"] <= 1 for c in cells if c["kv_type"] == "q4")
    assert "| 256 | q4 |" in files[".md"].read_text() and "<table>" in files[".html"].read_text()


def test_stream_bench_writes_its_table(tmp_path):
    """The smallest expert streaming run (a tiny MoE, one budget that leaves 4 of its 8 experts a layer):
    the reports' shape, the streamed tokens equal to the resident run's, the cache's figures in range."""
    from gguf import GGMLQuantizationType as QT

    import tiny_models

    model = tiny_models.write_tiny_model(tmp_path, "qwen3moe", QT.Q4_K)
    out = tmp_path / "out"
    _, files, report = _bench_cli(out, "--stream", "--models", str(model), "--budgets-mb", "1.3", "--tokens", "8")
    (entry,) = report["models"].values()
    resident, streamed, unguessed = entry["rows"]
    assert resident["mode"] == "resident" and streamed["mode"] == "experts streamed"
    assert unguessed["mode"] == "experts streamed, no guess" and unguessed["slots"] == streamed["slots"]
    assert streamed["same_tokens"] and unguessed["same_tokens"] and len(streamed["ids"]) == 8
    assert 0 < streamed["slots"] < entry["experts"] and 0 <= streamed["hit_rate"] < 1
    assert streamed["store_mb_per_token"] > 0 and streamed["predicted_tok_s"] > 0
    assert " right; " in streamed["guesses"] and unguessed["guesses"] == "0 of 0 right; 0 fetched, 0 used"
    md = files[".md"].read_text()
    assert "| experts streamed | gpu | 1.3 |" in md and "| experts streamed, no guess | gpu | 1.3 |" in md
    assert "<table>" in files[".html"].read_text()


def test_batch_bench_writes_its_table(tmp_path):
    """The smallest batched decode run (a tiny model, 1 and 3 sequences): the reports' shape, every
    sequence's tokens equal to its own alone, the speed-up measured against one sequence."""
    from gguf import GGMLQuantizationType as QT

    import tiny_models

    model = tiny_models.write_tiny_model(tmp_path, "llama", QT.Q4_0)
    _, files, report = _bench_cli(tmp_path / "out", "--batch", "--models", str(model), "--batches", "1,3", "--tokens", "5")
    (entry,) = report["models"].values()
    one, three = entry["rows"]
    assert (one["sequences"], three["sequences"]) == (1, 3) and one["speedup"] == 1.0
    assert one["same_tokens"] and three["same_tokens"]
    assert three["aggregate_tok_s"] == pytest.approx(3 * three["per_sequence_tok_s"], rel=1e-2) and three["speedup"] > 0
    assert "| 3 |" in files[".md"].read_text() and "<table>" in files[".html"].read_text()


@pytest.mark.models
@pytest.mark.slow
def test_grammar_bench_writes_its_table(tmp_path):
    """The smallest constrained-decoding run (SmolLM2 natively, one schema): the reports' shape, a reply
    that validates, per-token times of both runs and the grammar engine's share of them."""
    if not model_path("smollm2").is_file():
        pytest.fail("smollm2 is missing: run `pyshim setup`")
    _, files, report = _bench_cli(tmp_path, "--grammar", "--models", "smollm2", "--backends", "gpu", "--schemas", "1", "--tokens", "8")
    (row,) = report["rows"]
    assert row["valid"] == row["replies"] == 1 and row["constrained_tokens"] > 0
    assert row["plain_ms_per_token"] > 0 and row["constrained_ms_per_token"] > row["grammar_ms_per_token"] > 0
    assert "| smollm2 | gpu |" in files[".md"].read_text() and "<table>" in files[".html"].read_text()


def _npm_tarball(path, files: dict[str, bytes]):
    import io
    import tarfile

    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_wllama_vendoring_takes_only_what_the_peer_page_needs(tmp_path, monkeypatch):
    from pyshim.setup import vendoring

    tarball = _npm_tarball(tmp_path / "wllama.tgz", {
        "package/esm/index.js": b"export class Wllama {}", "package/esm/wasm/wllama.wasm": b"\0asm",
        "package/LICENCE": b"MIT", "package/esm/index.cjs": b"unused", "package/src/wllama.ts": b"unused"})
    calls = []
    monkeypatch.setattr(vendoring, "npm", lambda spec: calls.append(spec) or tarball)
    dest = tmp_path / "vendor" / "wllama"
    assert vendoring.vendor_wllama(dest).startswith("from")
    assert sorted(p.name for p in dest.iterdir()) == [".version", "LICENCE", "index.js", "wllama.wasm"]
    assert (dest / "wllama.wasm").read_bytes() == b"\0asm"
    assert vendoring.vendor_wllama(dest) == "already there" and calls == [f"@wllama/wllama@{vendoring.WLLAMA_VERSION}"]


@pytest.mark.parametrize("package, files, error, match", [
    ("xgrammar", {"package/lib/index.js": b"x", "package/package.json": b"{}"}, "ChecksumError", "integrity"),
    ("wllama", {"package/esm/index.js": b"x", "package/LICENCE": b"MIT"}, "SetupError", "wllama.wasm"),
    ("axe", {"package/axe.min.js": b"x", "package/LICENSE": b"MPL", "package/LICENSE-3RD-PARTY.txt": b""}, "ChecksumError", "integrity"),
], ids=["xgrammar-integrity", "wllama-without-wasm", "axe-integrity"])
def test_vendoring_refuses_a_bad_package_and_leaves_nothing(tmp_path, monkeypatch, package, files, error, match):
    from pyshim import errors
    from pyshim.setup import vendoring

    tarball = _npm_tarball(tmp_path / f"{package}.tgz", files)
    monkeypatch.setattr(vendoring, "npm", lambda spec: tarball)
    with pytest.raises(getattr(errors, error), match=match):
        getattr(vendoring, f"vendor_{package}")(tmp_path / "vendor" / package)
    assert not (tmp_path / "vendor" / package).exists()


@pytest.mark.browser
@pytest.mark.models
def test_wllama_webgpu_says_why_it_cannot_run_on_an_adapter_without_f16(chromium, dev_server):
    """The peer page's WebGPU mode on this adapter. Without shader-f16 (SwiftShader) the page refuses
    before loading anything, naming the feature; with that check off, wllama itself does not fail: it
    quietly loads the model on the CPU, and the page catches that from llama.cpp's log. Neither may pass
    off CPU figures as WebGPU ones, nor take long."""
    import time

    import bench_engines

    if not model_path("smollm2").is_file():
        pytest.fail("smollm2 is missing: run `pyshim setup`")
    workload = [{"name": "p8", "text": "The capital of France is", "max_tokens": 2, "decode": True}]
    url = bench._url(model_path("smollm2"))
    t0 = time.perf_counter()
    try:
        sample = bench_engines.peer_run(chromium, dev_server.url, url, workload, threads=1, webgpu=True)
    except bench_engines.EngineRefused as exc:
        assert "has no shader-f16, which llama.cpp's WebGPU backend requires" in str(exc)
        assert exc.detail["adapter"]["is_fallback"] is True and "shader-f16" not in exc.detail["adapter"]["features"]
        assert time.perf_counter() - t0 < 30      # a fresh page and one requestAdapter(), no model load
    else:   # an adapter with shader-f16: the layers must really be on the GPU
        assert sample["gpu_layers"] > 0 and sample["decode_tok_s"] > 0
        return
    with pytest.raises(bench_engines.EngineRefused, match=r"wllama loaded the model on the CPU .*no usable device") as caught:
        bench_engines.peer_run(chromium, dev_server.url, url, workload, threads=1, webgpu=True, check_f16=False)
    assert any("CPU model buffer" in line for line in caught.value.detail["log_tail"]), caught.value.detail


@pytest.mark.models
def test_native_engines_alone_need_no_chromium(tmp_path):
    """`--backends cpu --peer none` on a machine without Chromium (doctor's bench there): the native rows
    are measured, nothing launches a browser."""
    done = subprocess.run([sys.executable, "-m", "pyshim.cli", "bench", "--quick", "--backends", "cpu", "--peer", "none",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=QUICK_TIMEOUT_S,
                          env={**os.environ, "PYSHIM_CHROMIUM": str(tmp_path / "no-chromium")})
    print(done.stdout[-3000:], done.stderr[-2000:])
    assert done.returncode == 0
    report = json.loads(next(tmp_path.glob("*.json")).read_text())
    (row,) = report["results"]
    assert row["engine"] == "cpu" and row["status"] == "ok" and row["median"]["decode_tok_s"] > 0
    assert row["median"]["cpu_ms_per_step"] is None and "browser" not in report
