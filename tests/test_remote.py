"""A remote model (pyshim.api.load(base_url=...)) against a small OpenAI-shaped stub server: a real HTTP
server on 127.0.0.1, started here. The same API validates before sending, sends OpenAI's fields (pyshim's
extensions only when set), streams, joins a server's tool-call fragments, and explains a server that does
not answer, refuses the key, has no such path or model, or refuses the request."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pyshim.api import load
from pyshim.errors import BadRequestError, ModelNotFoundError, RemoteError

MODEL, KEY = "stub-model", "sk-test"
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


class Stub(BaseHTTPRequestHandler):
    bodies: list[dict] = []

    def log_message(self, *args):   # quiet
        pass

    def _json(self, code: int, obj: dict) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        if self.headers.get("Authorization") != f"Bearer {KEY}":
            self._json(401, {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}})
            return False
        return True

    def do_GET(self):
        if self.path != "/v1/models":
            return self._json(404, {"error": "not found"})
        if self._authorized():
            self._json(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    def do_POST(self):
        if self.path != "/v1/chat/completions":
            return self._json(404, {"error": "not found"})
        if not self._authorized():
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Stub.bodies.append(body)
        if body.get("temperature", 0) > 1.5:
            return self._json(400, {"error": {"message": "temperature too high for this server"}})
        words = ("echo: " + body["messages"][-1]["content"]).split(" ")
        calls = body.get("tool_choice") == "required"
        usage = {"prompt_tokens": 5, "completion_tokens": len(words), "total_tokens": 5 + len(words)}
        if not body.get("stream"):
            message = ({"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                "name": "get_weather", "arguments": '{"city": "Paris"}'}}]} if calls else {"role": "assistant", "content": " ".join(words)})
            return self._json(200, {"id": "x", "object": "chat.completion", "model": MODEL, "usage": usage, "choices": [
                {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}]})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()

        def send(delta: dict, finish=None, **extra):
            chunk = {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()

        self.wfile.write(b": keep-alive\n\n")
        send({"role": "assistant", "content": ""})
        if calls:   # OpenAI's pieces: the name first, the arguments in fragments
            send({"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}]})
            for part in ('{"city": ', '"Paris"}'):
                send({"tool_calls": [{"index": 0, "function": {"arguments": part}}]})
        else:
            for i, word in enumerate(words):
                send({"content": word if i == 0 else " " + word})
        send({}, "tool_calls" if calls else "stop", usage=usage)
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture(scope="module")
def stub():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


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
    with socket.socket() as s:         # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    with pytest.raises(RemoteError, match="could not reach .*is the server running"):
        run(load(MODEL, base_url=dead))
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
