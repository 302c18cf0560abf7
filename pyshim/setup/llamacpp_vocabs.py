"""llama.cpp's tokenizer test vocabularies and chat templates, fetched once from the llama-cpp-python sdist
on PyPI (no model hub is reachable here, and these are the real tokenizers of model families no package
ships: Llama 3's BPE, Phi-3's SentencePiece).

The sdist (≈75 MB) vendors llama.cpp, whose models/ folder holds vocab-only GGUFs (`ggml-vocab-NAME.gguf`)
with test pairs (`.gguf.inp` / `.gguf.out`, read by tests/llamacpp_vocabs.py) and the chat templates
llama.cpp tests (`templates/*.jinja`). Only those files are extracted, into
~/.cache/pyshim/llama-cpp-python-0.3.36/ (override with PYSHIM_LLAMACPP_VOCABS). Used by the tokenizer
tests and as the tokenizers of the synthetic Llama 3.2 and Phi-3.5 shapes (pyshim.setup.synthetic).
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


def vocab_dir() -> Path:
    """The folder with the vocab GGUFs, their test pairs and templates/, downloading the sdist the first time."""
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


def gguf_path(name: str) -> Path:
    """The vocab-only GGUF of `name` (e.g. "llama-bpe", "phi-3")."""
    return vocab_dir() / f"ggml-vocab-{name}.gguf"


def template_path(name: str) -> Path:
    """A real model's chat template (e.g. "meta-llama-Llama-3.2-3B-Instruct")."""
    return vocab_dir() / "templates" / f"{name}.jinja"
