"""GPU benchmark (not a test): matvec per weight type and whole-model decode on the native adapter,
against the adapter's streaming roofline measured in the same run by a plain vec4 f32 read-and-reduce.

    .venv/bin/python tests/bench_gpu.py [--rows 2048] [--cols 2048] [--types Q4_K,Q8_0] [--models smollm2,gemma3]
                                        [--int8 auto|on|off|both] [--json]

Matvec rows: the f32 kernel the executor picks, and ("i8 <type>") the int8 route's matvec on a row
quantized beforehand (the quantize pass itself is its own row, once per activation format). Decode:
`--int8` picks the executor's route (auto: its default on this adapter; both: off, then on).

Efficiency = max(weight bytes/s ÷ roofline bytes/s, weight elements/s ÷ roofline f32 elements/s): on a
real GPU bytes bind; on a CPU adapter (lavapipe, SwiftShader) the arithmetic per element does.

Two clocks: wall time, and — for CPU adapters, whose "GPU" is worker threads of this very process —
process CPU time, which stays meaningful on a machine shared with other jobs (wall time there mostly
measures the neighbours). Kernel timings are the difference of two runs (2·reps and reps dispatches in
one command buffer, each ended by a 4-byte read), which cancels the per-submit overhead.
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

import i8_emulation  # noqa: E402
from gpu_helpers import random_weight  # noqa: E402
from pyshim.gpu import open_device  # noqa: E402
from pyshim.gpu.kernels import (I8_ACTIVATIONS, I8_BLOCKS, PARAMS, UNIFORM_X_BYTES, WEIGHT_TYPES, WG,  # noqa: E402
                                KernelCache, groups, matvec_grid, matvec_i8_key, matvec_key,
                                quantize_key, xq_row_words)
from pyshim.gpu.policy import KernelPolicy  # noqa: E402
from pyshim.gpu.shaderc import ShaderKey  # noqa: E402
from pyshim.plan.memory import estimate, per_token  # noqa: E402

ROOFLINE_BYTES = 128 << 20        # streamed by the roofline kernel (capped by the binding limit)
ROOFLINE_PER_THREAD = 256         # vec4s each invocation sums in the contiguous variant (4 KiB)
TRIALS = 3
DECODE_PROMPT = 16                # tokens before the timed decode steps
DECODE_STEPS = 16


def clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


async def timed(device, dispatches, probe, reps: int) -> tuple[float, float]:
    """(wall s, process CPU s) per run of a dispatch list."""
    async def one(count: int) -> tuple[float, float]:
        walls, cpus = [], []
        for _ in range(TRIALS):
            w0, c0 = clocks()
            device.submit(list(dispatches) * count)
            await device.read(probe, 4)
            w1, c1 = clocks()
            walls.append(w1 - w0)
            cpus.append(c1 - c0)
        return statistics.median(walls), statistics.median(cpus)

    (w2, c2), (w1, c1) = await one(2 * reps), await one(reps)
    return max(w2 - w1, 1e-9) / reps, max(c2 - c1, 1e-9) / reps


def rates(nbytes: int, elements: int, wall: float, cpu: float, roof: dict) -> dict:
    out = {"ms": wall * 1e3, "cpu_ms": cpu * 1e3}
    for clock, t in (("wall", wall), ("cpu", cpu)):
        gbs, gel = nbytes / t / 1e9, elements / t / 1e9
        out[f"{clock}_GBps"], out[f"{clock}_Gelem_s"] = gbs, gel
        out[f"{clock}_eff_pct"] = 100 * max(gbs / roof[f"{clock}_GBps"], gel / roof[f"{clock}_Gelem_s"])
    return out


async def roofline(device, kernels, reps: int) -> dict:
    limit = device.caps.limits["max_storage_buffer_binding_size"]
    nbytes = min(ROOFLINE_BYTES, limit // 16 * 16)
    n4 = nbytes // 16
    src = device.buffer(nbytes, label="stream")
    device.write(src, np.random.default_rng(0).standard_normal(nbytes // 4, dtype=np.float32))
    threads = groups(n4, ROOFLINE_PER_THREAD)
    out = device.buffer(threads * 4, label="stream_out")
    params = device.buffer(16, label="p", uniform=True)
    device.write(params, PARAMS["stream"].pack(n4=n4, per_thread=ROOFLINE_PER_THREAD))
    best = None
    for strided in (False, True):           # the faster access order is the adapter's roofline
        pipe = await kernels.get(ShaderKey.of("stream", WG=WG, STRIDED=strided))
        group = device.bind_group(pipe, [src, out, params])
        dispatch = [(pipe, group, (groups(threads), 1, 1))]
        await timed(device, dispatch, out, 1)                     # warm-up
        wall, cpu = await timed(device, dispatch, out, reps)
        if best is None or wall < best[0]:
            best = (wall, cpu)
    src.destroy()
    wall, cpu = best
    return {"bytes": nbytes, "wall_GBps": nbytes / wall / 1e9, "wall_Gelem_s": nbytes / 4 / wall / 1e9,
            "cpu_GBps": nbytes / cpu / 1e9, "cpu_Gelem_s": nbytes / 4 / cpu / 1e9}


async def bench_matvec(device, kernels, roof: dict, rows: int, cols: int, reps: int, only) -> dict:
    rng = np.random.default_rng(0)
    reduce = not device.caps.is_fallback           # the variant the executor picks for one-token steps
    x = device.buffer(max(cols * 4, UNIFORM_X_BYTES), label="x", also_uniform=True)
    device.write(x, rng.standard_normal(cols, dtype=np.float32))
    x_binding = x if reduce or cols > UNIFORM_X_BYTES // 4 else (x, 0, UNIFORM_X_BYTES)
    y = device.buffer(rows * 4, label="y")
    p = device.buffer(PARAMS["matvec"].nbytes, label="p", uniform=True)
    results = {}
    for qtype, (define, _, _) in WEIGHT_TYPES.items():
        if only and qtype.name not in only:
            continue
        raw = random_weight(qtype, rows, cols, rng)
        w = device.buffer(raw.nbytes, label="w")
        device.write(w, raw)
        device.write(p, PARAMS["matvec"].pack(m=rows, k=cols, n=1, row_bytes=raw.shape[1], w_off=0, x_off=0, y_off=0,
                                              bias_off=0, y_stride=rows))
        pipe = await kernels.get(matvec_key(qtype, reduce=reduce, uniform_x=isinstance(x_binding, tuple)))
        dispatch = [(pipe, device.bind_group(pipe, [w, x_binding, y, p]), matvec_grid(rows, 1, reduce))]
        await timed(device, dispatch, y, 1)                       # warm-up (compiles)
        wall, cpu = await timed(device, dispatch, y, reps)
        results[qtype.name] = rates(raw.nbytes, rows * cols, wall, cpu, roof)
        fmt = I8_ACTIVATIONS.get(qtype)
        if fmt is not None and not reduce:
            results[f"i8 {qtype.name}"] = await bench_matvec_i8(device, kernels, roof, w, raw, qtype, rows, cols, reps)
        w.destroy()
    if not reduce:
        for fmt, (per, _) in I8_BLOCKS.items():
            row_words = xq_row_words(cols, fmt)
            q = device.buffer(row_words * 4, label="xq")
            p = device.buffer(PARAMS["quantize"].nbytes, label="pq", uniform=True)
            device.write(p, PARAMS["quantize"].pack(k=cols, n=1, x_off=0, x_stride=cols, q_off=0, row_words=row_words))
            pipe = await kernels.get(quantize_key(fmt))
            dispatch = [(pipe, device.bind_group(pipe, [x, q, p]), (groups(cols // per), 1, 1))]
            await timed(device, dispatch, q, 1)
            wall, cpu = await timed(device, dispatch, q, reps)
            results[f"quantize {fmt}"] = rates(cols * 4, cols, wall, cpu, roof)
    return results


async def bench_matvec_i8(device, kernels, roof: dict, w, raw, qtype, rows: int, cols: int, reps: int) -> dict:
    """The int8 matvec as the executor binds it for one token (the quantized row as a uniform)."""
    fmt = I8_ACTIVATIONS[qtype]
    x = np.random.default_rng(1).standard_normal((1, cols), dtype=np.float32)
    words = i8_emulation.pack(*i8_emulation.quantize(x, fmt))
    xq = device.buffer(max(words.nbytes, UNIFORM_X_BYTES), label="xq", also_uniform=True)
    device.write(xq, words)
    uniform = words.nbytes <= UNIFORM_X_BYTES
    y = device.buffer(rows * 4, label="y")
    p = device.buffer(PARAMS["matvec_i8"].nbytes, label="p", uniform=True)
    device.write(p, PARAMS["matvec_i8"].pack(m=rows, k=cols, n=1, row_bytes=raw.shape[1], w_off=0, x_off=0, y_off=0,
                                             bias_off=0, y_stride=rows, pair_off=0, x_row_words=xq_row_words(cols, fmt)))
    r = KernelPolicy.for_device(device.caps).matvec_rows
    pipe = await kernels.get(matvec_i8_key(qtype, uniform_x=uniform, rows=r))
    dispatch = [(pipe, device.bind_group(pipe, [w, (xq, 0, UNIFORM_X_BYTES) if uniform else xq, y, p]),
                 matvec_grid(rows, 1, rows=r))]
    await timed(device, dispatch, y, 1)
    wall, cpu = await timed(device, dispatch, y, reps)
    return rates(raw.nbytes, rows * cols, wall, cpu, roof)


async def bench_decode(device, roof: dict, model: str, int8: bool | None = None) -> dict:
    """Greedy decode steps (argmax on the GPU, 4 bytes read back per token)."""
    from pyshim.exec.gpu_runner import load_gpu
    from pyshim.exec.runner import Step, Want
    from pyshim.plan.settings import RunSettings
    from pyshim.setup.catalog import resolve_model

    arithmetic = None if int8 is None else "int8" if int8 else "f32"
    runner = await load_gpu(resolve_model(model), settings=RunSettings(context=DECODE_PROMPT + DECODE_STEPS + 8, arithmetic=arithmetic),
                            device=device)

    async def greedy(ids, start):
        return (await runner.step(Step.of(ids, start, want=Want.ARGMAX)))[0].token

    prompt = list(range(100, 100 + DECODE_PROMPT))
    w0 = time.perf_counter()
    token = await greedy(prompt, 0)
    first = time.perf_counter() - w0                              # records and builds programs too
    w0, c0 = clocks()
    await greedy(prompt, 0)                          # the prefill again, programs built
    w1, c1 = clocks()
    prefill_wall, prefill_cpu = w1 - w0, c1 - c0
    await greedy([token], DECODE_PROMPT)             # builds the n=1 program
    pos = DECODE_PROMPT + 1
    w0, c0 = clocks()
    host = 0.0
    for _ in range(DECODE_STEPS):
        h0 = time.perf_counter()
        program = await runner.program(1, Want.ARGMAX)
        device.write(runner.ops.tokens_buf, np.array([token], dtype=np.uint32))
        device.write(runner.ops.positions_buf, np.array([pos], dtype=np.uint32))
        device.submit(program.ready)
        host += time.perf_counter() - h0
        token = int(np.frombuffer(await device.read(program.argmax, 4), dtype=np.uint32)[0])
        pos += 1
    w1, c1 = clocks()
    wall, cpu = (w1 - w0) / DECODE_STEPS, (c1 - c0) / DECODE_STEPS
    elements = per_token(runner.spec, runner.header.tensors).active_params    # of a mixture: the routed experts
    out = rates(runner.weight_bytes, elements, wall, cpu, roof)
    out.update({"int8": runner.ops.policy.int8, "prefill_tokens": DECODE_PROMPT, "prefill_tok_s": DECODE_PROMPT / prefill_wall,
                "prefill_tok_per_cpu_s": DECODE_PROMPT / prefill_cpu, "decode_tok_s": 1 / wall, "decode_tok_per_cpu_s": 1 / cpu, "weight_bytes": runner.weight_bytes,
                "weight_elements": elements, "dispatches": len(program.ready), "host_ms": host / DECODE_STEPS * 1e3,
                "host_share_pct": 100 * host / DECODE_STEPS / wall, "first_call_s": first,
                "memory_MB": {k: v / 1e6 for k, v in runner.ops.memory().items()},
                "planned_MB": estimate(runner.spec, runner.header.tensors, context=runner.n_ctx).total_bytes / 1e6})
    return out


async def main_async(args) -> dict:
    device = await open_device()
    kernels = KernelCache(device)
    roof = await roofline(device, kernels, max(1, args.reps // 2))
    report = {"adapter": device.caps.summary(), "roofline": roof, "shape": [args.rows, args.cols]}
    only = [t for t in args.types.split(",") if t]
    report["matvec"] = await bench_matvec(device, kernels, roof, args.rows, args.cols, args.reps, only)
    choices = {"auto": [None], "on": [True], "off": [False], "both": [False, True]}[args.int8]
    report["decode"] = {f"{m} int8={c}": await bench_decode(device, roof, m, c)
                        for m in args.models.split(",") if m for c in choices}
    device.destroy()
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--cols", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--types", default="", help="comma-separated subset of weight types, e.g. Q8_0,Q4_K")
    ap.add_argument("--models", default="", help="comma-separated models to decode with, e.g. smollm2,gemma3")
    ap.add_argument("--int8", default="auto", choices=["auto", "on", "off", "both"])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    r = asyncio.run(main_async(args))
    if args.json:
        print(json.dumps(r, indent=1))
        return 0
    roof = r["roofline"]
    print(f"adapter: {r['adapter']}")
    print(f"roofline (vec4 f32 read+reduce, {roof['bytes'] >> 20} MiB): wall {roof['wall_GBps']:.2f} GB/s "
          f"({roof['wall_Gelem_s']:.3f} G f32/s); per CPU-second {roof['cpu_GBps']:.2f} GB ({roof['cpu_Gelem_s']:.3f} G f32)")
    print(f"matvec {r['shape'][0]}x{r['shape'][1]}, 1 token (the executor's decode variant):")
    print(f"{'type':13} {'ms':>7} {'GB/s':>6} {'Gel/s':>6} {'eff%':>5} | {'cpu ms':>7} {'GB/cs':>6} {'Gel/cs':>6} {'eff%':>5}")
    for name, t in r["matvec"].items():
        print(f"{name:13} {t['ms']:7.2f} {t['wall_GBps']:6.2f} {t['wall_Gelem_s']:6.3f} {t['wall_eff_pct']:5.0f} | "
              f"{t['cpu_ms']:7.2f} {t['cpu_GBps']:6.2f} {t['cpu_Gelem_s']:6.3f} {t['cpu_eff_pct']:5.0f}")
    for model, d in r["decode"].items():
        print(f"prefill {model} ({d['prefill_tokens']} tokens): {d['prefill_tok_s']:.1f} tok/s wall, "
              f"{d['prefill_tok_per_cpu_s']:.1f} tok per CPU-s")
        print(f"decode {model}: {d['decode_tok_s']:.1f} tok/s wall ({d['ms']:.0f} ms/token, eff {d['wall_eff_pct']:.0f}%), "
              f"{d['decode_tok_per_cpu_s']:.1f} tok per CPU-s (eff {d['cpu_eff_pct']:.0f}%); "
              f"{d['weight_bytes'] / 1e6:.1f} MB and {d['weight_elements'] / 1e6:.1f} M weights per token; "
              f"{d['dispatches']} dispatches, host {d['host_ms']:.2f} ms/step ({d['host_share_pct']:.1f}%); "
              "device memory MB: " + ", ".join(f"{k} {v:.1f}" for k, v in d["memory_MB"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
