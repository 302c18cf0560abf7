"""A remote model: an OpenAI-compatible server the user already runs (vLLM, llama.cpp's server, Ollama's
/v1) behind pyshim.api, for a model too big for this device even with streaming. The API validates a
request as it does for a local model; this module sends it to `<base_url>/chat/completions` (streamed as
server-sent events) and turns the answer back into a reply. Failures say what to do: a server that does
not answer, a refused key, a wrong base URL, a model it does not serve.

CPython only for now (the standard library's HTTP client, in a thread so the event loop stays free); in
a page the same request goes through the JavaScript engine's fetch (still to come).
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request

from pyshim.errors import BadRequestError, ModelNotFoundError, RemoteError
from pyshim.serve.wire import Chunks, Reply, reply_of, request_body

TIMEOUT_S = 300.0        # a first token of a big model on a busy server can take long; a dead one is refused at once
_DONE = object()


class RemoteSession:
    """pyshim.serve.session.Session's `chat` over an OpenAI-compatible server."""

    def __init__(self, base_url: str, model: str, api_key: str | None = None, *, timeout_s: float = TIMEOUT_S):
        if not base_url.startswith(("http://", "https://")):
            raise BadRequestError(f"base_url must be an http(s) URL, got {base_url!r}", param="base_url",
                                  hint="for example http://127.0.0.1:8080/v1 (llama.cpp's server) or http://127.0.0.1:11434/v1 (Ollama)")
        self.base_url, self.model, self.api_key, self.timeout_s = base_url.rstrip("/"), model, api_key, timeout_s

    def _request(self, path: str, body: dict | None = None) -> urllib.request.Request:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = None if body is None else json.dumps(body).encode()
        return urllib.request.Request(self.base_url + path, data=data, headers=headers, method="GET" if body is None else "POST")

    def _open(self, request: urllib.request.Request):
        """The response, or the error that says why there is none."""
        try:
            return urllib.request.urlopen(request, timeout=self.timeout_s)
        except urllib.error.HTTPError as exc:
            raise self._http_error(exc) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise RemoteError(f"could not reach {request.full_url}: {reason}",
                              hint="is the server running, and is the base URL right (it usually ends in /v1)?") from None

    def _http_error(self, exc: urllib.error.HTTPError) -> Exception:
        try:
            detail = json.loads(exc.read() or b"{}")
            message = (detail.get("error") or {}).get("message") if isinstance(detail.get("error"), dict) else detail.get("error")
        except (ValueError, AttributeError):
            message = None
        said = f": {message}" if message else ""
        if exc.code in (401, 403):
            return RemoteError(f"{exc.url} refused the request (HTTP {exc.code}){said}", hint="check the API key (api_key=)")
        if exc.code == 404:
            return RemoteError(f"{exc.url} does not exist on that server (HTTP 404){said}",
                               hint="the base URL usually ends in /v1, e.g. http://127.0.0.1:8080/v1")
        if exc.code in (400, 422):
            return BadRequestError(f"the server refused the request{said or f' (HTTP {exc.code})'}")
        return RemoteError(f"the server failed the request (HTTP {exc.code}){said}", hint="see the server's log")

    async def prepare(self) -> None:
        """The server answers and serves the model (when it lists its models: /models)."""
        def fetch():
            with self._open(self._request("/models")) as response:
                return json.loads(response.read() or b"{}")

        try:
            listing = await asyncio.to_thread(fetch)
        except RemoteError as exc:
            if "HTTP 404" not in str(exc):
                raise
            return           # a server without a listing: the first request will tell
        ids = [m.get("id") for m in listing.get("data") or () if isinstance(m, dict)]
        if ids and self.model not in ids:
            raise ModelNotFoundError(f"{self.base_url} does not serve {self.model!r}; it serves {', '.join(map(str, ids))}",
                                     hint="load one of those names")

    async def chat(self, messages, sampling, *, on_text=None, should_stop=None) -> Reply:
        body = {"model": self.model, **request_body(messages, sampling, stream=on_text is not None, extensions="set")}
        request = self._request("/chat/completions", body)
        if on_text is None:
            def fetch():
                with self._open(request) as response:
                    return json.loads(response.read())

            return reply_of(await asyncio.to_thread(fetch))
        return await self._stream(request, on_text, should_stop or (lambda: False))

    async def _stream(self, request, on_text, should_stop) -> Reply:
        """Server-sent events read in a thread, handed to the loop one chunk at a time."""
        loop, queue, stop = asyncio.get_running_loop(), asyncio.Queue(), threading.Event()

        def read():
            try:
                with self._open(request) as response:
                    for raw in response:
                        if stop.is_set():
                            break
                        line = raw.decode("utf-8").strip()
                        if not line.startswith("data:"):
                            continue             # event names, comments, keep-alives
                        data = line[5:].strip()
                        if data == "[DONE]":
                            break
                        loop.call_soon_threadsafe(queue.put_nowait, json.loads(data))
                loop.call_soon_threadsafe(queue.put_nowait, _DONE)
            except BaseException as exc:   # handed to the loop, raised there
                loop.call_soon_threadsafe(queue.put_nowait, exc)

        reader = asyncio.ensure_future(asyncio.to_thread(read))
        chunks = Chunks(on_text)
        try:
            while (item := await queue.get()) is not _DONE:
                if isinstance(item, BaseException):
                    raise item
                if isinstance(item, dict) and item.get("error"):
                    raise RemoteError(f"the server failed the request: {item['error']}", hint="see the server's log")
                chunks.add(item)
                if should_stop():
                    chunks.finish = "abort"
                    break
        finally:
            stop.set()
        if chunks.finish == "abort":
            reader.cancel()
        else:
            await reader
        return chunks.reply()

    def close(self) -> None:
        """Nothing held: each request opens its own connection."""
