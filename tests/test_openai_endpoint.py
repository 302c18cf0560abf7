"""The same-origin OpenAI endpoint, end to end in headless Chromium from a clean profile: web/examples/openai.html
downloads SmolLM2 through the store from the dev server, serves its engine to the service worker, and the
official `openai` client (baseURL = the site's /v1) streams and non-streams the same greedy reply. Bad
requests get 400 with OpenAI's error object (through the client and through plain fetch), GET /v1/models
lists the model, a site with no page serving a model answers 503, and two pages asking at once get
their own answers (each equal to its answer alone): the engine queues them, never mixes them."""

from __future__ import annotations

import json

import pytest

import harness
from site_helpers import smollm2_path

pytestmark = [pytest.mark.browser, pytest.mark.models, pytest.mark.slow]
MODEL = "smollm2"
MAX_TOKENS = 8                # SwiftShader: ~30 s of prefill and ~1 tok/s, per request
REPLY_TIMEOUT_MS = 600_000
READY_TIMEOUT_MS = 600_000    # boot + download (98 MB through the store) + GPU load
QUESTION = "What is the capital of France?"
OTHER_QUESTION = "Name a colour."
# Chromium logs every 4xx/5xx answer to fetch() as a console error; those here are on purpose.
HTTP_ERROR_NOISE = ("status of 400", "status of 404", "status of 405", "status of 503")

FETCH_JS = """async ([path, init]) => {
  const r = await fetch(path, init);
  const text = await r.text();
  let body = null;
  try { body = JSON.parse(text); } catch { body = text; }
  return {status: r.status, type: r.headers.get('content-type'), body};
}"""

# The official client's error for a request: {status, error, name} (it throws an APIError subclass).
CLIENT_ERROR_JS = """async (body) => {
  try { await window.pyshimExample.client.chat.completions.create(body); return null; }
  catch (e) { return {status: e.status ?? null, error: e.error ?? null, name: e.constructor.name}; }
}"""

# A greedy chat request over plain fetch ([question, max_tokens] -> {status, type, text}).
def chat_fetch_js(stream: bool) -> str:
    return """async ([question, maxTokens]) => {
      const r = await fetch('/v1/chat/completions', {method: 'POST', headers: {'Content-Type': 'application/json'},
        body: JSON.stringify({model: 'smollm2', temperature: 0, max_tokens: maxTokens, stream: %s,
                              messages: [{role: 'user', content: question}]})});
      return {status: r.status, type: r.headers.get('content-type'), text: await r.text()};
    }""" % ("true" if stream else "false")


def wait_ready(page):
    page.wait_for_function("() => ['ready', 'error'].includes(document.body.dataset.state)", timeout=READY_TIMEOUT_MS)
    assert page.evaluate("() => document.body.dataset.state") == "ready", page.inner_text("#status")


@pytest.fixture(scope="module")
def host(chromium, dev_server):
    """A clean profile with the example page serving SmolLM2 to the endpoint: (context, page, watch)."""
    smollm2_path()
    context = chromium.new_context()
    page, watch = harness.open_page(context, dev_server.url + "examples/openai.html")
    wait_ready(page)
    page.set_default_timeout(REPLY_TIMEOUT_MS)
    yield context, page, watch
    context.close()


@pytest.fixture(scope="module")
def client_page(host, dev_server):
    """A second page of the same site that serves no model: its requests go to the host page's engine."""
    context, _, _ = host
    page = context.new_page()
    page.goto(dev_server.url + "examples/openai.html?engine=none")
    wait_ready(page)
    page.set_default_timeout(REPLY_TIMEOUT_MS)
    yield page
    page.close()


def post(page, body, *, raw: str | None = None) -> dict:
    init = {"method": "POST", "headers": {"Content-Type": "application/json"}, "body": raw if raw is not None else json.dumps(body)}
    return page.evaluate(FETCH_JS, ["/v1/chat/completions", init])


def assert_openai_error(body, param=None, code=None):
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code


def test_models_lists_the_served_model(host):
    _, page, _ = host
    out = page.evaluate(FETCH_JS, ["/v1/models", {}])
    assert out["status"] == 200 and out["type"].startswith("application/json")
    assert out["body"]["object"] == "list" and [m["id"] for m in out["body"]["data"]] == [MODEL]
    listed = page.evaluate("async () => { const ids = []; for await (const m of window.pyshimExample.client.models.list()) ids.push(m.id); return ids; }")
    assert listed == [MODEL]


@pytest.mark.parametrize("body,param", [
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": -1}, "max_tokens"),
    ({"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]}, "model"),
    ({"model": MODEL, "messages": "hi"}, "messages"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, "temperature"),
])
def test_bad_requests_get_400_and_an_openai_error(host, body, param):
    _, page, _ = host
    out = post(page, body)
    assert out["status"] == 400 and out["type"].startswith("application/json")
    assert_openai_error(out["body"], param=param, code="model_not_found" if param == "model" else None)
    via_client = page.evaluate(CLIENT_ERROR_JS, body)
    assert via_client["status"] == 400 and via_client["name"] == "BadRequestError"
    assert via_client["error"] == out["body"]["error"]


def test_malformed_http_gets_openai_errors(host):
    _, page, _ = host
    out = post(page, None, raw="{not json")
    assert out["status"] == 400 and "not valid JSON" in out["body"]["error"]["message"]
    out = page.evaluate(FETCH_JS, ["/v1/chat/completions", {}])
    assert out["status"] == 405 and out["body"]["error"]["code"] == "method_not_allowed"
    out = page.evaluate(FETCH_JS, ["/v1/embeddings", {"method": "POST", "body": "{}"}])
    assert out["status"] == 404 and out["body"]["error"]["code"] == "unknown_url"


def test_streamed_text_equals_the_non_streamed_text(host):
    _, page, watch = host
    page.fill("#max-tokens", str(MAX_TOKENS))
    page.fill("#question", QUESTION)
    page.click("#send")
    page.wait_for_function("() => document.getElementById('same').textContent", timeout=2 * REPLY_TIMEOUT_MS)
    assert page.inner_text("#same") == "Same text both ways (greedy).", page.inner_text("#status")
    last = page.evaluate("() => window.pyshimExample.last")
    chunks, completion = last["chunks"], last["completion"]
    text = completion["choices"][0]["message"]["content"]
    assert text.strip() and "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == text

    # Chunks as OpenAI streams them: one id, object "chat.completion.chunk", the role first, the
    # finish_reason (and usage) only on the last.
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == MODEL and len(c["choices"]) == 1 for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    final = chunks[-1]
    assert final["choices"][0]["finish_reason"] == completion["choices"][0]["finish_reason"] in ("stop", "length")
    assert final["usage"]["completion_tokens"] == completion["usage"]["completion_tokens"] <= MAX_TOKENS
    assert final["usage"]["total_tokens"] == final["usage"]["prompt_tokens"] + final["usage"]["completion_tokens"]
    assert completion["object"] == "chat.completion" and completion["choices"][0]["message"]["role"] == "assistant"
    page.evaluate("(text) => { window.soloAnswer = text; }", text)
    watch.check(allow_console_errors=HTTP_ERROR_NOISE)


def sse_events(text: str) -> list:
    """`data: …\\n\\n` events of a Server-Sent Events body; every event must be a data line."""
    assert text.endswith("data: [DONE]\n\n"), text[-200:]
    events = text.split("\n\n")[:-1]
    assert all(e.startswith("data: ") and "\n" not in e for e in events), events
    return [e[len("data: "):] for e in events]


def test_two_pages_at_once_get_their_own_answers(host, client_page):
    _, page, _ = host
    solo = page.evaluate("() => window.soloAnswer")
    assert solo, "needs test_streamed_text_equals_the_non_streamed_text's answer"
    # The other page's question alone first (routed to the host page's engine: it serves none itself).
    other_solo = client_page.evaluate(chat_fetch_js(False), [OTHER_QUESTION, MAX_TOKENS])
    assert other_solo["status"] == 200, other_solo
    other_solo = json.loads(other_solo["text"])["choices"][0]["message"]["content"]

    # Now both at once (each sent before either answer is back): the host page streams its question over
    # plain fetch, the other page asks its own.
    page.evaluate("([js, q, n]) => { window.concurrent = (eval(js))([q, n]); }", [chat_fetch_js(True), QUESTION, MAX_TOKENS])
    client_page.evaluate("([js, q, n]) => { window.concurrent = (eval(js))([q, n]); }", [chat_fetch_js(False), OTHER_QUESTION, MAX_TOKENS])
    streamed = page.evaluate("() => window.concurrent")
    whole = client_page.evaluate("() => window.concurrent")

    assert streamed["status"] == 200 and streamed["type"].startswith("text/event-stream")
    events = sse_events(streamed["text"])
    chunks = [json.loads(e) for e in events[:-1]]
    assert events[-1] == "[DONE]" and all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == solo
    assert whole["status"] == 200 and json.loads(whole["text"])["choices"][0]["message"]["content"] == other_solo
    assert other_solo != solo


PARALLEL_JS = """async (requests) => {
  const ask = ([question, maxTokens]) => fetch('/v1/chat/completions', {method: 'POST',
      headers: {'Content-Type': 'application/json'},
      body: JSON.stringify({model: 'smollm2', temperature: 0, max_tokens: maxTokens, messages: [{role: 'user', content: question}]})})
    .then((r) => r.json()).then((b) => b.choices[0].message.content);
  const together = await Promise.all(requests.map(ask));
  const alone = [];
  for (const r of requests) alone.push(await ask(r));
  return {together, alone, worker: await window.pyshimExample.engine.client.request('stats', {})};
}"""


def test_four_requests_at_once_through_the_endpoint_each_get_their_answer_alone(chromium, dev_server):
    """A page serving its engine with ?parallel=4: four requests of other questions and lengths through
    /v1 at once run together (a KV cache each, their decode steps batched) and each answer is the one it
    gets alone, afterwards."""
    smollm2_path()
    context = chromium.new_context()
    try:
        page, _ = harness.open_page(context, dev_server.url + "examples/openai.html?parallel=4")
        wait_ready(page)
        page.set_default_timeout(REPLY_TIMEOUT_MS)
        requests = [[QUESTION, 6], [OTHER_QUESTION, 4], ["Say hello.", 5], ["Count to three.", 7]]
        out = page.evaluate(PARALLEL_JS, requests)
        assert out["together"] == out["alone"], json.dumps(out)
        assert out["worker"]["sequences"] == 4 and out["worker"]["batching"]["batched_steps"] >= 2, out["worker"]
    finally:
        context.close()


def test_no_page_serving_a_model_is_a_503(chromium, dev_server):
    context = chromium.new_context()
    try:
        page, watch = harness.open_page(context, dev_server.url + "examples/openai.html?engine=none")
        wait_ready(page)
        out = post(page, {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
        assert out["status"] == 503 and out["body"]["error"]["code"] == "no_engine"
        assert "open one that loads a model" in out["body"]["error"]["message"]
        assert post(page, {"model": MODEL, "messages": []})["status"] == 400   # a bad request is still a 400
        listed = page.evaluate(FETCH_JS, ["/v1/models", {}])
        assert listed["status"] == 200 and listed["body"]["data"] == []
        watch.check(allow_console_errors=HTTP_ERROR_NOISE)
    finally:
        context.close()


PLACE = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "country": {"type": "string", "maxLength": 12}},
         "required": ["city", "country"]}
CLIENT_JSON_JS = """async (schema) => {
  const out = await window.pyshimExample.client.chat.completions.create({model: 'smollm2', temperature: 0, max_tokens: 40,
    messages: [{role: 'user', content: 'Name a city and its country as JSON.'}],
    response_format: {type: 'json_schema', json_schema: {name: 'place', schema, strict: true}}});
  return out.choices[0];
}"""


def test_the_official_client_gets_json_of_its_schema(host):
    import jsonschema

    _, page, watch = host
    choice = page.evaluate(CLIENT_JSON_JS, PLACE)
    assert choice["finish_reason"] == "stop", choice
    jsonschema.validate(json.loads(choice["message"]["content"]), PLACE)
    watch.check(allow_console_errors=HTTP_ERROR_NOISE)
