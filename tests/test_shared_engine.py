"""createEngine({shared: true}): two pages of the origin share one engine (a SharedWorker: one Python,
one GPU device, one copy of the weights). The second page's engine comes up without booting Python or
loading the model again, and requests from both pages at once are queued, each answer equal to the one
its page got alone. Raw text completions with short prompts keep SwiftShader's prefill short."""

from __future__ import annotations

import time

import pytest

import harness
from site_helpers import smollm2_path

pytestmark = [pytest.mark.browser, pytest.mark.models, pytest.mark.slow]
PAGE = "examples/api.html"
CONTEXT = 512
PROMPTS = ("The capital of France is", "One, two, three,")
MAX_TOKENS = 4
TIMEOUT_MS = 600_000

CREATE_JS = """async ([context]) => {
  const { createEngine } = await import('/pyshim.js');
  const t0 = performance.now();
  window.engine = await createEngine({model: 'smollm2', context, shared: true});
  return {ms: performance.now() - t0, boot: await window.engine.client.request('boot'), stats: window.engine.stats()};
}"""

COMPLETE_JS = """async ([prompt, maxTokens]) =>
  (await window.engine.completions.create({prompt, temperature: 0, max_tokens: maxTokens})).choices[0].text"""

# Starts a completion and hands back a promise name to collect later, so two pages can run at once.
START_JS = """([prompt, maxTokens]) => {
  window.pending = window.engine.completions.create({prompt, temperature: 0, max_tokens: maxTokens})
    .then((r) => ({text: r.choices[0].text, done: Date.now()}));
}"""


@pytest.fixture(scope="module")
def two_pages(chromium, dev_server):
    smollm2_path()
    context = chromium.new_context()
    first, first_watch = harness.open_page(context, dev_server.url + PAGE)
    second, second_watch = harness.open_page(context, dev_server.url + PAGE)
    for page in (first, second):
        page.set_default_timeout(TIMEOUT_MS)
    yield (first, first_watch), (second, second_watch)
    context.close()


def test_two_pages_share_one_engine_and_their_requests_queue(two_pages):
    (first, first_watch), (second, second_watch) = two_pages
    created_first = first.evaluate(CREATE_JS, [CONTEXT])
    created_second = second.evaluate(CREATE_JS, [CONTEXT])
    # One Python: the second page gets the boot report of the first page's boot, not one of its own.
    assert created_second["boot"] == created_first["boot"]
    assert created_second["stats"]["load"]["gpu_ms"] < created_first["stats"]["load"]["gpu_ms"] / 2   # weights already on the GPU
    solo = [first.evaluate(COMPLETE_JS, [PROMPTS[0], MAX_TOKENS]), second.evaluate(COMPLETE_JS, [PROMPTS[1], MAX_TOKENS])]
    assert solo[0] != solo[1]
    t0 = time.time()
    first.evaluate(START_JS, [PROMPTS[0], MAX_TOKENS])
    second.evaluate(START_JS, [PROMPTS[1], MAX_TOKENS])
    together = [first.evaluate("() => window.pending"), second.evaluate("() => window.pending")]
    assert [t["text"] for t in together] == solo
    print(f"shared engine: first page ready in {created_first['ms'] / 1000:.1f} s, second in {created_second['ms'] / 1000:.1f} s; "
          f"two queued completions in {time.time() - t0:.1f} s")
    first_watch.check()
    second_watch.check()
