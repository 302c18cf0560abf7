"""Matvec kernels in headless Chromium (SwiftShader here): ms, GB/s and % of the adapter's streaming
roofline per weight type and variant, driven from plain JS so only the kernels are timed.

    .venv/bin/python playwright/bench_kernels.py [--rows 2048] [--cols 2048] [--types Q4_0,Q8_0]

Python expands the WGSL and makes the random GGUF blocks; the page creates the buffers, compiles, and
times (T(2r) − T(r)) / r with T the median of TRIALS submits awaited with onSubmittedWorkDone().
Variants: uniform x (the executor's CPU-adapter decode kernel) with 2 or 4 rows, storage x with 1/2/4
rows, REDUCE.
Weights go to the page once per type (base64 through Playwright: sending a copy per variant, hundreds
of MB, closed the page).
"""

from __future__ import annotations

import argparse
import base64
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "playwright"))

import harness  # noqa: E402
from gpu_helpers import random_weight  # noqa: E402
from pyshim.gpu.kernels import (PARAMS, REDUCE_ROWS, REDUCE_WG, UNIFORM_X_BYTES, UNIFORM_X_VEC4, WEIGHT_TYPES,  # noqa: E402
                                WG, groups, matvec_grid)
from pyshim.gpu.shaderc import Preprocessor, ShaderKey  # noqa: E402

ROOFLINE_BYTES = 64 << 20
ROOFLINE_PER_THREAD = 256
REPS = 2
TRIALS = 2

BENCH_JS = """async ({cases, blobs, reps, trials}) => {
  const adapter = await navigator.gpu.requestAdapter();
  const device = await adapter.requestDevice({requiredLimits: {
    maxStorageBufferBindingSize: adapter.limits.maxStorageBufferBindingSize,
    maxBufferSize: adapter.limits.maxBufferSize}});
  const U = GPUBufferUsage;
  const bytes = (b64) => Uint8Array.from(atob(b64), c => c.charCodeAt(0));
  const make = (size, usage) => device.createBuffer({size: Math.max(16, Math.ceil(size / 16) * 16), usage});
  const out = [];
  const decoded = {};
  for (const c of cases) {
    const module = device.createShaderModule({code: c.code});
    const pipeline = await device.createComputePipelineAsync({layout: "auto", compute: {module, entryPoint: "main"}});
    const bufs = c.inputs.map(inp => {
      const data = inp.blob ? (decoded[inp.blob] ??= bytes(blobs[inp.blob])) : null;
      const size = data ? data.length : inp.size;
      const b = make(Math.max(size, inp.min || 0), U.STORAGE | U.COPY_DST | (inp.uniform ? U.UNIFORM : 0));
      if (data) { const p = new Uint8Array(Math.ceil(data.length / 4) * 4); p.set(data); device.queue.writeBuffer(b, 0, p); }
      else if (inp.fill) { device.queue.writeBuffer(b, 0, new Float32Array(size / 4).fill(1.0)); }
      return b;
    });
    const params = make(bytes(c.params).length, U.UNIFORM | U.COPY_DST);
    device.queue.writeBuffer(params, 0, bytes(c.params));
    const group = device.createBindGroup({layout: pipeline.getBindGroupLayout(0),
      entries: [...bufs, params].map((buffer, binding) => ({binding, resource: {buffer, size: c.sizes[binding] || undefined}}))});
    const run = async (count) => {
      const enc = device.createCommandEncoder(); const pass = enc.beginComputePass();
      pass.setPipeline(pipeline); pass.setBindGroup(0, group);
      for (let i = 0; i < count; i++) pass.dispatchWorkgroups(...c.grid);
      pass.end(); device.queue.submit([enc.finish()]); await device.queue.onSubmittedWorkDone();
    };
    const median = async (count) => {
      const t = [];
      for (let i = 0; i < trials; i++) { const t0 = performance.now(); await run(count); t.push(performance.now() - t0); }
      t.sort((a, b) => a - b); return t[Math.floor(t.length / 2)];
    };
    await run(1);
    const t2 = await median(2 * reps), t1 = await median(reps);
    out.push({name: c.name, ms: Math.max(t2 - t1, 1e-6) / reps, ms_plain: t2 / (2 * reps)});
    [...bufs, params].forEach(b => b.destroy());
  }
  device.destroy();
  return {adapter: adapter.info.architecture || adapter.info.vendor, out};
}"""


def b64(a) -> str:
    return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode()


def build_cases(rows: int, cols: int, types: list[str]) -> tuple[list[dict], dict, dict]:
    """Cases, weight bytes per type, and the base64 inputs they share (each sent once)."""
    pre = Preprocessor()
    cases, sizes, blobs = [], {}, {}
    n4 = ROOFLINE_BYTES // 16
    threads = groups(n4, ROOFLINE_PER_THREAD)
    for strided in (False, True):
        cases.append({"name": f"roofline{' strided' if strided else ''}", "code": pre.build(ShaderKey.of("stream", WG=WG, STRIDED=strided)),
                      "inputs": [{"size": ROOFLINE_BYTES, "fill": True}, {"size": threads * 4}], "sizes": [],
                      "params": b64(PARAMS["stream"].pack(n4=n4, per_thread=ROOFLINE_PER_THREAD)), "grid": [groups(threads), 1, 1]})
    rng = np.random.default_rng(0)
    blobs["x"] = b64(rng.standard_normal(cols, dtype=np.float32))
    for qtype, (define, _, _) in WEIGHT_TYPES.items():
        if types and qtype.name not in types:
            continue
        raw = random_weight(qtype, rows, cols, rng)
        sizes[qtype.name] = raw.nbytes
        blobs[qtype.name] = b64(raw)
        params = b64(PARAMS["matvec"].pack(m=rows, k=cols, n=1, row_bytes=raw.shape[1], w_off=0, x_off=0, y_off=0,
                                           bias_off=0, y_stride=rows))
        variants = [(f"uniform-x rows{r}", ShaderKey.of("matvec", **{define: True}, WG=WG, ROWS=r, UNIFORM_X=True, X_VEC4=UNIFORM_X_VEC4),
                     (groups(rows, WG * r), 1, 1)) for r in (2, 4)]
        variants += [(f"rows{r}", ShaderKey.of("matvec", **{define: True}, WG=WG, ROWS=r), (groups(rows, WG * r), 1, 1)) for r in (1, 2, 4)]
        variants.append(("reduce", ShaderKey.of("matvec", **{define: True}, WG=REDUCE_WG, ROWS=REDUCE_ROWS, REDUCE=True),
                         matvec_grid(rows, 1, reduce=True)))
        for name, key, grid in variants:
            uniform = "uniform" in name
            cases.append({"name": f"{qtype.name} {name}", "code": pre.build(key), "params": params, "grid": list(grid),
                          "inputs": [{"blob": qtype.name}, {"blob": "x", "uniform": uniform, "min": UNIFORM_X_BYTES if uniform else 0},
                                     {"size": rows * 4}],
                          "sizes": [0, UNIFORM_X_BYTES if uniform else 0]})
    return cases, sizes, blobs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--cols", type=int, default=2048)
    ap.add_argument("--types", default="")
    args = ap.parse_args()
    cases, sizes, blobs = build_cases(args.rows, args.cols, [t for t in args.types.split(",") if t])
    from playwright.sync_api import sync_playwright

    with harness.DevServer() as server, sync_playwright() as p:
        browser = harness.launch_chromium(p)
        page, _ = harness.open_page(browser.new_context(), server.url + "/manifest.webmanifest")
        harness.require_adapter(page)
        page.set_default_timeout(600_000)
        result = page.evaluate(BENCH_JS, {"cases": cases, "blobs": blobs, "reps": REPS, "trials": TRIALS})
        browser.close()
    rows = {r["name"]: r for r in result["out"]}
    roof_ms = min(rows["roofline"]["ms"], rows["roofline strided"]["ms"])
    roof_gbs = ROOFLINE_BYTES / roof_ms / 1e6
    roof_gel = roof_gbs / 4
    print(f"adapter: {result['adapter']}; roofline {roof_gbs:.2f} GB/s = {roof_gel:.3f} G f32/s "
          f"(contiguous {ROOFLINE_BYTES / rows['roofline']['ms'] / 1e6:.2f}, strided {ROOFLINE_BYTES / rows['roofline strided']['ms'] / 1e6:.2f})")
    print(f"matvec {args.rows}x{args.cols}, 1 token: ms, GB/s, efficiency % = max(bytes, elements) vs roofline")
    for name, r in rows.items():
        if name.startswith("roofline"):
            continue
        qtype = name.split()[0]
        gbs = sizes[qtype] / r["ms"] / 1e6
        gel = args.rows * args.cols / r["ms"] / 1e6
        print(f"{name:22} {r['ms']:8.2f} ms {gbs:6.2f} GB/s {gel:6.3f} Gel/s  eff {100 * max(gbs / roof_gbs, gel / roof_gel):5.0f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
