"""A remote model (pyshim.api.load(base_url=...) and the JS API's createEngine({baseURL}) in Chromium)
against a small OpenAI-shaped stub server (tests/openai_stub.py: a real HTTP server on 127.0.0.1, another
origin than the site's). The same API validates before sending, sends OpenAI's fields (pyshim's extensions
only when set), streams, joins a server's tool-call fragments, and explains a server that does not answer,
one that does not allow the page's origin (CORS), a refused key, no such path or model, a refused request."""

from __future__ import annotations

import asyncio

import pytest

import harness
from openai_stub import KEY, MODEL, Stub, free_port_url, serve
from pyshim.api import load
from pyshim.errors import BadRequestError, ModelNotFoundError, RemoteError

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def stub():
    with serve() as url:
        yield url


def run(coro):
    return asyncio.run(coro)


async def _engine(stub):
    return await load(MODEL, base_url=stub + "/v1", api_key=KEY)


def test_replies_stream_and_send_openai_fields(stub):
    async def go():
        engine = await _engine(stub)
        whole = await engine.chat.completions.create(messages=[{"role": "user", "content": "hello there"}], max_tokens=16)
        chunks = [c async for c in await engine.chat.completions.create(messages=[{"role": "user", "content": "hello there"}],
                                                                         max_tokens=16, stream=True, top_k=5)]
        return whole, chunks

    Stub.bodies.clear()
    whole, chunks = run(go())
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": "echo: hello there"}
    assert whole["model"] == MODEL and whole["usage"]["completion_tokens"] == 3
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "echo: hello there"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop" and chunks[-1]["usage"]["total_tokens"] == 8
    plain, streamed = Stub.bodies
    assert plain["model"] == MODEL and plain["max_tokens"] == 16 and plain["stream"] is False
    assert not {"top_k", "min_p", "repetition_penalty", "seed"} & plain.keys()     # OpenAI's API refuses them
    assert streamed["stream"] is True and streamed["top_k"] == 5


def test_tool_calls_come_back_whole_streamed_or_not(stub):
    async def go():
        engine = await _engine(stub)
        request = dict(messages=[{"role": "user", "content": "weather?"}], tools=[WEATHER], tool_choice="required")
        whole = await engine.chat.completions.create(**request)
        chunks = [c async for c in await engine.chat.completions.create(**request, stream=True)]
        return whole, chunks

    whole, chunks = run(go())
    message = whole["choices"][0]["message"]
    assert message["content"] is None and whole["choices"][0]["finish_reason"] == "tool_calls"
    assert message["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    (delta,) = [c["choices"][0]["delta"]["tool_calls"] for c in chunks if "tool_calls" in c["choices"][0]["delta"]]
    assert delta == [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]
    assert Stub.bodies[-1]["tool_choice"] == "required" and Stub.bodies[-1]["tools"] == [WEATHER]


def test_a_bad_request_is_refused_before_it_is_sent(stub):
    async def go():
        engine = await _engine(stub)
        Stub.bodies.clear()
        with pytest.raises(BadRequestError, match="max_tokens") as err:
            await engine.chat.completions.create(messages=[{"role": "user", "content": "hi"}], max_tokens=-1)
        assert err.value.param == "max_tokens"
        with pytest.raises(BadRequestError, match="temperature too high for this server"):   # the server's own refusal
            await engine.chat.completions.create(messages=[{"role": "user", "content": "hi"}], temperature=1.9)

    run(go())
    assert len(Stub.bodies) == 1


def test_failures_say_what_to_do(stub):
    with pytest.raises(RemoteError, match="could not reach .*is the server running"):
        run(load(MODEL, base_url=free_port_url()))
    with pytest.raises(RemoteError, match="HTTP 401.*Incorrect API key.*check the API key"):
        run(load(MODEL, base_url=stub + "/v1", api_key="wrong"))
    with pytest.raises(ModelNotFoundError, match=f"does not serve 'nope'; it serves {MODEL}"):
        run(load("nope", base_url=stub + "/v1", api_key=KEY))
    with pytest.raises(BadRequestError, match="http"):
        run(load(MODEL, base_url="127.0.0.1:8080/v1"))

    async def without_v1():          # no /models there either: the first request says where /v1 belongs
        engine = await load(MODEL, base_url=stub, api_key=KEY)
        await engine.chat.completions.create(messages=[{"role": "user", "content": "hi"}])

    with pytest.raises(RemoteError, match="HTTP 404.*ends in /v1"):
        run(without_v1())


REMOTE_JS = """async ([base, dead, noCors, model, key, tools]) => {
  const { createEngine } = await import('/pyshim.js');
  const failure = async (f) => { try { await f(); return null; } catch (e) { return {name: e.name, status: e.status, code: e.code, message: e.message, hint: e.hint}; } };
  const engine = await createEngine({ baseURL: base + '/v1', apiKey: key, model });
  const question = [{role: 'user', content: 'hello there'}];
  const whole = await engine.chat.completions.create({ messages: question });
  let text = '', last = null;
  for await (const chunk of await engine.chat.completions.create({ messages: question, stream: true })) {
    text += chunk.choices[0]?.delta?.content ?? '';
    last = chunk;
  }
  const calls = [];
  for await (const chunk of await engine.chat.completions.create({ messages: question, tools, tool_choice: 'required', stream: true })) {
    calls.push(...(chunk.choices[0]?.delta?.tool_calls ?? []));
  }
  return {
    whole: whole.choices[0].message.content, text, finish: last.choices[0].finish_reason, calls,
    stats: engine.stats(), models: await engine.models.list(),
    bad: await failure(() => engine.chat.completions.create({ messages: question, max_tokens: -1 })),
    refused: await failure(() => engine.chat.completions.create({ messages: question, temperature: 1.9 })),
    dead: await failure(() => createEngine({ baseURL: dead, model })),
    cors: await failure(() => createEngine({ baseURL: noCors + '/v1', apiKey: key, model })),
    key: await failure(() => createEngine({ baseURL: base + '/v1', apiKey: 'wrong', model })),
    missing: await failure(() => createEngine({ baseURL: base + '/v1', apiKey: key, model: 'nope' })),
  };
}"""


def test_the_command_line_chats_through_a_remote_server(stub, capsys, monkeypatch):
    """`pyshim generate --base-url`: the reply streamed to stdout (and in --json), a missing --chat and a
    model the server does not serve refused with what to do."""
    import json

    from pyshim.cli import main

    base = ["--base-url", stub + "/v1", "--chat", "--prompt"]
    assert main(["generate", MODEL, "--api-key", KEY, *base, "hello from the shell"]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == "echo: hello from the shell" and f"{MODEL} on {stub}/v1" in out.err
    monkeypatch.setenv("OPENAI_API_KEY", KEY)                 # the key from the environment, as OpenAI's tools read it
    assert main(["generate", MODEL, *base, "hi", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["text"] == "echo: hi" and report["finish_reason"] == "stop" and report["remote"] == stub + "/v1"
    assert Stub.bodies[-1]["model"] == MODEL and Stub.bodies[-1]["messages"] == [{"role": "user", "content": "hi"}]
    assert main(["generate", MODEL, "--base-url", stub + "/v1", "--prompt", "hi"]) == 2
    assert "add --chat" in capsys.readouterr().err
    assert main(["generate", "no-such-model", *base, "hi"]) == 2
    err = capsys.readouterr().err
    assert "does not serve 'no-such-model'" in err and MODEL in err


@pytest.mark.browser
def test_the_js_api_chats_through_a_remote_server(chromium, dev_server, stub):
    Stub.bodies.clear()
    with serve(cors=False) as no_cors:
        context = chromium.new_context()
        try:
            page, watch = harness.open_page(context, dev_server.url + "manifest.webmanifest")
            out = page.evaluate(REMOTE_JS, [stub, free_port_url(), no_cors, MODEL, KEY, [WEATHER]])
        finally:
            context.close()
    assert out["whole"] == out["text"] == "echo: hello there" and out["finish"] == "stop"
    assert [c["function"].get("arguments", "") for c in out["calls"]] == ["", '{"city": ', '"Paris"}']   # the server's own fragments
    assert out["stats"]["remote"] == stub + "/v1" and out["models"]["data"][0]["id"] == MODEL
    assert out["bad"]["status"] == 400 and "max_tokens" in out["bad"]["message"]
    assert out["refused"]["status"] == 400 and "temperature too high for this server" in out["refused"]["message"]
    assert out["dead"]["code"] == "RemoteError" and "could not reach" in out["dead"]["message"]
    assert out["cors"]["code"] == "CORSError" and "CORS" in out["cors"]["message"] and "OLLAMA_ORIGINS" in out["cors"]["hint"]
    assert out["key"]["status"] == 401 and "API key" in out["key"]["hint"]
    assert out["missing"]["code"] == "model_not_found" and MODEL in out["missing"]["message"]
    assert all(b["model"] == MODEL for b in Stub.bodies) and len(Stub.bodies) == 4     # the bad request never left the page


@pytest.mark.browser
@pytest.mark.slow
def test_the_python_api_in_a_page_chats_through_a_remote_server(chromium, dev_server, stub):
    """web/examples/pyscript.html?base_url=...: pyshim.api.load(base_url=) in Pyodide goes through the
    page's remote engine; streamed and whole replies are the server's."""
    context = chromium.new_context()
    try:
        page, watch = harness.open_page(context, dev_server.url + f"examples/pyscript.html?base_url={stub}/v1&model={MODEL}&api_key={KEY}")
        page.wait_for_function("() => ['ready', 'error'].includes(document.body.dataset.state)", timeout=300_000)
        assert page.evaluate("() => document.body.dataset.state") == "ready", page.inner_text("#status")
        page.fill("#question", "hi from python")
        page.click("#send")
        page.wait_for_function("() => document.getElementById('same').textContent"
                               " || document.getElementById('status').textContent.includes('Error')", timeout=60_000)
        assert page.inner_text("#streamed") == page.inner_text("#whole") == "echo: hi from python", page.inner_text("#status")
        assert page.inner_text("#status").startswith("done: 4 tokens, finish_reason stop")
    finally:
        context.close()


@pytest.mark.browser
def test_the_site_chats_with_a_model_on_a_server(chromium, dev_server, stub):
    """The site's "Server" tab: a base URL, a model name and a key; the chat then goes to that server (no
    download, no GPU needed), and a server that refuses the page's origin is explained in the tab. And
    <pyshim-chat base-url api-key> in the same page."""
    with serve(cors=False) as no_cors:
        context = chromium.new_context()
        try:
            page, watch = harness.open_page(context, dev_server.url)
            page.click("[aria-controls=tab-remote]")
            page.fill("#remote-url", no_cors + "/v1")
            page.fill("#remote-model", MODEL)
            page.click("#remote-form button[type=submit]")
            page.wait_for_function("() => document.getElementById('remote-note').textContent.includes('CORS')", timeout=30_000)
            # the server's own list of models is offered as soon as its address and key are typed
            page.fill("#remote-url", stub + "/v1")
            page.fill("#remote-key", KEY)
            page.fill("#remote-model", "")
            page.dispatch_event("#remote-key", "change")
            page.wait_for_function("() => document.getElementById('remote-note').textContent.includes('serves')", timeout=30_000)
            assert page.input_value("#remote-model") == MODEL
            assert page.eval_on_selector_all("#remote-models option", "os => os.map(o => o.value)") == [MODEL]
            page.click("#remote-form button[type=submit]")
            page.wait_for_function("() => document.getElementById('remote-note').textContent.startsWith('Connected')", timeout=30_000)
            assert MODEL in page.inner_text("#chat-model") and "On the server" in page.inner_text("#chat-sub")
            page.fill("#prompt", "hello from the site")
            page.click("#send")
            page.wait_for_function("() => [...document.querySelectorAll('#messages .bubble')].at(-1)?.textContent.includes('echo')"
                                   " && document.getElementById('stop').hidden", timeout=30_000)
            replies = page.locator("#messages .bubble")
            assert replies.nth(replies.count() - 1).inner_text().strip() == "echo: hello from the site"
            assert Stub.bodies[-1]["messages"][-1] == {"role": "user", "content": "hello from the site"}
            # <pyshim-chat base-url api-key>: the element chats with the same server.
            reply = page.evaluate("""async ([base, model, key]) => {
              await import('/pyshim-chat.js');
              const box = document.createElement("pyshim-chat");
              for (const [k, v] of [['model', model], ['base-url', base], ['api-key', key]]) box.setAttribute(k, v);
              const ready = new Promise((resolve, reject) => { box.addEventListener('pyshim-ready', resolve); box.addEventListener('pyshim-error', (e) => reject(new Error(e.detail.message))); });
              document.body.append(box);
              await ready;
              return (await box.send('hi element')).text;
            }""", [stub + "/v1", MODEL, KEY])
            assert reply == "echo: hi element"
        finally:
            context.close()
