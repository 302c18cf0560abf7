"""pyshim.api's validated requests as OpenAI-shaped request bodies, and OpenAI-shaped replies and stream
chunks back as what the API builds its objects from: shared by the engines that take requests rather
than token ids (the page's JavaScript engine, pyshim.serve.js_engine; a remote server,
pyshim.serve.remote). Plain data only: no I/O, no FFI."""

from __future__ import annotations

from dataclasses import dataclass

from pyshim.serve.sampling import SamplingParams

# pyshim's sampling extensions, sent only when set: OpenAI's own API refuses fields it does not know.
EXTENSIONS = ("top_k", "min_p", "repetition_penalty")


@dataclass
class Reply:
    """What pyshim.api reads from a reply (as pyshim.serve.generation.Completion)."""

    text: str
    finish_reason: str
    usage_: dict
    tool_calls: list[dict] | None = None

    def usage(self) -> dict:
        return self.usage_


def request_body(messages: list[dict], sampling, *, stream: bool, extensions: str = "all") -> dict:
    """The request for `sampling` (pyshim.serve.protocol.Sampling). `extensions`: "all" (pyshim's JS
    engine takes every field) or "set" (a foreign server: only the extensions that change something)."""
    params, default = sampling.params, SamplingParams()
    body = {"messages": messages, "temperature": params.temperature, "top_p": params.top_p,
            "presence_penalty": params.presence_penalty, "frequency_penalty": params.frequency_penalty,
            "max_tokens": sampling.max_tokens, "stream": stream}
    for name in EXTENSIONS:
        if extensions == "all" or getattr(params, name) != getattr(default, name):
            body[name] = getattr(params, name)
    if params.seed is not None or extensions == "all":
        body["seed"] = params.seed
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    if sampling.response_format is not None:
        body["response_format"] = sampling.response_format.as_request()
    if sampling.tools is not None:
        body.update(sampling.tools.as_request())
    return body


def reply_of(completion: dict) -> Reply:
    """A chat.completion object as a Reply."""
    choice = completion["choices"][0]
    message = choice["message"]
    return Reply(message.get("content") or "", choice["finish_reason"], completion.get("usage") or {},
                 message.get("tool_calls") or None)


class Chunks:
    """Stream chunks gathered into a Reply; `on_text(piece, None)` sees each piece of text as it comes
    (such engines stream text, not token ids). Tool calls come whole (pyshim's engines) or in OpenAI's
    pieces (a remote server: name first, arguments in fragments), joined by index."""

    def __init__(self, on_text):
        self.on_text = on_text
        self.pieces: list[str] = []
        self.calls: dict[int, dict] = {}
        self.finish, self.usage = None, {}

    def add(self, chunk: dict) -> None:
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        if not chunk.get("choices"):
            return
        choice = chunk["choices"][0]
        delta = choice.get("delta") or {}
        if delta.get("content"):
            self.pieces.append(delta["content"])
            self.on_text(delta["content"], None)
        for part in delta.get("tool_calls") or ():
            call = self.calls.setdefault(part.get("index", len(self.calls)),
                                         {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
            call["id"] = part.get("id") or call["id"]
            fn = part.get("function") or {}
            call["function"]["name"] += fn.get("name") or ""
            call["function"]["arguments"] += fn.get("arguments") or ""
        if choice.get("finish_reason"):
            self.finish = choice["finish_reason"]

    def reply(self) -> Reply:
        calls = [self.calls[i] for i in sorted(self.calls)] or None
        return Reply("".join(self.pieces), self.finish or "stop", self.usage, calls)
