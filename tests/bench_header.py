"""Benchmark (not a test): how long parsing a GGUF header takes, from bytes already in memory.

    python tests/bench_header.py [MODEL ...]      # default: gemma3 (262,144-token vocabulary)

`bench(path)` is importable (e.g. in Pyodide: fetch the prefix, then time `read_header`); it returns
the best of REPEATS parses in seconds. The bar (issue 3): <= 1 s in CPython, <= 3 s in Pyodide.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPEATS = 5


def bench(path, repeats: int = REPEATS) -> float:
    """Best wall time of `repeats` parses of the header of the GGUF at `path` (prefix read once, untimed)."""
    from pyshim.header import read_header, read_header_from_file

    size = read_header_from_file(path).header_size
    with open(path, "rb") as f:
        prefix = f.read(size)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        read_header(prefix)
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str]) -> int:
    from pyshim.catalog import resolve_model
    from pyshim.header import read_header_from_file

    for name in argv or ["gemma3"]:
        path = resolve_model(name)
        header = read_header_from_file(path)
        tokens = header.metadata.get("tokenizer.ggml.tokens") or []
        seconds = bench(path)
        print(f"{Path(path).name}: header {header.header_size / 1e6:.1f} MB, {len(tokens):,} tokens, "
              f"{len(header.tensors)} tensors: best of {REPEATS} parses {seconds * 1000:.0f} ms "
              f"({sys.implementation.name} {sys.version.split()[0]})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
