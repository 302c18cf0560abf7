"""The site's engine Worker, its whole Python side: web/engine/worker.js calls these functions and
nothing else of pyshim (no Python source lives in the JS).

Requests arrive as JSON text whose shapes pyshim.serve.protocol defines (the page validated them against
the same schemas before posting); results go back as JSON text. The model lives in the site's store
(IndexedDB), which only JS can read, so a request that needs a model hands over `store`, a JS object
with the async methods the loader calls:
    readPrefix(model_id, length) -> Uint8Array       the file's first bytes (the header grows as needed)
    readRanges(model_id, ranges_json) -> [Uint8Array] the few small tensors Python keeps (norms, biases)
    upload(model_id, device, uploads)                every weight, store -> GPU buffer, chunk by chunk
    cpuEngine(threads, wide) -> engine               without WebGPU: a fresh WebAssembly CPU engine (cpu.js; wide:
                                                     its 64-bit build)
    wasm64                                           whether this browser runs it (memory64)
    uploadCpu(model_id, engine, uploads)             every matrix, store -> the engine's memory
so weights go from IndexedDB into GPU buffers without passing through Python (or Pyodide's heap). The
one model loaded and its settings live here; requests queue in one Scheduler; `emit(event, data_json)`
streams events to the request's caller: "started" (it left the queue), "token" {text, token, index},
"load-progress" {done_bytes, total_bytes, elapsed_ms} (the weights' upload, emitted by the store's
upload in web/engine/loader.js), and "progress" {phase, done, total}: phase "compile" (the GPU
pipelines of a load, pyshim.exec.gpu_runner.GpuRunner.prepare) or "prefill" (the prompt's tokens read
before the first new one, in generate and complete).

Arguments from JS arrive as Pyodide proxies (Uint8Array, functions); they are used by duck typing
(`to_bytes`), so this module also imports and tests in CPython.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import time

from pyshim.errors import BadRequestError, PyshimError
from pyshim.plan.settings import RunSettings
from pyshim.serve.engine_open import open_engine
from pyshim.serve.prewarm import Prewarm
from pyshim.serve.protocol import Sampling, validate
from pyshim.serve.scheduler import Scheduler

HEADER_FIRST_READ = 1 << 20      # most headers fit; a 262k-token vocabulary needs ~6 MB
HEADER_MAX_ROUNDS = 8
KERNEL_REPS = 2                  # per-kernel profile in bench: submissions per group (a decode step costs 0.3-2 s on SwiftShader)

# weights_kept: the last load kept the weights of the one before (other settings of the same model: _reload)
_state: dict = {"session": None, "model_id": None, "settings": None, "grammar": None, "engine": None, "weights_kept": False}
_prewarm = Prewarm()
_scheduler = Scheduler()


def _bytes(data) -> bytes:
    return data.to_bytes() if hasattr(data, "to_bytes") else bytes(data)


def _dump(obj) -> str:
    return json.dumps(obj)


def _boundary(fn):
    """A PyshimError comes back as {"__error__": {name, message, hint, param}} (worker.js throws it with
    those fields, so the page sees which field was wrong); anything else is a bug and propagates."""
    def envelope(exc: PyshimError) -> str:
        return _dump({"__error__": {"name": type(exc).__name__, "message": str(exc), "hint": exc.hint,
                                    "param": getattr(exc, "param", None)}})

    if asyncio.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def call(*args):
            try:
                return await fn(*args)
            except PyshimError as exc:
                return envelope(exc)
    else:
        @functools.wraps(fn)
        def call(*args):
            try:
                return fn(*args)
            except PyshimError as exc:
                return envelope(exc)
    return call


def use_grammar(access) -> None:
    """The page's grammar engine (web/engine/grammar.js: XGrammar in wasm), handed over once at boot; see
    pyshim.text.grammar.XGrammar. Without it (CPython) constrained requests use llguidance."""
    _state["grammar"] = access


def _grammars(model_id: str):
    access = _state["grammar"]
    if access is None:
        return None
    from pyshim.text.grammar import XGrammar

    return lambda tokenizer, end_ids: XGrammar(access, model_id, tokenizer, end_ids)


# --- no model needed ---------------------------------------------------------------------------------

@_boundary
async def selftest() -> str:
    from pyshim.gpu.selftest import selftest as run

    return _dump(await run())


@_boundary
def probe(prefix, request_json: str) -> str:
    """"Will it fit?" from header bytes (pyshim.plan.probe): {need: n} while the header runs past them,
    the summary and verdict, or {refused: {name, message, hint}} for a file pyshim cannot use."""
    from pyshim.plan.probe import probe as run

    request = validate("probe", json.loads(request_json))
    try:
        return _dump(run(_bytes(prefix), request["file_size"], context=request["context"], kv_type=request["kv_type"],
                         budget_bytes=request["budget_bytes"], limits=request["limits"], judge=request["judge"],
                         wasm64=request["wasm64"], streamed_layers=request["streamed_layers"], expert_slots=request["expert_slots"]))
    except PyshimError as exc:
        return _dump({"refused": {"name": type(exc).__name__, "message": str(exc), "hint": exc.hint}})


@_boundary
def loaded() -> str:
    """The loaded model {model_id, settings, auto, engine, weights_kept} (settings as loaded: context, KV
    type and arithmetic resolved; auto: what "auto" chose and why, or null; weights_kept: loaded by a
    settings change that kept the weights of the load before), or null."""
    session = _state["session"]
    if session is None:
        return "null"
    return _dump({"model_id": _state["model_id"], "settings": _effective(session).as_dict(), "auto": session.runner.auto,
                  "engine": _state["engine"].as_dict(), "weights_kept": _state["weights_kept"]})


@_boundary
def stats() -> str:
    session = _state["session"]
    batching = getattr(session.runner, "batch_stats", None) if session is not None else None
    kv = getattr(session.runner, "kv_stats", None) if session is not None else None
    return _dump({"loaded": json.loads(loaded()), **_scheduler.stats(), "batching": batching and batching.as_dict(),
                  "kv": kv and kv(), "prewarm": _prewarm.stats()})


@_boundary
def abort(request_json: str) -> str:
    request = validate("abort", json.loads(request_json))
    return _dump({"aborted": _scheduler.abort(int(request["request_id"]))})


# --- loading -------------------------------------------------------------------------------------------

def _effective(session) -> RunSettings:
    runner = session.runner
    return dataclasses.replace(runner.settings, context=runner.capacity.n_ctx, arithmetic=runner.arithmetic,
                               device=runner.runs_on, threads=getattr(runner, "threads", None))


def _matches(model_id: str, wanted: RunSettings) -> bool:
    """Whether the loaded model serves a request for `model_id` with `wanted` (a field left None takes
    whatever is loaded)."""
    session = _state["session"]
    if session is None or _state["model_id"] != model_id:
        return False
    if wanted == _state["settings"]:       # what the last load was asked for ("auto" then chose the rest)
        return True
    have = _effective(session)
    return ((wanted.context is None or wanted.context == have.context) and wanted.kv_type == have.kv_type
            and (wanted.arithmetic is None or wanted.arithmetic == have.arithmetic) and wanted.prefill_chunk == have.prefill_chunk
            and (wanted.rope_scaling, wanted.rope_scale, wanted.yarn_orig_ctx) == (have.rope_scaling, have.rope_scale, have.yarn_orig_ctx)
            and wanted.parallel == have.parallel and wanted.kv_pages == have.kv_pages and wanted.device in ("auto", have.device)
            and (wanted.threads is None or wanted.threads == have.threads))


async def _read_header(store, model_id: str, file_size: int):
    from pyshim.gguf.header import NeedMoreBytes, read_header

    length = min(file_size, HEADER_FIRST_READ)
    for _ in range(HEADER_MAX_ROUNDS):
        prefix = _bytes(await store.readPrefix(model_id, length))
        try:
            return read_header(prefix, file_size=file_size)
        except NeedMoreBytes as exc:
            if length >= file_size:
                raise
            length = min(file_size, max(exc.suggested, 2 * length))
    raise BadRequestError("the GGUF header is implausibly large")


async def _ensure_loaded(model_id: str | None, settings: RunSettings, file_size: int, store, emit) -> float:
    """Load `model_id` unless it is loaded with these settings; the milliseconds it took (0: it was). A
    request stops the background compilation (pyshim.serve.prewarm): its own steps compile what they need."""
    _prewarm.stop()
    if not model_id:
        raise BadRequestError("name the model by model_id (a stored model's id)", param="model_id")
    if _matches(model_id, settings):
        return 0.0
    if len(_scheduler.running) > 1:
        raise BadRequestError(f"{len(_scheduler.running) - 1} other request(s) are running on the loaded model, which this "
                              "request would replace (another model, or other load settings)",
                              hint="wait for them to finish, or send it with the settings they use")
    from pyshim.exec.gpu_runner import GpuRunner
    from pyshim.gguf.tensors import RangeSource
    from pyshim.serve.batching import BatchingRunner
    from pyshim.serve.session import Session

    t0 = time.perf_counter()
    if _state["model_id"] == model_id and await _reload(settings, store, emit):
        return 1e3 * (time.perf_counter() - t0)
    unload_now()
    header = await _read_header(store, model_id, int(file_size))
    small = [(t.offset, t.nbytes) for t in header.tensors if len(t.shape) == 1]
    keys = [r for r in _key_ranges(header, settings) if r not in small]
    source = RangeSource({})
    # (the key rows four ranges at a time: the page holds a few layers' in JS, not Phi-3.5's 200 MB at once)
    for batch in [small] + [keys[i:i + 4] for i in range(0, len(keys), 4)]:
        pieces = await store.readRanges(model_id, _dump([[o, n] for o, n in batch]))
        source.add({offset: _bytes(piece) for (offset, _), piece in zip(batch, pieces)})
    runner, choice = await open_engine(model_id, header, source, settings, store)
    source.drop([o for o, _ in keys])       # read into the key scales: not kept for the model's lifetime
    if getattr(runner, "wasm64", False):
        choice = choice.on_wasm64()
    try:
        if isinstance(runner, GpuRunner):
            uploads = [(u.file_offset, u.nbytes, u.buffer, u.buffer_offset) for u in runner.ops.uploads]
            await store.upload(model_id, runner.device.raw, uploads)
            for streamed in (runner.ops.expert_cache, runner.ops.layer_stream):
                if streamed is not None:
                    streamed.fetch = _streamer(store, model_id, runner.device.raw)
        else:       # the CPU engine's matrices, store -> its memory in JS, chunk by chunk, never through Python
            await store.uploadCpu(model_id, runner.module.engine, runner.ops.uploads)
        # several requests at once (settings.parallel): their decode steps batched, a sequence each
        session = Session(BatchingRunner(runner) if settings.parallel > 1 else runner, grammars=_grammars(model_id))
        await session.prepare(_progress(emit, "compile"))
    except BaseException:
        runner.close()
        raise
    _state.update(session=session, model_id=model_id, settings=settings, engine=choice, weights_kept=False)
    _scheduler.resize(settings.parallel)
    return 1e3 * (time.perf_counter() - t0)


async def _reload(settings: RunSettings, store, emit) -> bool:
    """The loaded model on the GPU under other settings that keep its weights — context, KV type, pages,
    parallel sequences, rope scaling (pyshim.exec.gpu_runner.reload_gpu): nothing read from the store or
    uploaded again but a q4 cache's key rows, and the compiled pipelines kept. False, with the model as it
    was, where the settings change the weights or the device asked for (then it is loaded afresh). A failure after the
    old KV cache was freed leaves no model loaded, as a failed load does."""
    from pyshim.exec.gpu_runner import GpuRunner, reload_gpu
    from pyshim.serve.batching import BatchingRunner
    from pyshim.serve.session import Session

    old = _state["session"]
    runner = getattr(old.runner, "inner", old.runner)
    # (another device asked for — "auto" after "gpu" measures the engines again — loads afresh)
    if not isinstance(runner, GpuRunner) or settings.device != _state["settings"].device:
        return False
    source = runner.ops.slots.store.source
    keys = [r for r in _key_ranges(runner.header, settings) if not source.has(*r)]
    try:
        for batch in [keys[i:i + 4] for i in range(0, len(keys), 4)]:
            pieces = await store.readRanges(_state["model_id"], _dump([[o, n] for o, n in batch]))
            source.add({offset: _bytes(piece) for (offset, _), piece in zip(batch, pieces)})
        new = await reload_gpu(runner, settings)
        if new is None:
            return False
        session = Session(BatchingRunner(new) if settings.parallel > 1 else new, tokenizer=old.tokenizer,
                          template=old.template, grammars=_grammars(_state["model_id"]))
        _state["session"] = session           # (closed by unload_now if preparing it fails)
        await session.prepare(_progress(emit, "compile"))
    except BaseException:
        unload_now()
        raise
    finally:
        source.drop([o for o, _ in keys])
    _state.update(settings=settings, weights_kept=True)
    _scheduler.resize(settings.parallel)
    return True


def _streamer(store, model_id: str, device):
    """Streamed weights' reads in the browser (a missed expert's byte ranges, a streamed layer's tensors):
    store -> GPU buffer in JS (IndexedDB, reading only those ranges), never through Python."""
    async def fetch(uploads) -> None:
        try:
            await store.stream(model_id, device, [(u.file_offset, u.nbytes, u.buffer, u.buffer_offset) for u in uploads])
        except Exception as exc:        # a JsException: the model deleted (another tab), storage cleared, a chunk lost
            from pyshim.errors import StoreReadError

            raise StoreReadError(f"the model's streamed weights could not be read from the browser's store: {exc}",
                                 hint="it may have been deleted or evicted (another tab?): store it again, or pick another model") from None

    return fetch


def _key_ranges(header, settings: RunSettings) -> list[tuple[int, int]]:
    """The file ranges of the key projections a KV cache of scaled keys makes its scales from
    (pyshim.models.key_scales.key_ranges), when the settings may give one ("auto" may: their bytes are a few
    per cent of the attention's)."""
    from pyshim.gguf.spec import ModelSpec
    from pyshim.models.key_scales import key_ranges
    from pyshim.plan.settings import AUTO

    if not (settings.scaled_keys or settings.kv_type == AUTO):
        return []
    return key_ranges(ModelSpec.from_header(header), header)


def unload_now() -> None:
    _prewarm.stop()
    session = _state["session"]
    _state.update(session=None, model_id=None, settings=None, engine=None)
    if session is not None:
        session.close()


def _settings(request: dict) -> RunSettings:
    return RunSettings.from_dict(request.get("settings"))


@_boundary
async def load(request_json: str, file_size: int, store, request_id: int, emit) -> str:
    """{model_id, settings} onto the GPU now rather than on the first request: {load_ms} (0 when it was),
    device and device_reason (which engine runs it, and why), weights_kept (other settings of the model
    loaded before, its weights kept on the GPU: only its KV cache made again)."""
    request = validate("load", json.loads(request_json))

    async def job(should_stop):
        load_ms = await _ensure_loaded(request.get("model_id"), _settings(request), file_size, store, emit)
        _prewarm.start(_state["session"].runner)     # loaded ahead: its first request comes later
        return {"load_ms": load_ms, "device": _state["session"].runner.runs_on, "device_reason": _state["engine"].reason,
                "weights_kept": _state["weights_kept"]}

    return _dump(await _scheduler.run(job, request_id, lambda: emit("started", "{}"), exclusive=True))


@_boundary
async def unload(request_id: int) -> str:
    async def job(should_stop):
        unload_now()
        return {"unloaded": True}

    return _dump(await _scheduler.run(job, request_id, exclusive=True))


# --- requests on the loaded model ---------------------------------------------------------------------

def _progress(emit, phase: str):
    """A Progress (pyshim.exec.runner) that emits "progress" {phase, done, total} to the caller."""
    return lambda done, total: emit("progress", _dump({"phase": phase, "done": int(done), "total": int(total)}))


@contextlib.contextmanager
def _compiles_reported(emit):
    """Pipelines this request compiles on a program's first use (a first prompt of its length: the tiled
    prefill kernels) reported as "progress" {phase: "compile"}, as the load's are."""
    runner = _state["session"].runner
    if not hasattr(runner, "on_compile"):
        yield
        return
    runner.on_compile = _progress(emit, "compile")
    try:
        yield
    finally:
        runner.on_compile = None


def _on_text(emit):
    index = iter(range(1 << 62))
    return lambda piece, token: emit("token", _dump({"text": piece, "token": int(token), "index": next(index)}))


@_boundary
async def generate(request_json: str, file_size: int, store, request_id: int, emit) -> str:
    """A chat reply: {model_id, messages, settings, sampling} -> {text, token_ids, finish_reason, usage,
    timings: {load_ms, prefill_ms, ttft_ms, decode_ms, decode_tok_per_s, cpu_ms, bytes_per_decode_step},
    compacted, device ("gpu" or "cpu": which engine ran it), device_reason (why that one), weights_kept (as
    `load` says)}; "token" events stream the text, "progress" events the loading and the prompt's prefill."""
    request = validate("generate", json.loads(request_json))
    sampling = Sampling.of(request["sampling"])

    async def job(should_stop):
        load_ms = await _ensure_loaded(request.get("model_id"), _settings(request), file_size, store, emit)
        with _compiles_reported(emit):
            done = await _state["session"].chat(request["messages"], sampling, on_text=_on_text(emit), should_stop=should_stop,
                                                on_prefill=_progress(emit, "prefill"))
        return {**_result(done, load_ms), "device": _state["session"].runner.runs_on, "device_reason": _state["engine"].reason,
                "weights_kept": _state["weights_kept"]}

    return _dump(await _scheduler.run(job, request_id, lambda: emit("started", "{}")))


@_boundary
async def complete(request_json: str, file_size: int, store, request_id: int, emit) -> str:
    """A raw continuation (no chat template): {model_id, prompt | prompt_ids, stop_token_ids, settings,
    sampling, reuse} -> as generate, with `arithmetic` (what ran)."""
    request = validate("complete", json.loads(request_json))
    sampling = Sampling.of(request["sampling"])

    async def job(should_stop):
        load_ms = await _ensure_loaded(request.get("model_id"), _settings(request), file_size, store, emit)
        session = _state["session"]
        prompt = session.prompt_ids(request.get("prompt"), request.get("prompt_ids"))
        with _compiles_reported(emit):
            done = await session.complete(prompt, sampling, stop_ids=session.stop_ids(sampling, request.get("stop_token_ids") or ()),
                                          on_text=_on_text(emit), should_stop=should_stop, on_prefill=_progress(emit, "prefill"),
                                          reuse=request["reuse"])
        runner = session.runner
        return {**_result(done, load_ms), "arithmetic": runner.arithmetic.value, "context": runner.n_ctx,
                "kv_type": runner.settings.kv_type, "auto": runner.auto, "expert_cache": runner.expert_cache_stats(),
                "layer_stream": runner.layer_stream_stats(), "device": runner.runs_on, "device_reason": _state["engine"].reason,
                "threads": getattr(runner, "threads", None), "weights_kept": _state["weights_kept"],
                "relaxed_simd": getattr(runner, "relaxed_simd", None), "wasm64": getattr(runner, "wasm64", None)}

    return _dump(await _scheduler.run(job, request_id, lambda: emit("started", "{}")))


@_boundary
async def score(request_json: str, file_size: int, store, request_id: int, emit) -> str:
    """Teacher-forced: {model_id, text | ids, settings, top_k} -> {ids, top_ids, top_logits, top_logprobs, arithmetic, ...}."""
    request = validate("score", json.loads(request_json))

    async def job(should_stop):
        await _ensure_loaded(request.get("model_id"), _settings(request), file_size, store, emit)
        session = _state["session"]
        ids = session.prompt_ids(request.get("text"), request.get("ids"))
        scores = await session.score(ids, request["top_k"])
        return {**scores.as_dict(), "arithmetic": session.runner.arithmetic.value, "kv_type": session.runner.settings.kv_type,
                "layer_stream": session.runner.layer_stream_stats()}

    return _dump(await _scheduler.run(job, request_id, lambda: emit("started", "{}"), exclusive=True))


@_boundary
async def bench(request_json: str, file_size: int, store, request_id: int, emit) -> str:
    """A greedy fixed-length run: {model_id, prompt | prompt_ids, settings, max_tokens, ignore_eos, kernels}
    -> {prompt_tokens, load_ms, prefill_ms, ttft_ms, decode_tokens, decode_ms, decode_tok_per_s, decode_median_step_ms, cpu_ms,
    cpu_share (= cpu_ms / decode_ms), cpu_ms_per_step (of which encode_ms_per_step in JavaScript), bytes_per_decode_step, dispatches_per_token, text, arithmetic,
    peak_gpu_bytes, planned_gpu_bytes}; with `kernels` also kernel_ms {shader group: ms per decode step}
    and kernel_step_ms (pyshim.exec.profile; a few decode steps' worth of extra time). "progress" events
    {phase: "prefill"} follow the prompt; the last (done = total) comes as the decode's clock starts."""
    request = validate("bench", json.loads(request_json))

    async def job(should_stop):
        load_ms = await _ensure_loaded(request.get("model_id"), _settings(request), file_size, store, emit)
        session = _state["session"]
        runner = session.runner
        prompt = session.prompt_ids(request.get("prompt"), request.get("prompt_ids"))
        from pyshim.exec.runner import Want

        gpu = runner.runs_on == "gpu"
        if gpu:
            decode = (await runner.program(1, Want.ARGMAX)).encoded
            encoded_before = runner.device.encoding_ms(decode)
        done = await session.bench(prompt, request["max_tokens"], ignore_eos=request["ignore_eos"],
                                   on_prefill=_progress(emit, "prefill"))
        # the part of a step's CPU side spent encoding its dispatches in JavaScript (before the GPU starts)
        encode_ms = (runner.device.encoding_ms(decode) - encoded_before) / done.decode_steps if gpu and done.decode_steps else None
        profile = {}
        if request["kernels"] and gpu:
            from pyshim.exec.profile import kernel_times

            times = await kernel_times(runner, reps=KERNEL_REPS, rounds=1)
            profile = {"kernel_ms": {name: g["ms"] for name, g in times["groups"].items()}, "kernel_step_ms": times["step_ms"]}
        return {**profile, "prompt_tokens": done.prompt_tokens, "load_ms": load_ms, "prefill_ms": done.prefill_ms,
                "ttft_ms": done.prefill_ms, "decode_tokens": len(done.token_ids), "decode_ms": done.decode_ms,
                "cpu_ms": done.cpu_ms, "cpu_share": done.cpu_ms / done.decode_ms if done.decode_ms > 0 else None,
                "cpu_ms_per_step": done.cpu_ms / done.decode_steps if done.decode_steps else None,
                "encode_ms_per_step": encode_ms,
                "decode_tok_per_s": done.decode_tok_per_s, "decode_median_step_ms": done.decode_median_step_ms,
                "bytes_per_decode_step": done.bytes_per_decode_step,
                "dispatches_per_token": await runner.dispatches_per_token() if gpu else None, "text": done.text,
                "arithmetic": runner.arithmetic.value, "device": runner.runs_on, **runner.memory()}

    return _dump(await _scheduler.run(job, request_id, lambda: emit("started", "{}"), exclusive=True))


def _result(done, load_ms: float) -> dict:
    out = done.as_dict()
    out["timings"]["load_ms"] = load_ms
    return out


__all__ = ["abort", "bench", "complete", "generate", "load", "loaded", "probe", "score", "selftest", "stats", "unload", "use_grammar"]
