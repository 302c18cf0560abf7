"""Chat in the real site: SmolLM2 downloaded into IndexedDB, loaded IndexedDB → GPU buffers by the
Worker along Python's upload plan, and a greedy reply streamed by the WebGPU executor (SwiftShader
here) that equals `pyshim generate --backend cpu` for the same messages and template — with the exact
(f32) arithmetic the settings offer, for an f32 KV cache and for a q8 one (the reference rounding its
cache the same way). The adapter's default arithmetic (int8 on CPU adapters) is held to llama.cpp by
the executor's own tests. Left to "auto", the page measures SwiftShader against the CPU engine and runs
the faster (the last test)."""

from __future__ import annotations

import time

import pytest

from site_helpers import open_site, shot, smollm2_path, wait_status

pytestmark = [pytest.mark.browser, pytest.mark.models, pytest.mark.slow]
MODEL = "SmolLM2-135M-Instruct.Q4_1"
QUESTION = "What is the capital of France?"
MAX_TOKENS = 8
REPLY_TIMEOUT_MS = 600_000   # load + prefill + 8 tokens on SwiftShader, a CPU adapter, on 2 busy cores


@pytest.fixture(scope="module")
def site(chromium, dev_server):
    smollm2_path()
    context, page, watch = open_site(chromium, dev_server)
    yield context, page, watch
    context.close()


def cpu_reference_reply(kv_type: str = "f32") -> str:
    import asyncio
    import concurrent.futures

    from pyshim.serve.protocol import Sampling
    from pyshim.serve.session import Session
    from pyshim.setup.catalog import resolve_model
    from runners import reference

    session = Session(reference(resolve_model("smollm2"), context=512, kv_type=kv_type))
    chat = session.chat([{"role": "user", "content": QUESTION}], Sampling.parse({"temperature": 0, "max_tokens": MAX_TOKENS}))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:      # Playwright's sync API keeps a loop running here
        return pool.submit(asyncio.run, chat).result().text


def set_settings(page, settings: dict) -> None:
    """The open chat's settings panel filled in, each field's change sent as a visitor's would be."""
    page.click("#settings-toggle")
    for key, value in settings.items():
        page.fill(f"#set-{key}", value) if key not in ("kv_type", "arithmetic", "device") else page.select_option(f"#set-{key}", value)
        page.dispatch_event(f"#set-{key}", "change")
    page.click("#settings-toggle")


def ask(page, settings: dict) -> str:
    """A new chat with these settings, QUESTION sent; the reply's text once it has finished."""
    page.click("#new-chat")
    set_settings(page, settings)
    page.fill("#prompt", QUESTION)
    page.click("#send")
    page.wait_for_selector("#stop:not([hidden])")
    page.wait_for_selector("#stop", state="hidden", timeout=REPLY_TIMEOUT_MS)
    replies = page.locator("#messages .bubble")
    return replies.nth(replies.count() - 1).inner_text().strip()


# Records each phase a visitor is shown before the reply's first token, where it is shown: in the pending
# reply's bubble ("bubble"), or in the notice while the model loads ahead as the message is typed ("notice",
# ui/chat.js warmAhead). A message sent while that load runs waits for it, and its bubble takes the phases over.
WATCH_PHASES_JS = """() => {
  window.seenPhases = [];
  const push = (seen) => {
    const last = window.seenPhases.at(-1);
    if (!last || last.phase !== seen.phase || last.detail !== seen.detail || last.where !== seen.where) window.seenPhases.push(seen);
  };
  new MutationObserver(() => {
    const p = document.querySelector('#messages .phase');
    if (p) push({where: 'bubble', phase: p.dataset.phase, label: p.querySelector('.phase-label').textContent,
                 detail: p.querySelector('.phase-detail').textContent, bar: p.querySelector('.bar > span').style.width});
  }).observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true});
  const notice = document.getElementById('notice');
  new MutationObserver(() => {
    if (notice.dataset.phase) push({where: 'notice', phase: notice.dataset.phase, detail: notice.innerText});
  }).observe(notice, {subtree: true, childList: true, characterData: true, attributes: true});
}"""


# device gpu: SwiftShader is a software adapter, where "auto" measures the CPU engine faster (test_site_cpu.py)
EXACT = {"temperature": "0", "max_tokens": str(MAX_TOKENS), "context": "512", "system": "", "arithmetic": "f32", "device": "gpu"}


def test_greedy_chat_reply_equals_the_cpu_reference(site):
    _, page, watch = site
    page.click(f"#models li:has-text('{MODEL}') button")
    wait_status(page, MODEL, "ready")
    assert page.evaluate("() => window.pyshimEngine.request('capabilities')")["generate"] is True
    page.evaluate(WATCH_PHASES_JS)
    text = ask(page, {**EXACT, "kv_type": "f32"})
    # typing the question loaded the model (in the notice, or in the bubble once sent): each phase was named
    # with its progress before the text, the prompt's in the bubble
    seen = page.evaluate("() => window.seenPhases")
    order = list(dict.fromkeys(p["phase"] for p in seen))
    assert [p for p in order if p in ("load", "compile", "prefill")] == ["load", "compile", "prefill"], seen
    assert any(p["phase"] == "prefill" and p["where"] == "bubble" for p in seen), seen
    for phase, unit in (("load", "MB"), ("compile", "pipelines"), ("prefill", "tokens")):
        details = [p["detail"] for p in seen if p["phase"] == phase]
        assert any(unit in d and " of " in d for d in details), (phase, details)
    assert any("MB/s" in p["detail"] for p in seen if p["phase"] == "load"), seen
    print("phases seen:", [(p["phase"], p["detail"]) for p in seen])
    shot(page, "12-chatting", readme=True)
    assert text == cpu_reference_reply().strip()
    assert "Paris" in text
    assert "tok/s" in page.inner_text("#messages")
    watch.check()


def test_the_model_loads_while_the_message_is_typed_or_with_the_reply(site):
    """Typing starts the load (engine.warm) with the conversation's settings: the notice shows its phases and
    the reply sent after it starts with the prompt (the load in its stats). A reply that needs other settings
    (here: regenerated after the context changed) gets them in its own bubble, although the models panel,
    judging the model again for the new context, redraws the chat meanwhile: the Worker keeps the model's
    weights on the GPU (only its KV cache is made again: nothing is read from the store), and says so."""
    _, page, watch = site
    page.click("#new-chat")
    set_settings(page, {**EXACT, "context": "448", "kv_type": "f32"})     # another context
    # (unloaded first: another context of the loaded model alone would keep its weights, as the end checks)
    page.evaluate("() => window.pyshimEngine.request('unload')")
    page.evaluate(WATCH_PHASES_JS)
    page.type("#prompt", QUESTION)
    page.wait_for_function("() => window.seenPhases.some(s => s.phase === 'compile') && !document.getElementById('notice').dataset.phase",
                           timeout=REPLY_TIMEOUT_MS)
    seen = page.evaluate("() => window.seenPhases")
    assert [s["phase"] for s in seen if s["phase"] != "ready"][:1] == ["load"] and {s["where"] for s in seen} == {"notice"}, seen
    assert any("Loading SmolLM2" in s["detail"] and " MB of " in s["detail"] for s in seen if s["phase"] == "load"), seen
    assert any(s["phase"] == "compile" for s in seen), seen
    assert page.is_hidden("#notice")
    assert page.evaluate("() => window.pyshimEngine.request('stats')")["loaded"]["settings"]["context"] == 448
    # the visitor is still typing while the Worker compiles the prompt steps' pipelines (pyshim.serve.prewarm)
    deadline = time.monotonic() + REPLY_TIMEOUT_MS / 1000
    while not (prewarm := page.evaluate("() => window.pyshimEngine.request('stats')")["prewarm"] or {}).get("done"):
        assert time.monotonic() < deadline, "the prompt pipelines' compilation did not finish"
        time.sleep(0.25)
    assert prewarm["compiled"] > 0, prewarm
    page.evaluate(WATCH_PHASES_JS)
    page.click("#send")
    page.wait_for_selector("#stop:not([hidden])")
    page.wait_for_selector("#stop", state="hidden", timeout=REPLY_TIMEOUT_MS)
    seen = page.evaluate("() => window.seenPhases")
    phases = {p["phase"] for p in seen}
    assert "prefill" in phases and not phases & {"load", "compile"}, seen
    assert page.locator("#messages .bubble").last.inner_text().strip() == cpu_reference_reply().strip()
    assert "loaded in" in page.inner_text("#messages .stats >> nth=-1")

    set_settings(page, {"context": "480"})
    page.evaluate(WATCH_PHASES_JS)
    page.click(".msg.assistant:last-child [data-action=regenerate]")
    page.wait_for_selector("#stop:not([hidden])")
    page.wait_for_selector("#stop", state="hidden", timeout=REPLY_TIMEOUT_MS)
    seen = page.evaluate("() => window.seenPhases")
    assert "prefill" in {p["phase"] for p in seen} and not any(" MB of " in p["detail"] for p in seen), seen
    assert {s["where"] for s in seen} == {"bubble"}, seen
    assert page.locator("#messages .bubble").last.inner_text().strip() == cpu_reference_reply().strip()
    assert "settings applied in" in (stats := page.inner_text("#messages .stats >> nth=-1")) and "weights kept" in stats, stats
    loaded = page.evaluate("() => window.pyshimEngine.request('stats')")["loaded"]
    assert loaded["settings"]["context"] == 480 and loaded["weights_kept"], loaded
    watch.check()


@pytest.mark.full      # the q8 cache against the reference natively by default (test_kv_types)
def test_q8_kv_cache_reply_equals_the_reference_with_that_cache(site):
    _, page, watch = site
    text = ask(page, {**EXACT, "kv_type": "q8"})
    loaded = page.evaluate("() => window.pyshimEngine.request('stats')")["loaded"]
    assert loaded["settings"]["kv_type"] == "q8" and loaded["settings"]["arithmetic"] == "f32", loaded   # loaded again, with a q8 cache
    assert text == cpu_reference_reply("q8").strip()
    watch.check()


def test_the_site_serves_its_model_to_same_origin_openai_clients(site):
    _, page, watch = site
    models = page.evaluate("""async () => {
        const base = await (await import('/engine/host.js')).endpointReady();
        return (await fetch(base + '/models')).json();
    }""")
    assert models["object"] == "list" and len(models["data"]) == 1, models
    assert "SmolLM2" in models["data"][0]["id"], models          # the model picked on the site
    watch.check()


def test_on_a_software_adapter_auto_measures_and_runs_the_faster_engine(site):
    """SwiftShader streams ~2.3 GB/s through WebGPU, the CPU engine several times that on the same cores:
    the probe (one matvec of SmolLM2's FFN matrix on each) picks the CPU engine, and the reply's stats say
    so; asking for the GPU by name still gets it."""
    _, page, watch = site
    # (another context, so the model loads again: "auto" alone would keep the engine already loaded)
    text = ask(page, {**EXACT, "kv_type": "f32", "device": "auto", "context": "384"})
    loaded = page.evaluate("() => window.pyshimEngine.request('stats')")["loaded"]
    engine = loaded["engine"]
    print(engine)
    assert loaded["settings"]["device"] == engine["device"] == "cpu", loaded
    assert engine["cpu_ms"] < engine["gpu_ms"] and "faster than WebGPU on this software adapter" in engine["reason"]
    assert "the CPU engine runs it" in page.inner_text("#messages .stats >> nth=-1")
    assert text == cpu_reference_reply().strip()
    ask(page, {**EXACT, "kv_type": "f32", "device": "gpu"})
    loaded = page.evaluate("() => window.pyshimEngine.request('stats')")["loaded"]
    assert loaded["settings"]["device"] == loaded["engine"]["device"] == "gpu", loaded
    assert loaded["engine"]["reason"] == "the settings ask for the GPU"
    watch.check()
