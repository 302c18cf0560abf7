"""Benchmark (not a test): greedy decode speed of one model under each kernel variant, on the native adapter.

    .venv/bin/python tests/bench_gpu_variants.py [--model smollm2] [--steps 16] [--variants barrier_free,reduce,subgroup]

Variants (all with the f32 arithmetic, int8=False): `barrier_free` (what CPU adapters get: matvec, rmsnorm
and argmax without barriers), `reduce` (real GPUs without subgroups: the workgroup-reduction matvec and the
workgroup-per-row rmsnorm, shared-memory trees), `subgroup` (real GPUs with subgroups: the same summed by
subgroupAdd, and the subgroup argmax). On a CPU adapter such as lavapipe the numbers say nothing about real
GPUs: there a workgroup is a loop over SIMD lanes and every barrier a synchronisation of that loop. Two
clocks: wall, and process CPU time (lavapipe's workers are threads of this process; steadier on a shared
machine).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

import numpy as np

VARIANTS = {"barrier_free": dict(reduce=False), "reduce": dict(reduce=True, subgroup=False), "subgroup": dict(subgroup=True)}
PROMPT = 16


async def decode_rate(device, model: str, steps: int, options: dict) -> tuple[float, float]:
    """(tokens per wall second, tokens per process-CPU second) of greedy one-token steps."""
    from pyshim.setup.catalog import resolve_model
    from pyshim.exec.gpu_runner import load_gpu
    from pyshim.exec.runner import Step, Want
    from pyshim.plan.settings import RunSettings

    runner = await load_gpu(resolve_model(model), settings=RunSettings(context=PROMPT + steps + 8, arithmetic="f32"), device=device,
                            policy=options)

    async def greedy(ids, start):
        return (await runner.step(Step.of(ids, start, want=Want.ARGMAX)))[0].token

    token = await greedy(list(range(100, 100 + PROMPT)), 0)
    token = await greedy([token], PROMPT)              # builds the one-token program
    w0, c0 = time.perf_counter(), time.process_time()
    for pos in range(PROMPT + 1, PROMPT + 1 + steps):
        token = await greedy([token], pos)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    for buf in [b for w in runner.ops._bound.values() for b, _, _ in w.parts]:
        device.release(buf)
    return steps / wall, steps / cpu


async def main_async(args) -> None:
    from pyshim.gpu import open_device

    device = await open_device()
    print(f"adapter: {device.caps.summary()}; model {args.model}, {args.steps} greedy decode steps, f32 arithmetic")
    for name in args.variants.split(","):
        rates = [await decode_rate(device, args.model, args.steps, VARIANTS[name]) for _ in range(args.trials)]
        wall, cpu = np.median([r[0] for r in rates]), np.median([r[1] for r in rates])
        print(f"{name:13} {wall:6.2f} tok/s wall  {cpu:6.2f} tok per CPU-s  (median of {args.trials})")
    device.destroy()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    asyncio.run(main_async(ap.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
