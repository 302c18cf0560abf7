"""`--backend browser`: one request run inside headless Chromium — Pyodide, pyshim and the WebGPU executor
in the site's engine Worker, as a visitor's browser runs them — and its result brought back to the CLI.

The dev server and Chromium come from the checkout's playwright/harness.py (not an importable package on
purpose: it sits next to the Playwright library's own name). The model file goes into the page's
IndexedDB store the way the site stores any model (header first through Python's probe, then Range
chunks), then the Worker loads it store → GPU along Python's upload plan and runs the request
(web/engine/runs.js: `complete`, `score`). A file outside the dev server's models/ folder is served to
the page from disk by a Playwright route.
"""

from __future__ import annotations

import contextlib
import re
import sys
import tempfile
from pathlib import Path
from typing import Callable

from pyshim.errors import GPUUnavailableError, PyshimError, SetupError
from pyshim.paths import IN_CHECKOUT, MODELS_DIR, PLAYWRIGHT_DIR, VENDOR_DIR

REQUEST_TIMEOUT_MS = 3_600_000     # one request on SwiftShader: Gemma 3 decodes ~0.5 tok/s on a loaded machine
STORE_TIMEOUT_MS = 600_000
ROUTED_PREFIX = "cli-model/"       # the page's URL for a model file served from disk (outside models/)
_RANGE = re.compile(r"bytes=(\d+)-(\d*)")

# One engine request; token events go to the exposed `pyshimCliToken` when streaming.
REQUEST_JS = """async ([kind, params, stream]) => {
  const onEvent = stream ? (event, data) => { if (event === "token") window.pyshimCliToken(data.text); } : null;
  try { return { ok: true, result: await window.pyshimEngine.request(kind, params, { onEvent }) }; }
  catch (e) { return { ok: false, error: { name: e.name, message: e.message, hint: e.hint ?? null } }; }
}"""


def open_header(path: Path):
    """The header of a model file, checked here (architecture, what the forward does) before the browser
    starts."""
    from pyshim.gguf.header import read_header_from_file
    from pyshim.gguf.spec import ModelSpec, check_supported

    header = read_header_from_file(path)
    check_supported(ModelSpec.from_header(header))
    return header


def _harness():
    if not IN_CHECKOUT or not (PLAYWRIGHT_DIR / "harness.py").is_file():
        raise SetupError("--backend browser runs from a pyshim checkout (it drives playwright/harness.py)",
                         hint="clone the repository and install it with `pip install -e .`")
    try:
        import playwright.sync_api  # noqa: F401  (the library, before playwright/ goes on the path)
    except ImportError:
        raise SetupError("--backend browser needs the Playwright library",
                         hint="pip install playwright (never `playwright install`: Debian's chromium is used)") from None
    if str(PLAYWRIGHT_DIR) not in sys.path:
        sys.path.insert(0, str(PLAYWRIGHT_DIR))
    import harness

    return harness


def _engine_error(error: dict) -> PyshimError:
    """An error the Worker answered, as the pyshim error of the same name when there is one."""
    from pyshim import errors

    cls = getattr(errors, error.get("name") or "", None)
    if not (isinstance(cls, type) and issubclass(cls, PyshimError)):
        cls = PyshimError
    message = error.get("message") or "the engine Worker failed"
    return cls(message if cls is not PyshimError else f"{error.get('name')}: {message}", hint=error.get("hint"))


def _serve_file(path: Path):
    """A Playwright route handler answering GET (with Range) for `path`, read from disk."""
    size = path.stat().st_size

    def handle(route):
        wanted = _RANGE.fullmatch(route.request.headers.get("range", "").strip())
        headers = {"Accept-Ranges": "bytes", "Content-Type": "application/octet-stream",
                   "ETag": f'"{size}-{int(path.stat().st_mtime)}"'}
        first, last = (0, size - 1) if not wanted else (int(wanted.group(1)), int(wanted.group(2) or size - 1))
        last = min(last, size - 1)
        with path.open("rb") as f:
            f.seek(first)
            body = f.read(last + 1 - first)
        if wanted:
            headers["Content-Range"] = f"bytes {first}-{last}/{size}"
        route.fulfill(status=206 if wanted else 200, headers=headers, body=body)

    return handle


def run(model: Path, kind: str, params: dict, *, on_text: Callable[[str], None] | None = None) -> dict:
    """Runs one Worker request (`complete` or `score`) on `model` in headless Chromium; its result.
    `params` without the model: it is stored in the page and named by its store id here."""
    with session(model, (params.get("settings") or {})) as request:
        return request(kind, params, on_text=on_text)


@contextlib.contextmanager
def session(model: Path, settings: dict | None = None):
    """Headless Chromium with `model` stored in its page (for `settings`' context and KV type): yields
    request(kind, params, on_text=None) -> result, for as many requests as the caller makes (the
    benchmarks: one boot and one store for all their runs)."""
    harness = _harness()
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    from pyshim.setup import vendoring

    model = Path(model).resolve()
    settings = settings or {}
    if not Path(harness.CHROMIUM).exists():      # before the dev server and the wheel build: fail fast
        raise SetupError(f"--backend browser needs Chromium, and {harness.CHROMIUM} is missing",
                         hint="apt-get install -y chromium (or set PYSHIM_CHROMIUM to a Chromium binary); "
                              "never `playwright install`, it downloads a browser")
    if not (VENDOR_DIR / "manifest.json").is_file():
        raise SetupError("web/vendor is missing (Pyodide and the wheels the page loads)", hint="run `pyshim setup` first")
    vendoring.refresh_pyshim()          # the Worker installs pyshim from this wheel: make it this checkout's code
    gpu_only = settings.get("device") == "gpu"
    try:
        # the CPU engine's threads share memory between Workers: the page must be cross-origin isolated
        # wherever it may run (device cpu, or auto: no adapter, or a probe that finds it faster)
        with harness.DevServer(isolated=not gpu_only) as server, sync_playwright() as p, \
                tempfile.TemporaryDirectory(prefix="pyshim-chromium-") as profile:
            try:
                # an on-disk profile: an incognito-like one keeps IndexedDB in memory and refuses a
                # multi-GB model. Service workers blocked: the site's precaching would compete for the cores.
                context = harness.launch_persistent(p, profile, service_workers="block")
            except harness.HarnessError as exc:
                raise SetupError(str(exc)) from None
            try:
                page, _ = harness.open_page(context, server.url)
                try:
                    if gpu_only:
                        harness.require_adapter(page)
                except harness.HarnessError as exc:
                    raise GPUUnavailableError(str(exc), hint="try --device cpu (the WebAssembly engine), --backend gpu "
                                                             "(native wgpu) or --backend cpu") from None
                harness.wait_for_boot(page)
                if model.is_relative_to(MODELS_DIR.resolve()):
                    url = server.url + "models/" + model.relative_to(MODELS_DIR.resolve()).as_posix()
                else:
                    url = server.url + ROUTED_PREFIX + model.name
                    context.route(url, _serve_file(model))      # registered last: matched before the network guard
                page.set_default_timeout(STORE_TIMEOUT_MS)
                stream = {k: settings.get(k) for k in ("streamed_layers", "expert_slots")}
                stored = page.evaluate(harness.STORE_JS, [url, settings.get("context"), settings.get("kv_type") or "auto", stream])
                if stored["status"] != "ready":
                    raise _engine_error(stored.get("error") or {"message": f"the model could not be stored ({stored['status']})"})
                sink: list = [None]
                page.expose_function("pyshimCliToken", lambda text: sink[0] and sink[0](text))

                def request(kind: str, params: dict, *, on_text: Callable[[str], None] | None = None) -> dict:
                    sink[0] = on_text
                    page.set_default_timeout(REQUEST_TIMEOUT_MS)
                    outcome = page.evaluate(REQUEST_JS, [kind, {**params, "model_id": stored["id"]}, on_text is not None])
                    if not outcome["ok"]:
                        raise _engine_error(outcome["error"])
                    return outcome["result"]

                yield request
            finally:
                context.close()
    except harness.HarnessError as exc:      # the dev server or the Worker's boot
        raise PyshimError(str(exc)) from None
    except PlaywrightError as exc:
        raise PyshimError(f"headless Chromium failed: {str(exc).splitlines()[0]}") from None
