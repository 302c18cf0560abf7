"""The Worker's Python side (pyshim.serve.worker_api) natively, on wgpu: the browser's loading path —
header prefix, the small tensors' bytes, then every weight copied by the caller along the upload plan —
answers like the CPU reference; requests queue and abort; the loaded model's settings are an object.
Left to "auto" on lavapipe (a fallback adapter), the measured choice loads the CPU engine instead."""

from __future__ import annotations

import asyncio
import json

import pytest

from pyshim.exec.loading import load_reference
from pyshim.gguf.tensors import FileSource
from pyshim.plan.settings import RunSettings
from pyshim.serve import worker_api
from pyshim.serve.generation import generate
from pyshim.serve.sampling import SamplingParams
from pyshim.serve.session import Session
from pyshim.setup.catalog import resolve_model

pytestmark = [pytest.mark.models, pytest.mark.slow]
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
MAX_TOKENS = 8
GREEDY = {"temperature": 0, "max_tokens": MAX_TOKENS}
# device gpu: on lavapipe, a fallback adapter, "auto" would measure the CPU engine faster (the last test)
SETTINGS = {"context": 256, "arithmetic": "f32", "device": "gpu"}      # exact arithmetic: the plain reference is the oracle
# where no reply is compared with the reference: the default route (f32 prompts are ~10x slower on lavapipe)
FAST = {"context": 256, "device": "gpu"}


class FileStore:
    """What web/engine/worker.js hands worker_api as `store`, over a file: the reads it asks for, and the
    upload it leaves to the caller (natively: the wgpu queue). Counts what it was asked."""

    def __init__(self, path):
        self.file = FileSource(path)
        self.size = self.file.size
        self.prefix_reads, self.uploaded = [], 0

    async def readPrefix(self, model_id, length):
        self.prefix_reads.append(length)
        return self.file.read(0, length).tobytes()

    async def readRanges(self, model_id, ranges_json):
        return [self.file.read(o, n).tobytes() for o, n in json.loads(ranges_json)]

    async def upload(self, model_id, device, uploads, quiet=False):
        for offset, size, buffer, buffer_offset in uploads:
            data = self.file.read(offset, size).tobytes()
            device.queue.write_buffer(buffer, buffer_offset, data + b"\0" * (-len(data) % 4))
            self.uploaded += size

    wasm64 = True                           # (wasmtime runs memory64)

    async def cpuEngine(self, threads, wide=False):
        return NativeEngine(threads, wide)

    async def uploadCpu(self, model_id, engine, uploads, quiet=False):
        for offset, size, ptr in uploads:
            engine.write(ptr, self.file.read(offset, size))
            self.uploaded += size


class _Bytes(bytes):
    def to_bytes(self) -> bytes:           # (a JS Uint8Array's, through Pyodide)
        return bytes(self)


class NativeEngine:
    """web/engine/cpu.js's engine object as PageModule uses it, natively: the module under wasmtime."""

    def __init__(self, threads, wide=False):
        from pyshim.exec.wasm_module import NativeModule

        self.module = NativeModule(threads=threads or 1, wide=wide)
        self.threads, self.relaxed, self.wide = self.module.threads, self.module.relaxed, self.module.wide

    def alloc(self, nbytes):
        return self.module.alloc(nbytes)

    def write(self, ptr, data):
        self.module.write(ptr, data)

    def read(self, ptr, nbytes):
        return _Bytes(self.module.read(ptr, nbytes))

    def call(self, name, *args):
        return self.module.call(name, *args)

    def memoryBytes(self):
        return self.module.memory_bytes

    def close(self):
        self.module.close()


def _call(fn, request: dict, store, request_id: int = 1, events=None):
    """As worker.js calls worker_api: JSON in, JSON out, a PyshimError as its envelope (raised here again)."""
    from pyshim import errors

    emit = (lambda event, data: events.append((event, json.loads(data)))) if events is not None else (lambda e, d: None)
    out = json.loads(asyncio.run(fn(json.dumps(request), store.size, store, request_id, emit)))
    if isinstance(out, dict) and "__error__" in out:
        e = out["__error__"]
        cls = getattr(errors, e["name"])
        raise cls(e["message"], **({"param": e["param"]} if issubclass(cls, errors.BadRequestError) else {}))
    return out


@pytest.fixture(scope="module")
def store():
    yield FileStore(resolve_model("smollm2"))
    worker_api.unload_now()


def test_browser_style_load_answers_like_the_cpu_reference(store):
    events = []
    reply = _call(worker_api.generate, {"model_id": "smollm2", "messages": MESSAGES, "settings": SETTINGS, "sampling": GREEDY},
                  store, events=events)
    loaded = json.loads(worker_api.loaded())
    assert loaded["model_id"] == "smollm2" and loaded["settings"]["context"] == 256 and loaded["settings"]["arithmetic"] == "f32"
    assert store.uploaded > 90e6 and reply["timings"]["load_ms"] > 0          # every weight went through the caller
    cpu = Session(load_reference(resolve_model("smollm2"), settings=RunSettings(context=256)))
    expected = asyncio.run(generate(cpu.runner, cpu.chat_ids(MESSAGES), SamplingParams(), MAX_TOKENS,
                                    stop_ids=cpu.template.stop_ids, decoder=cpu.tokenizer.stream()))
    assert reply["text"] == expected.text and "".join(d["text"] for e, d in events if e == "token") == reply["text"]
    assert reply["token_ids"] == expected.token_ids and reply["finish_reason"] == expected.finish_reason
    assert "Paris" in reply["text"] and reply["timings"]["bytes_per_decode_step"] == 4
    # "progress": the load's pipelines one by one, then the prompt (one chunk) before the first token, the
    # pipelines its program adds (the tiled prefill kernels, compiled on first use) reported in between
    progress = [(d["phase"], d["done"], d["total"]) for e, d in events if e == "progress"]
    pipelines, n = progress[0][2], reply["usage"]["prompt_tokens"]
    load = [("compile", i, pipelines) for i in range(pipelines + 1)]
    assert pipelines > 0 and progress[:len(load)] == load, progress
    assert progress[len(load)] == ("prefill", 0, n) and progress[-1] == ("prefill", n, n), progress
    first_use = progress[len(load) + 1:-1]
    assert first_use == [("compile", i, len(first_use) - 1) for i in range(len(first_use))], progress
    # the same model and settings again: nothing is loaded twice
    again = _call(worker_api.generate, {"model_id": "smollm2", "messages": MESSAGES, "settings": SETTINGS, "sampling": GREEDY}, store)
    assert again["timings"]["load_ms"] == 0 and again["text"] == reply["text"]


def test_bad_requests_are_refused_by_the_shared_schema(store):
    from pyshim.errors import BadRequestError

    for bad, param in (({"model_id": "smollm2", "messages": []}, "messages"),
                       ({"model_id": "smollm2", "messages": MESSAGES, "sampling": {"top_p": 0}}, "sampling.top_p"),
                       ({"model_id": "smollm2", "messages": MESSAGES, "settings": {"kv_type": "q3"}}, "settings.kv_type"),
                       ({"messages": MESSAGES}, "model_id")):
        with pytest.raises(BadRequestError) as info:
            _call(worker_api.generate, bad, store)
        assert info.value.param == param


def test_a_conversation_past_the_context_is_compacted_not_refused(store):
    messages = [{"role": "user", "content": "My name is Ada and my server is at /srv/app on port 8080."},
                {"role": "assistant", "content": "Got it."}]
    for i in range(12):
        messages += [{"role": "user", "content": f"Tell me fact {i}. " + "please " * 20},
                     {"role": "assistant", "content": "A fact. " * 20}]
    messages.append({"role": "user", "content": "What is my name?"})
    reply = _call(worker_api.generate, {"model_id": "smollm2", "messages": messages, "settings": FAST,
                                        "sampling": {"temperature": 0, "max_tokens": 2}}, store)
    assert reply["compacted"] and reply["usage"]["prompt_tokens"] < 256 and reply["usage"]["completion_tokens"] >= 1


def test_a_message_longer_than_the_context_is_refused_before_running(store):
    from pyshim.errors import ContextOverflowError

    with pytest.raises(ContextOverflowError, match="context"):
        _call(worker_api.generate, {"model_id": "smollm2", "messages": [{"role": "user", "content": "word " * 400}],
                                    "settings": SETTINGS, "sampling": GREEDY}, store)


def test_requests_queue_in_order_and_an_abort_stops_only_its_own(store):
    async def both():
        first = worker_api.complete(json.dumps({"model_id": "smollm2", "prompt": "Once upon a time", "settings": FAST,
                                                "sampling": {"temperature": 0, "max_tokens": 24, "ignore_eos": True}}),
                                    store.size, store, 11, lambda e, d: None)
        second = worker_api.complete(json.dumps({"model_id": "smollm2", "prompt": "The sky is", "settings": FAST,
                                                 "sampling": {"temperature": 0, "max_tokens": 3}}),
                                     store.size, store, 12, lambda e, d: None)
        tasks = [asyncio.ensure_future(first), asyncio.ensure_future(second)]
        await asyncio.sleep(0)
        assert json.loads(worker_api.stats())["queued"] >= 1
        worker_api.abort(json.dumps({"request_id": 11}))
        return [json.loads(r) for r in await asyncio.gather(*tasks)]

    first, second = asyncio.run(both())
    assert first["finish_reason"] == "abort" and len(first["token_ids"]) < 24, first
    assert second["finish_reason"] in ("stop", "length") and len(second["token_ids"]) >= 1


def test_a_model_loaded_ahead_compiles_its_prompt_pipelines_meanwhile(store):
    """The page loads the model picked; while the visitor types, the Worker compiles its prompt steps'
    pipelines (GpuRunner.prewarm), so the first reply's prompt compiles nothing (no "compile" progress after
    the load). A request stops a prewarm still running, and its reply is the same."""
    worker_api.unload_now()
    request = {"model_id": "smollm2", "prompt": "Once upon a time there was", "settings": FAST,
               "sampling": {"temperature": 0, "max_tokens": 3}}

    async def run():
        events = []
        emit = lambda e, d: events.append((e, json.loads(d)))      # noqa: E731
        load = json.dumps({"model_id": "smollm2", "settings": FAST})
        assert json.loads(await worker_api.load(load, store.size, store, 21, emit))["load_ms"] > 0
        running = worker_api._prewarm._task
        stopped = json.loads(await worker_api.complete(json.dumps(request), store.size, store, 22, emit))
        assert running is not None and running.cancelled() and json.loads(worker_api.stats())["prewarm"] is None
        worker_api.unload_now()
        assert json.loads(await worker_api.load(load, store.size, store, 23, emit))["load_ms"] > 0
        for _ in range(1200):                   # the visitor typing
            state = json.loads(worker_api.stats())["prewarm"]
            if state["done"]:
                break
            await asyncio.sleep(0.05)
        events.clear()
        reply = json.loads(await worker_api.complete(json.dumps(request), store.size, store, 24, emit))
        return stopped, state, reply, events

    stopped, state, reply, events = asyncio.run(run())
    assert state["done"] and state["compiled"] > 0, state
    phases = [d["phase"] for e, d in events if e == "progress"]
    assert "prefill" in phases and "compile" not in phases, phases
    assert reply["token_ids"] == stopped["token_ids"] and len(reply["token_ids"]) == 3


def test_other_settings_of_the_loaded_model_keep_its_weights_on_the_gpu(store):
    """A settings change that leaves the weights as they are (here the context and KV type) makes a new KV
    cache only (pyshim.exec.gpu_runner.reload_gpu): nothing is uploaded again, the pipelines compiled stay
    (only the new cache's are compiled), and the reply is that of the model loaded afresh with those
    settings. A change of arithmetic lays the weights out otherwise: that loads afresh."""
    worker_api.unload_now()

    def request(settings):
        return {"model_id": "smollm2", "prompt": "The capital of France is", "settings": settings,
                "sampling": {"temperature": 0, "max_tokens": 6, "ignore_eos": True}}

    def compiled(events):
        totals = [d["total"] for e, d in events if e == "progress" and d["phase"] == "compile"]
        return totals[0] if totals else 0

    first_events, events = [], []
    _call(worker_api.complete, request(FAST), store, events=first_events)
    uploaded = store.uploaded
    other = {**FAST, "context": 512, "kv_type": "q4"}     # (q4 keys are scaled from the key rows: read again)
    reloaded = _call(worker_api.complete, request(other), store, events=events)
    loaded = json.loads(worker_api.loaded())
    assert loaded["settings"]["context"] == 512 and loaded["settings"]["kv_type"] == "q4" and loaded["weights_kept"]
    assert store.uploaded == uploaded and reloaded["timings"]["load_ms"] > 0
    assert 0 < compiled(events) < compiled(first_events), (compiled(events), compiled(first_events))
    worker_api.unload_now()
    fresh = _call(worker_api.complete, request(other), store)
    assert store.uploaded > uploaded and fresh["token_ids"] == reloaded["token_ids"] and len(fresh["token_ids"]) == 6
    assert not json.loads(worker_api.loaded())["weights_kept"]
    before = store.uploaded
    _call(worker_api.complete, request({**other, "arithmetic": "f32"}), store)
    assert store.uploaded > before and json.loads(worker_api.loaded())["settings"]["arithmetic"] == "f32"
    worker_api.unload_now()


def test_auto_on_a_fallback_adapter_measures_and_loads_the_faster_engine(store):
    """"auto" on lavapipe: the probe times SmolLM2's FFN matrix on both engines, the CPU engine wins and
    loads the model (its weights through the caller, as the page's store does), and the f32 reply is the
    reference's; the reason is in the reply and in `loaded`."""
    worker_api.unload_now()
    settings = {**SETTINGS, "device": "auto", "context": 192}
    reply = _call(worker_api.generate, {"model_id": "smollm2", "messages": MESSAGES, "settings": settings, "sampling": GREEDY}, store)
    engine = json.loads(worker_api.loaded())["engine"]
    print(engine)
    assert reply["device"] == engine["device"] == "cpu" and engine["cpu_ms"] < engine["gpu_ms"], engine
    assert reply["device_reason"] == engine["reason"] and "faster than WebGPU on this software adapter" in engine["reason"]
    cpu = Session(load_reference(resolve_model("smollm2"), settings=RunSettings(context=192)))
    expected = asyncio.run(generate(cpu.runner, cpu.chat_ids(MESSAGES), SamplingParams(), MAX_TOKENS,
                                    stop_ids=cpu.template.stop_ids, decoder=cpu.tokenizer.stream()))
    assert reply["token_ids"] == expected.token_ids
    worker_api.unload_now()
