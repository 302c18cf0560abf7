"""Tool calls (OpenAI's `tools` / `tool_choice`): the tools rendered by the model's own chat template, the
call's arguments constrained to each function's JSON Schema, the calls read back from the reply.

The call format is the one the template teaches (`call_format`):
- `TAGGED`: templates that take `tools` and frame a call in `<tool_call>` … `</tool_call>` (Qwen2.5 and the
  Hermes family): `{"name": ..., "arguments": {...}}` between the tags, several calls in a row allowed;
- `BARE_JSON`: templates that take `tools` and ask for a bare `{"name": ..., "parameters": {...}}` object
  (the Llama 3.1–3.3 style), one call a reply;
- a template without tools gets the tagged format described in a system message of pyshim's
  (`TOOLS_SYSTEM`), so any chat model can be asked.

`CallMatcher` is a Matcher (pyshim.text.grammar) over three phases: the opener's tokens, the call's JSON
(an inner matcher for a schema whose `name` is one of the allowed functions' and whose arguments follow
that function's parameters), then the closer's tokens; after a call, another may follow (parallel calls)
or the reply ends. With tool_choice "auto" the model's first token decides: the opener's first token
starts a call (for a bare-JSON format: a token the call's grammar allows first that opens an object),
anything else makes the reply plain text, unconstrained.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

import numpy as np

from pyshim.errors import BadRequestError
from pyshim.text.grammar import Format, Grammars, Matcher, allowed
from pyshim.text.tokenizer import Tokenizer

@dataclass(frozen=True)
class CallFormat:
    """How a model writes a call: its JSON between `opener` and `closer` (empty: a bare object), the
    arguments under `arguments_key`; `several`: whether more calls may follow in the same reply."""

    opener: str
    closer: str
    arguments_key: str
    several: bool


TAGGED = CallFormat("<tool_call>\n", "\n</tool_call>", "arguments", True)
BARE_JSON = CallFormat("", "", "parameters", False)
OPENER, CLOSER = TAGGED.opener, TAGGED.closer
TOOLS_SYSTEM = ("You can call functions to answer. The functions, as JSON signatures:\n{tools}\n\n"
                "To call one, reply with only {opener}{{\"name\": <function name>, \"arguments\": <arguments object>}}{closer}")


@dataclass(frozen=True)
class ToolSpec:
    """The request's tools and what tool_choice allows: `names` the functions a call may name (all, or the
    one named), `required` a call must come (tool_choice "required" or a named function)."""

    tools: tuple[dict, ...]
    names: tuple[str, ...]
    required: bool
    parallel: bool = True

    def schema(self, arguments_key: str = "arguments") -> dict:
        """The JSON Schema of one call, its arguments under `arguments_key`."""
        def call(tool: dict) -> dict:
            fn = tool["function"]
            params = fn.get("parameters") or {"type": "object", "properties": {}}
            return {"type": "object", "properties": {"name": {"const": fn["name"]}, arguments_key: params},
                    "required": ["name", arguments_key]}

        options = [call(t) for t in self.tools if t["function"]["name"] in self.names]
        return options[0] if len(options) == 1 else {"anyOf": options}

    def as_request(self) -> dict:
        """The request fields that give this spec again (for an engine that takes requests: the JS one)."""
        if set(self.names) == {t["function"]["name"] for t in self.tools}:
            choice = "required" if self.required else "auto"
        else:
            choice = {"type": "function", "function": {"name": self.names[0]}}
        return {"tools": list(self.tools), "tool_choice": choice, "parallel_tool_calls": self.parallel}


def tool_spec(tools: list[dict] | None, tool_choice, parallel: bool | None = None) -> ToolSpec | None:
    """The validated request's `tools` and `tool_choice` (OpenAI's defaults: "auto" with tools), or None
    when no call may be made (no tools, or tool_choice "none")."""
    if not tools:
        if tool_choice not in (None, "none", "auto"):
            raise BadRequestError("tool_choice names a call, but the request has no tools", param="tool_choice")
        return None
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise BadRequestError(f"tools name a function twice: {sorted(n for n in set(names) if names.count(n) > 1)}", param="tools")
    choice = "auto" if tool_choice is None else tool_choice
    if choice == "none":
        return None
    if isinstance(choice, dict):
        name = choice["function"]["name"]
        if name not in names:
            raise BadRequestError(f"tool_choice names {name!r}, which is not among the tools ({', '.join(names)})", param="tool_choice")
        return ToolSpec(tuple(tools), (name,), True, False if parallel is None else bool(parallel))
    return ToolSpec(tuple(tools), tuple(names), choice == "required", True if parallel is None else bool(parallel))


def template_format(source: str) -> CallFormat | None:
    """The call format a chat template teaches when it renders `tools` itself, or None (it knows none)."""
    if "tools" not in source:
        return None
    if "<tool_call>" in source:
        return TAGGED
    if '"parameters"' in source:      # asks for {"name": ..., "parameters": ...} in the text it renders
        return BARE_JSON
    return None


def call_format(source: str) -> CallFormat:
    """The format a model with this template is asked to call in (pyshim's system message: TAGGED)."""
    return template_format(source) or TAGGED


def with_tools(messages: list[dict], spec: ToolSpec, template_source: str) -> tuple[list[dict], dict]:
    """The messages and template variables that render the tools: the template's own `tools` when it
    takes them, else pyshim's system message. Assistant calls' arguments go in as objects (templates
    write them with tojson) and tool results as their text."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": _arguments(c["function"].get("arguments"))}}
                               for c in m["tool_calls"]]
        if m.get("content") is None:
            m["content"] = ""
        out.append(m)
    if template_format(template_source) is not None:
        return out, {"tools": list(spec.tools)}
    listing = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in spec.tools)
    system = TOOLS_SYSTEM.format(tools=listing, opener=OPENER, closer=CLOSER)
    if out and out[0]["role"] == "system":
        out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + system}
    else:
        out.insert(0, {"role": "system", "content": system})
    return [_plain(m) for m in out], {}


def _arguments(value):
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _plain(message: dict) -> dict:
    """A tool-call turn for a template that knows no tools: calls written out as the format says, a tool
    result as a user turn."""
    if message.get("tool_calls"):
        calls = "".join(OPENER + json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]},
                                            ensure_ascii=False) + CLOSER for c in message["tool_calls"])
        return {"role": "assistant", "content": (message.get("content") or "") + calls}
    if message["role"] == "tool":
        return {"role": "user", "content": f"<tool_response>\n{message['content']}\n</tool_response>"}
    return message


class CallMatcher:
    """See the module docstring. `calls` holds the calls made (OpenAI's shape) once the reply is done;
    `calling` says whether the reply turned into calls (its text is then not content)."""

    def __init__(self, spec: ToolSpec, grammars: Grammars, tokenizer: Tokenizer, vocab_size: int, end_ids,
                 fmt: CallFormat = TAGGED):
        self.spec, self._grammars, self._tokenizer, self.fmt = spec, grammars, tokenizer, fmt
        self._opener = tokenizer.encode(fmt.opener, add_special=False, parse_special=True) if fmt.opener else []
        self._closer = tokenizer.encode(fmt.closer, add_special=False, parse_special=True) if fmt.closer else []
        self._words = (vocab_size + 31) // 32
        self._end = [int(t) for t in end_ids]
        self._format = Format("json_schema", json.dumps(spec.schema(fmt.arguments_key)), True)
        self._several = spec.parallel and fmt.several and bool(self._opener)
        self.calling = spec.required
        if not spec.required:
            self._phase = "free"
        else:
            self._phase = "open" if self._opener else "json"
        self._at = 0
        self._inner: Matcher | None = None
        self._first: np.ndarray | None = None     # a bare-JSON call's first tokens, while "auto" decides
        self._json: list[int] = []
        self._raw: list[list[int]] = []

    def _only(self, ids) -> np.ndarray:
        mask = np.zeros(self._words, dtype=np.uint32)
        for t in ids:
            mask[t >> 5] |= np.uint32(1 << (t & 31))
        return mask

    async def mask(self) -> np.ndarray:
        if self._phase == "free":     # (the first token decides: the opener's first starts a call, else text)
            if not self._opener and self._at == 0 and self._first is None:
                self._inner = await self._grammars.matcher(self._format)    # what may open a bare call
                self._first = await self._inner.mask()
            return np.full(self._words, 0xFFFFFFFF, dtype=np.uint32)
        if self._phase == "open":
            return self._only([self._opener[self._at]])
        if self._phase == "json":
            if self._inner is None:
                self._inner = await self._grammars.matcher(self._format)
            inner = await self._inner.mask()
            if allowed(inner, self._end).any():          # the call's object is complete: only the closer now
                self._inner.close()
                self._phase, self._at, self._inner = ("close" if self._closer else "after"), 0, None
                self._raw.append(self._json)
                return await self.mask()
            return inner
        if self._phase == "close":
            return self._only([self._closer[self._at]])
        return self._only(self._end + ([self._opener[0]] if self._several else []))    # "after": end, or another call

    def accept(self, token: int) -> None:
        token = int(token)
        if self._phase == "free":
            if self._at == 0 and self._opener and token == self._opener[0]:
                self.calling = True
                self._phase, self._at = "open", 0
            elif self._at == 0 and not self._opener and self._opens_bare_call(token):
                self.calling = True
                self._phase, self._json, self._first = "json", [], None
            else:
                if self._inner is not None:        # a bare format's reply turned out to be text
                    self._inner.close()
                    self._inner = self._first = None
                self._at += 1
                return
        if self._phase == "after":            # another call (a stop id never reaches accept)
            self._phase, self._at = "open", 0
        if self._phase == "open":
            self._at += 1
            if self._at == len(self._opener):
                self._phase, self._json, self._inner = "json", [], None
            return
        if self._phase == "json":
            self._inner.accept(token)
            self._json.append(token)
            return
        if self._phase == "close":
            self._at += 1
            if self._at == len(self._closer):
                self._phase = "after"

    def _opens_bare_call(self, token: int) -> bool:
        """A first token the call's grammar allows and that opens its object (not a reply that merely
        starts with a space the grammar would also take)."""
        first = self._first
        if first is None or not (int(first[token >> 5]) >> (token & 31)) & 1:
            return False
        return self._tokenizer.decode_bytes([token]).lstrip().startswith(b"{")

    def close(self) -> None:
        if self._inner is not None:
            self._inner.close()

    @property
    def calls(self) -> list[dict]:
        out = []
        # A bare call's object is known complete at the next mask: a reply cut right after its last token
        # still made it (one cut inside it did not: max_tokens, like a call without its closing tag).
        pending = [self._json] if self._phase == "json" and self._json else []
        for ids in self._raw + pending:
            try:
                call = json.loads(self._tokenizer.decode_bytes(ids).decode("utf-8"))
            except ValueError:
                continue
            out.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                        "function": {"name": call["name"], "arguments": json.dumps(call[self.fmt.arguments_key], ensure_ascii=False)}})
        return out
