"""The tokenizer inside Pyodide 0.27 (the browser's Python: no `regex`, Python 3.12), run under Node:
the same ids as llama.cpp on the real models' corpus and on llama.cpp's test vocabularies."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import llamacpp_vocabs

HERE = Path(__file__).parent
ROOT = HERE.parent
NODE_TIMEOUT_S = 300

pytestmark = pytest.mark.slow


def test_tokenizer_in_pyodide():
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    if not (ROOT / "web" / "vendor" / "manifest.json").is_file():
        pytest.fail("web/vendor is missing: run `pyshim setup` (the README's test command does it)")
    env = dict(os.environ, PYSHIM_LLAMACPP_VOCABS=str(llamacpp_vocabs.vocab_dir()))
    run = subprocess.run([node, str(HERE / "pyodide_tokenizer.mjs"), str(HERE / "pyodide_tokenizer_check.py")],
                         capture_output=True, text=True, env=env, timeout=NODE_TIMEOUT_S, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    print(f"\nPyodide Python {result['python']}: " + ", ".join(
        f"{name} load {m['load_s']} s" for name, m in result["models"].items()))
    assert result["python"].startswith("3.12")
    assert result["vocabs"] == {name: 0 for name in llamacpp_vocabs.SUPPORTED_VOCABS}
    for name, m in result["models"].items():
        assert m["wrong"] == [], name
        assert m["chat_ids"] > 3
