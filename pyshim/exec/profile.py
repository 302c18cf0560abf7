"""Where a decode step's time goes, kernel by kernel, on any adapter.

Timestamp queries would give this directly, but SwiftShader and lavapipe do not offer them (and
Chromium rounds them). So each group of the step's dispatches (one shader family and weight type,
e.g. every Q4_K matvec) is submitted alone, `reps` times in one command buffer, and timed to a 4-byte
readback; the readback's own cost (an empty submit) is measured the same way and taken off. Running a
subset of a step reads whatever its inputs hold, which is harmless: nothing is read back but timing.

The groups' times add up to about the whole step; the difference is what separates the dispatches
when they run together (barriers, cache reuse), reported as `overlap_ms`.
"""

from __future__ import annotations

import time

from pyshim.exec.runner import Want
from pyshim.gpu.shaderc import ShaderKey

PROFILE_REPS = 5      # submissions of each group per measurement; the median of ROUNDS measurements is kept
PROFILE_ROUNDS = 3


def group_name(key: ShaderKey) -> str:
    """`matvec q4_k`, `matvec_i8 q4_0 experts`, `attention`, `attention combine`, ...: the family and, for
    weight kernels, the weight type (and whether they are a mixture's expert matvecs); decode attention's
    combine pass apart from the pass over the keys."""
    defines = dict(key.defines)
    weight = next((name[2:].lower() for name, _ in key.defines if name.startswith("W_")), None)
    name = f"{key.family} {weight}" if weight else key.family
    if "COMBINE" in defines:
        name += " combine"
    return name + " experts" if "EXPERTS" in defines else name


def shape_name(dispatch) -> str:
    """group_name, and for a matvec its rows x width and workgroups (`matvec_i8 q6_kg 1536x8960 /6`): which
    of a family's matrices the time goes to."""
    name = group_name(dispatch.key)
    if dispatch.key.family.startswith("matvec"):
        name += f" {int(dispatch.params[0])}x{int(dispatch.params[1])} /{dispatch.grid[0]}"
    return name


async def kernel_times(runner, *, reps: int = PROFILE_REPS, rounds: int = PROFILE_ROUNDS, program=None,
                       by_shape: bool = False) -> dict:
    """{"step_ms", "groups": {name: {"dispatches", "ms", "share"}}, "overlap_ms"} for the runner's greedy
    decode step (built if needed), or for a built greedy `program` (a batched decode step's). Times are per
    step, medians over `rounds`; `by_shape`: groups by shape_name instead of group_name."""
    program = program or await runner.program(1, Want.ARGMAX)
    device = runner.device
    sync = program.argmax

    async def per_run(dispatches) -> float:
        samples = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            device.submit(list(dispatches) * reps, label="profile")
            await device.read(sync, 4)
            samples.append((time.perf_counter() - t0) / reps)
        return sorted(samples)[len(samples) // 2]

    members: dict[str, list[int]] = {}
    for i, d in enumerate(program.dispatches):
        members.setdefault(shape_name(d) if by_shape else group_name(d.key), []).append(i)
    await per_run(program.ready)                          # warm-up: first submissions pay one-time costs
    for _ in range(3):
        base = await per_run([])                          # the readback alone
        step = max(0.0, await per_run(program.ready) - base)
        groups = {}
        for name, idx in members.items():
            ms = max(0.0, await per_run([program.ready[i] for i in idx]) - base) * 1e3
            groups[name] = {"dispatches": len(idx), "ms": ms}
        total = sum(g["ms"] for g in groups.values())
        if total > 0:
            break
        reps *= 4       # every group under the readback's noise (a tiny model, a busy machine): longer runs
    for g in groups.values():
        g["share"] = g["ms"] / total if total else 0.0
    ordered = dict(sorted(groups.items(), key=lambda kv: -kv[1]["ms"]))
    return {"step_ms": step * 1e3, "groups": ordered, "overlap_ms": total - step * 1e3}
