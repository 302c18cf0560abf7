"""`pyshim bench`: the engine measured the way users meet it — in headless Chromium, against the real
dev server — next to wllama (llama.cpp in wasm) running the same GGUF in the same browser, on the CPU
(1 and 2 threads) and on llama.cpp's WebGPU backend where the adapter has shader-f16 (`wllama-webgpu`; a
row that says why it was refused elsewhere).

For each model and engine it takes N runs, each in a fresh page or process, and keeps the medians
(bench_engines.py says what each figure is). Derived per engine: bytes read per decode token (from
the GGUF header: every weight once, the embedding table whole only when it doubles as the output
head, plus the f32 KV cache at the mean decode position), achieved GB/s, and % of the device's
streaming roofline measured in the same run. Writes bench-<stamp>.json (machine, browser, adapter,
every sample and median), .html (inline SVG charts, opens offline) and .md (the summary table).

Usage: python playwright/bench.py [--models smollm2,gemma3] [--backends browser,wasm,gpu,cpu] [--peer wllama]
                                  [--runs N] [--out DIR] [--quick]          (or `pyshim bench ...`)
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_batch  # noqa: E402
import bench_engines  # noqa: E402
import bench_grammar  # noqa: E402
import bench_needle  # noqa: E402
import bench_stream  # noqa: E402
import bench_report  # noqa: E402
import harness  # noqa: E402

BACKENDS = ("browser", "wasm", "gpu", "cpu")    # wasm: pyshim's WebAssembly CPU engine in Chromium (rows wasm-1t, wasm-2t)
PEERS = ("wllama",)
PEER_THREADS = (1, 2)
WEBGPU_PEER = "wllama-webgpu"      # the peer on llama.cpp's WebGPU backend (shader-f16 only; bench_report.refusals)
DEFAULT_OUT = harness.ROOT / "artifacts" / "bench"


@dataclass(frozen=True)
class Settings:
    prompt_tokens: tuple[int, ...]     # prefill is measured on each; the first also carries the decode
    decode_tokens: int
    roofline_mib: int
    runs: int


FULL = Settings(prompt_tokens=(128, 512), decode_tokens=128, roofline_mib=64, runs=3)
# CI's run: one small model, few tokens, one run: the benchmark must not rot, its numbers are not asserted.
QUICK = Settings(prompt_tokens=(32,), decode_tokens=8, roofline_mib=64, runs=1)  # a smaller buffer misreads the roofline


@dataclass
class BenchConfig:
    models: list[str] = field(default_factory=lambda: ["smollm2", "gemma3"])
    backends: list[str] = field(default_factory=lambda: list(BACKENDS))
    peer: str | None = "wllama"
    runs: int = FULL.runs
    out: Path = DEFAULT_OUT
    quick: bool = False
    chromium_gpu: bool = False         # launch Chromium with harness.CHROMIUM_GPU_FLAGS (a real GPU through Vulkan)
    budget_mb: float | None = None     # the GPU memory budget, native and in the page (None: pyshim's default, 4 GiB)
    decode_tokens: int | None = None   # None: the quick or full run's

    @property
    def settings(self) -> Settings:
        base = QUICK if self.quick else FULL
        return Settings(base.prompt_tokens, self.decode_tokens or base.decode_tokens, base.roofline_mib, self.runs)


# --- prompts: the same text for every engine ------------------------------------------------------

# Written for this benchmark; cycled until the prompt has the token count asked for.
PASSAGE = (
    "The harbour master kept a ledger of every ship that crossed the bar after dark. "
    "Most entries were dull: a fishing boat late with the tide, a ferry running empty to keep its schedule. "
    "In the winter of the long storms the ledger grew thick with names he had never seen before, "
    "cargo ships from ports that sent no letters and paid their fees in coins of three different kingdoms. "
    "He wrote each one down with the hour, the wind, and the colour of the lanterns on the mast. "
    "When the inspectors finally came, they did not ask about the ships at all; they asked about the ink, "
    "which had changed from black to brown sometime in the second month, and nobody could say why. "
)


def build_prompt(tokenizer, n_tokens: int) -> tuple[str, int]:
    """A prefix of the passage that the model's tokenizer turns into n_tokens ids (specials included),
    or as close as re-tokenizing a cut allows. Returns (text, token count)."""
    text = PASSAGE * (n_tokens // 60 + 2)
    ids = tokenizer.encode(text, add_special=False)
    specials = len(tokenizer.encode("x", add_special=True)) - len(tokenizer.encode("x", add_special=False))
    keep = n_tokens - specials
    best = None
    for k in (keep, keep - 1, keep + 1, keep - 2, keep + 2):
        cut = tokenizer.decode(ids[:k]).rstrip()
        count = len(tokenizer.encode(cut, add_special=True))
        if best is None or abs(count - n_tokens) < abs(best[1] - n_tokens):
            best = (cut, count)
        if count == n_tokens:
            break
    return best


def _url(path: Path) -> str:
    """The dev server's URL of a model file below models/ (synthetic ones live in models/synthetic/)."""
    from pyshim.paths import MODELS_DIR

    try:
        return "models/" + path.resolve().relative_to(MODELS_DIR.resolve()).as_posix()
    except ValueError:
        return f"models/{path.name}"


def model_facts(name: str, settings: Settings) -> dict:
    """Header facts of a model and its prompts: path, sizes, bytes and weight elements read per decode token."""
    from pyshim.setup.catalog import resolve_model
    from pyshim.gguf.header import read_header_from_file
    from pyshim.plan.memory import kv_cache_bytes, per_token
    from pyshim.gguf.spec import ModelSpec
    from pyshim.text.tokenizer import Tokenizer

    path = Path(resolve_model(name))
    header = read_header_from_file(path)
    spec = ModelSpec.from_header(header)
    weight_bytes = sum(t.nbytes for t in header.tensors)
    # One embedding row per token (the whole table only when it is also the output head); of a mixture of
    # experts, the experts a token is routed to
    token = per_token(spec, header.tensors)
    per_token_bytes, per_token_elems = token.read_bytes, token.active_params
    tokenizer = Tokenizer.from_metadata(header.metadata)
    workload = []
    for i, n in enumerate(settings.prompt_tokens):
        text, count = build_prompt(tokenizer, n)
        decode = i == 0
        workload.append({"name": f"p{n}", "tokens": n, "text": text, "token_count": count, "decode": decode,
                         "max_tokens": settings.decode_tokens if decode else 1})
    mean_pos = settings.prompt_tokens[0] + settings.decode_tokens // 2
    kv_read = kv_cache_bytes(spec, mean_pos, "f32")
    return {
        "name": name, "file": path.name, "url": _url(path), "path": str(path), "file_bytes": path.stat().st_size,
        "architecture": spec.architecture, "n_layers": spec.n_layers, "n_vocab": spec.n_vocab, "tied_output": spec.tied_output,
        "weight_bytes": weight_bytes, "weight_bytes_per_token": per_token_bytes, "weight_elems_per_token": per_token_elems,
        "weight_elems_by_type_per_token": token.active_by_type,
        "kv_bytes_per_token_at_mean_pos": kv_read, "bytes_per_token": per_token_bytes + kv_read,
        "workload": workload,
    }


# --- machine -------------------------------------------------------------------------------------------

def machine_info() -> dict:
    mem_total = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_total = int(line.split()[1]) * 1024
    except OSError:
        pass
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=harness.ROOT).stdout.strip()
    return {
        "cpu_count": os.cpu_count(), "memory_bytes": mem_total, "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(), "python": platform.python_version(),
        "load_average_start": list(os.getloadavg()), "git_commit": commit or None,
    }


# --- medians and derived figures ----------------------------------------------------------------------

def medians(samples: list[dict]) -> dict:
    """Median of every numeric figure over the runs that have it; other values from the first run."""
    out: dict = {}
    keys = {k for s in samples for k in s}
    for key in sorted(keys):
        values = [s[key] for s in samples if key in s]
        numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if numbers and len(numbers) == len(values):
            out[key] = statistics.median(numbers)
        else:
            out[key] = values[0]
    return out


# Weight types held to the probe of their own element width where bench_roofline measures one (its
# `Gelem_s_by_bits`); every other type to the best element rate, the stricter ceiling.
ELEMENT_BITS = {"Q6_K": "6"}


def element_seconds(elems_by_type: dict, rate: float, by_bits: dict | None) -> float:
    """Seconds the roofline's probes take to stream a token's weight elements: each type's at the rate of
    its element width's probe (ELEMENT_BITS), the rest at `rate` (G elements/s, the best)."""
    by_bits = by_bits or {}
    return sum(n / 1e9 / (by_bits.get(ELEMENT_BITS.get(t, ""), 0.0) or rate) for t, n in elems_by_type.items())


def best_roofline(a: dict | None, b: dict | None) -> dict | None:
    """Two measurements of one adapter's roofline (bench_roofline) as one: the best of each figure."""
    if not a or "GBps" not in a:
        return b if b and "GBps" in b else a
    if not b or "GBps" not in b:
        return a
    bits = {k: max(a.get("Gelem_s_by_bits", {}).get(k, 0.0), b.get("Gelem_s_by_bits", {}).get(k, 0.0))
            for k in {*a.get("Gelem_s_by_bits", {}), *b.get("Gelem_s_by_bits", {})}}
    passes = {k: min(a.get("ms_per_pass", {}).get(k, float("inf")), b.get("ms_per_pass", {}).get(k, float("inf")))
              for k in {*a.get("ms_per_pass", {}), *b.get("ms_per_pass", {})}}
    return {**a, "GBps": max(a["GBps"], b["GBps"]), "Gelem_s": max(a.get("Gelem_s", 0.0), b.get("Gelem_s", 0.0)),
            "Gelem_s_by_bits": bits, "ms_per_pass": passes, "measurements": 2}


def derive(median: dict, facts: dict, roofline: dict | None) -> None:
    """Achieved GB/s and % of roofline from decode tok/s (in place). Efficiency follows the GPU issue:
    the higher of bytes/s ÷ roofline bytes/s and the probes' time for a token's weight elements ÷ the
    token's time (a CPU adapter is bound by arithmetic, a real GPU by bytes; the elements' rates are the
    best of f32 and of the int8 route's, and Q6_K's that of 6-bit elements, bench_roofline). A figure over
    100% means the roofline read low (a busy machine): it is kept as `roofline_over_pct` and `roofline_pct`
    left empty, so no report prints it as an efficiency. `roofline_one_rate_pct` is the elements' figure
    with every type at the best rate (the stricter, older measure).
    The same from the median decode step (`decode_median_step_ms`, where the engine reports it):
    `steady_tok_s` and `roofline_steady_pct` (over 100%: `roofline_steady_over_pct`). The roofline is the
    best of its passes, since a neighbour's load only ever slows a pass; decode_tok_s is a mean over every
    step, which carries each burst of a shared machine's other work (one run here: steps 223-398 ms, mean
    285, median 268). The median step is the like-for-like figure beside a best-of roofline, and still
    the stricter one (a median, not a best)."""
    tok_s = median.get("decode_tok_s")
    if not tok_s:
        return
    median["bytes_per_token"] = facts["bytes_per_token"]
    median["achieved_GBps"] = tok_s * facts["bytes_per_token"] / 1e9
    roof_gbs = median.get("roofline_GBps") or (roofline or {}).get("GBps")
    roof_gel = median.get("roofline_Gelem_s") or (roofline or {}).get("Gelem_s")
    by_bits = median.get("roofline_Gelem_s_by_bits") or (roofline or {}).get("Gelem_s_by_bits")
    if roof_gbs:
        if roof_gel:
            median["roofline_one_rate_pct"] = 100 * tok_s * facts["weight_elems_per_token"] / 1e9 / roof_gel
        median["roofline_GBps"], median["roofline_Gelem_s"] = roof_gbs, roof_gel
        pct = _roofline_pct(tok_s, facts, roof_gbs, roof_gel, by_bits)
        median["roofline_pct"] = pct if pct <= 100 else None
        median["roofline_over_pct"] = pct if pct > 100 else None
        if median.get("decode_median_step_ms"):
            median["steady_tok_s"] = steady = 1e3 / median["decode_median_step_ms"]
            pct = _roofline_pct(steady, facts, roof_gbs, roof_gel, by_bits)
            median["roofline_steady_pct"] = pct if pct <= 100 else None
            median["roofline_steady_over_pct"] = pct if pct > 100 else None


def _roofline_pct(tok_s: float, facts: dict, roof_gbs: float, roof_gel: float | None, by_bits: dict | None) -> float:
    """derive's efficiency at `tok_s`: the higher of the bytes' and the elements' figures."""
    pct_bytes = 100 * tok_s * facts["bytes_per_token"] / 1e9 / roof_gbs
    if not roof_gel:
        return pct_bytes
    by_type = facts.get("weight_elems_by_type_per_token") or {"": facts["weight_elems_per_token"]}
    return max(pct_bytes, 100 * tok_s * element_seconds(by_type, roof_gel, by_bits))


# --- the run -------------------------------------------------------------------------------------------

def _log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _measure(label: str, runs: int, one) -> dict:
    """Runs `one()` `runs` times; returns {"status", "samples", "median"} (status: ok | n/a | error)."""
    samples = []
    for i in range(runs):
        try:
            t0 = time.perf_counter()
            samples.append(one())
            _log(f"{label}: run {i + 1}/{runs} done in {time.perf_counter() - t0:.1f} s")
        except bench_engines.EngineUnavailable as exc:
            return {"status": f"n/a ({exc})", "samples": [], "median": {}}
        except bench_engines.EngineRefused as exc:   # the adapter said no: the same answer every run, so ask once
            _log(f"{label}: refused: {exc}")
            return {"status": f"refused: {exc}", "refused": str(exc), "refusal": exc.detail, "samples": [], "median": {}}
        except Exception as exc:  # noqa: BLE001 — one engine failing must not lose the others' numbers
            _log(f"{label}: run {i + 1}/{runs} failed: {exc}")
            return {"status": f"error: {str(exc)[:300]}", "samples": samples, "median": medians(samples) if samples else {}}
    return {"status": "ok", "samples": samples, "median": medians(samples)}


def run_bench(config: BenchConfig) -> dict:
    settings = config.settings
    started = time.perf_counter()
    report: dict = {
        "schema": 1, "started_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "config": {**asdict(config), "out": str(config.out), "settings": asdict(settings)},
        "machine": machine_info(), "models": {}, "results": [], "rooflines": {},
    }
    _log(f"models {config.models}, engines {config.backends} + peer {config.peer}, {settings.runs} run(s) each"
         f"{' (quick)' if config.quick else ''}")
    facts = {name: model_facts(name, settings) for name in config.models}
    report["models"] = facts

    # Native engines first: Playwright's sync API keeps an event loop in this process once started.
    cli = bench_engines.generate_cli_support()
    report["generate_cli"] = {"backends": sorted(cli["backends"]), "ignore_eos": "--ignore-eos" in cli["flags"]}
    config.out.mkdir(parents=True, exist_ok=True)
    _run_native(report, config, facts, cli)
    if "browser" in config.backends or "wasm" in config.backends or config.peer:    # native engines alone need no Chromium
        _run_in_browser(report, config, facts)
    order = ["browser", "wasm-1t", "wasm-2t", "gpu", "cpu"] + [f"{peer}-{t}t" for peer in ("wllama", "llamacpp") for t in PEER_THREADS] + [WEBGPU_PEER]
    report["results"].sort(key=lambda r: (config.models.index(r["model"]), order.index(r["engine"])))
    report["rooflines"]["host"] = report["rooflines"].get("cpu") or report["rooflines"].get("host") or _host_roofline()
    _peer_ratios(report)
    report["machine"]["load_average_end"] = list(os.getloadavg())
    report["elapsed_s"] = time.perf_counter() - started
    return report


def _run_native(report: dict, config: BenchConfig, facts: dict, cli: dict) -> None:
    """pyshim's native engines through `pyshim generate --json`, then native llama.cpp when installed."""
    settings = config.settings
    natives = [b for b in config.backends if b in ("gpu", "cpu")]
    if "gpu" in natives and "gpu" in cli["backends"]:
        report["rooflines"]["gpu"] = _safe(lambda: bench_engines.native_roofline(settings.roofline_mib), "native roofline")
    if "cpu" in natives and "cpu" in cli["backends"]:
        report["rooflines"]["cpu"] = _host_roofline()
    rows = []
    for name in config.models:
        for backend in natives:
            res = _measure(f"{name} {backend}", settings.runs,
                           lambda: bench_engines.cli_run(backend, Path(facts[name]["path"]), facts[name]["workload"], cli,
                                                         budget_mb=config.budget_mb))
            rows.append((name, backend, res))
    if report["rooflines"].get("gpu") and rows:
        # measured again after the rows, the best of each pass kept: a busy minute at the start (another
        # tenant of the machine) read lavapipe's 4-bit probe at 8.8 G elements/s against 12.5-13.1 in
        # quiet ones, and the whole run's percentages with it
        again = _safe(lambda: bench_engines.native_roofline(settings.roofline_mib), "native roofline, again")
        report["rooflines"]["gpu"] = best_roofline(report["rooflines"]["gpu"], again)
    for name, backend, res in rows:
        _add(report, name, backend, res, facts[name], report["rooflines"].get(backend))
    llama_python = bench_engines.llamacpp_python() if config.peer and not config.quick else None
    report["llamacpp_python"] = llama_python
    scratch = config.out / ".workload.json"
    for name in config.models if llama_python else ():
        for threads in PEER_THREADS:
            res = _measure(f"{name} llama.cpp {threads}t", settings.runs, lambda: bench_engines.llamacpp_run(
                llama_python, Path(facts[name]["path"]), facts[name]["workload"], threads=threads, scratch=scratch))
            _add(report, name, f"llamacpp-{threads}t", res, facts[name], None, peer=True)
    scratch.unlink(missing_ok=True)


def _run_in_browser(report: dict, config: BenchConfig, facts: dict) -> None:
    """The browser engine and the wllama peer, one Chromium, a fresh context per run, COOP/COEP on."""
    from playwright.sync_api import sync_playwright

    settings = config.settings
    if "browser" in config.backends or "wasm" in config.backends:
        # The page installs pyshim from its vendored wheel: rebuild it so the browser runs this checkout.
        from pyshim.setup import vendoring

        vendoring.refresh_pyshim()
    extra = harness.CHROMIUM_GPU_FLAGS if config.chromium_gpu else []
    with harness.DevServer(isolated=True) as server, sync_playwright() as p:
        browser = harness.launch_chromium(p, extra_flags=extra)
        report["browser"] = {"name": "chromium", "version": browser.version, "executable": harness.CHROMIUM,
                             "flags": harness.chromium_flags(gpu=config.chromium_gpu), "isolated": True}
        for name in config.models:
            f = facts[name]
            if "browser" in config.backends:
                res = _measure(f"{name} browser", settings.runs, lambda: bench_engines.browser_run(
                    p, server.url, f["url"], f["workload"], roofline_mib=settings.roofline_mib, extra_flags=extra,
                    budget_mb=config.budget_mb))
                if res["samples"] and res["samples"][0].get("adapter"):
                    report["adapter"] = res["samples"][0]["adapter"]
                _add(report, name, "browser", res, f, None)
            for threads in PEER_THREADS if "wasm" in config.backends else ():   # the same page, the CPU engine
                res = _measure(f"{name} wasm {threads}t", settings.runs, lambda: bench_engines.browser_run(
                    p, server.url, f["url"], f["workload"], roofline_mib=settings.roofline_mib, extra_flags=extra, device="cpu",
                    threads=threads))
                host = report["rooflines"].setdefault("host", _host_roofline())
                _add(report, name, f"wasm-{threads}t", res, f, host)
            if config.peer == "wllama":
                for threads in PEER_THREADS:
                    res = _measure(f"{name} wllama {threads}t", settings.runs, lambda: bench_engines.peer_run(
                        browser, server.url, f["url"], f["workload"], threads=threads))
                    _add(report, name, f"wllama-{threads}t", res, f, None, peer=True)
                # llama.cpp's WebGPU backend: the page checks shader-f16 first, so a refusal costs a second
                res = _measure(f"{name} {WEBGPU_PEER}", settings.runs, lambda: bench_engines.peer_run(
                    browser, server.url, f["url"], f["workload"], threads=bench_engines.WEBGPU_PEER_THREADS, webgpu=True))
                _add(report, name, WEBGPU_PEER, res, f, None, peer=True)
        browser.close()


def _safe(fn, label: str):
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 — a missing roofline leaves % of roofline empty, nothing else
        _log(f"{label} failed: {exc}")
        return {"error": str(exc)[:300]}


def _host_roofline() -> dict:
    from bench_roofline import measure_host_bandwidth

    return measure_host_bandwidth()


def _add(report: dict, model: str, engine: str, res: dict, facts: dict, roofline: dict | None, peer: bool = False) -> None:
    if res["median"]:
        derive(res["median"], facts, roofline)
    if not peer:     # every pyshim row says it: None where not measured (the cpu backend; a failed run)
        res["median"].setdefault("cpu_ms_per_step", None)
    report["results"].append({"model": model, "engine": engine, "peer": peer, **res})


def _peer_ratios(report: dict) -> None:
    """pyshim ÷ peer for decode and prefill, per pyshim engine and peer variant; the peer's % of the host
    memory bandwidth (its ceiling: it runs on the CPU); wllama-webgpu's % of the browser adapter's
    roofline measured in the browser row of the same model (it runs on that adapter)."""
    host = report["rooflines"]["host"]
    adapter_roof = {r["model"]: r["median"].get("roofline_GBps") for r in report["results"] if r["engine"] == "browser"}
    for r in report["results"]:
        m = r["median"]
        roof = adapter_roof.get(r["model"]) if r["engine"] == WEBGPU_PEER else host.get("GBps")
        if r["peer"] and m.get("achieved_GBps") and roof:
            m["roofline_GBps"] = roof
            m["roofline_pct"] = 100 * m["achieved_GBps"] / roof
    for r in report["results"]:
        if r["peer"]:
            continue
        ratios = {}
        for peer in report["results"]:
            if not peer["peer"] or peer["model"] != r["model"]:
                continue
            for key in [k for k in r["median"] if k.endswith("tok_s")]:
                ours, theirs = r["median"].get(key), peer["median"].get(key)
                if ours and theirs:
                    ratios[f"{key}_vs_{peer['engine']}"] = ours / theirs
        r["vs_peer"] = ratios


def write_outputs(report: dict, out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    stamp = report["started_at"].replace(":", "").replace("-", "").replace("+0000", "Z")
    return bench_report.write_all(report, out, f"bench-{stamp}")


def parse_args(argv: list[str] | None = None) -> BenchConfig:
    parser = argparse.ArgumentParser(prog="pyshim bench", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return config_from_args(parser.parse_args(argv))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", default=None, help="comma-separated short names (default smollm2,gemma3; --quick: smollm2)")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated: browser,wasm,gpu,cpu")
    parser.add_argument("--peer", default="wllama", choices=PEERS + ("none",), help="the peer engine in the same browser")
    parser.add_argument("--runs", type=int, default=None, help=f"runs per model and engine, medians kept (default {FULL.runs}; --quick: 1)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for bench-<time>.json/.html/.md")
    parser.add_argument("--quick", action="store_true", help="one small model, few tokens, one run (what CI runs)")
    parser.add_argument("--tokens", type=int, default=None,
                        help=f"tokens each run decodes (default {FULL.decode_tokens}; --quick: {QUICK.decode_tokens}; the "
                             "benchmarks of their own below: theirs): a full-size model's steady decode without the full "
                             "run's long prompts")
    parser.add_argument("--chromium-gpu", action="store_true",
                        help="launch Chromium with the real-GPU flags (Vulkan on Linux; playwright/harness.py CHROMIUM_GPU_FLAGS)")
    parser.add_argument("--budget-mb", type=float, default=None,
                        help="GPU memory the engines may plan for, natively and in the page (default pyshim's 4 GiB, "
                             "which WebGPU cannot check: a bigger model streams layers; give a big GPU's memory to keep "
                             "it resident)")
    stream = parser.add_argument_group("expert streaming (--stream: a MoE over its GPU budget against it resident)")
    stream.add_argument("--stream", action="store_true", help="run the expert streaming benchmark instead (bench_stream.py)")
    stream.add_argument("--budgets-mb", default=None, help="comma-separated GPU budgets in MB (default 1000,2000)")
    needle = parser.add_argument_group("needle in a haystack (--needle: retrieval by KV cache type, native GPU)")
    needle.add_argument("--needle", action="store_true", help="run the needle benchmark instead (bench_needle.py)")
    needle.add_argument("--contexts", default=None, help="comma-separated context lengths (default 1024,2048,4096)")
    needle.add_argument("--depths", default=None, help="comma-separated depths of the needle, 0..1 (default 0.15,0.5,0.85)")
    needle.add_argument("--seeds", type=int, default=None, help="haystacks per depth and length (default 3)")
    needle.add_argument("--kv-types", default=None, help="comma-separated KV cache types (default f32,f16,q8,q4)")
    batch = parser.add_argument_group("sequences decoded together (--batch: one program a step for all, natively)")
    batch.add_argument("--batch", action="store_true", help="run the batched decode benchmark instead (bench_batch.py)")
    batch.add_argument("--batches", default=None, help="comma-separated numbers of sequences (default 1,2,4)")
    grammar = parser.add_argument_group("constrained decoding (--grammar: response_format's cost per token)")
    grammar.add_argument("--grammar", action="store_true", help="run the constrained decoding benchmark instead (bench_grammar.py)")
    grammar.add_argument("--schemas", type=int, default=None, help="JSON Schemas per model and backend (default 4)")


def _csv(value: str | None, cast=str) -> list | None:
    """A comma-separated flag's values (None when the flag was not given)."""
    return None if not value else [cast(v) for v in value.split(",") if v]


def _own_config(args, config, mode: str, backends: tuple[str, ...] = ("gpu", "browser")):
    """A benchmark of its own: the models, tokens and backends (of `backends`) its flags name, else its defaults."""
    config.models = _csv(args.models) or config.models
    if args.tokens:
        config.tokens = max(2, args.tokens)
    if args.backends != ",".join(BACKENDS):
        config.backends = [b for b in args.backends.split(",") if b]
    unknown = [b for b in config.backends if b not in backends]
    if unknown:
        raise SystemExit(f"--{mode} runs on the {', '.join(backends)} backends, not {unknown}")
    return config


def stream_config(args) -> "bench_stream.StreamConfig":
    config = _own_config(args, bench_stream.StreamConfig(out=args.out), "stream")
    config.budgets_mb = _csv(args.budgets_mb, float) or config.budgets_mb
    return config


def grammar_config(args) -> "bench_grammar.GrammarConfig":
    config = _own_config(args, bench_grammar.GrammarConfig(out=args.out), "grammar")
    if args.schemas:
        config.schemas = max(1, args.schemas)
    return config


def needle_config(args) -> "bench_needle.NeedleConfig":
    config = bench_needle.NeedleConfig(out=args.out)
    config.models = _csv(args.models) or config.models
    config.contexts = _csv(args.contexts, int) or config.contexts
    config.depths = tuple(_csv(args.depths, float) or config.depths)
    if args.seeds:
        config.seeds = max(1, args.seeds)
    config.kv_types = _csv(args.kv_types) or config.kv_types
    if args.backends != ",".join(BACKENDS):
        config.backend = args.backends
        if config.backend not in ("gpu", "wasm"):
            raise SystemExit(f"--needle runs on one backend, gpu or wasm, not {config.backend!r}")
    if config.kv_types[0] != "f32":
        raise SystemExit("--kv-types: the first must be f32 (the others' answers are compared with its)")
    return config


def batch_config(args) -> "bench_batch.BatchConfig":
    config = _own_config(args, bench_batch.BatchConfig(out=args.out), "batch", ("gpu", "wasm", "browser", "browser-cpu"))
    config.batches = _csv(args.batches, int) or config.batches
    return config


def config_from_args(args):
    if getattr(args, "batch", False):
        return batch_config(args)
    if getattr(args, "needle", False):
        return needle_config(args)
    if getattr(args, "stream", False):
        return stream_config(args)
    if getattr(args, "grammar", False):
        return grammar_config(args)
    backends = [b for b in args.backends.split(",") if b]
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown:
        raise SystemExit(f"unknown backend(s) {unknown}; choose from {', '.join(BACKENDS)}")
    models = [m for m in (args.models or ("smollm2" if args.quick else "smollm2,gemma3")).split(",") if m]
    runs = args.runs or (QUICK.runs if args.quick else FULL.runs)
    return BenchConfig(models=models, backends=backends, peer=None if args.peer == "none" else args.peer,
                       runs=max(1, runs), out=args.out, quick=args.quick, chromium_gpu=args.chromium_gpu,
                       budget_mb=args.budget_mb, decode_tokens=max(2, args.tokens) if args.tokens else None)


def run_and_report(config) -> int:
    for module, kind in ((bench_stream, bench_stream.StreamConfig), (bench_needle, bench_needle.NeedleConfig),
                         (bench_grammar, bench_grammar.GrammarConfig), (bench_batch, bench_batch.BatchConfig)):
        if isinstance(config, kind):        # the benchmarks of their own: run, write, print the tables
            report = module.run(config, log=_log)
            paths = module.write_outputs(report, config.out)
            print()
            print(module.markdown(report))
            for name, path in paths.items():
                print(f"{name}: {path}")
            return 0
    report = run_bench(config)
    paths = write_outputs(report, config.out)
    print()
    print(bench_report.markdown(report))
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_and_report(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
