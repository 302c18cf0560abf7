"""Where a native decode step's time goes, kernel family by family (pyshim.exec.profile.kernel_times), on
the adapter wgpu opens: `python playwright/profile_decode.py MODEL [--context N] [--budget-mb MB] [--policy JSON]
[--shapes]` (--shapes: each matvec shape apart, e.g. a model's ffn_down from its attention output). Prints
the kernel policy, then one JSON line {"model", "adapter", "policy", "step_ms", "groups", "overlap_ms"}.
What the bench's decode tok/s cannot say: which kernels a real GPU spends its step on."""

from __future__ import annotations

import argparse
import asyncio
import json

from pyshim.exec.gpu_runner import load_gpu
from pyshim.exec.profile import kernel_times
from pyshim.exec.runner import Step, Want
from pyshim.plan.settings import RunSettings
from pyshim.setup.catalog import resolve_model

PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]


async def profile(model: str, context: int, policy: dict | None, budget_mb: float | None, shapes: bool = False) -> dict:
    budget = None if budget_mb is None else int(budget_mb * 1e6)
    runner = await load_gpu(resolve_model(model), settings=RunSettings(context=context, kv_type="f32", budget_bytes=budget),
                            policy=policy)
    try:
        await runner.prepare()
        await runner.step(Step.of(PROMPT, want=Want.ARGMAX))
        times = await kernel_times(runner, by_shape=shapes)
        return {"model": model, "adapter": runner.device.caps.summary(), "policy": runner.policy.as_dict(), **times}
    finally:
        runner.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--budget-mb", type=float, default=None, help="GPU memory to plan for (default pyshim's 4 GiB)")
    parser.add_argument("--policy", type=json.loads, default=None, help='kernel policy overrides, e.g. {"f16": false}')
    parser.add_argument("--shapes", action="store_true", help="time each matvec shape apart (rows x width /workgroups)")
    args = parser.parse_args()
    out = asyncio.run(profile(args.model, args.context, args.policy, args.budget_mb, args.shapes))
    print(f"{out['model']} on {out['adapter']}: step {out['step_ms']:.3f} ms (overlap {out['overlap_ms']:.3f})")
    for name, g in out["groups"].items():
        print(f"  {name:40s} {g['dispatches']:4d} dispatches {g['ms']:8.3f} ms {100 * g['share']:5.1f}%")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
