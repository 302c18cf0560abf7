"""Benchmark (not a test): how long parsing a GGUF header takes, from bytes already in memory, in
CPython and in Pyodide (the site's Worker in headless Chromium, which fetches just the header with Range).

    python tests/bench_header.py [--no-browser] [MODEL ...]      # default: gemma3 (262,144-token vocabulary)

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
    from pyshim.gguf.header import read_header, read_header_from_file

    size = read_header_from_file(path).header_size
    with open(path, "rb") as f:
        prefix = f.read(size)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        read_header(prefix)
        best = min(best, time.perf_counter() - start)
    return best


def bench_pyodide(paths) -> dict:
    """Parse time (ms) of each header inside the site's Worker, as the Worker reports it."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "playwright"))
    import harness
    from playwright.sync_api import sync_playwright

    from pyshim.setup import vendoring

    vendoring.refresh_pyshim()
    out = {}
    with harness.DevServer() as server, sync_playwright() as p:
        browser = harness.launch_chromium(p)
        page, _ = harness.open_page(browser.new_context(), server.url)
        harness.wait_for_boot(page)
        for path in paths:
            result = harness.engine_request(page, "read-header", {"url": f"models/{Path(path).name}"})
            out[path] = result["parse_ms"]
        browser.close()
    return out


def main(argv: list[str]) -> int:
    from pyshim.setup.catalog import resolve_model
    from pyshim.gguf.header import read_header_from_file

    browser = "--no-browser" not in argv
    names = [a for a in argv if not a.startswith("--")] or ["gemma3"]
    paths = [resolve_model(name) for name in names]
    for path in paths:
        header = read_header_from_file(path)
        tokens = header.metadata.get("tokenizer.ggml.tokens") or []
        seconds = bench(path)
        print(f"{Path(path).name}: header {header.header_size / 1e6:.1f} MB, {len(tokens):,} tokens, "
              f"{len(header.tensors)} tensors: best of {REPEATS} parses {seconds * 1000:.0f} ms "
              f"({sys.implementation.name} {sys.version.split()[0]})")
    if browser:
        for path, ms in bench_pyodide(paths).items():
            print(f"{Path(path).name}: parsed in Pyodide (site Worker, Chromium) in {ms:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
