"""Per-kernel decode time (pyshim.exec.profile): every dispatch of the step is in exactly one group, and
the numbers are the kind a report can chart (no timing is asserted: this machine is shared and noisy)."""

from __future__ import annotations

import asyncio

from gguf import GGMLQuantizationType as QT

import tiny_models
from pyshim.exec.profile import group_name, kernel_times, shape_name
from pyshim.exec.runner import Step, Want
from runners import gpu
from pyshim.gpu.shaderc import ShaderKey


def test_group_names():
    assert group_name(ShaderKey.of("matvec", W_Q4_K=True, WG=64)) == "matvec q4_k"
    assert group_name(ShaderKey.of("attention", SOFTCAP=True)) == "attention"
    assert group_name(ShaderKey.of("attention", COMBINE=True, SPLITS=16)) == "attention combine"


def test_kernel_times_cover_the_step(tmp_path):
    path = tiny_models.write_tiny_model(tmp_path, "gemma3", QT.Q4_K)

    async def run():
        runner = await gpu(path, context=tiny_models.N_CTX)
        try:
            await runner.prepare()
            await runner.step(Step.of(tiny_models.test_ids(), want=Want.ARGMAX))
            program = await runner.program(1, Want.ARGMAX)
            shapes = await kernel_times(runner, reps=2, rounds=1, by_shape=True)
            return (len(program.dispatches), {group_name(d.key) for d in program.dispatches},
                    await kernel_times(runner, reps=2, rounds=1), {shape_name(d) for d in program.dispatches}, shapes)
        finally:
            runner.close()

    n, names, out, shape_names, shapes = asyncio.run(run())
    assert sum(g["dispatches"] for g in out["groups"].values()) == n
    assert set(out["groups"]) == names and any(name.startswith("matvec") for name in names)
    assert all(g["ms"] >= 0 for g in out["groups"].values()) and out["step_ms"] > 0
    assert abs(sum(g["share"] for g in out["groups"].values()) - 1) < 1e-9
    times = [g["ms"] for g in out["groups"].values()]
    assert times == sorted(times, reverse=True)
    # by shape: the same dispatches, each matvec group named by its rows x width and workgroups
    assert set(shapes["groups"]) == shape_names and sum(g["dispatches"] for g in shapes["groups"].values()) == n
    assert len(shape_names) > len(names) and any(" /" in s and "x" in s for s in shape_names if s.startswith("matvec"))
