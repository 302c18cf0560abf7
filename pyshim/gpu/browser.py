"""The browser face: WebGPU through `navigator.gpu`, driven from Pyodide.

This is the only module in pyshim that imports `js` and `pyodide`; it is imported only when
running in Pyodide. JS exceptions become PyshimErrors here, at the boundary.
"""

from __future__ import annotations

import asyncio
import time
from typing import Sequence

import js  # type: ignore[import-not-found]
import numpy as np
import pyshim_gpu_js  # type: ignore[import-not-found]  # web/engine/gpu.js, registered by engine/python.js
from pyodide.ffi import JsException, to_js  # type: ignore[import-not-found]

from pyshim.errors import DeviceLostError, GPUUnavailableError, PyshimError, ShaderError
from pyshim.gpu.device import PLANNING_LIMITS, Binding, Capabilities, Dispatch, GPUDevice

ADAPTER_RETRY_DELAY_S = 1.0  # a null adapter was seen once under heavy load; one retry after a pause
OPTIONAL_FEATURES = ("shader-f16", "subgroups", "timestamp-query")


def _js(obj):
    """Python dicts/lists → plain JS objects/arrays (JS objects inside pass through unchanged)."""
    return to_js(obj, dict_converter=js.Object.fromEntries)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.capitalize() for w in rest)


def _language_features(gpu) -> frozenset[str]:
    """WGSL language features (navigator.gpu.wgslLanguageFeatures), as "wgsl:<name>" features."""
    listed = getattr(gpu, "wgslLanguageFeatures", None)
    return frozenset() if listed is None else frozenset(f"wgsl:{name}" for name in listed)


class BrowserDevice(GPUDevice):
    def __init__(self, adapter, device, caps: Capabilities):
        self._adapter = adapter
        self._device = device
        self.caps = caps
        self._lost: str | None = None
        self._uncaptured: list[str] = []

        def on_lost(info):
            self._lost = f"{info.reason}: {info.message}"

        def on_error(event):
            self._uncaptured.append(str(event.error.message))

        # Keep the callbacks alive as long as the device (Pyodide would otherwise destroy the proxies).
        from pyodide.ffi import create_proxy  # type: ignore[import-not-found]

        self._callbacks = (create_proxy(on_lost), create_proxy(on_error))
        device.lost.then(self._callbacks[0])
        device.onuncapturederror = self._callbacks[1]
        self._staging = pyshim_gpu_js.stagingPool()     # readbacks' staging buffers, reused

    @classmethod
    async def open(cls, *, power_preference: str = "high-performance") -> "BrowserDevice":
        gpu = getattr(js.navigator, "gpu", None)
        if gpu is None:
            raise GPUUnavailableError("this browser exposes no WebGPU (navigator.gpu is missing)",
                                      hint="use a recent Chrome/Edge/Firefox/Safari over https or localhost; in headless Chromium pass --enable-unsafe-webgpu")
        adapter = None
        for attempt in range(2):
            adapter = await gpu.requestAdapter(_js({"powerPreference": power_preference}))
            if adapter is not None:
                break
            if attempt == 0:
                await asyncio.sleep(ADAPTER_RETRY_DELAY_S)
        if adapter is None:
            raise GPUUnavailableError("navigator.gpu.requestAdapter() returned null twice",
                                      hint="WebGPU may be disabled or the GPU blocklisted; close other GPU-heavy tabs and reload")
        features = frozenset(str(f) for f in adapter.features)
        wanted = [f for f in OPTIONAL_FEATURES if f in features]
        limits = {name: int(getattr(adapter.limits, _camel(name))) for name in PLANNING_LIMITS}
        required = {_camel(n): limits[n] for n in ("max_buffer_size", "max_storage_buffer_binding_size",
                                                     "max_storage_buffers_per_shader_stage", "max_compute_workgroup_storage_size",
                                                     "max_compute_invocations_per_workgroup", "max_compute_workgroup_size_x")}
        try:
            device = await adapter.requestDevice(_js({"requiredFeatures": wanted, "requiredLimits": required}))
        except JsException as exc:
            raise GPUUnavailableError(f"the adapter refused to give a device: {exc}") from None
        info = adapter.info
        is_fallback = bool(getattr(info, "isFallbackAdapter", False) or getattr(adapter, "isFallbackAdapter", False))
        caps = Capabilities(
            face="browser", vendor=str(info.vendor or ""), architecture=str(info.architecture or ""),
            description=str(getattr(info, "description", "") or ""), backend="WebGPU", is_fallback=is_fallback,
            features=frozenset(wanted) | features | _language_features(gpu), limits=limits,
            subgroup_min_size=int(getattr(info, "subgroupMinSize", 0) or 0), subgroup_max_size=int(getattr(info, "subgroupMaxSize", 0) or 0),
        )
        return cls(adapter, device, caps)

    @property
    def raw(self):
        """The JS GPUDevice, for JS code that copies weights into this device's buffers."""
        return self._device

    def _check(self) -> None:
        if self._lost is not None:
            raise DeviceLostError(f"the GPU device was lost ({self._lost})", hint="reload the page; if it repeats, try a smaller model or context")
        if self._uncaptured:
            messages, self._uncaptured = self._uncaptured, []
            raise PyshimError("WebGPU reported: " + " | ".join(messages))

    def buffer(self, size: int, *, label: str, uniform: bool = False, also_uniform: bool = False):
        usage = js.GPUBufferUsage
        kind = usage.UNIFORM if uniform else usage.STORAGE | (usage.UNIFORM if also_uniform else 0)
        return self._device.createBuffer(_js({"label": label, "size": max(4, (size + 3) // 4 * 4),
                                               "usage": kind | usage.COPY_DST | usage.COPY_SRC}))

    def write(self, buffer, data, offset: int = 0) -> None:
        view = memoryview(data).cast("B")
        body = len(view) // 4 * 4            # WebGPU writes whole 4-byte words: the tail goes zero-padded
        if body:
            self._device.queue.writeBuffer(buffer, offset, to_js(view[:body]))
        if body < len(view):
            self._device.queue.writeBuffer(buffer, offset + body, to_js(memoryview(bytes(view[body:]).ljust(4, b"\0"))))

    def copy(self, copies) -> None:
        encoder = self._device.createCommandEncoder()
        for src, src_offset, dst, dst_offset, size in copies:     # a few dozen FFI calls, once a shared prompt
            encoder.copyBufferToBuffer(src, src_offset, dst, dst_offset, size)
        self._device.queue.submit(to_js([encoder.finish()]))

    async def pipeline(self, wgsl: str, *, label: str, entry: str = "main"):
        module = self._device.createShaderModule(_js({"label": label, "code": wgsl}))
        info = await module.getCompilationInfo()
        errors = [f"line {m.lineNum}:{m.linePos}: {m.message}" for m in info.messages if m.type == "error"]
        if errors:
            raise ShaderError(f"WGSL {label} does not compile: " + "; ".join(errors))
        try:
            return await self._device.createComputePipelineAsync(
                _js({"label": label, "layout": "auto", "compute": {"module": module, "entryPoint": entry}}))
        except JsException as exc:
            raise ShaderError(f"pipeline {label} could not be created: {exc}") from None

    def bind_group(self, pipeline, bindings: Sequence[Binding], *, label: str = ""):
        entries = []
        for i, b in enumerate(bindings):
            buf, offset, size = b if isinstance(b, tuple) else (b, 0, int(b.size))
            entries.append({"binding": i, "resource": {"buffer": buf, "offset": offset, "size": size}})
        return self._device.createBindGroup(_js({"label": label, "layout": pipeline.getBindGroupLayout(0), "entries": entries}))

    def submit(self, dispatches: Sequence[Dispatch], *, label: str = "") -> None:
        self.replay(self.encode(dispatches), label=label)

    # A step crosses the FFI once: the dispatch list lives in JS (web/engine/gpu.js) from build time on.
    def encode(self, dispatches: Sequence[Dispatch]):
        pipelines, bind_groups, grids = [], [], []
        for pipeline, group, grid in dispatches:
            pipelines.append(pipeline)
            bind_groups.append(group)
            grids.extend(grid)
        return _Encoded(pyshim_gpu_js.program(to_js(pipelines), to_js(bind_groups), to_js(grids)), len(pipelines))

    def set_dispatch(self, encoded, i: int, dispatch: Dispatch) -> None:
        # only bind groups change after a program is built (Program.rebind): pipeline and grid stay
        pyshim_gpu_js.setGroup(encoded.js, i, dispatch[1])

    def replay(self, encoded, start: int = 0, end: int | None = None, *, label: str = "", writes=()) -> None:
        self._check()
        pyshim_gpu_js.replay(self._device, encoded.js, start, encoded.n if end is None else end, label, _writes(writes))

    def replay_read(self, encoded, start: int, end: int | None, read, *, label: str = "", writes=()):
        self._check()
        buffer, size, offset = read
        return self._answer(pyshim_gpu_js.replay(self._device, encoded.js, start, encoded.n if end is None else end, label,
                                                 _writes(writes), to_js([buffer, offset, size]), self._staging), size)

    def encoding_ms(self, encoded) -> float:
        return float(encoded.js.encodeMs)

    async def read(self, buffer, size: int | None = None, offset: int = 0) -> bytes:
        size = int(buffer.size) - offset if size is None else size
        self._check()
        return await self._answer(pyshim_gpu_js.read(self._device, self._staging, buffer, offset, size), size)

    async def _answer(self, promise, size: int) -> bytes:
        """Await a readback's promise (the GPU finishing what was queued before it: counted as waiting)."""
        waited = time.perf_counter()
        try:
            data = (await promise).to_bytes()
        except JsException as exc:
            self._check()
            raise DeviceLostError(f"reading back from the GPU failed: {exc}") from None
        self.read_wait_s += time.perf_counter() - waited
        self.bytes_read += size
        self._check()
        return data

    def release(self, buffer) -> None:
        buffer.destroy()

    def destroy(self) -> None:
        pyshim_gpu_js.clearPool(self._staging)
        self._device.destroy()


def _writes(writes):
    """(buffer, offset, NumPy uint32 array) -> [buffer, offset, [words]] each, or null for none. A step's
    writes are a few words (token ids, positions): as a plain list they cross in microseconds, where a
    typed-array view of the wasm heap made queue.writeBuffer cost ~0.5 ms a call in Chromium."""
    if not writes:
        return None
    return to_js([[buffer, offset, np.asarray(data, dtype=np.uint32).tolist()] for buffer, offset, data in writes])


class _Encoded:
    """A program's dispatches on the JavaScript side (web/engine/gpu.js's `program`), and how many."""

    def __init__(self, js_program, n: int):
        self.js, self.n = js_program, n
