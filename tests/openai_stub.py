"""A small OpenAI-shaped server for the remote-model tests: a real HTTP server on 127.0.0.1 that serves
/v1/models and /v1/chat/completions (an echo of the last message, streamed as server-sent events, or a
tool call in OpenAI's streamed fragments when tool_choice is "required"), checks the API key, refuses a
temperature above 1.5 as a server would, and answers a browser's CORS preflight unless told not to."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL, KEY = "stub-model", "sk-test"


class Stub(BaseHTTPRequestHandler):
    bodies: list[dict] = []
    cors = True          # a page of another origin may read the answers (set per server: see serve)

    def log_message(self, *args):   # quiet
        pass

    def _json(self, code: int, obj: dict) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self._cors()
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _cors(self) -> None:
        if self.cors:
            self.send_header("Access-Control-Allow-Origin", "*")

    def do_OPTIONS(self):   # a browser's preflight (Authorization and a JSON body need one)
        self.send_response(204)
        self._cors()
        if self.cors:
            self.send_header("Access-Control-Allow-Headers", "authorization, content-type")
            self.send_header("Access-Control-Allow-Methods", "GET, POST")
        self.end_headers()

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
        self._cors()
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


@contextlib.contextmanager
def serve(cors: bool = True):
    """The stub on a free port of 127.0.0.1; yields its URL (without /v1)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Stub", (Stub,), {"cors": cors}))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def free_port_url() -> str:
    """A URL nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"
