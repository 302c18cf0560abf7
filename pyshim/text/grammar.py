"""Constrained decoding: a reply that must be a JSON object, match a JSON Schema, or follow a GBNF grammar.

The grammar engines are maintained libraries, one per place Python runs:
- natively, llguidance (PyPI, Rust, no dependencies: `pip install pyshim[grammar]`);
- in the browser, XGrammar's WebAssembly build (@mlc-ai/web-xgrammar, vendored by `pyshim setup`), which
  the engine Worker hands to Python as a small JS object (web/engine/grammar.js) used by duck typing, so
  this module imports in CPython and nothing here imports `js`.
(llguidance has no Pyodide build and XGrammar's Python package pulls in torch; both engines take the same
JSON Schemas and GBNF, and the same tests run against both.)

Both see the model's vocabulary as bytes (`vocab_bytes`: what each token stands for, the way the decoder
writes it), so multi-character and partial-UTF-8 tokens are judged by their real bytes; control tokens
never match text. A matcher answers the set of tokens allowed next as a bitmask (uint32 words, bit t % 32
of word t // 32: token t), with the model's end-of-generation ids allowed once the grammar may end.
JSON is written compactly (", " and ": " between items, no other whitespace), so a small model cannot
wander off into endless blank lines, and both engines accept exactly the same text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from pyshim.errors import BadRequestError, UnsupportedError
from pyshim.text.tokenizer import Tokenizer
from pyshim.text.tokenizer.unicode import _gpt2_byte_alphabet
from pyshim.text.tokenizer.vocab import Attr

KINDS = ("json_object", "json_schema", "grammar")
ITEM_SEPARATOR, KEY_SEPARATOR = ", ", ": "
SPECIAL_MARK = b"\xff"        # llguidance's prefix for a control token's bytes: never matched as text


@dataclass(frozen=True)
class Format:
    """What a reply must be: kind "json_object" (any object), "json_schema" (`text`: the schema as JSON)
    or "grammar" (`text`: GBNF, rule `root` first-class). `strict` (json_schema): objects take only the
    properties they list, as OpenAI's strict mode demands."""

    kind: str
    text: str = ""
    strict: bool = True

    @property
    def key(self) -> tuple:
        return (self.kind, self.text, self.strict)

    def as_request(self) -> dict:
        """Back to a response_format (what another engine's API takes)."""
        if self.kind == "grammar":
            return {"type": "grammar", "grammar": self.text}
        if self.kind == "json_object":
            return {"type": "json_object"}
        return {"type": "json_schema", "json_schema": {"name": "reply", "schema": json.loads(self.text), "strict": self.strict}}


def response_format(value) -> Format | None:
    """OpenAI's `response_format` ({type: "text" | "json_object" | "json_schema" | "grammar"}; the request
    schema checked its shape) as a Format, or None for plain text."""
    if value is None or value.get("type") == "text":
        return None
    kind = value["type"]
    if kind == "json_object":
        return Format("json_object", json.dumps({"type": "object"}))
    if kind == "json_schema":
        spec = value["json_schema"]
        schema = spec["schema"]
        strict = spec.get("strict")
        strict = True if strict is None else bool(strict)
        return Format("json_schema", json.dumps(_closed(schema) if strict else schema), strict)
    return Format("grammar", value["grammar"])


def _closed(node):
    """The schema with `additionalProperties: false` on every object that does not say (strict mode)."""
    if isinstance(node, list):
        return [_closed(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: (v if k in ("enum", "const", "default", "examples") else _closed(v)) for k, v in node.items()}
    if out.get("type") == "object" and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def vocab_bytes(tokenizer: Tokenizer) -> tuple[list[bytes], list[int]]:
    """Each token's bytes as the reply's text would hold them, and the control (special) token ids."""
    attrs = tokenizer.vocab.attrs
    pieces, special = [], []
    for i in range(tokenizer.vocab_size):
        if attrs[i] & (Attr.CONTROL | Attr.UNKNOWN):
            special.append(i)
            pieces.append(b"")
        else:
            pieces.append(tokenizer.piece_bytes(i))
    return pieces, special


def allowed(mask: np.ndarray, ids) -> np.ndarray:
    """Which of token `ids` the bitmask allows (bool array)."""
    ids = np.asarray(ids, dtype=np.int64)
    inside = ids < 32 * mask.shape[0]
    words = mask[np.where(inside, ids >> 5, 0)]
    return inside & (((words >> (ids & 31).astype(np.uint32)) & 1) == 1)


def mask_logits(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Logits with every token the mask forbids at -inf (a new array)."""
    ok = allowed(mask, np.arange(logits.shape[-1]))
    return np.where(ok, logits, -np.inf).astype(np.float32)


class Matcher(Protocol):
    """One reply's progress through its grammar."""

    async def mask(self) -> np.ndarray:
        """The tokens allowed next: uint32 words [ceil(vocab / 32)]."""

    def accept(self, token: int) -> None:
        """Advance past `token` (one the last mask allowed)."""

    def close(self) -> None:
        """Free what the engine holds for this reply."""


class Grammars(Protocol):
    """A grammar engine bound to one model's vocabulary."""

    async def matcher(self, fmt: Format) -> Matcher:
        """A fresh matcher for `fmt`; BadRequestError for a schema or grammar the engine refuses."""


async def accepted_prefix(matcher: Matcher, ids: Sequence[int]) -> int:
    """How many of `ids` the grammar takes in order, each allowed by the mask before it: a tokenized text
    checked against an engine (the tests' way of asking whether it accepts that text)."""
    for n, token in enumerate(ids):
        if not allowed(await matcher.mask(), [token])[0]:
            return n
        matcher.accept(token)
    return len(ids)


# --- llguidance (native) ---------------------------------------------------------------------------------

class _Vocabulary:
    """The tokenizer as llguidance's TokenizerWrapper reads it."""

    def __init__(self, tokenizer: Tokenizer, stop_ids: Sequence[int]):
        pieces, special = vocab_bytes(tokenizer)
        for i in special:
            pieces[i] = SPECIAL_MARK + tokenizer.piece_bytes(i, special=True)
        self.tokens = pieces
        self.special_token_ids = special
        self.eos_token_id = int(stop_ids[0])
        self.bos_token_id = tokenizer.bos_id
        self._tokenizer = tokenizer

    def __call__(self, text) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", "surrogateescape")
        return self._tokenizer.encode(text, add_special=False)


class LLGuidance:
    """Grammars through llguidance; the tokenizer is converted once (0.1-0.8 s for 50k-262k tokens)."""

    def __init__(self, tokenizer: Tokenizer, stop_ids: Sequence[int]):
        try:
            import llguidance
        except ImportError:
            raise UnsupportedError("constrained decoding natively needs the llguidance package",
                                   hint="pip install 'pyshim[grammar]' (or: pip install llguidance)") from None
        if not stop_ids:
            raise BadRequestError("a constrained reply needs an end-of-generation token (ignore_eos is set)", param="response_format")
        self._llg = llguidance
        self._tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Vocabulary(tokenizer, stop_ids)),
                                                 n_vocab=tokenizer.vocab_size, eos_token=[int(t) for t in stop_ids])
        self._grammars: dict[tuple, str] = {}

    def _grammar(self, fmt: Format) -> str:
        grammar = self._grammars.get(fmt.key)
        if grammar is None:
            llg = self._llg
            try:
                if fmt.kind == "grammar":
                    grammar = llg.grammar_from("gbnf", fmt.text)
                else:
                    grammar = llg.LLMatcher.grammar_from_json_schema(fmt.text, overrides={
                        "whitespace_flexible": False, "item_separator": ITEM_SEPARATOR, "key_separator": KEY_SEPARATOR})
            except ValueError as exc:
                raise _refused(fmt, str(exc)) from None
            is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar, self._tokenizer)
            if is_error:
                raise _refused(fmt, messages[0] if messages else "invalid")
            self._grammars[fmt.key] = grammar
        return grammar

    async def matcher(self, fmt: Format) -> Matcher:
        return _LLMatcher(self._llg.LLMatcher(self._tokenizer, self._grammar(fmt)))


class _LLMatcher:
    def __init__(self, matcher):
        self._m = matcher

    async def mask(self) -> np.ndarray:
        return np.frombuffer(self._m.compute_bitmask(), dtype=np.uint32)

    def accept(self, token: int) -> None:
        if not self._m.consume_token(int(token)):
            raise BadRequestError(f"the grammar refused token {token}: {self._m.get_error()}", param="response_format")

    def close(self) -> None:
        pass


# --- XGrammar (in the page) ---------------------------------------------------------------------------------

_BYTE_ALPHABET = _gpt2_byte_alphabet()


def byte_level_vocab(tokenizer: Tokenizer) -> list[str]:
    """The vocabulary in GPT-2's byte alphabet (XGrammar's "byte_level" type), whatever the model's own
    tokenizer: every byte is one printable character, so a JS string carries partial UTF-8 exactly.
    Control tokens are empty, which XGrammar treats as special."""
    pieces, _ = vocab_bytes(tokenizer)
    return ["".join(_BYTE_ALPHABET[b] for b in piece) for piece in pieces]


class XGrammar:
    """Grammars through the page's XGrammar: `access` is web/engine/grammar.js's object, whose methods
    take and return JSON text or plain numbers and one matcher object per reply:
        tokenizer(key, vocab_json, stop_ids_json) -> Promise   (once per model; `key` caches it)
        matcher(key, kind, text, strict) -> Promise<matcher>   (kind: "json_schema" | "grammar")
    where matcher.mask() -> Promise<Int32Array>, matcher.accept(id) -> bool and matcher.close()."""

    def __init__(self, access, key: str, tokenizer: Tokenizer, stop_ids: Sequence[int]):
        if not stop_ids:
            raise BadRequestError("a constrained reply needs an end-of-generation token (ignore_eos is set)", param="response_format")
        self._access, self._key = access, key
        self._vocab = (tokenizer, [int(t) for t in stop_ids])
        self._ready = False

    async def matcher(self, fmt: Format) -> Matcher:
        if not self._ready:
            tokenizer, stops = self._vocab
            await self._access.tokenizer(self._key, json.dumps(byte_level_vocab(tokenizer)), json.dumps(stops))
            self._ready = True
        kind = "grammar" if fmt.kind == "grammar" else "json_schema"
        try:
            handle = await self._access.matcher(self._key, kind, fmt.text, fmt.strict)
        except Exception as exc:          # a JsException: XGrammar's parse or compile error
            raise _refused(fmt, str(exc).splitlines()[-1] if str(exc) else "invalid") from None
        return _XMatcher(handle)


class _XMatcher:
    def __init__(self, handle):
        self._h = handle

    async def mask(self) -> np.ndarray:
        words = await self._h.mask()
        data = words.to_bytes() if hasattr(words, "to_bytes") else bytes(np.asarray(words, dtype=np.int32))
        return np.frombuffer(data, dtype=np.uint32)

    def accept(self, token: int) -> None:
        if not self._h.accept(int(token)):
            raise BadRequestError(f"the grammar refused token {token}", param="response_format")

    def close(self) -> None:
        self._h.close()


def _refused(fmt: Format, why: str) -> BadRequestError:
    what = "GBNF grammar" if fmt.kind == "grammar" else "JSON Schema"
    return BadRequestError(f"the {what} of response_format cannot be used: {why}", param="response_format",
                           hint="check it; JSON Schemas may use type, properties, required, items, enum, const, anyOf, $ref, "
                                "minLength/maxLength, minItems/maxItems")
