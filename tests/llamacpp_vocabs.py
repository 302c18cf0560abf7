"""llama.cpp's tokenizer test vocabularies (pyshim.setup.llamacpp_vocabs fetches them): their test pairs
(`.gguf.inp`: texts separated by "\\n__ggml_vocab_test__\\n"; `.gguf.out`: one line of ids per text, tokenized
with add_special=False, parse_special=False) and the chat templates llama.cpp tests (`templates/*.jinja`).
"""

from __future__ import annotations

from pathlib import Path

from pyshim.setup.llamacpp_vocabs import gguf_path, vocab_dir  # noqa: F401  (gguf_path: the tests use it from here)

SEPARATOR = "\n__ggml_vocab_test__\n"
# Every test vocabulary whose type pyshim supports (bert-bge is WordPiece: not supported).
SUPPORTED_VOCABS = ["command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4", "gpt-2", "llama-bpe",
                    "llama-spm", "mpt", "phi-3", "qwen2", "qwen35", "refact", "starcoder"]


def vocab_names() -> list[str]:
    """Names (e.g. "llama-spm") of the vocabularies that come with test pairs."""
    return sorted(p.name[len("ggml-vocab-"):-len(".gguf.inp")] for p in vocab_dir().glob("ggml-vocab-*.gguf.inp"))


def chat_templates() -> list[Path]:
    """The Jinja chat templates of real models that llama.cpp's own tests render."""
    return sorted((vocab_dir() / "templates").glob("*.jinja"))


def test_pairs(name: str) -> list[tuple[str, list[int]]]:
    """(text, expected ids) pairs, read the way llama.cpp's test-tokenizer-0 reads them."""
    base = vocab_dir() / f"ggml-vocab-{name}.gguf"
    raw = (base.parent / (base.name + ".inp")).read_bytes().decode("utf-8")
    texts = []
    pos = 0
    while pos < len(raw):
        nxt = raw.find(SEPARATOR, pos)
        if nxt < 0:
            texts.append(raw[pos:])
            break
        texts.append(raw[pos:nxt])
        pos = nxt + len(SEPARATOR)
    lines = (base.parent / (base.name + ".out")).read_text("utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) != len(texts):
        raise ValueError(f"{name}: {len(texts)} texts but {len(lines)} id lines")
    return [(t, [int(x) for x in line.split()]) for t, line in zip(texts, lines)]
