"""The Python API, shaped like OpenAI's client (snake_case), over the chat engine:

    engine = await pyshim.api.load("smollm2")
    reply = await engine.chat.completions.create(messages=[{"role": "user", "content": "Hi"}])
    async for chunk in await engine.chat.completions.create(messages=..., stream=True):
        print(chunk["choices"][0]["delta"].get("content", ""), end="")

Requests are validated before any work, with BadRequestError naming the field. Requests to one engine
run one at a time (a lock), so two callers never interleave inside one KV cache.

In Pyodide (a PyScript page) the backend is pyshim's JavaScript engine (pyshim/serve/js_engine.py): the
model comes from the site's store and runs in the engine's Worker; validation and shapes stay here.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from typing import TYPE_CHECKING, Any, AsyncIterator

from pyshim.errors import BadRequestError
from pyshim.serve.sampling import SamplingParams

if TYPE_CHECKING:
    from pyshim.serve.session import ChatEngine

DEFAULT_MAX_TOKENS = 256
ROLES = ("system", "user", "assistant")
IN_PYODIDE = sys.platform == "emscripten"


class _AsyncCpuRunner:
    """The NumPy reference behind the async runner interface ChatEngine drives."""

    def __init__(self, runner):
        self._runner = runner
        self.n_ctx = runner.n_ctx

    async def forward_async(self, ids, start: int, all_logits: bool = False):
        return self._runner.forward(list(ids), start, all_logits)

    async def greedy_async(self, ids, start: int) -> int:
        return int(self._runner.forward(list(ids), start)[-1].argmax())

    async def prepare_async(self) -> None:
        self._runner.prepare()

    def reset(self) -> None:
        self._runner.reset()


async def load(model: str, *, backend: str | None = None, n_ctx: int | None = None, kv_type: str = "f32",
               on_progress=None, js_module=None) -> "Engine":
    """An engine for a model path or short name (`smollm2`, `gemma3`, `qwen2.5`); backend "gpu" (native
    WebGPU through wgpu), "cpu" (the NumPy reference) or, in Pyodide, "browser" (the default there: the
    site's JavaScript engine; `on_progress(dict)` gets its download/load progress, `js_module` is
    web/pyshim.js or its URL when the PyScript config does not name it, see pyshim/serve/js_engine.py).
    `kv_type`: the KV cache, "f32", "f16" or "q8"."""
    from pyshim.exec.kvcache import KV_TYPES     # light: PyScript pages have numpy and pyshim, not gguf

    if kv_type not in KV_TYPES:
        raise BadRequestError(f"unknown kv_type {kv_type!r}", hint=f"use one of: {', '.join(KV_TYPES)}")
    backend = backend or ("browser" if IN_PYODIDE else "gpu")
    if backend == "browser":
        if not IN_PYODIDE:
            raise BadRequestError("backend 'browser' runs only inside Pyodide (a PyScript page)",
                                  hint="use 'gpu' or 'cpu' here; `pyshim generate --backend browser` drives a headless browser")
        from pyshim.serve.js_engine import load_js_engine

        chat_engine = await load_js_engine(model, n_ctx=n_ctx, kv_type=kv_type, on_progress=on_progress, js_module=js_module)
        return Engine(chat_engine, model_id=str(model))
    from pyshim.setup.catalog import resolve_model
    from pyshim.text.chat import ChatTemplate
    from pyshim.serve.session import ChatEngine
    from pyshim.gguf.header import read_header_from_file
    from pyshim.text.tokenizer import Tokenizer
    from pyshim.gguf.tensors import FileSource

    path = resolve_model(model)
    header = read_header_from_file(path)
    if backend == "gpu":
        chat_engine = await ChatEngine.open(header, FileSource(path), n_ctx=n_ctx, kv_type=kv_type)
    elif backend == "cpu":
        from pyshim.exec.loading import load as load_cpu

        tokenizer = Tokenizer.from_metadata(header.metadata)
        chat_engine = ChatEngine(_AsyncCpuRunner(load_cpu(path, n_ctx=n_ctx, kv_type=kv_type)), tokenizer,
                                 ChatTemplate.from_metadata(header.metadata, tokenizer))
    else:
        raise BadRequestError(f"unknown backend {backend!r}", hint="use 'gpu' or 'cpu' ('browser' in Pyodide)")
    await chat_engine.prepare()
    return Engine(chat_engine, model_id=str(model))


class Engine:
    def __init__(self, chat_engine: ChatEngine, model_id: str):
        self._engine = chat_engine
        self.model_id = model_id
        self._lock = asyncio.Lock()
        self.chat = _Chat(self)


class _Chat:
    def __init__(self, engine: Engine):
        self.completions = _Completions(engine)


def _validate(engine: Engine, messages, model, temperature, top_p, max_tokens, stop, seed) -> tuple[list[dict], SamplingParams, int, list[str]]:
    if model is not None and model != engine.model_id:
        raise BadRequestError(f"unknown model {model!r}: this engine serves {engine.model_id!r}", hint="omit `model` or load that model")
    if not isinstance(messages, list) or not messages:
        raise BadRequestError("`messages` must be a non-empty list of {role, content}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise BadRequestError(f"messages[{i}] must be {{'role': one of {', '.join(ROLES)}, 'content': a string}}")
    for name, value, low, high in (("temperature", temperature, 0.0, 2.0), ("top_p", top_p, 0.0, 1.0)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise BadRequestError(f"`{name}` must be a number in [{low}, {high}], got {value!r}")
    if top_p == 0:
        raise BadRequestError("`top_p` must be greater than 0")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise BadRequestError(f"`max_tokens` must be a positive integer, got {max_tokens!r}")
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if not all(isinstance(s, str) and s for s in stops) or len(stops) > 4:
        raise BadRequestError("`stop` must be a non-empty string or a list of up to 4 of them")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise BadRequestError(f"`seed` must be an integer, got {seed!r}")
    return messages, SamplingParams(temperature=float(temperature), top_p=float(top_p), seed=seed), max_tokens, stops


class _Completions:
    def __init__(self, engine: Engine):
        self._engine = engine

    async def create(self, *, messages, model: str | None = None, temperature: float = 1.0, top_p: float = 1.0,
                     max_tokens: int = DEFAULT_MAX_TOKENS, stop=None, seed: int | None = None, stream: bool = False):
        """An OpenAI-shaped `chat.completion` dict, or (stream=True) an async iterator of `chat.completion.chunk` dicts."""
        messages, params, max_tokens, stops = _validate(self._engine, messages, model, temperature, top_p, max_tokens, stop, seed)
        base = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()), "model": self._engine.model_id}
        if stream:
            return self._stream(base, messages, params, max_tokens, stops)
        async with self._engine._lock:
            reply = await self._engine._engine.chat(messages, params, max_tokens, stop_strings=stops)
        return {**base, "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": reply.text}, "finish_reason": reply.finish_reason}],
                "usage": reply.as_dict()["usage"]}

    async def _stream(self, base, messages, params, max_tokens, stops) -> AsyncIterator[dict[str, Any]]:
        def chunk(delta: dict, finish: str | None = None, **extra) -> dict:
            return {**base, "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}

        queue: asyncio.Queue = asyncio.Queue()
        done = object()

        async def produce():
            async with self._engine._lock:
                try:
                    reply = await self._engine._engine.chat(messages, params, max_tokens, stop_strings=stops,
                                                             on_text=lambda piece, token: queue.put_nowait(piece))
                    queue.put_nowait((done, reply))
                except Exception as exc:  # handed to the consumer, who re-raises it
                    queue.put_nowait((done, exc))

        task = asyncio.ensure_future(produce())
        yield chunk({"role": "assistant", "content": ""})
        try:
            while True:
                item = await queue.get()
                if isinstance(item, tuple) and item[0] is done:
                    if isinstance(item[1], BaseException):
                        raise item[1]
                    reply = item[1]
                    yield chunk({}, reply.finish_reason, usage=reply.as_dict()["usage"])
                    return
                yield chunk({"content": item})
        finally:
            await task
