"""Tokenizer speed on ≈100 KB of English (the bar: ≤ 1 s in CPython). Not a test: it prints numbers.

    .venv/bin/python tests/bench_tokenizer.py [MODEL ...]      (default: smollm2 gemma3 qwen2.5)

For each model: building the tokenizer from header metadata, encoding the text with an empty word cache
("cold", what a first prompt pays) and again ("warm"), and decoding the ids. Best of REPEATS runs.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from english_text import long_english_text  # noqa: E402

from pyshim.setup.catalog import resolve_model  # noqa: E402
from pyshim.errors import ModelNotFoundError  # noqa: E402
from pyshim.gguf.header import read_header_from_file  # noqa: E402
from pyshim.text.tokenizer import Tokenizer  # noqa: E402

REPEATS = 3
DEFAULT_MODELS = ["smollm2", "gemma3", "qwen2.5"]


def best(fn, repeats: int = REPEATS) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return min(times), result


def main(models: list[str]) -> None:
    text = long_english_text()
    size_kb = len(text.encode("utf-8")) / 1024
    print(f"text: {size_kb:.0f} KB of English (pydoc topics), Python {sys.version.split()[0]}")
    print(f"{'model':<10} {'load s':>7} {'cold s':>7} {'warm s':>7} {'decode s':>8} {'tokens':>7} {'tok/s cold':>11}")
    for name in models:
        try:
            path = resolve_model(name)
        except ModelNotFoundError as exc:
            print(f"{name:<10} skipped: {exc}")
            continue
        metadata = read_header_from_file(path).metadata
        load_s, tok = best(lambda: Tokenizer.from_metadata(metadata))

        def cold():
            fresh = Tokenizer(tok.vocab)   # same vocabulary, empty word cache
            return fresh.encode(text, add_special=False)

        cold_s, ids = best(cold)
        tok.encode(text, add_special=False)
        warm_s, _ = best(lambda: tok.encode(text, add_special=False))
        decode_s, _ = best(lambda: tok.decode(ids))
        print(f"{name:<10} {load_s:7.3f} {cold_s:7.3f} {warm_s:7.3f} {decode_s:8.3f} {len(ids):7d} {len(ids) / cold_s:11.0f}")


if __name__ == "__main__":
    main(sys.argv[1:] or DEFAULT_MODELS)
