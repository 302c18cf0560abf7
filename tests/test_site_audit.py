"""Accessibility and installability audits of the site (issue #25): axe-core (web/vendor/axe/, placed by
`pyshim setup`; a test dependency, not part of the app) finds no serious or critical violation in the
main page after boot, with its Settings open, holding a conversation with a reply, nor in the example
pages; the chat works from the keyboard alone; and the registered service worker controls the page.

Replies come from the stand-in engine (site_helpers.FAKE_ENGINE_JS) on a tiny GGUF imported through
the File tab, so no real model is needed. The manifest's and icons' static checks are in
tests/test_site_shell.py (test_manifest_is_installable); the offline reload with the network off is
tests/test_site_offline.py's test_offline_after_one_visit."""

from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType as QT

import harness
from site_helpers import FAKE_ENGINE_JS, ROOT, open_site, shot, wait_status
from tiny_models import write_tiny_model

pytestmark = [pytest.mark.browser, pytest.mark.slow]
AXE_JS = ROOT / "web" / "vendor" / "axe" / "axe.min.js"
BLOCKING = ("serious", "critical")     # the impacts a test fails on; minor and moderate ones are printed
MAX_TABS = 80                          # Tab presses allowed to reach the message box from the top of the page


def axe(page) -> list[dict]:
    """axe-core's violations in the page as it is now (shadow roots included): dicts with id, impact,
    help, helpUrl and nodes (each with target, html and failureSummary)."""
    if not AXE_JS.is_file():
        pytest.fail("web/vendor/axe is missing: run `pyshim setup`")
    if not page.evaluate("() => typeof window.axe?.run === 'function'"):
        page.add_script_tag(path=str(AXE_JS))
    return page.evaluate("async () => (await axe.run(document, {resultTypes: ['violations']})).violations")


def describe(violations: list[dict]) -> str:
    lines = []
    for v in violations:
        lines.append(f"[{v['impact']}] {v['id']}: {v['help']} ({v['helpUrl']})")
        for node in v["nodes"]:
            lines.append(f"    {node['target']}  {node['html'][:160]}")
            summary = (node.get("failureSummary") or "").replace("\n", " / ")
            if summary:
                lines.append(f"        {summary[:300]}")
    return "\n".join(lines)


def assert_accessible(page, where: str) -> None:
    violations = axe(page)
    lesser = [v for v in violations if v["impact"] not in BLOCKING]
    if lesser:
        print(f"axe, {where}: minor/moderate\n{describe(lesser)}")
    blocking = [v for v in violations if v["impact"] in BLOCKING]
    assert not blocking, f"axe found serious or critical violations in {where}:\n{describe(blocking)}"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("audit-model"), "llama", QT.Q8_0)


@pytest.fixture(scope="module")
def site(chromium, dev_server):
    context, page, watch = open_site(chromium, dev_server, wait_gpu=False)
    page.wait_for_selector("#status:not([data-state=booting])", timeout=harness.BOOT_TIMEOUT_MS)
    yield context, page, watch
    context.close()


@pytest.fixture(scope="module")
def chatting(site, tiny_model):
    """The site with the tiny model stored and selected, answering through the stand-in engine."""
    _, page, _ = site
    page.click("[aria-controls=tab-file]")
    page.set_input_files("#file-input", str(tiny_model))
    wait_status(page, tiny_model.name, "ready")
    page.evaluate(FAKE_ENGINE_JS)
    page.click(f"#stored li:has-text('{tiny_model.name}') .row-main")
    page.wait_for_selector("#chat[data-state=ready]")
    return page


def replies(page) -> int:
    return page.locator(".msg.assistant .stats").count()


def wait_reply(page, before: int) -> None:
    page.wait_for_function("(n) => document.querySelectorAll('.msg.assistant .stats').length > n"
                           " && document.getElementById('stop').hidden", arg=before)


def test_main_page_after_boot(site):
    _, page, _ = site
    assert_accessible(page, "the main page after boot")


def test_main_page_with_settings_open(site):
    _, page, _ = site
    page.click("#settings-toggle")
    page.wait_for_selector("#settings:not([hidden])")
    try:
        assert_accessible(page, "the main page with Settings open")
    finally:
        page.click("#settings-toggle")


def test_main_page_holding_a_reply(chatting):
    page = chatting
    before = replies(page)
    page.fill("#prompt", "echo how do you do")
    page.click("#send")
    wait_reply(page, before)
    assert "reply" in page.locator(".msg.assistant .bubble").last.inner_text()
    page.wait_for_function("() => document.querySelectorAll('#chats li').length > 0")   # saved and listed
    shot(page, "30-audit-conversation")
    assert_accessible(page, "the main page holding a conversation with a reply")


def test_phone_width_with_the_sidebar_open(chromium, dev_server):
    context = chromium.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    try:
        page, _ = harness.open_page(context, dev_server.url)
        harness.wait_for_boot(page)
        assert_accessible(page, "the chat at 390x844")
        page.click("#sidebar-toggle")
        page.wait_for_selector("#stored-panel", state="visible")
        assert_accessible(page, "the sidebar at 390x844")
    finally:
        context.close()


def test_keyboard_alone_sends_and_stops(chatting):
    page = chatting
    page.evaluate("() => document.activeElement?.blur()")
    for presses in range(1, MAX_TABS + 1):
        page.keyboard.press("Tab")
        if page.evaluate("() => document.activeElement?.id") == "prompt":
            break
    else:
        pytest.fail(f"{MAX_TABS} presses of Tab never reached the message box")
    print(f"Tab presses to the message box: {presses}")
    # ...or one: the page's first Tab stop skips straight there
    first = page.evaluate("() => [...document.querySelectorAll('a[href], button, input, textarea, select, [tabindex]')]"
                          ".find(el => !el.disabled && el.tabIndex >= 0)?.textContent")
    assert first == "Skip to the message box"
    page.focus(".skip-link")
    page.keyboard.press("Enter")
    page.wait_for_function("() => document.activeElement?.id === 'prompt'")
    before = replies(page)
    page.keyboard.type("echo typed, not clicked")
    page.keyboard.press("Enter")
    wait_reply(page, before)
    assert page.locator(".msg.user .bubble").last.inner_text() == "echo typed, not clicked"
    assert page.evaluate("() => document.getElementById('prompt').value") == ""
    # A long reply (400 words from the stand-in), stopped with Escape.
    page.keyboard.type("talk forever")
    page.keyboard.press("Enter")
    page.wait_for_selector("#stop:not([hidden])")
    page.wait_for_function("() => document.querySelector('.msg.assistant:last-child .bubble')?.textContent.includes('word3')")
    page.keyboard.press("Escape")
    page.wait_for_selector(".msg.assistant .stats:has-text('stopped')", timeout=10_000)
    assert page.is_hidden("#stop")
    assert "word399" not in page.locator(".msg.assistant .bubble").last.inner_text()


def test_service_worker_controls_the_page_after_a_reload(site):
    """The installability half the browser must show: a registered worker with a fetch handler takes the
    page over (sw.js's fetch handler itself is checked in test_site_shell; going offline, in test_site_offline)."""
    _, page, _ = site
    page.wait_for_function("() => window.pyshimOffline === true", timeout=harness.BOOT_TIMEOUT_MS)
    page.reload()
    harness.wait_for_boot(page)
    controller = page.evaluate("() => navigator.serviceWorker.controller?.scriptURL ?? null")
    assert controller and controller.endswith("/sw.js"), controller
    manifest = page.evaluate("async () => { const r = await fetch(document.querySelector('link[rel=manifest]').href); return r.ok && await r.json(); }")
    assert manifest and manifest["start_url"]


# Each example page, once its own content has rendered (not waiting for a model: the audit is of the page).
EXAMPLES = {
    "api.html": "() => document.getElementById('send') !== null",
    "element.html": "() => document.querySelector('pyshim-chat')?.shadowRoot?.querySelector('textarea') != null",
    "openai.html?engine=none": "() => document.body.dataset.state === 'ready'",
    "pyscript.html": "() => document.readyState === 'complete' && document.getElementById('send') !== null",
}


@pytest.mark.parametrize("example", list(EXAMPLES), ids=[e.split(".")[0] for e in EXAMPLES])
def test_example_page(chromium, dev_server, example):
    context = chromium.new_context()
    try:
        page, _ = harness.open_page(context, dev_server.url + "examples/" + example)
        page.wait_for_function(EXAMPLES[example], timeout=60_000)
        shot(page, f"31-audit-example-{example.split('.')[0]}")
        assert_accessible(page, f"examples/{example}")
    finally:
        context.close()
