"""The Python API, shaped like OpenAI's client (snake_case), over a session:

    engine = await pyshim.api.load("smollm2")
    reply = await engine.chat.completions.create(messages=[{"role": "user", "content": "Hi"}])
    async for chunk in await engine.chat.completions.create(messages=..., stream=True):
        print(chunk["choices"][0]["delta"].get("content", ""), end="")

Requests are checked before any work against the shapes of pyshim.serve.protocol (the same rules the
JS API and the /v1 endpoint apply), with BadRequestError naming the field. Requests to one engine run one
at a time (pyshim.serve.scheduler), so two callers never interleave inside one KV cache — or, loaded with
`parallel=N` (the gpu backend), up to N at once, each in a cache of its own, their decode steps run
together (continuous batching: `asyncio.gather` of several `create` calls reads the weights once a step
for all of them; each reply is what it is alone).

In Pyodide (a PyScript page) the backend is pyshim's JavaScript engine (pyshim.serve.js_engine): the
model comes from the site's store and runs in the engine's Worker; validation and shapes stay here.
Importing this module needs only numpy: the engine's own dependencies load with a native backend.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from typing import Any, AsyncIterator

from pyshim.errors import BadRequestError
from pyshim.plan.settings import RunSettings
from pyshim.serve.protocol import Sampling, validate
from pyshim.serve.scheduler import Scheduler

IN_PYODIDE = sys.platform == "emscripten"
BACKENDS = ("gpu", "cpu", "wasm", "browser")


async def load(model: str, *, backend: str | None = None, n_ctx: int | None = None, kv_type: str = "auto",
               arithmetic: str | None = None, rope_scaling: str | None = None, rope_scale: float | None = None,
               yarn_orig_ctx: int | None = None, budget_mb: float | None = None, expert_slots: int | None = None,
               streamed_layers: int | None = None, on_progress=None, js_module=None,
               base_url: str | None = None, api_key: str | None = None, parallel: int = 1,
               kv_pages: int | None = None) -> "Engine":
    """An engine for a model path or short name (`smollm2`, `gemma3`, `qwen2.5`); backend "gpu" (native
    WebGPU through wgpu), "cpu" (the NumPy reference), "wasm" (the WebAssembly SIMD CPU engine under
    wasmtime) or, in Pyodide, "browser" (the default there: the
    site's JavaScript engine; `on_progress(dict)` gets its download/load progress, `js_module` is
    web/pyshim.js or its URL when the PyScript config does not name it). `kv_type` (auto — the default: the
    type and, without `n_ctx`, the context that fit the GPU budget, pyshim.plan.auto —, f32, f16, q8, q4) and
    `arithmetic` (f32, int8, llama.cpp-exact; None: the backend's default) as pyshim.plan.settings says;
    `rope_scaling` (none, linear, yarn), `rope_scale` and `yarn_orig_ctx` override the GGUF's rope scaling.
    `budget_mb`: the GPU memory auto plans against (MiB; default 4096); `expert_slots`: a mixture of experts
    keeps that many experts a layer on the GPU and streams the rest from the store; `streamed_layers`: the
    last that many layers are streamed from the store through rotating GPU buffers (None: auto decides).
    `base_url` (with an optional `api_key`): `model` is served by that OpenAI-compatible server (vLLM,
    llama.cpp's server, Ollama's /v1) instead, through the same API (pyshim.serve.remote). `parallel`: how
    many requests run at once (default 1), their decode steps batched; on the gpu backend they share a KV
    cache of `kv_pages` pages of 16 positions (default: room for every request's whole context; fewer: a
    request that finds none free waits for another to end, or fails with KVCacheFullError when all wait)."""
    settings = RunSettings(context=n_ctx, kv_type=kv_type, arithmetic=arithmetic, rope_scaling=rope_scaling,
                           rope_scale=rope_scale, yarn_orig_ctx=yarn_orig_ctx, expert_slots=expert_slots, streamed_layers=streamed_layers,
                           budget_bytes=None if budget_mb is None else int(budget_mb * 2**20), parallel=parallel,
                           kv_pages=kv_pages)
    if parallel > 1 and base_url is not None:
        raise BadRequestError("parallel requests run on pyshim's own engines, not through a remote server",
                              hint="leave parallel at 1: the server schedules its own requests", param="parallel")
    if base_url is not None:
        if IN_PYODIDE:   # the page's fetch, through the JS API's remote engine (web/engine/remote.js)
            from pyshim.serve.js_engine import load_js_session

            session = await load_js_session(model, settings, js_module=js_module, base_url=base_url, api_key=api_key)
            return Engine(session, model_id=str(model))
        from pyshim.serve.remote import RemoteSession

        session = RemoteSession(base_url, str(model), api_key)
        await session.prepare()
        return Engine(session, model_id=str(model))
    backend = backend or ("browser" if IN_PYODIDE else "gpu")
    if backend not in BACKENDS:
        raise BadRequestError(f"unknown backend {backend!r}", hint="use 'gpu', 'cpu' or 'wasm' ('browser' in Pyodide)")
    if backend == "browser":
        if not IN_PYODIDE:
            raise BadRequestError("backend 'browser' runs only inside Pyodide (a PyScript page)",
                                  hint="use 'gpu' or 'cpu' here; `pyshim generate --backend browser` drives a headless browser")
        from pyshim.serve.js_engine import load_js_session

        session = await load_js_session(model, settings, on_progress=on_progress, js_module=js_module)
        return Engine(session, model_id=str(model))
    from pyshim.exec.loading import load as load_runner
    from pyshim.serve.session import Session
    from pyshim.setup.catalog import resolve_model

    runner = await load_runner(resolve_model(model), backend=backend, settings=settings)
    if parallel > runner.capacity.max_seqs:
        runner.close()
        raise BadRequestError(f"the {backend} backend holds at most {runner.capacity.max_seqs} sequences, not {parallel}",
                              hint=f"use parallel={runner.capacity.max_seqs} or fewer", param="parallel")
    if parallel > 1:
        from pyshim.serve.batching import BatchingRunner

        runner = BatchingRunner(runner)
    session = Session(runner)
    await session.prepare()
    return Engine(session, model_id=str(model), parallel=parallel)


class Engine:
    def __init__(self, session, model_id: str, parallel: int = 1):
        self.session = session
        self.model_id = model_id
        self.scheduler = Scheduler(parallel)
        self.chat = _Chat(self)

    def close(self) -> None:
        self.session.close()


def _message(reply) -> dict:
    """The assistant's message: its text, or (content null) the calls it made."""
    if reply.tool_calls:
        return {"role": "assistant", "content": None, "tool_calls": reply.tool_calls}
    return {"role": "assistant", "content": reply.text}


class _Chat:
    def __init__(self, engine: Engine):
        self.completions = _Completions(engine)


class _Completions:
    def __init__(self, engine: Engine):
        self._engine = engine

    async def create(self, *, stream: bool = False, **fields):
        """An OpenAI-shaped `chat.completion` dict, or (stream=True) an async iterator of
        `chat.completion.chunk` dicts. Fields as OpenAI's (messages, model, temperature, top_p, max_tokens,
        stop, seed) plus pyshim's sampling extensions (top_k, min_p, the penalties)."""
        request = validate("chat.completions", {**fields, "stream": stream})
        engine = self._engine
        if request["model"] is not None and request["model"] != engine.model_id:
            raise BadRequestError(f"unknown model {request['model']!r}: this engine serves {engine.model_id!r}",
                                  hint="omit `model` or load that model", param="model")
        messages = [{k: m[k] for k in ("role", "content", "tool_calls", "tool_call_id") if k in m} for m in request["messages"]]
        sampling = Sampling.of(request)
        base = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()), "model": engine.model_id}
        if stream:
            return self._stream(base, messages, sampling)
        reply = await engine.scheduler.run(lambda should_stop: engine.session.chat(messages, sampling, should_stop=should_stop))
        return {**base, "object": "chat.completion",
                "choices": [{"index": 0, "message": _message(reply), "finish_reason": reply.finish_reason}],
                "usage": reply.usage()}

    async def _stream(self, base, messages, sampling) -> AsyncIterator[dict[str, Any]]:
        def chunk(delta: dict, finish: str | None = None, **extra) -> dict:
            return {**base, "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}

        engine = self._engine
        queue: asyncio.Queue = asyncio.Queue()
        done = object()

        async def produce():
            try:
                reply = await engine.scheduler.run(lambda should_stop: engine.session.chat(
                    messages, sampling, should_stop=should_stop, on_text=lambda piece, token: queue.put_nowait(piece)))
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
                    if reply.tool_calls:
                        yield chunk({"tool_calls": [{"index": i, **call} for i, call in enumerate(reply.tool_calls)]})
                    yield chunk({}, reply.finish_reason, usage=reply.usage())
                    return
                yield chunk({"content": item})
        finally:
            await task
