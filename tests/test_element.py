"""<pyshim-chat> in web/examples/element.html (one script tag, one element) from a clean profile: it
shows the download and load inside itself, answers, stops
on Stop, shows user text as text, shares its engine with another element of the same model, and shows
an unknown model's error inside itself. One page for the module (SwiftShader: ~1 s per token)."""

from __future__ import annotations

import time

import pytest

import harness
from site_helpers import shot, smollm2_path

pytestmark = [pytest.mark.browser, pytest.mark.models, pytest.mark.slow]
PAGE = "examples/element.html"
QUESTION = "What is the capital of France?"
MAX_TOKENS = 8
READY_TIMEOUT_MS = 300_000      # Python boot + 98 MB into IndexedDB + GPU load, on 2 busy cores
REPLY_TIMEOUT_MS = 600_000

# Records every text the element's status line shows, from the moment the element is defined.
STATUS_LOG_JS = """customElements.whenDefined('pyshim-chat').then(() => {
  const status = document.querySelector('pyshim-chat').shadowRoot.querySelector('.status');
  window.statusLog = [status.textContent];
  new MutationObserver(() => window.statusLog.push(status.textContent)).observe(status, {childList: true, characterData: true, subtree: true});
});"""

SEND_JS = """async ([text, attrs]) => {
  const el = document.querySelector('pyshim-chat');
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  const reply = new Promise((resolve) => el.addEventListener('pyshim-reply', (e) => resolve(e.detail), {once: true}));
  const input = el.shadowRoot.querySelector('textarea');
  input.value = text;
  el.shadowRoot.querySelector('button[type=submit]').click();
  return reply;
}"""


@pytest.fixture(scope="module")
def element_page(chromium, dev_server):
    smollm2_path()
    context = chromium.new_context(viewport={"width": 900, "height": 800})
    context.add_init_script(STATUS_LOG_JS)
    t0 = time.monotonic()
    page, watch = harness.open_page(context, dev_server.url + PAGE)
    page.wait_for_selector("pyshim-chat[data-state=ready]", timeout=READY_TIMEOUT_MS)
    ready_s = time.monotonic() - t0
    page.set_default_timeout(REPLY_TIMEOUT_MS)
    yield page, watch, ready_s
    context.close()


def test_the_element_shows_progress_and_answers(element_page):
    page, watch, ready_s = element_page
    log = page.evaluate("() => window.statusLog")
    assert any(s.startswith("Downloading") and s.endswith("%") for s in log), log
    assert any(s.startswith("Loading onto the GPU") for s in log), log
    assert log[-1] == "smollm2 · ready"
    reply = page.evaluate(SEND_JS, [QUESTION, {"max-tokens": str(MAX_TOKENS), "temperature": "0"}])
    shown = page.locator("pyshim-chat .message.assistant span").first.inner_text()
    assert reply["text"] == shown and reply["finish_reason"] in ("stop", "length")
    assert reply["text"].strip() and reply["usage"]["completion_tokens"] <= MAX_TOKENS   # its words: test_site_chat's business
    assert "first token" in page.locator("pyshim-chat .message.assistant .stats").first.inner_text()
    shot(page, "20-element-reply")
    print(f"element ready {ready_s:.1f} s after opening the page (clean profile); time to first token {reply['ttft_ms'] / 1000:.1f} s")
    watch.check()


def test_stop_ends_the_reply_and_user_text_stays_text(element_page):
    page, _, _ = element_page
    markup = '<img src=x onerror="window.pwned = 1"> Tell me a long story.'
    page.evaluate("""(text) => {
      const el = document.querySelector('pyshim-chat');
      el.clear();   // a fresh conversation: a short prompt to prefill
      el.setAttribute('max-tokens', '64');
      window.stopped = new Promise((resolve) => el.addEventListener('pyshim-reply', (e) => resolve(e.detail), {once: true}));
      el.shadowRoot.querySelector('textarea').value = text;
      el.shadowRoot.querySelector('button[type=submit]').click();
    }""", markup)
    page.wait_for_selector("pyshim-chat[data-state=busy]")
    page.click("pyshim-chat button.stop")
    reply = page.evaluate("() => window.stopped")
    assert reply["finish_reason"] == "abort" and reply["usage"]["completion_tokens"] < 64
    assert page.locator("pyshim-chat .message.user").last.inner_text() == markup
    assert page.evaluate("() => document.querySelector('pyshim-chat').shadowRoot.querySelectorAll('img').length") == 0
    assert page.evaluate("() => window.pwned") is None
    assert "stopped" in page.locator("pyshim-chat .message.assistant .stats").last.inner_text()
    page.wait_for_selector("pyshim-chat[data-state=ready]")


def test_a_second_element_shares_the_engine(element_page):
    page, _, _ = element_page
    same = page.evaluate("""async () => {
      const first = document.querySelector('pyshim-chat');
      const second = document.createElement('pyshim-chat');
      second.setAttribute('model', 'smollm2');
      const ready = new Promise((resolve) => second.addEventListener('pyshim-ready', resolve, {once: true}));
      const t0 = performance.now();
      document.body.append(second);
      await ready;
      const ms = performance.now() - t0;
      second.remove();
      return {same: second.engine === first.engine, ms};
    }""")
    assert same["same"] and same["ms"] < 5_000, same


def test_an_unknown_model_shows_its_error_inside(element_page):
    page, _, _ = element_page
    out = page.evaluate("""async () => {
      const el = document.createElement('pyshim-chat');
      el.setAttribute('model', 'no-such-model');
      const failed = new Promise((resolve) => el.addEventListener('pyshim-error', (e) => resolve(e.detail), {once: true}));
      document.body.append(el);
      const detail = await failed;
      const box = el.shadowRoot.querySelector('.error');
      const out = {detail, state: el.dataset.state, hidden: box.hidden, text: box.textContent,
                   disabled: el.shadowRoot.querySelector('textarea').disabled};
      el.remove();
      return out;
    }""")
    assert out["state"] == "error" and not out["hidden"] and out["disabled"]
    assert 'unknown model "no-such-model"' in out["text"] and "smollm2" in out["text"]   # the hint names what works
