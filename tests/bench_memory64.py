"""What the CPU engine's 64-bit build costs (not a test): one matrix-vector product — decode's work — of a
[rows x cols] Q4_K matrix, timed on the 32-bit module and its 64-bit (memory64) twin, 1 and 2 threads,
natively under wasmtime and in headless Chromium (the page's own web/engine/cpu.js), all in one run.
Prints GB/s of weights streamed and the 64-bit build's share of the 32-bit one's speed.

    .venv/bin/python tests/bench_memory64.py [--rows 4096] [--cols 4096] [--reps 40]
"""

from __future__ import annotations

import argparse
import base64
import sys
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as QT

from pyshim.exec.wasm_module import NativeModule
from pyshim.exec.wasm_ops import OP, OP_WORDS
from pyshim.setup.synthetic import _q4_k

# The timing runs in a Web Worker, as the engine does (a program's threads wait with Atomics.wait, which
# a page's main thread may not call).
WORKER_JS = """
self.onmessage = async ({ data: [cpuUrl, wide, threads, w, rows, cols, reps] }) => {
  const cpu = await import(cpuUrl);
  const e = await cpu.instantiate(threads, { wide });
  const wp = e.alloc(w.length);
  e.write(wp, w);
  const x = e.alloc(4 * cols), y = e.alloc(4 * rows);
  e.write(x, new Float32Array(cols).map((_, i) => Math.sin(i)));
  const scratch = e.alloc(e.call("matmul_scratch", %(type)d, 1, cols));
  const fields = [%(op)d, x, 1, cols, wp, %(type)d, rows, y, 0, 0, scratch];
  const words = wide ? new BigInt64Array(%(words)d) : new Int32Array(%(words)d);
  fields.forEach((v, i) => { words[i] = wide ? BigInt(v) : v; });
  const prog = e.alloc(words.byteLength);
  e.write(prog, new Uint8Array(words.buffer));
  e.call("run", prog, 1);
  const t0 = performance.now();
  for (let r = 0; r < reps; r++) e.call("run", prog, 1);
  const ms = (performance.now() - t0) / reps;
  self.postMessage({ ms, threads: e.threads, wide: e.wide, relaxed: e.relaxed });
  e.close();
};
""" % {"op": OP["matmul"], "words": OP_WORDS, "type": int(QT.Q4_K)}
PAGE_JS = """([code, wide, threads, b64, rows, cols, reps]) => new Promise((resolve, reject) => {
  const worker = new Worker(URL.createObjectURL(new Blob([code], { type: "text/javascript" })), { type: "module" });
  worker.onmessage = (m) => { worker.terminate(); resolve(m.data); };
  worker.onerror = (err) => reject(new Error(err.message));
  const w = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  worker.postMessage([new URL("engine/cpu.js", document.baseURI).href, wide, threads, w, rows, cols, reps]);
})"""


def matrix(rows: int, cols: int) -> np.ndarray:
    return _q4_k(np.random.default_rng(0), rows, cols)


def native_ms(w: np.ndarray, rows: int, cols: int, wide: bool, threads: int, reps: int) -> float:
    m = NativeModule(threads=threads, wide=wide)
    try:
        wp = m.alloc(w.nbytes)
        m.write(wp, w)
        x, y = m.alloc(4 * cols), m.alloc(4 * rows)
        m.write(x, np.sin(np.arange(cols, dtype=np.float32)))
        scratch = m.alloc(m.call("matmul_scratch", int(QT.Q4_K), 1, cols))
        words = np.zeros(OP_WORDS, dtype=np.int64 if wide else np.int32)
        words[:11] = [OP["matmul"], x, 1, cols, wp, int(QT.Q4_K), rows, y, 0, 0, scratch]
        prog = m.alloc(words.nbytes)
        m.write(prog, words)
        m.call("run", prog, 1)
        t0 = time.perf_counter()
        for _ in range(reps):
            m.call("run", prog, 1)
        return (time.perf_counter() - t0) / reps * 1e3
    finally:
        m.close()


def browser_ms(w: np.ndarray, rows: int, cols: int, reps: int) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "playwright"))
    import harness
    from playwright.sync_api import sync_playwright

    b64 = base64.b64encode(w.tobytes()).decode()
    out = {}
    with harness.DevServer(isolated=True) as server, sync_playwright() as p:
        browser = harness.launch_chromium(p)
        page = browser.new_page()
        page.goto(server.url + "manifest.webmanifest")      # any same-origin document (cross-origin isolated)
        for wide in (False, True):
            for threads in (1, 2):
                out[wide, threads] = page.evaluate(PAGE_JS, [WORKER_JS, wide, threads, b64, rows, cols, reps])
        browser.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=40)
    args = ap.parse_args()
    w = matrix(args.rows, args.cols)
    gb = w.nbytes / 1e9
    print(f"Q4_K [{args.rows} x {args.cols}]: {w.nbytes / 2**20:.1f} MiB, {args.reps} reps each")
    rows = []
    for threads in (1, 2):
        ms = {wide: native_ms(w, args.rows, args.cols, wide, threads, args.reps) for wide in (False, True)}
        rows.append(("wasmtime", threads, ms[False], ms[True]))
    page = browser_ms(w, args.rows, args.cols, args.reps)
    for threads in (1, 2):
        rows.append(("Chromium", threads, page[False, threads]["ms"], page[True, threads]["ms"]))
    print("| runtime | threads | 32-bit ms | GB/s | 64-bit ms | GB/s | 64-bit / 32-bit speed |")
    print("|---|---|---|---|---|---|---|")
    for where, threads, ms32, ms64 in rows:
        print(f"| {where} | {threads} | {ms32:.3f} | {gb / ms32 * 1e3:.2f} | {ms64:.3f} | {gb / ms64 * 1e3:.2f} | {ms32 / ms64:.2f} |")


if __name__ == "__main__":
    main()
