"""Speed of the NumPy reference executor (not a test): prefill and decode tok/s per model, with weights
dequantized once and cached as f32 (default) or dequantized per matmul (the small-memory mode for
Pyodide). Prints GB/s of f32 weights read per decoded token next to the machine's numpy copy bandwidth.

    .venv/bin/python tests/bench_reference.py [smollm2 gemma3 qwen2.5] [--per-call] [--tokens N]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from pyshim.setup.catalog import resolve_model
from pyshim.exec.loading import load_reference
from pyshim.exec.runner import Step

PROMPT_TOKENS = 64
BANDWIDTH_BYTES = 1 << 28      # 256 MiB copied to estimate memory bandwidth


def numpy_bandwidth() -> float:
    src = np.ones(BANDWIDTH_BYTES // 4, dtype=np.float32)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best / 1e9      # read + write


def bench(name: str, per_call: bool, tokens: int) -> None:
    runner = load_reference(resolve_model(name), cache_weights=not per_call)
    ids = [int(i) for i in np.random.default_rng(0).integers(100, 1000, PROMPT_TOKENS)]
    t0 = time.perf_counter()
    logits = runner.logits(ids)                      # (the first call also dequantizes when caching)
    first = time.perf_counter() - t0
    runner.reset()
    t0 = time.perf_counter()
    logits = runner.logits(ids)
    prefill_s = time.perf_counter() - t0
    pos, token = len(ids), int(np.argmax(logits))
    t0 = time.perf_counter()
    for _ in range(tokens):
        token = int(np.argmax(runner.run(Step.of([token], pos))[0].logits))
        pos += 1
    decode_s = time.perf_counter() - t0
    f32_bytes = sum(w.ref.n_elements * 4 for w in runner.ops._bound.values())
    tok_s = tokens / decode_s
    print(f"{name:8s} {'per-call' if per_call else 'cached':8s} first prefill {first:6.1f} s | "
          f"prefill {PROMPT_TOKENS / prefill_s:7.1f} tok/s | decode {tok_s:6.2f} tok/s | "
          f"{f32_bytes / 1e9:.2f} GB f32 weights -> {f32_bytes * tok_s / 1e9:5.1f} GB/s "
          f"({runner.weight_bytes / 1e6:.0f} MB in the file)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("models", nargs="*", default=["smollm2", "gemma3", "qwen2.5"])
    parser.add_argument("--per-call", action="store_true", help="also measure per-matmul dequantization")
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args()
    print(f"numpy copy bandwidth: {numpy_bandwidth():.1f} GB/s")
    for name in args.models:
        bench(name, False, args.tokens)
        if args.per_call:
            bench(name, True, max(2, args.tokens // 8))


if __name__ == "__main__":
    main()
