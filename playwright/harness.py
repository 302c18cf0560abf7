"""Headless Chromium with WebGPU against the dev server: the one harness tests and benchmarks share.

- `DevServer` starts `pyshim serve` on a free port in a subprocess (the real server, as users run it).
- `launch_chromium()` starts Debian's /usr/bin/chromium with the flags measured to give WebGPU
  (SwiftShader here) and to keep it off the network; `CHROMIUM_GPU_FLAGS`, passed as extra flags, ask
  for a real GPU through Vulkan instead (each flag says why it is there); `ADAPTER_INFO_JS` says which
  adapter a page got.
- `open_page()` opens a page that records console errors, page errors and every request; any request
  to a non-local address is blocked and makes `PageWatch.check()` fail.
- `require_adapter()` checks `navigator.gpu.requestAdapter()`, retrying once (a null adapter was
  seen once under heavy load) and saying clearly what happened.

This folder is not a Python package on purpose: a package named `playwright` would shadow the
Playwright library itself. Import it with `sys.path.insert(0, "<repo>/playwright"); import harness`.
"""

from __future__ import annotations

import ipaddress
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit
from urllib.request import urlopen

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("PYSHIM_CHROMIUM", "/usr/bin/chromium")
# --enable-unsafe-webgpu is the only flag WebGPU needs here; the rest keep Chromium off the network
# (this machine refuses outside connections, and Chromium retries them noisily otherwise).
CHROMIUM_FLAGS = [
    "--enable-unsafe-webgpu",
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1, EXCLUDE localhost",
]
# A real GPU through Vulkan on Linux, headless (`pyshim doctor --chromium-gpu`, `pyshim bench --chromium-gpu`),
# added to CHROMIUM_FLAGS. Chromium 156 knows every one of these switches. On this machine (no GPU, Mesa's
# lavapipe the only Vulkan driver) they give no adapter at all — requestAdapter() answers null and only
# {forceFallbackAdapter: true} still finds SwiftShader — so callers check which adapter they got.
CHROMIUM_GPU_FLAGS = [
    # headless Chromium forces SwiftShader unless told to use the normal driver selection
    "--enable-gpu",
    # data-centre and server GPUs (and their drivers) are often blocklisted, which hides them from WebGPU
    "--ignore-gpu-blocklist",
    # Dawn reaches the GPU through Vulkan on Linux: the GPU process must bring Vulkan up, with ANGLE (GL)
    # on the same Vulkan device rather than on EGL, which a headless machine cannot initialise
    "--enable-features=Vulkan,VulkanFromANGLE,DefaultANGLEVulkan",
    "--use-angle=vulkan",
    # the system's Vulkan loader and drivers (NVIDIA's ICD), not the SwiftShader one Chromium bundles
    "--use-vulkan=native",
    # no window system: no VkSurface (presentation would fail or hang without a display; compute needs none)
    "--disable-vulkan-surface",
    # GPUAdapterInfo then carries description, driver, backend and type: the report can name the GPU
    # (it also stops rounding timestamp queries to 100 µs)
    "--enable-webgpu-developer-features",
]
SERVER_START_TIMEOUT_S = 60
ADAPTER_RETRY_DELAY_MS = 2000
BOOT_TIMEOUT_MS = 180_000  # Pyodide + numpy + wheels on a loaded 2-core machine


class HarnessError(RuntimeError):
    pass


class DevServer:
    """`pyshim serve --port 0` in a subprocess; `url` is its base URL once started."""

    def __init__(self, *, isolated: bool = False, env: dict[str, str] | None = None):
        self.isolated = isolated
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.log: list[str] = []

    def __enter__(self) -> "DevServer":
        cmd = [sys.executable, "-m", "pyshim.cli", "serve", "--port", "0"] + (["--isolated"] if self.isolated else [])
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, **(self.env or {})})
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.log.append(line.rstrip())
            match = re.search(r"serving (http://\S+/)", line)
            if match:
                self.url = match.group(1)
                break
        if not self.url:
            self.__exit__()
            raise HarnessError("the dev server did not start:\n" + "\n".join(self.log[-20:]))
        # Keep draining its output so a chatty server never blocks on a full pipe.
        threading.Thread(target=self._drain, daemon=True).start()
        with urlopen(self.url + "api/health", timeout=10) as r:
            if r.status != 200:
                raise HarnessError(f"dev server health check answered {r.status}")
        return self

    def _drain(self) -> None:
        for line in self.proc.stdout:
            self.log.append(line.rstrip())

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def chromium_flags(*, gpu: bool = False) -> list[str]:
    """The flags Chromium is launched with: the SwiftShader-friendly set, or with `gpu` the real-GPU one too."""
    return CHROMIUM_FLAGS + (CHROMIUM_GPU_FLAGS if gpu else [])


def launch_chromium(playwright, *, extra_flags: list[str] | None = None, headless: bool = True, webgpu: bool = True):
    """Debian's Chromium with CHROMIUM_FLAGS; `webgpu=False`: a browser without WebGPU (no navigator.gpu:
    the unsafe-WebGPU switch left out, the feature turned off), as visitors with it blocklisted have."""
    if not Path(CHROMIUM).exists():
        raise HarnessError(f"{CHROMIUM} not found: install Debian's chromium (apt-get install -y chromium); "
                           "never `playwright install`, it downloads a browser and fails offline")
    flags = CHROMIUM_FLAGS if webgpu else [f for f in CHROMIUM_FLAGS if f != "--enable-unsafe-webgpu"] + ["--disable-features=WebGPU"]
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=headless, args=flags + (extra_flags or []))


def launch_persistent(playwright, user_data_dir, *, extra_flags: list[str] | None = None, headless: bool = True, **context):
    """Chromium with an on-disk profile in `user_data_dir`: a BrowserContext (closing it ends the browser).
    A plain `launch()` context is incognito-like, whose IndexedDB lives in memory: it refuses to store a
    multi-GB model ("quota full") long before the quota navigator.storage.estimate() reports. A visitor's
    browser keeps its data on disk, and so do runs that store full-size models."""
    if not Path(CHROMIUM).exists():
        raise HarnessError(f"{CHROMIUM} not found: install Debian's chromium (apt-get install -y chromium); "
                           "never `playwright install`, it downloads a browser and fails offline")
    return playwright.chromium.launch_persistent_context(str(user_data_dir), executable_path=CHROMIUM, headless=headless,
                                                         args=CHROMIUM_FLAGS + (extra_flags or []), **context)


def is_local(url: str) -> bool:
    parts = urlsplit(url)
    if parts.scheme in ("data", "blob", "about", "chrome", "chrome-extension", "devtools"):
        return True
    host = (parts.hostname or "").strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass
class PageWatch:
    """What a page did that a test should know about."""

    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    outside_requests: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    console: list[str] = field(default_factory=list)

    def check(self, *, allow_console_errors: tuple[str, ...] = ()) -> None:
        problems = []
        if self.outside_requests:
            problems.append(f"requests to non-local addresses: {self.outside_requests}")
        if self.page_errors:
            problems.append(f"page errors: {self.page_errors}")
        errors = [e for e in self.console_errors if not any(a in e for a in allow_console_errors)]
        if errors:
            problems.append(f"console errors: {errors}")
        if problems:
            raise AssertionError("; ".join(problems))


def open_page(context, url: str, *, wait_until: str = "load"):
    """A new page on `url`, watched. Returns (page, watch)."""
    watch = PageWatch()

    def guard(route):
        request_url = route.request.url
        watch.requests.append(request_url)
        if is_local(request_url):
            route.continue_()
        else:
            watch.outside_requests.append(request_url)
            route.abort("blockedbyclient")

    context.route("**/*", guard)
    page = context.new_page()
    page.on("console", lambda m: (watch.console.append(f"{m.type}: {m.text}"),
                                  watch.console_errors.append(m.text) if m.type == "error" else None))
    page.on("pageerror", lambda e: watch.page_errors.append(str(e)))
    page.goto(url, wait_until=wait_until)
    return page, watch


ADAPTER_JS = """async (retryDelay) => {
  if (!navigator.gpu) return {ok: false, reason: "navigator.gpu is missing"};
  let adapter = await navigator.gpu.requestAdapter();
  let retried = false;
  if (!adapter) { retried = true; await new Promise(r => setTimeout(r, retryDelay)); adapter = await navigator.gpu.requestAdapter(); }
  if (!adapter) return {ok: false, retried, reason: "requestAdapter() returned null twice"};
  const info = adapter.info || {};
  return {ok: true, retried, vendor: info.vendor, architecture: info.architecture,
          isFallbackAdapter: !!(info.isFallbackAdapter ?? adapter.isFallbackAdapter),
          features: [...adapter.features], maxStorageBufferBindingSize: adapter.limits.maxStorageBufferBindingSize};
}"""


# Everything the page's adapter says about itself (description, driver, backend and type need
# --enable-webgpu-developer-features); when the default request answers null, whether a fallback
# adapter is there at all. page.evaluate(ADAPTER_INFO_JS) -> {ok, reason | {vendor, ..., fallback_only}}.
ADAPTER_INFO_JS = """async () => {
  if (!navigator.gpu) return {ok: false, reason: "navigator.gpu is missing (WebGPU is off)"};
  let adapter = await navigator.gpu.requestAdapter({powerPreference: "high-performance"});
  let fallbackOnly = false;
  if (!adapter) { adapter = await navigator.gpu.requestAdapter({forceFallbackAdapter: true}); fallbackOnly = !!adapter; }
  if (!adapter) return {ok: false, reason: "requestAdapter() returned null, also with forceFallbackAdapter"};
  const info = adapter.info || {};
  const limits = {};
  for (const key of ["maxBufferSize", "maxStorageBufferBindingSize", "maxComputeWorkgroupStorageSize",
                     "maxComputeInvocationsPerWorkgroup", "maxStorageBuffersPerShaderStage"]) limits[key] = adapter.limits[key];
  return {ok: true, fallback_only: fallbackOnly, vendor: info.vendor, architecture: info.architecture,
          description: info.description, device: info.device, driver: info.driver ?? null, backend: info.backend ?? null,
          type: info.type ?? null, is_fallback: !!(info.isFallbackAdapter ?? adapter.isFallbackAdapter),
          subgroup_min_size: info.subgroupMinSize ?? null, subgroup_max_size: info.subgroupMaxSize ?? null,
          features: [...adapter.features].sort(), limits};
}"""


def require_adapter(page) -> dict:
    info = page.evaluate(ADAPTER_JS, ADAPTER_RETRY_DELAY_MS)
    if not info["ok"]:
        raise HarnessError(f"WebGPU unavailable in the page: {info['reason']}. Chromium must run with --enable-unsafe-webgpu "
                           "and without --disable-software-rasterizer; under heavy machine load the adapter can be null — retry the run.")
    return info


def wait_for_boot(page, timeout_ms: int = BOOT_TIMEOUT_MS) -> dict:
    """Waits for the site's engine Worker to report Python ready; returns its boot report."""
    page.wait_for_function("() => window.pyshimBoot !== undefined", timeout=timeout_ms)
    boot = page.evaluate("() => window.pyshimBoot")
    if "error" in boot:
        raise HarnessError(f"the engine Worker failed to boot: {boot['error']}")
    return boot


def engine_request(page, kind: str, params: dict | None = None, timeout_ms: int = BOOT_TIMEOUT_MS):
    """Sends one request to the page's engine Worker and returns its result (raises on an engine error).
    The request's events go to `window.pyshimOnEngineEvent(event, data)` where a script has set one (the
    benchmark's JS-heap watch pauses while decode is timed)."""
    page.set_default_timeout(timeout_ms)
    outcome = page.evaluate(
        """async ([kind, params]) => {
             const onEvent = (event, data) => window.pyshimOnEngineEvent?.(event, data);
             try { return {ok: true, result: await window.pyshimEngine.request(kind, params, {onEvent})}; }
             catch (e) { return {ok: false, error: {name: e.name, message: e.message, hint: e.hint}}; }
           }""",
        [kind, params or {}],
    )
    if not outcome["ok"]:
        err = outcome["error"]
        raise HarnessError(f"engine {kind} failed: {err['name']}: {err['message']}")
    return outcome["result"]


# Puts a model into the site's IndexedDB store the way the page does (Range chunks, each hashed, the
# header first through Python's "will it fit?" against this page's adapter): page.evaluate(STORE_JS,
# [url, context, kvType, stream]) -> {id, model_id, status, error, ms, bytes}; kvType defaults to "auto", as
# the engine's; stream: the streaming the settings name ({streamed_layers, expert_slots}). `pyshim ...
# --backend browser` and the benchmark store their model so.
STORE_JS = """async ([url, context, kvType = "auto", stream = {}]) => {
  const store = await import(new URL("store/store.js", location.href).href);
  const { checkFit } = await import(new URL("engine/resolve.js", location.href).href);
  const engine = window.pyshimEngine;
  const adapter = await engine.request("gpu-selftest").then((gpu) => gpu.adapter, () => null);   // what the page judges by
  const created = await store.createFromURL(url);
  const t0 = performance.now();
  const ready = await store.download(created.id, {
    checkFit: (prefix, size) => checkFit(engine, adapter, context, prefix, size, kvType, stream ?? {}) });
  return { model_id: ready.id, id: ready.id, status: ready.status, error: ready.error, ms: performance.now() - t0, bytes: ready.size };
}"""
