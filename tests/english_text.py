"""≈100 KB of real English prose for the tokenizer benchmark and its llama.cpp check: CPython's own
pydoc topics (the text of the language reference), read from the running interpreter, not copied here.
The text differs between Python versions, so checks against recorded ids compare its SHA-256 first."""

from __future__ import annotations

import hashlib

LONG_TEXT_KB = 100


def long_english_text(kb: int = LONG_TEXT_KB) -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))[: kb * 1024]


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
