"""A GPU device that goes away (driver reset, watchdog, or closed by us) surfaces as DeviceLostError
with a hint, from every device call and from a model step, never as a raw wgpu error or a hang."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import tiny_models
from pyshim.errors import DeviceLostError
from pyshim.gpu import open_device
from pyshim.exec.runner import Step, Want
from runners import gpu


def calls(device, buffer):
    return {
        "write": lambda: device.write(buffer, np.zeros(4, dtype=np.float32)),
        "buffer": lambda: device.buffer(64, label="after"),
        "submit": lambda: device.submit([]),
        "read": lambda: asyncio.run(device.read(buffer, 4)),
    }


@pytest.mark.parametrize("how", ["closed", "lost"])
def test_every_call_says_device_lost(how):
    device = asyncio.run(open_device())
    buffer = device.buffer(64, label="before")
    if how == "closed":
        device.destroy()
    else:
        device.raw.destroy()      # what a driver reset looks like from here: pyshim did not close it
    for name, call in calls(device, buffer).items():
        with pytest.raises(DeviceLostError) as info:
            call()
        assert info.value.hint, name


def test_model_step_after_loss(tmp_path):
    path = tiny_models.write_tiny_model(tmp_path, "llama", QT.Q4_0)

    async def run():
        runner = await gpu(path, context=tiny_models.N_CTX)
        await runner.prepare()
        (first,) = await runner.step(Step.of([1, 2, 3], want=Want.ARGMAX))
        runner.device.raw.destroy()
        with pytest.raises(DeviceLostError):
            await runner.step(Step.of([first.token], 3, want=Want.ARGMAX))

    asyncio.run(run())
