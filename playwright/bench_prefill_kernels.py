"""Prefill kernels in headless Chromium (SwiftShader here): ms per matmul of a many-token step, per kernel
choice, and prefill attention, run in plain JS (bench_kernels.py's runner) and timed by wall clock and by
the CPU time of Chromium's GPU process (where SwiftShader's threads run: steadier on a shared machine).

    .venv/bin/python playwright/bench_prefill_kernels.py [--tokens 64]

Matmul shapes are the FFN up/gate matrices of SmolLM2 (Q4_1 1536x576, up/gate) and Gemma 3 270M (Q4_K 640x2048, down):
the barrier-free matvec with 4 rows per invocation, the int8 route's matvec (its quantize pass timed on its own row; one token per
invocation as in decode, and for the I8_TOKEN_TYPES (rows, tokens) per invocation, I8_SHAPES), and the
tiled matmul with the CPU-adapter and the GPU tile shapes. Attention: the decode kernel one invocation per
(head, token) against the key-tiled prefill kernel, over a prompt of --tokens at positions 0...
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as QT

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "playwright"))

import harness  # noqa: E402
import i8_emulation  # noqa: E402
from bench_kernels import BENCH_JS as KERNELS_JS, b64  # noqa: E402
from gpu_helpers import random_weight  # noqa: E402
from pyshim.gpu.policy import MATMUL_TILE, MATMUL_TILE_CPU, NARROW_SIMD_ROWS  # noqa: E402
from pyshim.gpu.kernels import (I8_ACTIVATIONS, I8_BLOCKS, I8_PAIR_TYPES, I8_TOKEN_TYPES, PARAMS,  # noqa: E402
                                attention_keys, attention_prefill_grid, attention_prefill_key, groups, matmul_grid,
                                matmul_key, matvec_grid, matvec_i8_grid, matvec_i8_key, matvec_key, quantize_key, xq_row_words)
from pyshim.gpu.shaderc import Preprocessor  # noqa: E402
from pyshim.plan.settings import KV_PAGE  # noqa: E402

# bench_kernels' runner, with the adapter's workgroup memory (the CPU tile takes 24 KiB), as pyshim.gpu.browser asks
LIMIT = "maxBufferSize: adapter.limits.maxBufferSize"
BENCH_JS = KERNELS_JS.replace(LIMIT, LIMIT + ", maxComputeWorkgroupStorageSize: adapter.limits.maxComputeWorkgroupStorageSize")
assert BENCH_JS != KERNELS_JS
MATMULS = [(QT.Q4_1, 1536, 576), (QT.Q4_K, 640, 2048), (QT.Q5_0, 2048, 640)]
I8_SHAPES = ((4, 4), (4, 8), (8, 8), (8, 16), (16, 8))   # the int8 matvec's (rows, tokens) per invocation tried
ATTENTION = [("smollm2", 9, 3, 64), ("gemma3", 4, 1, 256)]     # heads, kv heads, head dim
CPU_REPS = 3


def build_cases(n: int) -> tuple[list[dict], dict]:
    pre = Preprocessor()
    cases, blobs = [], {}
    rng = np.random.default_rng(0)
    for qtype, m, k in MATMULS:
        raw = random_weight(qtype, m, k, rng)
        x = rng.standard_normal((n, k), dtype=np.float32)
        w_blob, x_blob = f"w_{qtype.name}", f"x_{qtype.name}"
        blobs[w_blob], blobs[x_blob] = b64(raw), b64(x)
        params = b64(PARAMS["matvec"].pack(m=m, k=k, n=n, row_bytes=raw.shape[1], w_off=0, x_off=0, y_off=0, bias_off=0, y_stride=m))
        variants = [("matvec rows4", matvec_key(qtype, rows=NARROW_SIMD_ROWS), matvec_grid(m, n, rows=NARROW_SIMD_ROWS)),
                    (f"tiled cpu {MATMUL_TILE_CPU}", matmul_key(qtype, tile=MATMUL_TILE_CPU), matmul_grid(m, n, MATMUL_TILE_CPU)),
                    (f"tiled gpu {MATMUL_TILE}", matmul_key(qtype, tile=MATMUL_TILE), matmul_grid(m, n, MATMUL_TILE))]
        for name, key, grid in variants:
            cases.append({"name": f"{qtype.name} {m}x{k} {name}", "code": pre.build(key), "grid": list(grid), "params": params,
                          "inputs": [{"blob": w_blob}, {"blob": x_blob}, {"size": n * m * 4}], "sizes": []})
        fmt = I8_ACTIVATIONS[qtype]
        row_words = xq_row_words(k, fmt)
        blobs[f"xq_{qtype.name}"] = b64(i8_emulation.pack(*i8_emulation.quantize(x, fmt)))
        cases.append({"name": f"{qtype.name} {m}x{k} quantize {fmt}", "code": pre.build(quantize_key(fmt)), "sizes": [],
                      "inputs": [{"blob": x_blob}, {"size": n * row_words * 4}], "grid": [groups(k // I8_BLOCKS[fmt][0]), n, 1],
                      "params": b64(PARAMS["quantize"].pack(k=k, n=n, x_off=0, x_stride=k, q_off=0, row_words=row_words))})
        pairs = qtype in I8_PAIR_TYPES and k % 64 == 0
        i8_params = b64(PARAMS["matvec_i8"].pack(m=m, k=k, n=n, row_bytes=raw.shape[1], w_off=0, x_off=0, y_off=0,
                                                 bias_off=0, y_stride=m, pair_off=0, x_row_words=row_words))
        i8 = [("i8 matvec rows4", matvec_i8_key(qtype, rows=NARROW_SIMD_ROWS, pairs=pairs), NARROW_SIMD_ROWS, 1)]
        if qtype in I8_TOKEN_TYPES:
            i8 += [(f"i8 matvec rows{r} tokens{t}", matvec_i8_key(qtype, rows=r, tokens=t), r, t) for r, t in I8_SHAPES]
        for name, key, rows, tokens in i8:
            cases.append({"name": f"{qtype.name} {m}x{k} {name}", "code": pre.build(key), "params": i8_params, "sizes": [],
                          "grid": list(matvec_i8_grid(m, n, rows, tokens)),
                          "inputs": [{"blob": w_blob}, {"blob": f"xq_{qtype.name}"}, {"size": n * m * 4}]})
    # the step map as the KV cache writes it (include/kv.wgsl): positions, each token's sequence (0), then
    # sequence 0's page table (pages in order)
    table_len = -(-n // KV_PAGE)
    blobs["positions"] = b64(np.concatenate([np.arange(n), np.zeros(n), np.arange(table_len)]).astype(np.uint32))
    for model, heads, kv_heads, hd in ATTENTION:
        blobs[f"q_{model}"] = b64(rng.standard_normal((n, heads, hd), dtype=np.float32))
        blobs[f"kv_{model}"] = b64(rng.standard_normal((n, kv_heads, hd), dtype=np.float32))
        params = b64(PARAMS["attention"].pack(n=n, heads=heads, kv_heads=kv_heads, table_len=table_len, window=0,
                                              scale=hd ** -0.5, softcap=0.0, pos_off=0, q_off=0, out_off=0, seq_off=n,
                                              table_off=2 * n))
        inputs = [{"blob": f"q_{model}"}, {"blob": f"kv_{model}"}, {"blob": f"kv_{model}"}, {"blob": "positions"},
                  {"size": n * heads * hd * 4}]
        decode_key, _ = attention_keys(hd, hd, False, 1)
        for name, key, grid in (("decode kernel", decode_key, (groups(heads), n, 1)),
                                ("key-tiled", attention_prefill_key(hd, hd, False), attention_prefill_grid(n, heads, kv_heads))):
            cases.append({"name": f"attention {model} ({heads}/{kv_heads} heads, {hd}) {name}", "code": pre.build(key),
                          "grid": list(grid), "params": params, "inputs": inputs, "sizes": []})
    return cases, blobs


def gpu_process_cpu_s() -> float:
    """CPU seconds (user + system) used so far by the GPU processes of the Chromium this process started
    (SwiftShader runs there; other Chromiums on a shared machine are not counted)."""
    def stat(pid: str) -> list[str]:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()

    def mine(pid: str) -> bool:
        while pid not in ("0", "1"):
            if pid == str(os.getpid()):
                return True
            pid = stat(pid)[1]
        return False

    total = 0.0
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and b"--type=gpu-process" in (proc / "cmdline").read_bytes() and mine(proc.name):
                fields = stat(proc.name)
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:         # a process that ended meanwhile
            continue
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    cases, blobs = build_cases(args.tokens)
    from playwright.sync_api import sync_playwright

    with harness.DevServer() as server, sync_playwright() as p:
        browser = harness.launch_chromium(p)
        page, _ = harness.open_page(browser.new_context(), server.url + "/manifest.webmanifest")
        harness.require_adapter(page)
        page.set_default_timeout(600_000)
        for case in cases:
            used = {b["blob"] for b in case["inputs"] if "blob" in b}
            arg = {"cases": [case], "blobs": {k: v for k, v in blobs.items() if k in used}, "trials": 1}
            # one trial each of 1 + 3 * reps dispatches: the difference of reps = CPU_REPS and 1 is
            # 3 * (CPU_REPS - 1) dispatches, with compilation and transfer cancelled out
            page.evaluate(BENCH_JS, {**arg, "reps": 1})            # compiles (Chromium then caches the pipeline)
            c0 = gpu_process_cpu_s()
            page.evaluate(BENCH_JS, {**arg, "reps": 1})
            c1 = gpu_process_cpu_s()
            result = page.evaluate(BENCH_JS, {**arg, "reps": CPU_REPS})
            c2 = gpu_process_cpu_s()
            cpu_ms = ((c2 - c1) - (c1 - c0)) / (3 * (CPU_REPS - 1)) * 1e3
            print(f"{case['name']:56} {result['out'][0]['ms_plain']:8.1f} ms wall {cpu_ms:8.1f} ms GPU-process CPU", flush=True)
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
