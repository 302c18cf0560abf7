"""A local file imported chunk by chunk (file input and drag-and-drop), then the site offline: after
one online visit the service worker serves the app and Python, and the stored models are listed."""

from __future__ import annotations

import re

import pytest

import harness
from site_helpers import FAKE_ENGINE_JS, OFFLINE_CONSOLE_NOISE, SMOLLM2, open_site, row_text, shot, smollm2_path, store_ok, wait_status

pytestmark = [pytest.mark.browser, pytest.mark.models, pytest.mark.slow]
FILE_NAME = SMOLLM2.file_name


@pytest.fixture(scope="module")
def site(chromium, dev_server):
    smollm2_path()
    context, page, watch = open_site(chromium, dev_server)
    yield context, page, watch
    context.set_offline(False)
    context.close()


def test_service_worker_takes_over(site):
    _, page, _ = site
    page.wait_for_function("() => window.pyshimOffline === true", timeout=harness.BOOT_TIMEOUT_MS)
    caches = page.evaluate("() => caches.keys()")
    assert any(c.startswith("pyshim-shell-") for c in caches), caches
    cached = page.evaluate("async () => (await (await caches.open((await caches.keys()).find(k => k.startsWith('pyshim-shell-')))).keys()).map(r => r.url)")
    assert any(u.endswith("pyodide.asm.wasm") for u in cached) and any("pyshim-" in u and u.endswith(".whl") for u in cached)
    assert not any("/models/" in u for u in cached)


def test_a_controlled_page_is_cross_origin_isolated(site, dev_server):
    """The dev server here sends no COOP/COEP (no --isolated), as a static host would not: the service
    worker adds them, so a second visit can share memory between Workers (the CPU engine's threads)."""
    context, page, _ = site
    assert page.evaluate("() => navigator.serviceWorker.controller !== null")
    second = context.new_page()
    second.goto(dev_server.url)
    assert second.evaluate("() => self.crossOriginIsolated && typeof SharedArrayBuffer === 'function'")
    second.close()


def test_import_local_file_through_the_file_input(site):
    _, page, watch = site
    page.click("[aria-controls=tab-file]")
    before = len(watch.requests)
    page.set_input_files("#file-input", str(smollm2_path()))
    wait_status(page, FILE_NAME, "ready")
    assert not any("/models/" in r for r in watch.requests[before:])   # read from the file, not the server
    models = store_ok(page, "listModels")
    (manifest,) = [m for m in models if m["name"] == FILE_NAME]
    assert manifest["source"]["kind"] == "file" and manifest["size"] == SMOLLM2.size
    assert manifest["sha256"] == SMOLLM2.sha256 and len(manifest["chunks"]) == 6 and all(manifest["chunks"])
    assert "local file" in row_text(page, FILE_NAME)


def test_drag_and_drop_goes_through_the_same_store(site):
    _, page, _ = site
    page.evaluate("""() => {
        const dt = new DataTransfer();
        dt.items.add(new File(['just some notes, not a model'], 'notes.gguf', {type: 'application/octet-stream'}));
        document.getElementById('dropzone').dispatchEvent(new DragEvent('drop', {dataTransfer: dt, bubbles: true, cancelable: true}));
    }""")
    wait_status(page, "notes.gguf", "refused", 60_000)
    assert "not a GGUF file" in row_text(page, "notes.gguf")
    page.click("#stored li:has-text('notes.gguf') button:has-text('Delete')")
    page.wait_for_selector("#stored li:has-text('notes.gguf')", state="detached")


def test_generate_protocol_refuses_a_model_that_is_not_stored(site):
    _, page, _ = site
    caps = harness.engine_request(page, "capabilities")
    assert caps["generate"] is True and {"generate", "abort", "probe-bytes", "store-digest"} <= set(caps["kinds"])
    err = page.evaluate("""async () => { try { await window.pyshimEngine.request('generate', {model_id: 'url:nowhere',
                                                    messages: [{role: 'user', content: 'hi'}]}); }
                                         catch (e) { return {name: e.name, hint: e.hint}; } }""")
    assert err["name"] == "ModelNotFoundError" and err["hint"]      # (ModelNotReadyError: stored in part)
    # a request of the wrong shape never reaches the Worker: refused by the shared schema, the field named
    bad = page.evaluate("""async () => { try { await window.pyshimEngine.request('generate', {model_id: 'url:nowhere', messages: []}); }
                                         catch (e) { return {name: e.name, param: e.param, message: e.message}; } }""")
    assert bad == {"name": "BadRequestError", "param": "messages",
                   "message": "`messages` must be a non-empty list of {role, content}, got []"}
    assert harness.engine_request(page, "abort", {"request_id": 12345}) == {"aborted": False}

def test_chat_ui_streams_text_safely_with_a_stand_in_engine(site):
    _, page, _ = site
    page.click(f"#stored li:has-text('{FILE_NAME}') .row-main")
    page.evaluate(FAKE_ENGINE_JS)
    page.wait_for_selector("#chat[data-state=ready]")
    assert page.is_hidden("#notice")
    page.fill("#prompt", "Show me <b>markup</b>")
    page.click("#send")
    page.wait_for_selector(".msg.assistant .stats:has-text('tok/s')")
    reply = page.locator(".msg.assistant .bubble").last
    assert "<script>window.pwned = 1</script>" in reply.inner_text()
    assert page.evaluate("() => window.pwned") is None
    assert page.locator(".messages script, .messages img").count() == 0
    assert reply.locator("strong").inner_text() == "bold" and reply.locator("pre code").inner_text() == 'print("hi")'
    assert page.locator(".msg.user .bubble").inner_text() == "Show me <b>markup</b>"
    sent = page.evaluate("() => window.lastGenerate")
    assert sent["messages"][0]["role"] == "system" and sent["messages"][-1] == {"role": "user", "content": "Show me <b>markup</b>"}
    assert set(sent["sampling"]) == {"temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                                     "frequency_penalty", "max_tokens", "seed"}
    shot(page, "09-chatting-stand-in-engine")
    page.fill("#prompt", "talk forever")
    page.click("#send")
    page.wait_for_selector("#stop:visible")
    page.click("#stop")
    page.wait_for_selector(".msg.assistant .stats:has-text('stopped')")
    assert page.is_hidden("#stop")
    page.click("#new-chat")
    assert page.locator(".msg").count() == 0


def test_a_new_version_replaces_the_old_cache(site, dev_server):
    context, page, _ = site
    page.evaluate("() => caches.open('pyshim-shell-v0').then(c => c.put('/stale', new Response('old')))")
    source = (harness.ROOT / "web" / "sw.js").read_text()
    current = re.search(r'const CACHE_VERSION = "([^"]+)";', source)
    assert current, "sw.js names its cache version"
    upgraded = source.replace(current.group(0), 'const CACHE_VERSION = "v2-test";')
    context.route("**/sw.js", lambda route: route.fulfill(status=200, content_type="text/javascript", body=upgraded))
    try:
        page.evaluate("async () => (await navigator.serviceWorker.getRegistration()).update()")
        page.wait_for_function("() => caches.keys().then(k => k.length === 1 && k[0] === 'pyshim-shell-v2-test')", timeout=60_000)
    finally:
        context.unroute("**/sw.js")

def test_offline_after_one_visit(site):
    context, page, watch = site
    context.set_offline(True)
    page.reload()
    boot = harness.wait_for_boot(page)
    assert boot["versions"]["pyshim"] and boot["total_ms"] > 0
    wait_status(page, FILE_NAME, "ready", 30_000)
    page.wait_for_function("() => document.querySelector('#server-note').textContent.includes('No dev server')")
    page.wait_for_selector("#status[data-state=ready]", timeout=harness.BOOT_TIMEOUT_MS)
    assert page.evaluate("() => navigator.onLine") is False
    shot(page, "08-offline-stored-model")
    # ...and the stored model loads into the GPU and answers, with the network still off.
    page.click("#settings-toggle")
    for key, value in {"temperature": "0", "max_tokens": "2", "context": "512"}.items():
        page.fill(f"#set-{key}", value)
        page.dispatch_event(f"#set-{key}", "change")
    page.click("#settings-toggle")
    page.fill("#prompt", "Hello!")
    page.click("#send")
    page.wait_for_selector("#stop:not([hidden])")
    page.wait_for_selector("#stop", state="hidden", timeout=600_000)
    assert page.locator(".msg.assistant .bubble").last.inner_text().strip()
    assert "hit max tokens" in page.locator(".msg.assistant .stats").last.inner_text()
    watch.check(allow_console_errors=OFFLINE_CONSOLE_NOISE)
