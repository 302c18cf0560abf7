"""Matvec kernels in headless Chromium (SwiftShader here): ms, GB/s and % of the adapter's streaming
roofline per weight type and variant, driven from plain JS so only the kernels are timed.

    .venv/bin/python playwright/bench_kernels.py [--rows 2048] [--cols 2048] [--types Q4_0,Q8_0]

Python expands the WGSL and makes the random GGUF blocks; the page creates the buffers, compiles, and
times (T(2r) − T(r)) / r with T the median of TRIALS submits awaited with onSubmittedWorkDone().
Variants: uniform x (the executor's CPU-adapter decode kernel) with 2 or 4 rows, storage x with 1/2/4
rows, REDUCE; and the int8 route ("i8 ...": matvec_i8 on x quantized in NumPy, uniform with 2 or 4 rows,
storage with 4; Q8_0 repacked as the executor does at load; the quantize pass itself is timed as
"quantize <format>"). `--variants` keeps the cases
whose names contain one of its comma-separated words.
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
import i8_emulation  # noqa: E402
from gpu_helpers import random_weight  # noqa: E402
from pyshim.gpu.kernels import (GROUPED_TYPES, I8_ACTIVATIONS, I8_BLOCKS, PARAMS, REDUCE_ROWS, REDUCE_WG, UNIFORM_X_BYTES,  # noqa: E402
                                UNIFORM_X_VEC4, WEIGHT_TYPES, WG, groups, matvec_grid, matvec_i8_key, quantize_key,
                                xq_row_words)
from pyshim.gpu.shaderc import Preprocessor, ShaderKey  # noqa: E402

ROOFLINE_BYTES = 64 << 20
ROOFLINE_PER_THREAD = 256
REPS = 6
TRIALS = 3

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
      const b = make(Math.max(size, inp.min || 0), U.STORAGE | U.COPY_DST | U.COPY_SRC | (inp.uniform ? U.UNIFORM : 0));
      if (data) { const p = new Uint8Array(Math.ceil(data.length / 4) * 4); p.set(data); device.queue.writeBuffer(b, 0, p); }
      else if (inp.fill) { device.queue.writeBuffer(b, 0, new Float32Array(size / 4).fill(1.0)); }
      return b;
    });
    const params = make(bytes(c.params).length, U.UNIFORM | U.COPY_DST);
    device.queue.writeBuffer(params, 0, bytes(c.params));
    // copies > 1: that many copies of the weights (binding 0), the dispatches taking them in turn, so that
    // together they outgrow the CPU's last-level cache as a whole model's weights do
    const copies = c.inputs[0].blob && !c.name.startsWith("roofline") ? Math.max(1, c.copies || 1) : 1;
    for (let k = 1; k < copies; k++) {
      const b = make(bufs[0].size, U.STORAGE | U.COPY_DST | U.COPY_SRC);
      const enc = device.createCommandEncoder(); enc.copyBufferToBuffer(bufs[0], 0, b, 0, bufs[0].size);
      device.queue.submit([enc.finish()]); bufs.push(b);
    }
    const binds = [...Array(copies).keys()].map(k => device.createBindGroup({layout: pipeline.getBindGroupLayout(0),
      entries: [k ? bufs[bufs.length - copies + k] : bufs[0], ...bufs.slice(1, c.inputs.length), params].map(
        (buffer, binding) => ({binding, resource: {buffer, size: c.sizes[binding] || undefined}}))}));
    const run = async (count) => {
      const enc = device.createCommandEncoder(); const pass = enc.beginComputePass();
      pass.setPipeline(pipeline);
      for (let i = 0; i < count; i++) { pass.setBindGroup(0, binds[i % copies]); pass.dispatchWorkgroups(...c.grid); }
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


def build_cases(rows: int, cols: int, types: list[str], only: list[str]) -> tuple[list[dict], dict, dict]:
    """Cases, weight bytes per type, and the base64 inputs they share (each sent once)."""
    pre = Preprocessor()
    cases, sizes, blobs = [], {}, {}
    n4 = ROOFLINE_BYTES // 16
    threads = groups(n4, ROOFLINE_PER_THREAD)
    rng = np.random.default_rng(0)
    blobs["acts"] = b64(rng.integers(-127, 128, 256, dtype=np.int8))
    # the streaming probes bench_roofline measures: f32, and the int8 route's int8 and 4-bit elements
    for element in ("", "i8", "i4"):
        for strided in (False, True):
            inputs = [{"size": ROOFLINE_BYTES, "fill": True}] + ([{"blob": "acts", "uniform": True}] if element else [])
            cases.append({"name": f"roofline{' strided' if strided else ''}{' ' + element if element else ''}",
                          "code": pre.build(ShaderKey.of("stream", WG=WG, STRIDED=strided, I8=element == "i8", I4=element == "i4")),
                          "inputs": inputs + [{"size": threads * 4}], "sizes": [],
                          "params": b64(PARAMS["stream"].pack(n4=n4, per_thread=ROOFLINE_PER_THREAD)), "grid": [groups(threads), 1, 1]})
    x = rng.standard_normal((1, cols), dtype=np.float32)
    blobs["x"] = b64(x)
    for fmt in [f for f in I8_BLOCKS if cols % I8_BLOCKS[f][0] == 0]:
        blobs[f"xq_{fmt}"] = b64(i8_emulation.pack(*i8_emulation.quantize(x, fmt)))
        per = I8_BLOCKS[fmt][0]
        row_words = xq_row_words(cols, fmt)
        cases.append({"name": f"quantize {fmt}", "code": pre.build(quantize_key(fmt)), "sizes": [],
                      "inputs": [{"blob": "x"}, {"size": row_words * 4}], "grid": [groups(cols // per), 1, 1],
                      "params": b64(PARAMS["quantize"].pack(k=cols, n=1, x_off=0, x_stride=cols, q_off=0, row_words=row_words))})
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
        x_blob = {name: "x" for name, _, _ in variants}
        fmt = I8_ACTIVATIONS.get(qtype)
        if fmt is not None and f"xq_{fmt}" in blobs:
            params_i8 = b64(PARAMS["matvec_i8"].pack(m=rows, k=cols, n=1, row_bytes=raw.shape[1], w_off=0, x_off=0, y_off=0,
                                                     bias_off=0, y_stride=rows, pair_off=0, x_row_words=xq_row_words(cols, fmt)))
            for r, uniform in ((2, True), (4, True), (4, False)):
                name = f"i8 {'uniform-x ' if uniform else ''}rows{r}"
                variants.append((name, matvec_i8_key(qtype, uniform_x=uniform, rows=r), (groups(rows, WG * r), 1, 1)))
                x_blob[name] = f"xq_{fmt}"
            # the fused gate-and-up pass: the same matrix read as gate's rows / 2 rows, then up's
            params_glu = b64(PARAMS["matvec_i8"].pack(m=rows // 2, k=cols, n=1, row_bytes=raw.shape[1], w_off=0, x_off=0,
                                                      y_off=0, bias_off=0, y_stride=rows // 2, pair_off=0, x_row_words=xq_row_words(cols, fmt)))
            for r in (2, 4):
                variants.append((f"i8 glu uniform-x rows{r}", matvec_i8_key(qtype, uniform_x=True, rows=r, glu="silu"),
                                 (groups(rows // 2, WG * r), 1, 1)))
                x_blob[f"i8 glu uniform-x rows{r}"] = f"xq_{fmt}"
            if qtype in GROUPED_TYPES:      # matvec_i8 reads these in the layout the executor repacks them to
                blobs[f"{qtype.name} grouped"] = b64(i8_emulation.grouped(raw, qtype))
        for name, key, grid in variants:
            if only and not any(word in f"{qtype.name} {name}" for word in only):
                continue
            uniform = "uniform" in name
            cases.append({"name": f"{qtype.name} {name}", "code": pre.build(key), "grid": list(grid),
                          "params": params_glu if "glu" in name else params_i8 if name.startswith("i8") else params,
                          "inputs": [{"blob": f"{qtype.name} grouped" if name.startswith("i8") and qtype in GROUPED_TYPES else qtype.name},
                                     {"blob": x_blob[name], "uniform": uniform, "min": UNIFORM_X_BYTES if uniform else 0},
                                     {"size": rows * 4}],
                          "sizes": [0, UNIFORM_X_BYTES if uniform else 0]})
    return cases, sizes, blobs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--cols", type=int, default=2048)
    ap.add_argument("--types", default="")
    ap.add_argument("--variants", default="", help="e.g. 'uniform-x rows4' or 'i8,rows4'")
    ap.add_argument("--copies", type=int, default=1, help="copies of each weight, dispatched in turn (several: past the CPU's cache, as a model)")
    ap.add_argument("--trials", type=int, default=TRIALS, help="submits per timing, the median kept (more: steadier on a busy machine)")
    args = ap.parse_args()
    cases, sizes, blobs = build_cases(args.rows, args.cols, [t for t in args.types.split(",") if t],
                                      [v for v in args.variants.split(",") if v])
    for case in cases:
        case["copies"] = args.copies
    from playwright.sync_api import sync_playwright

    with harness.DevServer() as server, sync_playwright() as p:
        browser = harness.launch_chromium(p)
        page, _ = harness.open_page(browser.new_context(), server.url + "/manifest.webmanifest")
        harness.require_adapter(page)
        page.set_default_timeout(600_000)
        result = page.evaluate(BENCH_JS, {"cases": cases, "blobs": blobs, "reps": REPS, "trials": args.trials})
        browser.close()
    rows = {r["name"]: r for r in result["out"]}
    probes = {name: r["ms"] for name, r in rows.items() if name.startswith("roofline")}
    bytes_per_elem = {"i8": 1.0, "i4": 0.5}
    roof_gbs = ROOFLINE_BYTES / min(probes.values()) / 1e6
    roof_gel = max(ROOFLINE_BYTES / bytes_per_elem.get(name.split()[-1], 4.0) / ms / 1e6 for name, ms in probes.items())
    print(f"adapter: {result['adapter']}; roofline {roof_gbs:.2f} GB/s, {roof_gel:.3f} G elements/s (the best of "
          + ", ".join(f"{name[9:] or 'contiguous'} {ROOFLINE_BYTES / ms / 1e6:.2f} GB/s" for name, ms in probes.items()) + ")")
    print(f"matvec {args.rows}x{args.cols}, 1 token: ms, GB/s, efficiency % = max(bytes, elements) vs roofline")
    for name, r in rows.items():
        if name.startswith("roofline"):
            continue
        if name.startswith("quantize"):
            print(f"{name:22} {r['ms']:8.2f} ms")
            continue
        qtype = name.split()[0]
        gbs = sizes[qtype] / r["ms"] / 1e6
        gel = args.rows * args.cols / r["ms"] / 1e6
        # (ms_plain: the whole submit of 2 reps over its dispatches, overheads in; steadier on a busy machine)
        print(f"{name:22} {r['ms']:8.2f} ms {gbs:6.2f} GB/s {gel:6.3f} Gel/s  eff {100 * max(gbs / roof_gbs, gel / roof_gel):5.0f}%"
              f"  (plain {r['ms_plain']:.2f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
