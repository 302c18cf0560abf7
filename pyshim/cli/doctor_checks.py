"""The checks `pyshim doctor` runs, each in a process of its own:

    python -m pyshim.cli.doctor_checks native [--roofline yes|no|auto]
    python -m pyshim.cli.doctor_checks browser [--gpu-flags]

Each prints one JSON object as its last line of stdout: {"status": "ok" | "unavailable" | "failed",
"error": what went wrong and what to do, ...what was seen}. A process per check lets doctor bound it
with a timeout, keeps a driver that crashes from taking the report with it, and keeps Playwright's event
loop apart from wgpu's. Tracebacks go to stderr only (doctor keeps them in a log file beside the report).

native: every adapter wgpu enumerates, the one pyshim opens (Capabilities: features, limits), the kernel
self-test (pyshim.gpu.selftest) and, on a GPU or with --roofline, the streaming roofline of
playwright/bench_roofline.py. browser: headless Chromium through playwright/harness.py — which adapter
a page gets with the default flags or, with --gpu-flags, with the real-GPU ones (harness.CHROMIUM_GPU_FLAGS;
when those give no hardware adapter it says so and goes on with the default flags), then the site's
engine Worker booted and its `gpu-selftest`.
May import: anything in pyshim; the checkout's playwright/ folder inside the checks.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import traceback

ROOFLINE_MIB = 64           # the bench's own size (bench.py Settings.roofline_mib): a smaller buffer misreads it
ADAPTER_NOTE_SWIFTSHADER = "swiftshader"


class Unavailable(Exception):
    """Something the check needs is not on this machine (a package, Chromium, an adapter): not a failure."""


def _text(exc: BaseException) -> str:
    """An exception as one readable line (a PyshimError's message already says what to do)."""
    from pyshim.errors import PyshimError

    first = (str(exc).strip().splitlines() or [""])[0]
    return first if isinstance(exc, PyshimError) else f"{type(exc).__name__}: {first}"


# --- native (wgpu) -------------------------------------------------------------------------------------

def _adapter_line(info: dict, features) -> dict:
    return {"name": info.get("device") or info.get("description") or info.get("vendor") or "?",
            "vendor": info.get("vendor"), "description": info.get("description"), "backend": info.get("backend_type"),
            "type": info.get("adapter_type"), "f16": "shader-f16" in features}


def _enumerate(wgpu) -> list[dict]:
    """Every adapter wgpu-native sees (Vulkan, GL, ...), not only the one a device is opened on."""
    listing = getattr(wgpu.gpu, "enumerate_adapters_sync", None)
    adapters = listing() if listing else asyncio.run(wgpu.gpu.enumerate_adapters_async())
    return [_adapter_line(dict(a.info), set(a.features)) for a in adapters]


async def _native(roofline: str) -> dict:
    try:
        import wgpu
    except ImportError:
        raise Unavailable("the `wgpu` package is not installed — pip install wgpu (or pip install -e '.[dev]')") from None
    try:
        from pyshim.errors import GPUUnavailableError
        from pyshim.gpu import open_device
        from pyshim.gpu.selftest import selftest
    except ImportError as exc:       # numpy (or another dependency) not installed in this Python
        raise Unavailable(f"the native check needs the `{exc.name}` package — pip install -e '.[dev]'") from None

    out: dict = {"wgpu_version": getattr(wgpu, "__version__", "?")}
    try:
        out["adapters"] = _enumerate(wgpu)
    except Exception as exc:  # noqa: BLE001 — the listing is extra information; the device below decides
        out["adapters_error"] = _text(exc)
    try:
        device = await open_device()
    except GPUUnavailableError as exc:
        raise Unavailable(str(exc)) from None
    try:
        caps = device.caps
        out["adapter"] = caps.as_dict()
        t0 = time.perf_counter()
        result = await selftest(device)
        out["selftest"] = {"ok": result["ok"], "n": result["n"], "max_abs_err": result["max_abs_err"],
                           "ms": 1e3 * (time.perf_counter() - t0)}
    finally:
        device.destroy()
    if not out["selftest"]["ok"]:
        out["status"] = "failed"
        out["error"] = (f"the kernel self-test disagrees with NumPy (max error {out['selftest']['max_abs_err']:.3g}): "
                        "this adapter's results cannot be trusted")
    if roofline == "yes" or (roofline == "auto" and not caps.is_fallback):
        out["roofline"] = await _roofline()
    else:
        out["roofline"] = {"skipped": "a CPU fallback adapter: the roofline takes ~20 s there (the bench measures it); add --roofline"}
    return out


async def _roofline() -> dict:
    from pyshim.paths import PLAYWRIGHT_DIR

    if not (PLAYWRIGHT_DIR / "bench_roofline.py").is_file():
        return {"skipped": "playwright/bench_roofline.py is not here (a checkout has it)"}
    sys.path.insert(0, str(PLAYWRIGHT_DIR))
    try:
        from bench_roofline import measure_roofline

        r = await measure_roofline(ROOFLINE_MIB)
        return {"GBps": r["GBps"], "Gelem_s": r["Gelem_s"], "bytes": r["bytes"], "ms_per_pass": r["ms_per_pass"]}
    except Exception as exc:  # noqa: BLE001 — the roofline is a figure on top; its failure is reported, not fatal
        traceback.print_exc()
        return {"error": _text(exc)}


# --- browser (headless Chromium) ----------------------------------------------------------------------------

def verdict(adapter: dict) -> str:
    """What a page's adapter (harness.ADAPTER_INFO_JS) is: "hardware", "software" (SwiftShader or another
    CPU adapter) or "none"."""
    if not adapter.get("ok"):
        return "none"
    software = (adapter.get("is_fallback") or adapter.get("fallback_only") or adapter.get("type") == "CPU"
                or ADAPTER_NOTE_SWIFTSHADER in f"{adapter.get('architecture')} {adapter.get('description')}".lower())
    return "software" if software else "hardware"


def adapter_name(adapter: dict) -> str:
    if not adapter.get("ok"):
        return "no adapter"
    parts = [adapter.get("vendor"), adapter.get("architecture"), adapter.get("description")]
    return " ".join(p for p in parts if p) or "an unnamed adapter"


def _probe(playwright, harness, server, extra: list[str]) -> dict:
    """The adapter a plain page gets from Chromium launched with `extra` flags."""
    browser = harness.launch_chromium(playwright, extra_flags=extra)
    try:
        context = browser.new_context(service_workers="block")
        page, _ = harness.open_page(context, server.url + "api/health")
        adapter = page.evaluate(harness.ADAPTER_INFO_JS)
        return {"version": browser.version, "adapter": adapter, "verdict": verdict(adapter)}
    finally:
        browser.close()


def _browser(gpu_flags: bool) -> dict:
    from pyshim.cli.browser import _harness
    from pyshim.errors import SetupError
    from pyshim.paths import VENDOR_DIR

    try:
        harness = _harness()
    except SetupError as exc:
        raise Unavailable(str(exc)) from None
    from pathlib import Path

    from playwright.sync_api import sync_playwright

    if not Path(harness.CHROMIUM).exists():
        raise Unavailable(f"Chromium is not installed ({harness.CHROMIUM} is missing) — apt-get install -y chromium, "
                          "or set PYSHIM_CHROMIUM to a Chromium binary")
    if not (VENDOR_DIR / "manifest.json").is_file():
        raise Unavailable("web/vendor is missing (Pyodide and the wheels the page loads) — run `pyshim setup`")
    from pyshim.setup import vendoring

    vendoring.refresh_pyshim()        # the Worker installs pyshim from this wheel: make it this checkout's code
    out: dict = {"chromium": harness.CHROMIUM}
    with harness.DevServer() as server, sync_playwright() as p:
        use_gpu = False
        if gpu_flags:
            tried = _probe(p, harness, server, harness.CHROMIUM_GPU_FLAGS)
            use_gpu = tried["verdict"] == "hardware"
            tried.update(flags=harness.CHROMIUM_GPU_FLAGS, used=use_gpu)
            if not use_gpu:
                adapter = tried["adapter"]
                got = ("no adapter at all" if not adapter.get("ok")
                       else f"no GPU adapter (requestAdapter() answered null; with forceFallbackAdapter, {adapter_name(adapter)})"
                       if adapter.get("fallback_only") else f"{adapter_name(adapter)}, a software (CPU) adapter")
                tried["note"] = (f"Chromium launched with the real-GPU flags got {got}: no GPU reached the browser; "
                                 "the browser checks ran with the default flags (SwiftShader)")
            out["gpu_flags"] = tried
        extra = harness.CHROMIUM_GPU_FLAGS if use_gpu else []
        first = _probe(p, harness, server, extra)
        out.update(version=first["version"], flags=harness.chromium_flags(gpu=use_gpu), adapter=first["adapter"],
                   verdict=first["verdict"])
        if not first["adapter"].get("ok"):
            raise Unavailable(f"WebGPU gives no adapter in Chromium: {first['adapter'].get('reason')}")
        browser = harness.launch_chromium(p, extra_flags=extra)
        try:
            context = browser.new_context(service_workers="block")
            page, watch = harness.open_page(context, server.url)
            boot = harness.wait_for_boot(page)
            out["python_ready_ms"] = boot.get("total_ms")
            t0 = time.perf_counter()
            result = harness.engine_request(page, "gpu-selftest")
            out["selftest"] = {"ok": bool(result.get("ok")), "n": result.get("n"), "max_abs_err": result.get("max_abs_err"),
                               "ms": 1e3 * (time.perf_counter() - t0)}
            out["worker_adapter"] = result.get("adapter")
            out["page_problems"] = watch.console_errors + watch.page_errors + watch.outside_requests
        finally:
            browser.close()
    if not out["selftest"]["ok"]:
        out["status"] = "failed"
        out["error"] = f"the site Worker's self-test disagrees with NumPy (max error {out['selftest']['max_abs_err']})"
    return out


# --- entry --------------------------------------------------------------------------------------------

def run_check(name: str, args) -> dict:
    """One check as its JSON result: never raises."""
    try:
        out = asyncio.run(_native(args.roofline)) if name == "native" else _browser(args.gpu_flags)
        out.setdefault("status", "ok")
        return out
    except Unavailable as exc:
        return {"status": "unavailable", "error": " ".join(str(exc).split())}     # wgpu's reports span lines
    except Exception as exc:  # noqa: BLE001 — a check reports its failure as text; the traceback goes to the log
        traceback.print_exc()
        return {"status": "failed", "error": _text(exc)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pyshim.cli.doctor_checks")
    parser.add_argument("check", choices=("native", "browser"))
    parser.add_argument("--roofline", choices=("yes", "no", "auto"), default="auto")
    parser.add_argument("--gpu-flags", action="store_true")
    args = parser.parse_args(argv)
    result = run_check(args.check, args)
    print(json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
