"""Every request shape, defined once: the OpenAI-shaped chat and text completions of the Python and JS
APIs (and the /v1 endpoint), and the messages the page sends the engine Worker.

Shapes are JSON Schema (a small subset: type, enum, const, minimum, maximum, exclusiveMinimum,
minLength, minItems, maxItems, items, properties, required, anyOf, default), each field with a
`description` that error messages quote: "`temperature` must be a number in [0, 2], got 3". `validate`
here and web/engine/protocol.js implement the same subset with the same messages (null, like an absent field, takes the default); `pyshim setup` writes
`SCHEMAS` (with the defaults and names below) to web/vendor/definitions.js, so the JS API refuses a bad
request before posting it and Python refuses it again on arrival, by the same rules.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from pyshim.errors import BadRequestError
from pyshim.plan.settings import AUTO, DEFAULT_CONTEXT, DEVICES, KV_TYPES, MAX_PARALLEL, MAX_THREADS, PREFILL_CHUNK, ROPE_SCALINGS, Arithmetic
from pyshim.serve.sampling import SamplingParams
from pyshim.text.grammar import Format, response_format
from pyshim.text.tools import ToolSpec, tool_spec

ROLES = ("system", "user", "assistant", "tool")
MAX_STOP_STRINGS = 4
DEFAULT_MAX_TOKENS = 256
DEFAULT_TEMPERATURE = 1.0      # OpenAI's default; 0 is greedy
DEFAULT_SCORE_TOP_K = 10
MAX_SCORE_TOP_K = 100


def _show(value) -> str:
    """A value as JSON, as JavaScript's JSON.stringify writes it (so both sides' messages match)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)


def _number(low, high, *, default=None, exclusive_low: bool = False) -> dict:
    bounds = f"{'(' if exclusive_low else '['}{_show(low)}, {_show(high)}]"
    node = {"type": "number", "maximum": high, "description": f"a number in {bounds}"}
    node["exclusiveMinimum" if exclusive_low else "minimum"] = low
    if default is not None:
        node["default"] = default
    return node


STOP = {"anyOf": [{"type": "string", "minLength": 1},
                  {"type": "array", "maxItems": MAX_STOP_STRINGS, "items": {"type": "string", "minLength": 1}},
                  {"type": "null"}],
        "description": f"a non-empty string or a list of up to {MAX_STOP_STRINGS} of them", "default": None}

# OpenAI's response_format, plus a grammar form (GBNF, as llama.cpp's server takes it); pyshim.text.grammar
# turns it into what the grammar engines take.
RESPONSE_FORMAT = {"anyOf": [
    {"type": "object", "required": ["type"], "properties": {"type": {"enum": ["text", "json_object"]}}},
    {"type": "object", "required": ["type", "json_schema"], "properties": {
        "type": {"const": "json_schema"},
        "json_schema": {"type": "object", "required": ["schema"], "properties": {
            "name": {"type": "string"}, "schema": {"type": "object"}, "strict": {"type": ["boolean", "null"]}}}}},
    {"type": "object", "required": ["type", "grammar"], "properties": {
        "type": {"const": "grammar"}, "grammar": {"type": "string", "minLength": 1}}},
    {"type": "null"}],
    "default": None,
    "description": '{type: "text" | "json_object"}, {type: "json_schema", json_schema: {schema, name, strict}} '
                   'or {type: "grammar", grammar: a GBNF grammar}'}

TOOL = {"type": "object", "required": ["type", "function"], "properties": {
    "type": {"const": "function"},
    "function": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string", "minLength": 1}, "description": {"type": "string"}, "parameters": {"type": "object"}}}},
    "description": '{type: "function", function: {name, description, parameters}}'}
TOOLS = {"type": ["array", "null"], "items": TOOL, "default": None, "description": "a list of tools"}
TOOL_CHOICE = {"anyOf": [{"enum": ["none", "auto", "required"]},
                         {"type": "object", "required": ["type", "function"], "properties": {
                             "type": {"const": "function"},
                             "function": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string", "minLength": 1}}}}},
                         {"type": "null"}],
               "default": None, "description": '"none", "auto", "required" or {type: "function", function: {name}}'}

# What shapes a reply, shared by chat and text completions; top_k, min_p, the penalties and ignore_eos are
# pyshim's (llama.cpp's) extensions, off by default.
SAMPLING: dict[str, dict] = {
    "temperature": _number(0, 2, default=DEFAULT_TEMPERATURE),
    "top_p": _number(0, 1, default=1.0, exclusive_low=True),
    "top_k": {"type": "integer", "minimum": 0, "default": 0, "description": "a non-negative integer"},
    "min_p": _number(0, 1, default=0.0),
    "repetition_penalty": _number(0, 10, default=1.0, exclusive_low=True),
    "presence_penalty": _number(-2, 2, default=0.0),
    "frequency_penalty": _number(-2, 2, default=0.0),
    "max_tokens": {"type": "integer", "minimum": 1, "default": DEFAULT_MAX_TOKENS, "description": "a positive integer"},
    # newer OpenAI clients send this name; it means max_tokens
    "max_completion_tokens": {"type": ["integer", "null"], "minimum": 1, "default": None, "description": "a positive integer"},
    "seed": {"type": ["integer", "null"], "default": None, "description": "an integer"},
    "stop": STOP,
    "ignore_eos": {"type": "boolean", "default": False, "description": "true or false"},
    "response_format": RESPONSE_FORMAT,
    # chat only (a text completion with tools is refused)
    "tools": TOOLS,
    "tool_choice": TOOL_CHOICE,
    "parallel_tool_calls": {"type": ["boolean", "null"], "default": None, "description": "true or false"},
}
MODEL = {"type": ["string", "null"], "default": None, "description": "a model's name"}
OPENAI_EXTRAS = {
    "model": MODEL,
    "stream": {"type": "boolean", "default": False, "description": "true or false"},
    "n": {"type": ["integer", "null"], "const": 1, "default": 1, "description": "1 (one choice per request)"},
}
TOOL_CALL = {"type": "object", "required": ["id", "function"], "properties": {
    "id": {"type": "string"}, "type": {"const": "function"},
    "function": {"type": "object", "required": ["name", "arguments"], "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}}}}}
MESSAGE = {"type": "object", "required": ["role", "content"],
           "properties": {"role": {"enum": list(ROLES)}, "content": {"type": ["string", "null"]},
                          "tool_calls": {"type": "array", "items": TOOL_CALL}, "tool_call_id": {"type": "string"}},
           "description": f"{{role: one of {', '.join(ROLES)}; content: a string (null beside an assistant's tool_calls)}}"}
MESSAGES = {"type": "array", "minItems": 1, "items": MESSAGE, "description": "a non-empty list of {role, content}"}
PROMPT = {"anyOf": [{"type": "string", "minLength": 1},
                    {"type": "array", "minItems": 1, "maxItems": 1, "items": {"type": "string", "minLength": 1}}],
          "description": "a non-empty string"}
TOKEN_IDS = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0},
             "description": "a non-empty list of token ids"}
KV_CHOICES = [AUTO, *KV_TYPES]
SETTINGS = {"type": "object", "description": "load settings {context, kv_type, arithmetic, prefill_chunk, rope_scaling, "
            "rope_scale, yarn_orig_ctx, budget_bytes, expert_slots, streamed_layers, parallel, kv_pages, device, threads}", "properties": {
    "context": {"type": ["integer", "null"], "minimum": 1, "default": None, "description": "a positive number of tokens"},
    "kv_type": {"enum": KV_CHOICES, "default": AUTO, "description": f"one of {', '.join(KV_CHOICES)}"},
    "arithmetic": {"enum": [a.value for a in Arithmetic] + [None], "default": None,
                   "description": f"one of {', '.join(a.value for a in Arithmetic)}, or null (the adapter's default)"},
    "prefill_chunk": {"type": "integer", "minimum": 1, "maximum": PREFILL_CHUNK, "default": PREFILL_CHUNK,
                      "description": f"an integer in [1, {PREFILL_CHUNK}]"},
    "rope_scaling": {"enum": [*ROPE_SCALINGS, None], "default": None, "description": f"one of {', '.join(ROPE_SCALINGS)}, or null (the GGUF's)"},
    "rope_scale": {"type": ["number", "null"], "default": None, "description": "a context extension factor, or null"},
    "yarn_orig_ctx": {"type": ["integer", "null"], "minimum": 1, "default": None, "description": "a positive number of tokens, or null"},
    "budget_bytes": {"type": ["integer", "null"], "minimum": 1, "default": None, "description": "a byte count, or null"},
    "expert_slots": {"type": ["integer", "null"], "minimum": 1, "default": None,
                     "description": "experts per MoE layer kept on the GPU, the rest streamed from the store; or null (auto)"},
    "streamed_layers": {"type": ["integer", "null"], "minimum": 1, "default": None,
                        "description": "the last layers streamed from the store through rotating GPU buffers; or null (auto)"},
    "parallel": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_PARALLEL, "default": None,
                 "description": f"requests decoded together, sharing the KV cache: an integer in [1, {MAX_PARALLEL}], or null (1)"},
    "kv_pages": {"type": ["integer", "null"], "minimum": 1, "default": None,
                 "description": "the GPU KV cache's pages of 16 positions, shared by the parallel requests; or null (room "
                                "for every request's whole context)"},
    "device": {"enum": [*DEVICES, None], "default": None,
               "description": "gpu (WebGPU), cpu (the WebAssembly engine), auto or null (the GPU when the browser has one)"},
    "threads": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_THREADS, "default": None,
                "description": f"the CPU engine's threads: an integer in [1, {MAX_THREADS}], or null (the cores; one where the page is not cross-origin isolated)"},
}}
MODEL_ID = {"type": "string", "minLength": 1, "description": "a stored model's id"}
# raw-prompt kinds may name the model by URL instead: the Worker stores it first, then names it by id
MODEL_URL = {"type": "string", "minLength": 1, "description": "a .gguf URL"}


def _request(required: dict, optional: dict, description: str) -> dict:
    return {"type": "object", "required": list(required), "properties": {**required, **optional}, "description": description}


SCHEMAS: dict[str, dict] = {
    # the OpenAI faces (Python API, JS API, /v1)
    "chat.completions": _request({"messages": MESSAGES}, {**SAMPLING, **OPENAI_EXTRAS}, "a JSON object"),
    "completions": _request({"prompt": PROMPT}, {**SAMPLING, **OPENAI_EXTRAS}, "a JSON object"),
    # the engine Worker's kinds (web/engine/worker.js -> pyshim.serve.worker_api)
    "load": _request({"model_id": MODEL_ID}, {"settings": SETTINGS}, "{model_id, settings}"),
    "generate": _request({"model_id": MODEL_ID, "messages": MESSAGES}, {"settings": SETTINGS, "sampling": {
        "type": "object", "properties": SAMPLING, "description": "sampling settings"}}, "{model_id, messages, settings, sampling}"),
    "complete": _request({}, {"model_id": MODEL_ID, "model_url": MODEL_URL, "settings": SETTINGS, "prompt": {"type": "string", "minLength": 1, "description": "a non-empty string"},
                                                  "prompt_ids": TOKEN_IDS, "stop_token_ids": {**TOKEN_IDS, "minItems": 0},
                                                  "sampling": {"type": "object", "properties": SAMPLING, "description": "sampling settings"},
                                                  "reuse": {"type": "boolean", "default": True, "description": "true or false (false: run the whole prompt, as a benchmark does)"}},
                         "{model_id | model_url, prompt | prompt_ids, settings, sampling, reuse}"),
    "score": _request({}, {"model_id": MODEL_ID, "model_url": MODEL_URL, "settings": SETTINGS, "text": {"type": "string", "minLength": 1, "description": "a non-empty string"},
                                               "ids": TOKEN_IDS, "top_k": {"type": "integer", "minimum": 1, "maximum": MAX_SCORE_TOP_K,
                                                                           "default": DEFAULT_SCORE_TOP_K, "description": f"an integer in [1, {MAX_SCORE_TOP_K}]"}},
                      "{model_id | model_url, text | ids, settings, top_k}"),
    "bench": _request({}, {"model_id": MODEL_ID, "model_url": MODEL_URL, "settings": SETTINGS, "prompt": {"type": "string", "minLength": 1, "description": "a non-empty string"},
                                               "prompt_ids": TOKEN_IDS, "max_tokens": SAMPLING["max_tokens"],
                                               "ignore_eos": {**SAMPLING["ignore_eos"], "default": True},
                                               "kernels": {"type": "boolean", "default": False, "description": "true or false"}},
                      "{model_id | model_url, prompt | prompt_ids, settings, max_tokens, ignore_eos, kernels}"),
    "probe": _request({}, {"file_size": {"type": ["integer", "null"], "minimum": 0, "default": None, "description": "a byte count"},
                           "context": {"type": ["integer", "null"], "minimum": 1, "default": None, "description": "a positive number of tokens"},
                           "kv_type": SETTINGS["properties"]["kv_type"],
                           "budget_bytes": {"type": ["integer", "null"], "minimum": 1, "default": None, "description": "a byte count"},
                           "limits": {"type": ["object", "null"], "default": None, "description": "the adapter's limits (null: none)"},
                           "judge": {"type": "boolean", "default": False, "description": "true or false"},
                           "wasm64": {"type": "boolean", "default": False,
                                      "description": "true or false (the browser runs 64-bit WebAssembly memories)"},
                           "streamed_layers": SETTINGS["properties"]["streamed_layers"],
                           "expert_slots": SETTINGS["properties"]["expert_slots"]},
                      "{file_size, context, kv_type, budget_bytes, limits, judge, wasm64, streamed_layers, expert_slots}"),
    "abort": _request({"request_id": {"type": "integer", "description": "a request id"}}, {}, "{request_id}"),
}

# What the page also needs to know and Python defines (written beside SCHEMAS into definitions.js).
DEFINITIONS = {"roles": list(ROLES), "kv_types": list(KV_TYPES), "kv_choices": KV_CHOICES, "arithmetic": [a.value for a in Arithmetic],
               "default_context": DEFAULT_CONTEXT, "prefill_chunk": PREFILL_CHUNK, "max_stop_strings": MAX_STOP_STRINGS,
               "default_max_tokens": DEFAULT_MAX_TOKENS, "default_temperature": DEFAULT_TEMPERATURE}


# --- the validator (web/engine/protocol.js is its twin) ------------------------------------------------

_TYPES = {
    "string": lambda v: isinstance(v, str),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer()),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def _matches(node: dict, value) -> bool:
    if "anyOf" in node:
        return any(_matches(option, value) for option in node["anyOf"])
    if "enum" in node and value not in node["enum"]:
        return False
    if "const" in node and value != node["const"] and not (value is None and "null" in _types(node)):
        return False
    types = _types(node)
    if types and not any(_TYPES[t](value) for t in types):
        return False
    if _TYPES["number"](value):
        if "minimum" in node and value < node["minimum"]:
            return False
        if "maximum" in node and value > node["maximum"]:
            return False
        if "exclusiveMinimum" in node and value <= node["exclusiveMinimum"]:
            return False
    if isinstance(value, (str, list)):
        if len(value) < node.get("minLength", node.get("minItems", 0)):
            return False
        if isinstance(value, list) and len(value) > node.get("maxItems", len(value)):
            return False
    if isinstance(value, list) and "items" in node:
        return all(_matches(node["items"], v) for v in value)
    if isinstance(value, dict) and "properties" in node:
        if any(key not in value for key in node.get("required", ())):
            return False
        return all(_matches(sub, value[key]) for key, sub in node["properties"].items() if _given(value, key, sub))
    return True


def _given(obj: dict, key: str, sub: dict) -> bool:
    """Whether obj gives `key` a value to check: null means "the default" where there is one (as OpenAI)."""
    return key in obj and not (obj[key] is None and "default" in sub)


def _types(node: dict) -> list[str]:
    t = node.get("type")
    return [] if t is None else [t] if isinstance(t, str) else list(t)


def _find(node: dict, value, path: str) -> tuple[str, str] | None:
    """(path, description) of the innermost described node that `value` fails, or None when it matches.
    A fault inside an array's item or an object's field is reported there when that part has a
    description of its own (`messages[0]`), else at the enclosing node."""
    if _matches(node, value):
        return None
    if isinstance(value, dict) and "properties" in node:
        for key in node.get("required", ()):
            sub = node["properties"][key]
            if key not in value and "description" in sub:
                return _join(path, key), sub["description"]
        for key, sub in node["properties"].items():
            if _given(value, key, sub) and "description" in sub:
                inner = _find(sub, value[key], _join(path, key))
                if inner is not None:
                    return inner
    if isinstance(value, list) and "description" in node.get("items", {}) and _matches(
            {k: v for k, v in node.items() if k != "items"}, value):
        for i, item in enumerate(value):
            inner = _find(node["items"], item, f"{path}[{i}]")
            if inner is not None:
                return inner
    return path, node.get("description", "valid")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def validate(kind: str, body, *, defaults: bool = True) -> dict:
    """`body` checked against SCHEMAS[kind]: a copy with the defaults filled in, or BadRequestError naming
    the field (`param`) and what it must be."""
    schema = SCHEMAS[kind]
    if not isinstance(body, dict):
        raise BadRequestError(f"the request must be a JSON object, got {_show(body)}", param=None)
    bad = _find(schema, body, "")
    if bad is not None:
        path, description = bad
        value = _lookup(body, path)
        if value is _MISSING:
            raise BadRequestError(f"`{path}` is required: {description}", param=path)
        raise BadRequestError(f"`{path}` must be {description}, got {_show(value)}", param=path)
    return _with_defaults(schema, body) if defaults else dict(body)


_MISSING = object()


def _lookup(body, path: str):
    value = body
    for part in path.replace("]", "").replace("[", ".").split("."):
        if not part:
            continue
        try:
            value = value[int(part)] if isinstance(value, list) else value[part]
        except (KeyError, IndexError, ValueError, TypeError):
            return _MISSING
    return value


def _with_defaults(node: dict, value):
    if isinstance(value, dict) and "properties" in node:
        out = dict(value)
        for key, sub in node["properties"].items():
            if key in out and out[key] is not None:
                out[key] = _with_defaults(sub, out[key])
            elif "default" in sub and (key not in out or out[key] is None):
                out[key] = sub["default"]
            elif key not in out and sub.get("type") == "object" and "properties" in sub:
                out[key] = _with_defaults(sub, {})
        return out
    return value


def schemas_js() -> str:
    """web/vendor/definitions.js: the schemas and definitions as an ES module (written by `pyshim setup`)."""
    return ("// Generated by `pyshim setup` from pyshim/serve/protocol.py: do not edit.\n"
            f"export const SCHEMAS = {json.dumps(SCHEMAS, indent=1)};\n"
            f"export const DEFINITIONS = {json.dumps(DEFINITIONS, indent=1)};\n")


# --- validated fields -> what the generation loop takes ------------------------------------------------


@dataclass(frozen=True)
class Sampling:
    """A request's sampling fields (validated: see SAMPLING) as the generation loop takes them."""

    params: SamplingParams
    max_tokens: int
    stop: tuple[str, ...]
    ignore_eos: bool
    response_format: Format | None = None      # a JSON Schema or grammar the reply must match
    tools: ToolSpec | None = None              # functions the reply may (or must) call

    @classmethod
    def of(cls, fields: dict) -> "Sampling":
        """From a validated request (or its `sampling` object): defaults already filled in."""
        seed = fields.get("seed")
        params = SamplingParams(temperature=float(fields["temperature"]), top_p=float(fields["top_p"]), top_k=int(fields["top_k"]),
                                min_p=float(fields["min_p"]), repetition_penalty=float(fields["repetition_penalty"]),
                                presence_penalty=float(fields["presence_penalty"]), frequency_penalty=float(fields["frequency_penalty"]),
                                seed=None if seed is None else int(seed))
        stop = fields.get("stop") or ()
        max_tokens = fields.get("max_completion_tokens") or fields["max_tokens"]
        fmt = response_format(fields.get("response_format"))
        if fmt is not None and fields["ignore_eos"]:
            raise BadRequestError("response_format needs the reply to end: it cannot be combined with ignore_eos", param="ignore_eos")
        tools = tool_spec(fields.get("tools"), fields.get("tool_choice"), fields.get("parallel_tool_calls"))
        if tools is not None and fmt is not None:
            raise BadRequestError("tools and response_format cannot be combined: a reply is either calls or JSON of the schema", param="response_format")
        if tools is not None and fields["ignore_eos"]:
            raise BadRequestError("tools need the reply to end: they cannot be combined with ignore_eos", param="ignore_eos")
        return cls(params, int(max_tokens), (stop,) if isinstance(stop, str) else tuple(stop), bool(fields["ignore_eos"]), fmt, tools)

    @classmethod
    def parse(cls, fields: dict | None) -> "Sampling":
        """From raw sampling fields (checked here): what the Worker and the CLI hand over."""
        body = validate("generate", {"model_id": "-", "messages": [{"role": "user", "content": ""}], "sampling": fields or {}})
        return cls.of(body["sampling"])
