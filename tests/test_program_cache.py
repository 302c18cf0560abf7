"""Built step programs are kept for the one-token step and the KEEP_PROGRAMS most recently used other
shapes: a long chat with many prompt lengths neither grows GPU memory nor changes an answer when a
dropped shape is built again."""

from __future__ import annotations

import asyncio

import numpy as np
from gguf import GGMLQuantizationType as QT

import tiny_models
from pyshim.exec.gpu_runner import KEEP_PROGRAMS
from pyshim.exec.runner import Step, Want
from pyshim.plan.settings import Arithmetic
from runners import gpu


def test_programs_are_bounded_and_rebuilt_alike(tmp_path):
    path = tiny_models.write_tiny_model(tmp_path, "qwen2", QT.Q4_K)
    ids = tiny_models.test_ids() * 3

    async def run():
        runner = await gpu(path, context=tiny_models.N_CTX, arithmetic=Arithmetic.F32)
        try:
            await runner.prepare()
            first = (await runner.step(Step.of(ids[:2])))[0].logits
            sizes = []
            for n in range(3, 3 + 2 * KEEP_PROGRAMS):             # twice as many shapes as are kept
                await runner.step(Step.of(ids[:n], want=Want.ARGMAX))
                sizes.append((len(runner._programs), runner.ops.allocator.allocated))
            again = (await runner.step(Step.of(ids[:2])))[0].logits   # its program was dropped: built anew
            return first, again, sizes
        finally:
            runner.close()

    first, again, sizes = asyncio.run(run())
    one_token = 2                                                     # decode programs: logits and argmax
    assert max(count for count, _ in sizes) <= one_token + KEEP_PROGRAMS
    settled = [allocated for _, allocated in sizes[-KEEP_PROGRAMS:]]  # each shape made now drops one like it
    assert len(set(settled)) == 1, settled                            # memory stops growing
    np.testing.assert_array_equal(first, again)
