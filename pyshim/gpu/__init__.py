"""The GPU layer: one async device interface with two faces, and what runs a model on it.

- `device`: the interface and the adapter's capabilities; `browser`: `navigator.gpu` through Pyodide's FFI
  (with pyshim.serve.js_engine the only code that imports `js`/`pyodide`; its JavaScript half, which
  encodes a step's dispatches in one call, is web/engine/gpu.js); `native`: the `wgpu` package
  (wgpu-native: Vulkan, Metal, DX12) in CPython. `await open_device()` picks the face by where Python runs.
- `policy`: which kernel variants run, from the adapter's features and limits; `kernels` and `shaderc`:
  the WGSL catalog, params layouts and preprocessor; `program`: recorded dispatches built and replayed;
  `pool`: the allocator and activation buffers; `slots`: weights by name; `kv`: the KV cache per
  sequence; `ops`: the ops interface recorded into programs (`experts`: its mixture-of-experts part;
  `fused`: the ops it runs in fewer passes than the interface spells them);
  weights streamed from the store: `expert_cache` (routed experts in slots) and `layer_stream` (dense
  layers through rotating buffers); `selftest`: a first dispatch.
May import: pyshim.errors, pyshim.gguf, pyshim.plan, pyshim.models (the ops interface, rope's tables).
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
