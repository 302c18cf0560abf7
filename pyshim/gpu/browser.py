"""The browser face: WebGPU through `navigator.gpu`, driven from Pyodide.

This is the only module in pyshim that imports `js` and `pyodide`; it is imported only when
running in Pyodide. JS exceptions become PyshimErrors here, at the boundary.
"""

from __future__ import annotations

import asyncio
import time
from typing import Sequence

import js  # type: ignore[import-not-found]
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
        self._check()
        encoder = self._device.createCommandEncoder(_js({"label": label}))
        compute = encoder.beginComputePass()
        for pipeline, group, (x, y, z) in dispatches:
            compute.setPipeline(pipeline)
            compute.setBindGroup(0, group)
            compute.dispatchWorkgroups(x, y, z)
        compute.end()
        self._device.queue.submit(_js([encoder.finish()]))

    async def read(self, buffer, size: int | None = None, offset: int = 0) -> bytes:
        size = int(buffer.size) - offset if size is None else size
        padded = (size + 3) // 4 * 4
        usage = js.GPUBufferUsage
        staging = self._device.createBuffer(_js({"label": "readback", "size": padded, "usage": usage.MAP_READ | usage.COPY_DST}))
        encoder = self._device.createCommandEncoder()
        encoder.copyBufferToBuffer(buffer, offset, staging, 0, padded)
        self._device.queue.submit(_js([encoder.finish()]))
        waited = time.perf_counter()
        try:
            await staging.mapAsync(js.GPUMapMode.READ)
        except JsException as exc:
            self._check()
            raise DeviceLostError(f"reading back from the GPU failed: {exc}") from None
        self.read_wait_s += time.perf_counter() - waited
        self.bytes_read += size
        data = js.Uint8Array.new(staging.getMappedRange()).to_bytes()[:size]
        staging.unmap()
        staging.destroy()
        self._check()
        return data

    def release(self, buffer) -> None:
        buffer.destroy()

    def destroy(self) -> None:
        self._device.destroy()
