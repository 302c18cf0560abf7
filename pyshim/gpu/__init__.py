"""The GPU layer: one async device interface with two faces.

- browser: `navigator.gpu` through Pyodide's FFI (the only code in pyshim that imports `js`/`pyodide`);
- native: the `wgpu` package (wgpu-native: Vulkan, Metal, DX12) in CPython.

`await open_device()` picks the face by where Python runs.
"""

from __future__ import annotations

import sys

from pyshim.gpu.device import Capabilities, GPUDevice

IN_BROWSER = sys.platform == "emscripten"


async def open_device(*, power_preference: str = "high-performance") -> GPUDevice:
    if IN_BROWSER:
        from pyshim.gpu.browser import BrowserDevice

        return await BrowserDevice.open(power_preference=power_preference)
    from pyshim.gpu.native import NativeDevice

    return await NativeDevice.open(power_preference=power_preference)


__all__ = ["Capabilities", "GPUDevice", "IN_BROWSER", "open_device"]
