"""The Python API in a PyScript page (web/examples/pyscript.html), from a clean profile: PyScript boots
Pyodide and the pyshim wheel from the site's vendor/ folder (no CDN), `pyshim.api.load("smollm2")`
downloads the model through the store from the dev server into pyshim's JS engine, and the streamed
reply equals the non-streamed one for the same greedy request; a bad request raises BadRequestError."""

from __future__ import annotations

import pytest

import harness
from site_helpers import smollm2_path

pytestmark = [pytest.mark.browser, pytest.mark.models, pytest.mark.slow]
MAX_TOKENS = 8
READY_TIMEOUT_MS = 600_000    # PyScript + the engine Worker's Python + download + GPU load, on 2 busy cores
REPLY_TIMEOUT_MS = 900_000    # two greedy replies on SwiftShader


def test_python_api_streams_the_same_text_it_answers(chromium, dev_server):
    smollm2_path()
    context = chromium.new_context()
    try:
        page, watch = harness.open_page(context, dev_server.url + "examples/pyscript.html")
        page.wait_for_function("() => ['ready', 'error'].includes(document.body.dataset.state)", timeout=READY_TIMEOUT_MS)
        assert page.evaluate("() => document.body.dataset.state") == "ready", page.inner_text("#status")
        page.fill("#max-tokens", str(MAX_TOKENS))
        page.click("#send")
        page.wait_for_function("() => document.getElementById('same').textContent"
                               " || document.getElementById('status').textContent.includes('a bug in pyshim')", timeout=REPLY_TIMEOUT_MS)
        streamed, whole = page.inner_text("#streamed"), page.inner_text("#whole")
        assert streamed.strip() and streamed == whole, (streamed, whole, page.inner_text("#status"))
        assert page.inner_text("#same") == "Same text both ways (greedy)."
        status = page.inner_text("#status")
        assert status.startswith("done: ") and "finish_reason" in status
        assert int(status.split()[1]) <= MAX_TOKENS
        # A bad request is refused by the same validation as in CPython, before any work, as BadRequestError.
        page.fill("#max-tokens", "-1")
        page.click("#send")
        page.wait_for_function("() => document.getElementById('status').textContent.startsWith('BadRequestError')", timeout=30_000)
        assert "`max_tokens` must be a positive integer, got -1" in page.inner_text("#status")
        # Python came from the site: the interpreter, numpy and pyshim's wheel, and nothing from outside.
        assert any(r.endswith("vendor/pyodide/pyodide.asm.wasm") for r in watch.requests)
        assert any("vendor/wheels/pyshim-" in r for r in watch.requests)
        watch.check()
    finally:
        context.close()
