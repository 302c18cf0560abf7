"""Chat prompts: the model's `tokenizer.chat_template` rendered in a sandboxed jinja2 environment, or a
fallback per model family when the file has none (Gemma 3 base), plus the tokens that end a turn.

    template = ChatTemplate.from_metadata(metadata, tokenizer)
    ids = template.encode(tokenizer, [{"role": "user", "content": "Hi"}])   # ready for prefill
    stop = template.stop_ids                                                 # end-of-turn ids

Templates are written for Hugging Face's `apply_chat_template`, so the environment mirrors it:
trim_blocks and lstrip_blocks, the loop-control extension, `{% generation %}` blocks, `raise_exception`, a `tojson` filter that
keeps non-ASCII text, `strftime_now`, and `bos_token` / `eos_token` as the vocabulary's texts. The
immutable sandbox stops a template (which comes with a downloaded file) from reaching Python internals
or mutating the caller's messages.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from pyshim.errors import ChatTemplateError
from pyshim.text.tokenizer import Tokenizer

# Fallback templates, chosen by the vocabulary's turn tokens (then the architecture).
CHATML = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
# Gemma: roles "user" and "model"; a system message is folded into the first user turn.
GEMMA = (
    "{{- bos_token -}}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set system = messages[0]['content'] + '\\n\\n' -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set system = '' -%}{%- set turns = messages -%}{%- endif -%}"
    "{%- for message in turns -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{- '<start_of_turn>' + role + '\\n' + (system if loop.first else '') + (message['content'] | trim)"
    " + '<end_of_turn>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"
)
LLAMA3 = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + (message['content'] | trim)"
    " + '<|eot_id|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"
)
PHI3 = (
    "{%- for message in messages -%}"
    "{{- '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- endif -%}"
)
# No turn tokens at all: a plain "Role: text" transcript.
PLAIN = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{{- message['role'] | capitalize }}: {{ message['content'] | trim + '\\n\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- 'Assistant:' -}}{%- endif -%}"
)

# Texts that end a turn in some template family; any of them present in the vocabulary stops generation.
END_OF_TURN_TEXTS = ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|end|>", "<|eom_id|>", "<|endoftext|>")


def fallback_template(tokenizer: Tokenizer, architecture: str | None) -> str:
    """The template to use when the file carries none."""
    has = tokenizer.token_id
    arch = architecture or ""
    if has("<start_of_turn>") is not None or arch.startswith("gemma"):
        return GEMMA
    if has("<|start_header_id|>") is not None:
        return LLAMA3
    if has("<|im_start|>") is not None:
        return CHATML
    if arch == "phi3" and has("<|assistant|>") is not None:
        return PHI3
    return PLAIN


def _tojson(value: Any, indent: int | None = None, separators=None, sort_keys: bool = False,
            ensure_ascii: bool = False) -> str:
    return json.dumps(value, indent=indent, separators=separators, sort_keys=sort_keys, ensure_ascii=ensure_ascii)


def _raise_exception(message: str):
    raise ChatTemplateError(f"the chat template refused the messages: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


class _GenerationBlocks(Extension):
    """`{% generation %}...{% endgeneration %}` (Hugging Face marks assistant text with it for training
    masks): rendered as its plain body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols", _GenerationBlocks])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@dataclass
class ChatTemplate:
    source: str
    bos_token: str
    eos_token: str
    stop_ids: frozenset[int]
    from_file: bool          # False: a pyshim fallback

    def __post_init__(self):
        try:
            self._template = _environment().from_string(self.source)
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(f"the model's chat template does not parse (line {exc.lineno}: {exc.message})",
                                    hint="pass another template") from None

    @classmethod
    def from_metadata(cls, metadata: dict[str, Any], tokenizer: Tokenizer,
                      override: str | None = None) -> "ChatTemplate":
        """The file's `tokenizer.chat_template` (or `override`), else the family's fallback."""
        source = override or metadata.get("tokenizer.chat_template")
        from_file = bool(source)
        if not source:
            source = fallback_template(tokenizer, metadata.get("general.architecture"))
        return cls(source=source, bos_token=_token_text(tokenizer, tokenizer.bos_id),
                   eos_token=_token_text(tokenizer, tokenizer.eos_id),
                   stop_ids=stop_ids(tokenizer, source), from_file=from_file)

    def render(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True, **extra: Any) -> str:
        """The prompt text for `messages` ([{"role": ..., "content": ...}, ...]); `extra` reaches the
        template as variables (tools, documents, ...)."""
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or "role" not in message:
                raise ChatTemplateError(f"message {i} needs a 'role' (and usually a 'content')")
        variables = dict(extra, messages=messages, add_generation_prompt=add_generation_prompt,
                         bos_token=self.bos_token, eos_token=self.eos_token)
        try:
            return self._template.render(**variables)
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"the chat template failed: {exc}") from None

    def encode(self, tokenizer: Tokenizer, messages: list[dict[str, Any]], *,
               add_generation_prompt: bool = True, **extra: Any) -> list[int]:
        """Render and tokenize as llama.cpp's server does: special tokens parsed, and a BOS written by
        the template dropped when the tokenizer adds one itself (no double BOS)."""
        text = self.render(messages, add_generation_prompt=add_generation_prompt, **extra)
        if tokenizer.vocab.add_bos and self.bos_token and text.startswith(self.bos_token):
            text = text[len(self.bos_token):]
        return tokenizer.encode(text, add_special=True, parse_special=True)


def _token_text(tokenizer: Tokenizer, token_id: int | None) -> str:
    return tokenizer.token_text(token_id) if token_id is not None else ""


def stop_ids(tokenizer: Tokenizer, template_source: str) -> frozenset[int]:
    """Ids that end the assistant's turn: llama.cpp's end-of-generation set, plus any end-of-turn token
    the template writes."""
    ids = set(tokenizer.eog_ids)
    for text in END_OF_TURN_TEXTS:
        tid = tokenizer.token_id(text)
        if tid is not None and text in template_source:
            ids.add(tid)
    return frozenset(ids)
