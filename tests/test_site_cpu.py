"""The site in a browser without WebGPU (Chromium without its unsafe-WebGPU switch, the feature off: no
adapter, as a blocklisted GPU gives): it says
so, says models run on the CPU, and still stores SmolLM2, loads it into the WebAssembly engine
(web/engine/cpu.js, store -> its memory in JS) and chats — the greedy reply, in f32, equal to the CPU
reference's. (With a software adapter, "auto" measures: tests/test_site_chat.py.)"""

from __future__ import annotations

import pytest

import harness
from site_helpers import open_site, smollm2_path, wait_status
from test_site_chat import EXACT, MODEL, ask, cpu_reference_reply

pytestmark = [pytest.mark.browser, pytest.mark.models, pytest.mark.slow]


@pytest.fixture(scope="module")
def site(dev_server):
    from playwright.sync_api import sync_playwright

    smollm2_path()
    with sync_playwright() as p:
        browser = harness.launch_chromium(p, webgpu=False)
        context, page, watch = open_site(browser, dev_server, wait_gpu=False)
        yield context, page, watch
        context.close()
        browser.close()


def test_without_webgpu_the_site_chats_on_the_cpu_engine(site):
    _, page, watch = site
    assert page.evaluate("async () => !navigator.gpu || (await navigator.gpu.requestAdapter()) === null")
    page.wait_for_selector("#status[data-state=cpu]", timeout=harness.BOOT_TIMEOUT_MS)
    assert "CPU" in page.inner_text("#status")
    page.click(f"#models li:has-text('{MODEL}') button")
    wait_status(page, MODEL, "ready")
    text = ask(page, {**EXACT, "kv_type": "f32", "device": "auto"})
    loaded = page.evaluate("() => window.pyshimEngine.request('stats')")["loaded"]
    assert loaded["settings"]["device"] == "cpu", loaded
    assert loaded["engine"]["reason"].startswith("the CPU engine runs it: no WebGPU here"), loaded
    assert text == cpu_reference_reply().strip()
    assert "Paris" in text
    assert "tok/s" in page.inner_text("#messages")
    watch.check()

