"""One run of one engine on one model: each function returns a flat *sample* (figure name -> value) for
bench.py to take medians of. Every run starts fresh: a new browser context (nothing cached, service
workers blocked so the site's precaching never competes with the measurement) or a new process.

Figure names shared by all engines (absent = not measured by that engine yet):
    ready_ms            Pyodide + numpy + wheels + `import pyshim` (the Worker's boot report)
    header_ms           GGUF header read with Range requests and parsed in Python (wall, page side)
    load_ms             model weights to where they run (GPU buffers; for wllama, download + load)
    ttft_ms             request → first token of the decode prompt
    prefill_<N>_tok_s   prompt tokens per second for the N-token prompt
    decode_tok_s        generated tokens per second after the first (greedy)
    decode_median_step_ms  the median of those steps' own times (bench.derive's steady figures)
    cpu_share_pct       share of a decode step spent on the CPU side outside GPU waits
    cpu_ms_per_step     CPU time of one decode step (cpu_ms ÷ decode steps; a step = a token after the first)
    dispatches_per_token  compute dispatches one decode step encodes (the GPU executor's program)
    peak_gpu_bytes, planned_gpu_bytes
    roofline_GBps, roofline_Gelem_s   the device's streaming ceiling measured in the same run

The browser engine: the site's Worker answers `boot`, `gpu-selftest`, `read-header`, `probe-bytes`,
`exec` and `bench`; the page's store downloads the model into IndexedDB first (store_ms, store_MBps), then
the Worker's `bench` request (pyshim/serve/worker_api.py) runs each prompt: params {model_url, prompt, max_tokens,
ignore_eos: true}; result {prompt_tokens, load_ms, ttft_ms, prefill_ms, decode_tokens, decode_ms, text,
cpu_ms, cpu_share, peak_gpu_bytes, planned_gpu_bytes} — raw prompts, exact token counts, greedy, the model
loaded IndexedDB → GPU as the site does; cpu_ms = decode time outside awaiting the GPU readback, so
cpu_share_pct = 100 × cpu_ms / decode_ms and cpu_ms_per_step = cpu_ms / (decode_tokens - 1): decode_ms
spans the steps after the first token (pyshim/serve/generation.py), as decode_tok_s does.

The peer wllama runs twice on the CPU (1 and 2 threads) and once with llama.cpp's WebGPU backend
(`wllama-webgpu`). That backend needs `shader-f16`; where the page's adapter lacks it, or wllama still
put no layer on the GPU, the run raises EngineRefused and the row carries the reason instead of numbers.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness

HERE = Path(__file__).resolve().parent
BENCH_KIND = "bench"
KERNEL_PREFIX = "kernel_ms:"   # sample keys of the per-kernel decode profile: "kernel_ms:matvec_i8 q4_1"
PEER_PAGE = "bench/wllama.html"
PAGE_READY_TIMEOUT_MS = 60_000
RUN_TIMEOUT_MS = 900_000          # one engine run on a loaded 2-core machine (Gemma 3, 512-token prompt)
CLI_TIMEOUT_S = 900
# Fields of `pyshim generate --json` (and of the Worker's `bench` result) copied into a sample when present.
# dispatches_per_token: not in the CLI's JSON yet; taken as soon as `pyshim generate --json` reports it.
OPTIONAL_FIGURES = ("load_ms", "ttft_ms", "cpu_share_pct", "peak_gpu_bytes", "planned_gpu_bytes", "dispatches_per_token",
                    "decode_median_step_ms")
WEBGPU_PEER_THREADS = 2          # wllama-webgpu: with every layer on the GPU the CPU keeps the embedding lookup and sampling


class EngineUnavailable(Exception):
    """The engine cannot run this yet (not built); the reason is shown instead of numbers."""


class EngineRefused(Exception):
    """The engine declined this adapter (wllama's WebGPU backend without shader-f16): a result in itself,
    shown with its reason. `detail` holds what the page saw (the adapter, llama.cpp's log lines)."""

    def __init__(self, reason: str, detail: dict | None = None):
        super().__init__(reason)
        self.detail = detail or {}


def cpu_ms_per_step(cpu_ms: float | None, decode_tokens: int | None) -> float | None:
    """CPU time of one decode step: cpu_ms covers the steps after the first token (decode_tokens - 1)."""
    steps = (decode_tokens or 0) - 1
    return cpu_ms / steps if cpu_ms is not None and steps > 0 else None


def _adapter_brief(adapter: dict) -> dict:
    limits = adapter.get("limits", {})
    return {
        "summary": adapter.get("summary"),
        "vendor": adapter.get("vendor"),
        "architecture": adapter.get("architecture"),
        "description": adapter.get("description"),
        "backend": adapter.get("backend"),
        "is_fallback": adapter.get("is_fallback"),
        "f16": "shader-f16" in adapter.get("features", ()),
        "timestamps": "timestamp-query" in adapter.get("features", ()),
        "max_storage_buffer_binding_size": limits.get("max_storage_buffer_binding_size"),
        "max_buffer_size": limits.get("max_buffer_size"),
    }


def _prefill_figures(sample: dict, prompt: dict, tokens: int, seconds: float) -> None:
    sample[f"prompt_{prompt['name']}_tokens"] = tokens
    if seconds > 0:
        sample[f"prefill_{prompt['tokens']}_tok_s"] = tokens / seconds


# --- the CLI (native backends) -------------------------------------------------------------------

def generate_cli_support(python: str = sys.executable) -> dict:
    """What `pyshim generate` offers right now: {"backends": set, "flags": set}; empty when absent."""
    top = subprocess.run([python, "-m", "pyshim.cli", "--help"], capture_output=True, text=True, cwd=harness.ROOT)
    if not re.search(r"\bgenerate\b", top.stdout):
        return {"backends": set(), "flags": set()}
    sub = subprocess.run([python, "-m", "pyshim.cli", "generate", "--help"], capture_output=True, text=True, cwd=harness.ROOT)
    text = sub.stdout
    flags = set(re.findall(r"(--[a-z][a-z0-9-]*)", text))
    if "--backend" not in flags:
        return {"backends": {"cpu"}, "flags": flags}     # the reference executor is the only one without the flag
    # The backends named in --backend's help (choices or prose), and those pyshim.exec.loading accepts.
    line = re.search(r"--backend\b[^\n]*(?:\n {20,}[^\n]*)*", text)
    named = {b for b in ("cpu", "gpu", "browser") if line and re.search(rf"\b{b}\b", line.group(0))}
    probe = subprocess.run([python, "-c", "from pyshim.exec.loading import BACKENDS; print(','.join(BACKENDS))"],
                           capture_output=True, text=True, cwd=harness.ROOT)
    loadable = set(probe.stdout.strip().split(",")) if probe.returncode == 0 else set()
    return {"backends": (named | loadable) - {""}, "flags": flags}


def cli_run(backend: str, model_path: Path, workload: list[dict], support: dict, python: str = sys.executable,
            budget_mb: float | None = None) -> dict:
    """One run through `pyshim generate ... --json` in a fresh process per prompt."""
    if backend not in support["backends"]:
        raise EngineUnavailable("not built yet")
    sample: dict = {}
    for prompt in workload:
        cmd = [python, "-m", "pyshim.cli", "generate", str(model_path), "--prompt", prompt["text"],
               "--max-tokens", str(prompt["max_tokens"]), "--temperature", "0", "--backend", backend, "--json"]
        if "--ignore-eos" in support["flags"]:
            cmd.append("--ignore-eos")
        if budget_mb is not None:
            cmd += ["--budget-mb", str(budget_mb)]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=harness.ROOT, timeout=CLI_TIMEOUT_S)
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            raise RuntimeError(f"pyshim generate --backend {backend} failed: {(done.stderr or done.stdout).strip()[-400:]}")
        out = json.loads(done.stdout.strip().splitlines()[-1])
        n_prompt = len(out.get("prompt_ids", ())) or prompt["tokens"]
        sample[f"prompt_{prompt['name']}_tokens"] = n_prompt
        if out.get("prefill_tok_s"):
            sample[f"prefill_{prompt['tokens']}_tok_s"] = out["prefill_tok_s"]
        if prompt.get("decode"):
            sample["decode_tok_s"] = out.get("decode_tok_s")
            sample["decode_tokens"] = len(out.get("ids", ()))
            sample["text"] = out.get("text", "")
            if out.get("prefill_tok_s"):
                sample.setdefault("ttft_ms", 1e3 * n_prompt / out["prefill_tok_s"])
            # Process start, imports and loading: what the wall clock holds beyond prefill and decode.
            busy = n_prompt / out["prefill_tok_s"] if out.get("prefill_tok_s") else 0.0
            busy += (sample["decode_tokens"] - 1) / out["decode_tok_s"] if out.get("decode_tok_s") else 0.0
            sample["startup_and_load_ms"] = 1e3 * max(wall - busy, 0.0)
            for key in OPTIONAL_FIGURES:
                if isinstance(out.get(key), (int, float)):
                    sample[key] = out[key]
            memory = _memory_mode(out.get("auto"))
            if memory:
                sample["memory_mode"] = memory
            per_step = _native_cpu_ms_per_step(out, sample["decode_tokens"])
            if per_step is not None:
                sample["cpu_ms_per_step"] = per_step
    return sample


def _memory_mode(auto: dict | None) -> str | None:
    """How the weights sat in GPU memory for this run ("resident", "12 layers streamed", "8 expert slots a
    layer"): a model over the budget streams, and its speed is that of streaming, which a row must say."""
    if not isinstance(auto, dict) or not auto.get("mode"):
        return None
    if auto.get("streamed_layers"):
        return f"{auto['streamed_layers']} layers streamed"
    if auto.get("expert_slots"):
        return f"{auto['expert_slots']} expert slots a layer"
    return str(auto["mode"])


def _native_cpu_ms_per_step(out: dict, decode_tokens: int) -> float | None:
    """A native run's CPU ms per decode step: `generate --json` gives it on the gpu backend. The cpu backend
    has no GPU waits to leave out: None there."""
    per_step = out.get("cpu_ms_per_step")
    return float(per_step) if isinstance(per_step, (int, float)) else None


def native_roofline(mib: int, python: str = sys.executable) -> dict:
    """The native adapter's roofline, in a subprocess (Playwright's sync API holds this process's event loop)."""
    done = subprocess.run([python, str(HERE / "bench_roofline.py"), "--mib", str(mib)], capture_output=True, text=True,
                          cwd=harness.ROOT, timeout=CLI_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"native roofline failed: {(done.stderr or done.stdout).strip()[-400:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- native llama.cpp (optional extra rows) -----------------------------------------------------------

def llamacpp_python() -> str | None:
    """A Python with llama-cpp-python: $PYSHIM_LLAMA_CPP_PYTHON, or this one if it has the package."""
    import importlib.util
    import os

    chosen = os.environ.get("PYSHIM_LLAMA_CPP_PYTHON")
    if chosen:
        return chosen if Path(chosen).is_file() else None
    return sys.executable if importlib.util.find_spec("llama_cpp") else None


def llamacpp_run(python: str, model_path: Path, workload: list[dict], *, threads: int, scratch: Path) -> dict:
    scratch.write_text(json.dumps(workload))
    done = subprocess.run([python, str(HERE / "bench_llamacpp.py"), str(model_path), str(scratch), "--threads", str(threads)],
                          capture_output=True, text=True, cwd=harness.ROOT, timeout=CLI_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"llama.cpp run failed: {(done.stderr or done.stdout).strip()[-400:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- the browser engine (the site's Worker) --------------------------------------------------------

def _roofline_code(mib: int) -> str:
    # The Worker's `exec` runs Python with top-level await; the module runs in its own namespace so
    # its `if __name__ == "__main__"` block stays off.
    source = (HERE / "bench_roofline.py").read_text("utf-8")
    return ("import json\n_ns = {'__name__': 'bench_roofline'}\n"
            f"exec(compile({source!r}, 'bench_roofline.py', 'exec'), _ns)\n"
            f"_r = json.dumps(await _ns['measure_roofline']({int(mib)}))\ndel _ns\n_r")


STORE_CONTEXT = 1024
# The page's and its Workers' JS heaps while a run loads and prefills, sampled every HEAP_SAMPLE_MS with
# performance.measureUserAgentSpecificMemory() (cross-origin isolated pages only, as the site is): with
# MEASURE_MEMORY_FLAG Chromium answers at once instead of at its next garbage collection. The peak says
# whether weights went to the GPU chunk by chunk or passed whole through JS memory (SmolLM2's 0.1 GB: 54 MB).
# Paused while decode is timed (from the prefill's last "progress" event to the next prompt's first): each
# eager measurement stops every isolate of the page for a collection, and on a 2-core host sampling at this
# rate took 10% from SwiftShader's decode (Qwen2.5-1.5B's shape: 1.90 -> 2.08 s a step, the same page).
MEASURE_MEMORY_FLAG = "--enable-blink-features=ForceEagerMeasureMemory"
HEAP_SAMPLE_MS = 250
HEAP_WATCH_JS = """(ms) => {
  const peak = window.pyshimHeapPeak = {bytes: 0, samples: 0, error: null, decode_pauses: 0};
  let paused = false;
  const sample = async () => {
    if (paused) return;
    try {
      const m = await performance.measureUserAgentSpecificMemory();
      peak.bytes = Math.max(peak.bytes, m.bytes);
      peak.samples += 1;
    } catch (e) { peak.error = String(e); }
  };
  window.pyshimOnEngineEvent = (event, data) => {
    if (event !== "progress" || data.phase !== "prefill") return;
    const decoding = data.done >= data.total;
    if (decoding && !paused) peak.decode_pauses += 1;
    paused = decoding;
  };
  sample();
  window.pyshimHeapWatch = setInterval(sample, ms);
}"""
HEAP_PEAK_JS = """() => {
  clearInterval(window.pyshimHeapWatch);
  window.pyshimOnEngineEvent = null;
  return window.pyshimHeapPeak;
}"""


def browser_run(playwright, base_url: str, model_url: str, workload: list[dict], *, roofline_mib: int,
                extra_flags: list[str] | None = None, budget_mb: float | None = None, device: str | None = None,
                threads: int | None = None) -> dict:
    """One run of pyshim in a Chromium of its own with a fresh on-disk profile (as a visitor's browser
    keeps IndexedDB on disk; an incognito-like context keeps it in memory and refuses multi-GB models).
    `budget_mb`: the GPU memory the page plans for, as a visitor's setting gives it (None: the page's 4 GiB);
    `device` "cpu": the model on the WebAssembly CPU engine on `threads` threads (no adapter roofline then:
    the host's applies)."""
    profile = tempfile.mkdtemp(prefix="pyshim-bench-")
    context = harness.launch_persistent(playwright, profile, service_workers="block",
                                        extra_flags=(extra_flags or []) + [MEASURE_MEMORY_FLAG])
    try:
        page, watch = harness.open_page(context, base_url)
        boot = harness.wait_for_boot(page)
        sample: dict = {"ready_ms": boot["total_ms"]}
        for step in boot.get("timings", ()):
            sample[f"boot_{step['step']}_ms"] = step["ms"]
        sample["cross_origin_isolated"] = page.evaluate("() => self.crossOriginIsolated")
        selftest = harness.engine_request(page, "gpu-selftest")
        sample["gpu_selftest_ok"] = bool(selftest.get("ok"))
        sample["adapter"] = _adapter_brief(selftest.get("adapter", {}))
        t0 = time.perf_counter()
        header = harness.engine_request(page, "read-header", {"url": model_url})
        sample["header_ms"] = 1e3 * (time.perf_counter() - t0)
        sample["header_parse_ms"] = header.get("parse_ms")
        try:
            if device != "cpu":
                roof = harness.engine_request(page, "exec", {"code": _roofline_code(roofline_mib)}, timeout_ms=RUN_TIMEOUT_MS)
                sample["roofline_GBps"], sample["roofline_Gelem_s"] = roof["GBps"], roof["Gelem_s"]
                sample["roofline_Gelem_s_by_bits"] = roof.get("Gelem_s_by_bits")
        except harness.HarnessError as exc:  # the other figures still count; % of roofline stays empty
            sample["roofline_error"] = str(exc)[:300]
        # Stored first, as the site does, so the bench request's load_ms is IndexedDB → GPU alone.
        page.set_default_timeout(RUN_TIMEOUT_MS)
        stored = page.evaluate(harness.STORE_JS, [model_url, STORE_CONTEXT])
        sample["store_ms"] = stored["ms"]
        sample["store_MBps"] = stored["bytes"] / 1e6 / (stored["ms"] / 1e3)
        settings = {} if budget_mb is None else {"kv_type": "auto", "budget_bytes": int(budget_mb * 2**20)}
        # pyshim's rows name their engine: WebGPU unless `device` says the CPU engine ("auto" would measure
        # and, on a software adapter, pick the CPU engine for the WebGPU row)
        settings = {**settings, "device": device or "gpu", **({"threads": threads} if threads else {})}
        page.evaluate(HEAP_WATCH_JS, HEAP_SAMPLE_MS)
        sample.update(_worker_generation(page, model_url, workload, settings))
        heap = page.evaluate(HEAP_PEAK_JS)
        if heap["samples"]:
            sample["peak_js_heap_bytes"] = heap["bytes"]
            sample["js_heap_paused_for_decode"] = heap["decode_pauses"] > 0
        elif heap["error"]:
            sample["js_heap_error"] = heap["error"][:300]
        sample["page_problems"] = watch.console_errors + watch.page_errors + watch.outside_requests
        return sample
    finally:
        context.close()
        shutil.rmtree(profile, ignore_errors=True)


def _worker_generation(page, model_url: str, workload: list[dict], settings: dict | None = None) -> dict:
    sample: dict = {}
    for i, prompt in enumerate(workload):
        request = {"model_url": model_url, "prompt": prompt["text"], "max_tokens": prompt["max_tokens"],
                   "ignore_eos": True, "kernels": bool(prompt.get("decode"))}
        r = harness.engine_request(page, BENCH_KIND, {**request, **({"settings": settings} if settings else {})},
                                   timeout_ms=RUN_TIMEOUT_MS)
        if i == 0 and r.get("load_ms") is not None:
            sample["load_ms"] = r["load_ms"]
        _prefill_figures(sample, prompt, r["prompt_tokens"], r["prefill_ms"] / 1e3)
        if prompt.get("decode"):
            steps = max(r["decode_tokens"] - 1, 0)
            sample["ttft_ms"] = r.get("ttft_ms")
            sample["decode_tokens"] = r["decode_tokens"]
            if steps and r["decode_ms"] > 0:
                sample["decode_tok_s"] = steps / (r["decode_ms"] / 1e3)
            if r.get("cpu_ms") is not None and r["decode_ms"] > 0:
                sample["cpu_share_pct"] = 100 * r["cpu_ms"] / r["decode_ms"]
            if r.get("cpu_ms") is not None:
                sample["cpu_ms"] = r["cpu_ms"]
                if (per_step := cpu_ms_per_step(r["cpu_ms"], r["decode_tokens"])) is not None:
                    sample["cpu_ms_per_step"] = per_step
            for key in ("peak_gpu_bytes", "planned_gpu_bytes", "kernel_step_ms", "bytes_per_decode_step", "dispatches_per_token",
                        "encode_ms_per_step", "decode_median_step_ms"):
                if r.get(key) is not None:
                    sample[key] = r[key]
            for group, ms in (r.get("kernel_ms") or {}).items():     # flat keys, so medians() takes them
                sample[f"{KERNEL_PREFIX}{group}"] = ms
            sample["text"] = r.get("text", "")
    return sample


# --- the peer: wllama in the same browser ---------------------------------------------------------

def peer_run(browser, base_url: str, model_url: str, workload: list[dict], *, threads: int, webgpu: bool = False,
             check_f16: bool = True) -> dict:
    """One wllama run in a fresh context: on the CPU, or with `webgpu` every layer offloaded to llama.cpp's
    WebGPU backend (raises EngineRefused when the adapter or wllama declines; `check_f16=False` skips the
    page's shader-f16 check so that wllama's own behaviour can be seen)."""
    context = browser.new_context(service_workers="block")
    try:
        page, watch = harness.open_page(context, base_url + PEER_PAGE)
        page.wait_for_function("() => window.wllamaBench !== undefined", timeout=PAGE_READY_TIMEOUT_MS)
        page.set_default_timeout(RUN_TIMEOUT_MS)
        params = {"model_url": "/" + model_url, "n_threads": threads, "webgpu": webgpu, "check_f16": check_f16,
                  "prompts": [{"name": p["name"], "text": p["text"], "max_tokens": p["max_tokens"]} for p in workload]}
        r = page.evaluate("(p) => window.wllamaBench.run(p)", params)
        if r.get("refused"):
            raise EngineRefused(r["refused"], {"adapter": r.get("adapter"), "log_tail": r.get("log_tail", [])})
        if threads > 1 and not r["multithread"]:
            raise RuntimeError("wllama fell back to one thread: the page is not cross-origin isolated (serve with --isolated)")
        sample: dict = {"load_ms": r["load_ms"], "threads": r["threads"], "cross_origin_isolated": r["cross_origin_isolated"]}
        if webgpu:
            sample.update({"gpu_layers": r.get("gpu_layers"), "n_layers": r.get("n_layers"), "gpu_device": r.get("gpu_device")})
        for prompt, out in zip(workload, r["prompts"]):
            _prefill_figures(sample, prompt, out["prompt_tokens"], out["prefill_ms"] / 1e3)
            if prompt.get("decode"):
                sample["ttft_ms"] = out["ttft_ms"]
                sample["decode_tokens"] = out["decode_tokens"]
                sample["decode_tok_s"] = out["decode_tok_s"]
                sample["text"] = out["text"]
        sample["page_problems"] = watch.console_errors + watch.page_errors + watch.outside_requests
        return sample
    finally:
        context.close()
