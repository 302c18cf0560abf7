"""The JavaScript API (web/pyshim.js) in a plain page from a clean profile: createEngine downloads SmolLM2
through the store and loads it; chat completions come back in OpenAI's shapes, streamed text equals
the whole reply, bad requests are refused with OpenAI error objects before any work, stop strings end
the reply, and concurrent requests on one engine are queued (each answer equals its solo answer).

One page and one engine for the module: SwiftShader makes every generated token cost about a second."""

from __future__ import annotations

import json

import pytest

import harness
from site_helpers import SMOLLM2, smollm2_path

pytestmark = [pytest.mark.browser, pytest.mark.models, pytest.mark.slow]
PAGE = "examples/api.html"
CONTEXT = 512
QUESTION = "What is the capital of France?"
OTHER_QUESTION = "Name a colour."
SYSTEM = "Be brief."
MAX_TOKENS = 8
OTHER_MAX_TOKENS = 4
GENERATION_TIMEOUT_MS = 600_000   # prefill + a few tokens on SwiftShader, on 2 busy cores

CREATE_JS = """async ([context]) => {
  const { createEngine } = await import('/pyshim.js');
  window.progress = [];
  const t0 = performance.now();
  window.engine = await createEngine({model: 'smollm2', context, onProgress: (p) => window.progress.push(p)});
  return {ms: performance.now() - t0, stats: window.engine.stats(), models: await window.engine.models.list()};
}"""

# Runs engine.chat.completions.create(body): {ok, value} (a completion, or a stream's chunks) or
# {ok: false, error: {name, status, body}}.
CREATE_REQUEST_JS = """async (body) => {
  try {
    const out = await window.engine.chat.completions.create(body);
    if (!body.stream) return {ok: true, value: out};
    const chunks = [];
    for await (const chunk of out) chunks.push(chunk);
    return {ok: true, value: chunks};
  } catch (e) {
    return {ok: false, error: {name: e.name, status: e.status, body: e.body, message: e.message}};
  }
}"""


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def greedy(text: str, max_tokens: int = MAX_TOKENS, **extra) -> dict:
    # A short system message: SmolLM2's template would add its own, longer one (prefill is most of the time).
    messages = [{"role": "system", "content": SYSTEM}, *user(text)]
    return {"messages": messages, "model": "smollm2", "temperature": 0, "max_tokens": max_tokens, **extra}


@pytest.fixture(scope="module")
def api(chromium, dev_server):
    smollm2_path()
    context = chromium.new_context()
    page, watch = harness.open_page(context, dev_server.url + PAGE)
    page.set_default_timeout(GENERATION_TIMEOUT_MS)
    created = page.evaluate(CREATE_JS, [CONTEXT])
    yield page, watch, created, {}
    context.close()


def request(page, body: dict):
    out = page.evaluate(CREATE_REQUEST_JS, body)
    assert out["ok"], f"request failed: {out['error']}"
    return out["value"]


def solo_answer(api) -> dict:
    """The greedy reply to QUESTION, non-streamed; computed once per module."""
    page, _, _, cache = api
    if "solo" not in cache:
        cache["solo"] = request(page, greedy(QUESTION))
    return cache["solo"]


def test_create_engine_downloads_through_the_store_and_loads(api):
    page, watch, created, _ = api
    phases = [p["phase"] for p in page.evaluate("() => window.progress")]
    assert {"boot", "header", "download", "load"} <= set(phases) and phases[-1] == "ready"
    (manifest,) = page.evaluate("async () => (await import('/store/store.js')).listModels()")
    assert manifest["status"] == "ready" and manifest["sha256"] == SMOLLM2.sha256   # verified, as the site stores it
    assert created["stats"]["model"] == "smollm2" and created["stats"]["context"] == CONTEXT
    assert created["models"] == {"object": "list", "data": [{"id": "smollm2", "object": "model", "created": 0, "owned_by": "pyshim"}]}
    print(f"createEngine from a clean profile: {created['ms'] / 1000:.1f} s (store {created['stats']['load']['store_ms'] / 1000:.1f} s, "
          f"GPU load {created['stats']['load']['gpu_ms'] / 1000:.1f} s)")
    watch.check()


def test_loading_and_the_first_request_report_their_phases_in_order(api):
    """After the store: the weights' upload ("load", bytes, with a rate), the GPU pipelines ("compile", up to
    all of them; the CPU engine, which "auto" picks on SwiftShader, has none), "ready", then the first
    request's prompt ("prefill", tokens, up to all of them)."""
    page, _, _, _ = api
    solo_answer(api)                      # a request has run (onProgress is also the engine's default)
    progress = page.evaluate("() => window.progress")
    compiles = ["compile"] if page.evaluate("() => window.engine.stats().device") == "gpu" else []
    phases = [p["phase"] for p in progress]
    after_store = phases[phases.index("load"):]
    runs = [phase for i, phase in enumerate(after_store) if i == 0 or after_store[i - 1] != phase]
    assert runs[:3 + len(compiles)] == ["load", *compiles, "ready", "prefill"], runs
    for phase in ("load", *compiles, "prefill"):
        events = [p for p in progress if p["phase"] == phase]
        end = next((i for i, p in enumerate(events) if p["loaded"] == p["total"]), None)
        assert end is not None, (phase, events)           # it reached its total
        events = events[:end + 1]                         # its first run (each later request has its own prefill)
        done = [p["loaded"] for p in events]
        assert done == sorted(done) and all(p["total"] > 0 for p in events), (phase, events)
    assert any(p["bytesPerSec"] > 0 for p in progress if p["phase"] == "load")


# A second engine (its own Worker) on the stored model, as the site's chat makes one: select() only, so the
# GPU load happens in the first request, and every phase reaches the engine's own onProgress.
SELECTED_FIRST_REQUEST_JS = """async (body) => {
  const { Engine } = await import('/pyshim.js');
  const [stored] = await (await import('/store/store.js')).listModels();
  const progress = [];
  const engine = new Engine({onProgress: (p) => progress.push(p)});
  engine.select(stored, {context: body.context, id: body.model});
  try {
    await engine.chat.completions.create(body.request);
  } finally {
    engine.terminate();
  }
  return {progress, device: engine.stats().device};
}"""


def test_a_selected_model_reports_load_compile_and_prefill_in_its_first_request(api):
    page, watch, _, _ = api
    out = page.evaluate(SELECTED_FIRST_REQUEST_JS, {"context": CONTEXT, "model": "smollm2", "request": greedy(QUESTION, 1)})
    progress = out["progress"]
    runs = []                 # consecutive events of one phase
    for p in progress:
        if runs and runs[-1][0]["phase"] == p["phase"]:
            runs[-1].append(p)
        else:
            runs.append([p])
    names = [run[0]["phase"] for run in runs]
    # the prompt's own program may compile pipelines (the tiled prefill kernels) on its first use; the CPU
    # engine ("auto" on SwiftShader) compiles nothing
    if out["device"] == "gpu":
        assert names in (["load", "compile", "prefill"], ["load", "compile", "prefill", "compile", "prefill"]), names
    else:
        assert names == ["load", "prefill"], (out["device"], names)
    for run in runs:
        done = [p["loaded"] for p in run]
        assert done == sorted(done) and run[-1]["loaded"] == run[-1]["total"] or run[0]["phase"] == "prefill" and run is not runs[-1], run
    assert runs[-1][-1]["loaded"] == runs[-1][-1]["total"] > 0
    watch.check()


BAD_REQUESTS = [
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "bot", "content": "hi"}]}, "messages[0]"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": 5}]}, "messages[1]"),
    ({"messages": user("hi"), "model": "gpt-4o"}, "model"),
    ({"messages": user("hi"), "max_tokens": -1}, "max_tokens"),
    ({"messages": user("hi"), "max_tokens": 0}, "max_tokens"),
    ({"messages": user("hi"), "max_tokens": 2.5}, "max_tokens"),
    ({"messages": user("hi"), "max_tokens": "8"}, "max_tokens"),
    ({"messages": user("hi"), "max_completion_tokens": -3}, "max_completion_tokens"),
    ({"messages": user("hi"), "temperature": 2.5}, "temperature"),
    ({"messages": user("hi"), "temperature": "hot"}, "temperature"),
    ({"messages": user("hi"), "top_p": 0}, "top_p"),
    ({"messages": user("hi"), "top_p": 1.5}, "top_p"),
    ({"messages": user("hi"), "stop": 5}, "stop"),
    ({"messages": user("hi"), "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"messages": user("hi"), "stop": [""]}, "stop"),
    ({"messages": user("hi"), "seed": 1.5}, "seed"),
    ({"messages": user("hi"), "seed": "7"}, "seed"),
    ({"messages": user("hi"), "stream": "yes"}, "stream"),
    ({"messages": user("hi"), "n": 2}, "n"),
    ({"messages": user("hi"), "response_format": {"type": "json_schema"}}, "response_format"),
    ({"messages": user("hi"), "response_format": {"type": "xml"}}, "response_format"),
    ({"messages": user("hi"), "response_format": {"type": "grammar", "grammar": ""}}, "response_format"),
]


def test_bad_requests_reject_with_openai_errors_before_any_work(api):
    page, _, _, _ = api
    before = page.evaluate("() => window.engine.stats().requests")
    for body, param in BAD_REQUESTS:
        out = page.evaluate(CREATE_REQUEST_JS, body)
        assert not out["ok"], f"accepted {body}"
        err = out["error"]
        assert err["name"] == "APIError" and err["status"] == 400, (body, err)
        assert set(err["body"]["error"]) == {"message", "type", "param", "code"}, err
        assert err["body"]["error"]["type"] == "invalid_request_error" and err["body"]["error"]["param"] == param, (body, err)
        assert err["body"]["error"]["message"] == err["message"] and param.split("[")[0] in err["message"], err
    unknown = page.evaluate(CREATE_REQUEST_JS, {"messages": user("hi"), "model": "gpt-4o"})["error"]["body"]["error"]
    assert unknown["code"] == "model_not_found" and "smollm2" in unknown["message"]
    not_an_object = page.evaluate("""async () => { try { await window.engine.chat.completions.create(null); }
                                     catch (e) { return [e.status, e.body.error.param]; } }""")
    assert not_an_object == [400, None]
    empty_prompt = page.evaluate("""async () => { try { await window.engine.completions.create({prompt: ''}); }
                                    catch (e) { return [e.status, e.body.error.param]; } }""")
    assert empty_prompt == [400, "prompt"]
    assert page.evaluate("() => window.engine.stats()")["requests"] == before   # nothing reached the Worker


def test_streamed_text_equals_the_whole_reply(api):
    page, watch, _, _ = api
    whole = solo_answer(api)
    assert whole["object"] == "chat.completion" and whole["id"].startswith("chatcmpl-") and whole["model"] == "smollm2"
    (choice,) = whole["choices"]
    text = choice["message"]["content"]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] in ("stop", "length")
    assert text.strip()   # what it says is test_site_chat's business (the Worker's reply vs the CPU reference)
    usage = whole["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] and 0 < usage["completion_tokens"] <= MAX_TOKENS

    chunks = request(page, greedy(QUESTION, stream=True))
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    middle, last = chunks[1:-1], chunks[-1]
    assert middle and all(set(c["choices"][0]["delta"]) == {"content"} and c["choices"][0]["finish_reason"] is None for c in middle)
    assert last["choices"][0]["delta"] == {} and last["choices"][0]["finish_reason"] == choice["finish_reason"]
    same = lambda u: {k: v for k, v in u.items() if k != "prompt_tokens_details"}     # (what the cache kept varies)
    assert same(last["usage"]) == same(usage)
    assert "".join(c["choices"][0]["delta"]["content"] for c in middle) == text
    print(f"greedy reply: {text!r}; time to first token {last['pyshim']['timings']['ttft_ms'] / 1000:.1f} s")
    watch.check()


def test_stop_strings_end_the_reply(api):
    page, _, _, _ = api
    text = solo_answer(api)["choices"][0]["message"]["content"]
    stop = text[len(text) // 2:len(text) // 2 + 3]   # from the reply itself, so any greedy reply works
    assert len(stop) == 3, f"the greedy reply is too short to cut: {text!r}"
    stopped = request(page, greedy(QUESTION, stop=["\u2603never", stop]))
    assert stopped["choices"][0]["message"]["content"] == text.split(stop)[0]
    assert stopped["choices"][0]["finish_reason"] == "stop"
    assert stopped["usage"]["completion_tokens"] < solo_answer(api)["usage"]["completion_tokens"]


CONCURRENT_JS = """async ([first, second]) => {
  const events = [];
  const stream = window.engine.chat.completions.create(first);     // asked first, so it runs first
  const other = window.engine.chat.completions.create(second).then((r) => { events.push('second-done'); return r.choices[0].message.content; });
  const queued = window.engine.stats().queued;
  const collect = async () => {
    let text = '';
    for await (const c of await stream) {
      text += c.choices[0].delta.content ?? '';
      events.push('first');
    }
    return text;
  };
  const [a, b] = await Promise.all([collect(), other]);
  return {a, b, events, queued};
}"""


def test_concurrent_requests_on_one_engine_are_queued(api):
    page, _, _, _ = api
    solo = solo_answer(api)["choices"][0]["message"]["content"]
    other_solo = request(page, greedy(OTHER_QUESTION, OTHER_MAX_TOKENS))["choices"][0]["message"]["content"]
    out = page.evaluate(CONCURRENT_JS, [greedy(QUESTION, stream=True), greedy(OTHER_QUESTION, OTHER_MAX_TOKENS)])
    assert out["queued"] == 2, out                         # both waited their turn (the first had not started yet)
    assert out["a"] == solo and out["b"] == other_solo, json.dumps(out)
    assert out["a"] != out["b"]
    assert out["events"][-1] == "second-done" and out["events"].count("second-done") == 1   # one after the other, never mixed


PARALLEL_JS = """async ([context, bodies]) => {
  const { createEngine } = await import('/pyshim.js');
  const engine = await createEngine({model: 'smollm2', context, parallel: bodies.length});
  try {
    const replies = await Promise.all(bodies.map((b) => engine.chat.completions.create(b)));
    return {texts: replies.map((r) => r.choices[0].message.content), worker: await engine.client.request('stats', {})};
  } finally {
    engine.terminate();
  }
}"""


def test_parallel_requests_are_decoded_together_each_as_alone(api):
    """An engine made with {parallel: 3}: three requests at once, a KV cache each, their decode steps
    batched in the Worker; each reply is the one the module's engine gives it alone."""
    page, _, _, _ = api
    bodies = [greedy(QUESTION), greedy(OTHER_QUESTION, OTHER_MAX_TOKENS), greedy("Say hello.", 6)]
    alone = [request(page, body)["choices"][0]["message"]["content"] for body in bodies]
    out = page.evaluate(PARALLEL_JS, [CONTEXT, bodies])
    assert out["texts"] == alone, json.dumps(out)
    worker = out["worker"]
    assert worker["sequences"] == 3 and worker["loaded"]["settings"]["parallel"] == 3
    assert worker["batching"]["batched_steps"] >= OTHER_MAX_TOKENS - 2, worker


WEBGPU_PARALLEL_JS = """async ([context, bodies, kvPages]) => {
  const { createEngine } = await import('/pyshim.js');
  const engine = await createEngine({model: 'smollm2', context, parallel: bodies.length, device: 'gpu', kvPages});
  try {
    const text = (r) => r.choices[0].message.content;
    const alone = [];
    for (const b of bodies) alone.push(text(await engine.chat.completions.create(b)));
    const replies = await Promise.all(bodies.map((b) => engine.chat.completions.create(b)));
    return {alone, texts: replies.map(text), worker: await engine.client.request('stats', {})};
  } finally {
    engine.terminate();
  }
}"""


def test_parallel_requests_on_webgpu_share_a_paged_kv_cache(api):
    """WebGPU named, {parallel: 3, kvPages: 5}: three requests at once over five pages of 16 positions
    (about two a request): batched decode steps, pages taken back from finished sequences or waited for,
    and each reply is the one the same engine gives it alone."""
    page, _, _, _ = api
    bodies = [greedy(QUESTION), greedy(OTHER_QUESTION, OTHER_MAX_TOKENS), greedy("Say hello.", 6)]
    out = page.evaluate(WEBGPU_PARALLEL_JS, [CONTEXT, bodies, 5])
    assert out["texts"] == out["alone"], json.dumps(out)
    worker = out["worker"]
    assert worker["loaded"]["engine"]["device"] == "gpu" and worker["loaded"]["settings"]["kv_pages"] == 5
    assert worker["kv"]["pages"] == 5 and len(worker["kv"]["held"]) == 3, worker
    assert worker["batching"]["batched_steps"] >= 1, worker


COMPLETE_JS = """async (body) => {
  const whole = await window.engine.completions.create(body);
  const chunks = [];
  for await (const c of await window.engine.completions.create({...body, stream: true})) chunks.push(c);
  return {whole, chunks};
}"""


def test_text_completion_streamed_equals_whole(api):
    page, _, _, _ = api
    out = page.evaluate(COMPLETE_JS, {"prompt": "The capital of France is", "temperature": 0, "max_tokens": 4})
    whole, chunks = out["whole"], out["chunks"]
    assert whole["object"] == "text_completion" and whole["id"].startswith("cmpl-")
    text = whole["choices"][0]["text"]
    assert text.startswith(" Paris")   # llama.cpp's greedy continuation (FACTS.md)
    assert all(c["object"] == "text_completion" for c in chunks) and chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert "".join(c["choices"][0]["text"] for c in chunks) == text
    # the streamed request came right after the whole one: it kept all of the prompt's keys but the last
    n = whole["usage"]["prompt_tokens"]
    assert chunks[-1]["usage"] == {**whole["usage"], "prompt_tokens_details": {"cached_tokens": n - 1}}
    assert whole["usage"]["completion_tokens"] == 4


ABORT_JS = """async (body) => {
  const chunks = [];
  for await (const c of await window.engine.chat.completions.create(body)) {
    chunks.push(c);
    if (c.choices[0].delta.content) window.engine.abort();   // the first words are enough
  }
  return chunks;
}"""


def test_abort_stops_the_running_request(api):
    page, _, _, _ = api
    chunks = page.evaluate(ABORT_JS, greedy(QUESTION, 64, stream=True))
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] == "abort" and last["usage"]["completion_tokens"] < 64
    assert page.evaluate("() => window.engine.stats()")["last"]["finish_reason"] == "abort"


UNLOAD_JS = """async () => {
  await window.engine.unload();
  let refused = null;
  try { await window.engine.chat.completions.create({messages: [{role: 'user', content: 'hi'}]}); }
  catch (e) { refused = [e.status, e.body.error.code, e.message]; }
  const t0 = performance.now();
  await window.engine.load('smollm2');
  return {refused, reload_ms: performance.now() - t0, stats: window.engine.stats(), models: await window.engine.models.list()};
}"""


def test_unload_then_load_from_the_store(api):
    page, watch, _, _ = api
    out = page.evaluate(UNLOAD_JS)
    assert out["refused"] == [400, "model_not_found", "no model is loaded"]
    assert out["stats"]["model"] == "smollm2" and out["models"]["data"][0]["id"] == "smollm2"
    assert out["stats"]["load"]["store_ms"] < 5_000   # already stored: nothing downloaded again
    watch.check()


PERSON = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "big": {"type": "boolean"}},
          "required": ["city", "big"]}


def test_response_format_gives_json_that_validates_streamed_or_not(api):
    """The JS API hands response_format to the Worker's XGrammar: the reply is JSON of the schema, the
    stream carries the same text, and a grammar the engine cannot use is a 400 naming the field."""
    import jsonschema

    page, watch, _, _ = api
    fmt = {"type": "json_schema", "json_schema": {"name": "place", "schema": PERSON, "strict": True}}
    body = greedy("Name a city as JSON.", 40, response_format=fmt)
    whole = request(page, body)["choices"][0]
    chunks = request(page, {**body, "stream": True})
    assert whole["finish_reason"] == "stop", whole
    jsonschema.validate(json.loads(whole["message"]["content"]), PERSON)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == whole["message"]["content"]
    bad = page.evaluate(CREATE_REQUEST_JS, greedy("hi", 4, response_format={"type": "grammar", "grammar": "root ::= nowhere"}))
    assert not bad["ok"] and bad["error"]["status"] == 400 and bad["error"]["body"]["error"]["param"] == "response_format", bad
    watch.check()


# A model loaded ahead (engine.load) on WebGPU: while nothing runs, the Worker compiles its prompt steps'
# pipelines (pyshim.serve.prewarm), so the first request's progress has no "compile" after "ready".
LOADED_AHEAD_JS = """async (body) => {
  const { Engine } = await import('/pyshim.js');
  const progress = [];
  const engine = new Engine({onProgress: (p) => progress.push(p), device: 'gpu', context: body.context});
  try {
    await engine.load(body.model);
    const stats = async () => { const s = await engine.client.request('stats'); return typeof s === 'string' ? JSON.parse(s) : s; };
    let prewarm = null;
    for (let i = 0; i < 1200 && !prewarm?.done; i++) {
      prewarm = (await stats()).prewarm;
      await new Promise((r) => setTimeout(r, 100));
    }
    const ready = progress.length;
    const reply = await engine.chat.completions.create(body.request);
    const after_stats = (await stats()).prewarm;
    return {prewarm, after: progress.slice(ready).map((p) => p.phase), after_stats,
            text: reply.choices[0].message.content, device: engine.stats().device, again: await engine.warm()};
  } finally {
    engine.terminate();
  }
}"""


def test_a_model_loaded_ahead_compiles_its_prompt_pipelines_before_the_first_request(api):
    page, watch, _, _ = api
    out = page.evaluate(LOADED_AHEAD_JS, {"context": CONTEXT, "model": "smollm2", "request": greedy(QUESTION, 2)})
    print(out)
    assert out["device"] == "gpu" and out["prewarm"]["done"] and out["prewarm"]["compiled"] > 0, out
    assert "prefill" in out["after"] and "compile" not in out["after"], out
    assert out["after_stats"] is None and out["text"]          # the request stopped it (it had finished)
    again = out["again"]                                        # warm() with the same settings: nothing to load
    assert again["load_ms"] == 0 and again["device"] == "gpu" and again["device_reason"] == "the settings ask for the GPU", again
    watch.check()


# Other settings of the loaded model (a longer context, a q8 cache): the Worker keeps its weights on the
# GPU and makes a new KV cache (pyshim.exec.gpu_runner.reload_gpu); the reply is that of the model loaded
# afresh with those settings.
SETTINGS_CHANGE_JS = """async (body) => {
  const { Engine } = await import('/pyshim.js');
  const engine = new Engine({device: 'gpu', context: body.context});
  const ask = async () => (await engine.chat.completions.create(body.request)).choices[0].message.content;
  try {
    await engine.load(body.model);
    const id = engine.model.storeId, other = {id: engine.model.id, context: 2 * body.context, kvType: 'q8', device: 'gpu'};
    engine.select(id, other);
    const changed = await engine.warm();
    const text = await ask();
    await engine.unload();
    engine.select(id, other);
    const fresh = await engine.warm();
    return {changed, fresh, text, fresh_text: await ask()};
  } finally {
    engine.terminate();
  }
}"""


def test_other_settings_of_the_loaded_model_keep_its_weights_on_the_gpu(api):
    page, watch, _, _ = api
    out = page.evaluate(SETTINGS_CHANGE_JS, {"context": CONTEXT, "model": "smollm2", "request": greedy(QUESTION, 4)})
    print({k: out[k] for k in ("changed", "fresh")})
    assert out["changed"]["weights_kept"] and out["changed"]["load_ms"] > 0 and out["changed"]["device"] == "gpu", out
    assert not out["fresh"]["weights_kept"] and out["fresh"]["load_ms"] > 0, out
    assert out["text"] and out["text"] == out["fresh_text"], out
    watch.check()
