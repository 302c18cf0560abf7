"""Kernel benchmark (not a test): matvec GB/s per weight type on the native adapter, against the
adapter's streaming roofline measured in the same run by a plain vec4 f32 read-and-reduce kernel.

    .venv/bin/python tests/bench_gpu.py [--rows 2048] [--cols 2048] [--reps 10] [--json]

Efficiency = max(weight bytes/s ÷ roofline bytes/s, weight elements/s ÷ roofline f32 elements/s): on a
real GPU bytes bind; on a CPU adapter (lavapipe, SwiftShader) the arithmetic per element does.
Each timing is the difference of two medians (submits of 2·reps and reps dispatches in one command
buffer, each ended by a 4-byte read), which cancels the per-submit overhead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_helpers import random_weight  # noqa: E402
from pyshim.gpu import open_device  # noqa: E402
from pyshim.gpu.kernels import PARAMS, WEIGHT_TYPES, WG, KernelCache, groups  # noqa: E402
from pyshim.gpu.shaderc import ShaderKey  # noqa: E402

ROOFLINE_BYTES = 128 << 20        # streamed by the roofline kernel (capped by the binding limit)
ROOFLINE_PER_THREAD = 256         # vec4s each invocation sums (4 KiB contiguous)
TRIALS = 5


async def timed(device, dispatches, probe, reps: int) -> float:
    """Seconds per run of a dispatch list: (T(2·reps) − T(reps)) / reps, each T the median of TRIALS
    submits ended by a 4-byte read. The difference cancels the submit-and-wait overhead."""
    async def one(count: int) -> float:
        samples = []
        for _ in range(TRIALS):
            t0 = time.perf_counter()
            device.submit(list(dispatches) * count)
            await device.read(probe, 4)
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples)

    return max(await one(2 * reps) - await one(reps), 1e-9) / reps


async def bench(rows: int, cols: int, reps: int, only: list[str] = ()) -> dict:
    device = await open_device()
    kernels = KernelCache(device)
    rng = np.random.default_rng(0)
    probe = device.buffer(16, label="probe")

    # roofline: one binding of up to ROOFLINE_BYTES
    limit = device.caps.limits["max_storage_buffer_binding_size"]
    chunk = min(ROOFLINE_BYTES, limit // 16 * 16)
    n4 = chunk // 16
    src = device.buffer(chunk, label="stream")
    device.write(src, rng.standard_normal(chunk // 4, dtype=np.float32))
    threads = groups(n4, ROOFLINE_PER_THREAD)
    out = device.buffer(threads * 4, label="stream_out")
    params = device.buffer(16, label="p", uniform=True)
    device.write(params, PARAMS["stream"].pack(n4=n4, per_thread=ROOFLINE_PER_THREAD))
    times = []
    for strided in (False, True):
        pipe = await kernels.get(ShaderKey.of("stream", WG=WG, STRIDED=strided))
        group = device.bind_group(pipe, [src, out, params])
        await timed(device, [(pipe, group, (groups(threads), 1, 1))], out, 1)    # warm-up
        t = await timed(device, [(pipe, group, (groups(threads), 1, 1))], out, max(1, reps // 2))
        times.append(t)
    t = min(times)
    roof_gbs = chunk / t / 1e9
    roof_elems = chunk / 4 / t / 1e9
    report = {"adapter": device.caps.summary(), "roofline_GBps": roof_gbs, "roofline_Gelem_s": roof_elems,
              "shape": [rows, cols], "types": {}}

    x = device.buffer(cols * 4, label="x")
    device.write(x, rng.standard_normal(cols, dtype=np.float32))
    y = device.buffer(rows * 4, label="y")
    for qtype, (define, _, _) in WEIGHT_TYPES.items():
        if only and qtype.name not in only:
            continue
        raw = random_weight(qtype, rows, cols, rng)
        w = device.buffer(raw.nbytes, label="w")
        device.write(w, raw)
        p = device.buffer(PARAMS["matvec"].nbytes, label="p", uniform=True)
        device.write(p, PARAMS["matvec"].pack(m=rows, k=cols, n=1, row_bytes=raw.shape[1], w_off=0, x_off=0, y_off=0, bias_off=0, y_stride=rows))
        pipe = await kernels.get(ShaderKey.of("matvec", **{define: True}, WG=WG))
        group = device.bind_group(pipe, [w, x, y, p])
        await timed(device, [(pipe, group, (groups(rows), 1, 1))], y, 1)         # warm-up (compiles)
        t = await timed(device, [(pipe, group, (groups(rows), 1, 1))], y, reps)
        gbs = raw.nbytes / t / 1e9
        gel = rows * cols / t / 1e9
        report["types"][qtype.name] = {
            "ms": t * 1e3, "GBps": gbs, "Gelem_s": gel,
            "pct_bytes": 100 * gbs / roof_gbs, "pct_elems": 100 * gel / roof_elems,
            "efficiency_pct": 100 * max(gbs / roof_gbs, gel / roof_elems),
        }
        w.destroy()
    device.destroy()
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--cols", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--types", default="", help="comma-separated subset, e.g. Q8_0,Q4_1")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    r = asyncio.run(bench(args.rows, args.cols, args.reps, [t for t in args.types.split(",") if t]))
    if args.json:
        print(json.dumps(r, indent=1))
        return 0
    print(f"adapter: {r['adapter']}")
    print(f"roofline (vec4 f32 read+reduce): {r['roofline_GBps']:.2f} GB/s = {r['roofline_Gelem_s']:.3f} G f32/s")
    print(f"matvec {r['shape'][0]}x{r['shape'][1]}, 1 token:")
    print(f"{'type':6} {'ms':>8} {'GB/s':>7} {'Gelem/s':>8} {'%bytes':>7} {'%elems':>7} {'eff%':>6}")
    for name, t in r["types"].items():
        print(f"{name:6} {t['ms']:8.2f} {t['GBps']:7.2f} {t['Gelem_s']:8.3f} {t['pct_bytes']:7.1f} {t['pct_elems']:7.1f} {t['efficiency_pct']:6.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
