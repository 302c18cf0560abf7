"""The engine's state inside the site's Worker: one loaded model at a time, driven by web/engine/chat.js.

Arguments from JS arrive as Pyodide proxies (Uint8Array, arrays, functions); they are taken by duck
typing (`to_bytes`, `to_py`) so this module also imports and tests in CPython. Results go back as
plain Python values, or JSON text where JS only reads them.
"""

from __future__ import annotations

import json

from pyshim.serve.session import ChatEngine, small_tensor_ranges
from pyshim.errors import BadRequestError
from pyshim.gguf.header import read_header
from pyshim.plan.memory import KV_TYPES
from pyshim.serve.sampling import SamplingParams

_state: dict = {"engine": None, "key": None}


def _bytes(data) -> bytes:
    return data.to_bytes() if hasattr(data, "to_bytes") else bytes(data)


def small_ranges(prefix, file_size: int) -> list[list[int]]:
    """The [offset, size] ranges the loader needs in Python (norms and biases); the rest never comes here."""
    return [[o, n] for o, n in small_tensor_ranges(read_header(_bytes(prefix), file_size=int(file_size)))]


def loaded_key():
    return _state["key"]


def loaded_engine() -> ChatEngine:
    """The loaded model's engine (pyshim.serve.runs drives it too, for raw prompts); refuses when none is loaded."""
    engine = _state["engine"]
    if engine is None or _state["key"] is None:
        raise BadRequestError("no model is loaded", hint="pick a stored model first")
    return engine


ARITHMETIC_INT8 = {"int8": True, "f32": False}    # a load's `arithmetic` -> the executor's int8 route


async def load(key: str, prefix, file_size: int, ranges, n_ctx: int, arithmetic: str | None = None, kv_type: str = "f32"):
    """Bind a model on the GPU; returns (GPUDevice, [(file_offset, nbytes, GPUBuffer, buffer_offset), ...])
    for JS to copy the weights from the store. `finish_load()` follows once they are copied. `arithmetic`:
    "f32" or "int8" (see pyshim.serve.runs.arithmetic); None: the adapter's default. `kv_type`: f32, f16 or q8."""
    if arithmetic is not None and arithmetic not in ARITHMETIC_INT8:
        raise BadRequestError(f"arithmetic must be one of {', '.join(ARITHMETIC_INT8)}, got {arithmetic!r}")
    if kv_type not in KV_TYPES:
        raise BadRequestError(f"kv_type must be one of {', '.join(KV_TYPES)}, got {kv_type!r}")
    unload()
    pairs = ranges.to_py() if hasattr(ranges, "to_py") else ranges
    data = {int(offset): _bytes(chunk) for offset, chunk in pairs}
    engine = await ChatEngine.open_prefix(_bytes(prefix), int(file_size), data, n_ctx=int(n_ctx),
                                          int8=ARITHMETIC_INT8.get(arithmetic), kv_type=kv_type)
    _state.update(engine=engine, key=None, pending=key)
    uploads = [(u.file_offset, u.nbytes, u.buffer, u.buffer_offset) for u in engine.uploads]
    return engine.runner.device.raw, uploads


async def finish_load() -> None:
    await _state["engine"].prepare()
    _state["key"] = _state.pop("pending")


def unload() -> None:
    engine = _state.get("engine")
    _state.update(engine=None, key=None)
    if engine is not None:
        engine.runner.device.destroy()


def sampling_from(request: dict) -> tuple[SamplingParams, int, list[str]]:
    """The Worker's `sampling` dict -> (params, max_tokens, stop strings); `stop` is a string or a list."""
    seed = request.get("seed")
    params = SamplingParams(temperature=float(request.get("temperature", 0.0)), top_p=float(request.get("top_p", 1.0)),
                            top_k=int(request.get("top_k", 0)), seed=None if seed is None else int(seed))
    stop = request.get("stop") or []
    return params, int(request.get("max_tokens", 256)), [stop] if isinstance(stop, str) else [str(s) for s in stop]


async def chat(messages_json: str, sampling_json: str, on_text, should_stop) -> str:
    engine = _state["engine"]
    if engine is None or _state["key"] is None:
        raise BadRequestError("no model is loaded", hint="pick a stored model first")
    params, max_tokens, stops = sampling_from(json.loads(sampling_json))
    reply = await engine.chat(json.loads(messages_json), params, max_tokens, stop_strings=stops,
                              on_text=lambda piece, token: on_text(piece, token), should_stop=lambda: bool(should_stop()))
    return json.dumps(reply.as_dict())
