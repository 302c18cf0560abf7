"""Prompt pipelines compiled before the first prompt (GpuRunner.prewarm), natively on wgpu: after it, prompts
of a chat's usual lengths compile nothing; the pipeline cache shares a compilation under way (a step asking
for a key the background is compiling waits for it), and a waiter cancelled leaves it to the others. The
Worker's side (starting it after a load, a request stopping it): tests/test_engine.py."""

from __future__ import annotations

import asyncio

import pytest

from gpu_helpers import GPU
from pyshim.exec.runner import Step, Want
from pyshim.gpu.shaderc import ShaderKey
from pyshim.setup.catalog import resolve_model
from runners import gpu


class CountedCompiles:
    """The device's pipeline() with a count by label, and a pause before each (wgpu-native compiles without
    yielding; the browser's createComputePipelineAsync yields: the pause makes the native one overlap too)."""

    def __init__(self, device):
        self.inner, self.counts = device.pipeline, {}

    async def __call__(self, wgsl: str, *, label: str, **kw):
        self.counts[label] = self.counts.get(label, 0) + 1
        await asyncio.sleep(0.05)
        return await self.inner(wgsl, label=label, **kw)


def test_a_compilation_under_way_is_shared_and_survives_a_cancelled_waiter():
    g = GPU()
    try:
        compiles = g.device.pipeline = CountedCompiles(g.device)
        a, b = ShaderKey.of("rmsnorm", WG=64), ShaderKey.of("quantize", WG=64, Q8_0=True)

        async def run():
            first, second = await asyncio.gather(g.kernels.get(a), g.kernels.get(a))
            assert first is second
            waiter = asyncio.ensure_future(g.kernels.get(b))
            await asyncio.sleep(0.01)           # b's compilation under way, then its only waiter gone
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            return await g.kernels.get(b)       # the same compilation, finished for the next one to ask

        assert g.run(run()) is not None
        assert compiles.counts == {a.label: 1, b.label: 1}
        assert a in g.kernels and b in g.kernels and not g.kernels._compiling
    finally:
        g.close()


@pytest.mark.models
def test_after_prewarm_a_chats_prompts_compile_nothing():
    loop = asyncio.new_event_loop()
    runner = loop.run_until_complete(gpu(resolve_model("smollm2"), context=512))
    try:
        loop.run_until_complete(runner.prepare())
        kernels, allocated = runner.ops.kernels, runner.ops.allocator.allocated
        before = len(kernels)
        compiled = loop.run_until_complete(runner.prewarm())
        assert compiled > 0 and len(kernels) == before + compiled
        assert runner.ops.allocator.allocated == allocated          # recorded, not built: no buffer kept
        assert loop.run_until_complete(runner.prewarm()) == 0       # nothing left to compile
        start = 0
        for n, want in ((6, Want.ARGMAX), (20, Want.TOP_K), (40, Want.ARGMAX), (100, Want.TOP_K), (1, Want.TOP_K)):
            loop.run_until_complete(runner.step(Step.of(list(range(100, 100 + n)), start, want=want, k=40 if want is Want.TOP_K else 0)))
            start += n
            assert len(kernels) == before + compiled, (n, want)
    finally:
        runner.close()
        loop.close()
