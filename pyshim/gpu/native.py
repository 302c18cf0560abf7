"""The native face: the `wgpu` package (wgpu-native over Vulkan, Metal or DX12) in CPython.

Same WGSL as the browser, compiled by naga instead of Tint: every shader must satisfy both.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Sequence

from pyshim.errors import DeviceLostError, GPUUnavailableError, OutOfMemoryError, PyshimError, ShaderError
from pyshim.gpu.device import PLANNING_LIMITS, Binding, Capabilities, Dispatch, GPUDevice

OPTIONAL_FEATURES = ("shader-f16", "subgroup", "timestamp-query")
# WGSL language features, reported as "wgsl:<name>" among the features. wgpu-native lists none
# (wgsl_language_features is empty), so each is probed by compiling a one-line use of it.
LANGUAGE_PROBES = {
    "packed_4x8_integer_dot_product": "@group(0) @binding(0) var<storage, read_write> o: array<i32>;\n"
    "@compute @workgroup_size(1) fn main() { o[0] = dot4I8Packed(pack4xI8(vec4<i32>(1, -2, 3, -4)), 0x01020304u); }",
    # the subgroup matvec's builtins (naga takes them without `enable subgroups;` once the device has 'subgroup')
    "subgroup_id": "@group(0) @binding(0) var<storage, read_write> o: array<u32>;\n"
    "@compute @workgroup_size(1) fn main(@builtin(subgroup_id) s: u32, @builtin(num_subgroups) n: u32) { o[s] = n; }",
}


def _language_features(device) -> frozenset[str]:
    found = set()
    for name, code in LANGUAGE_PROBES.items():
        try:
            device.create_shader_module(label=f"probe_{name}", code=code)
        except Exception:  # wgpu raises GPUValidationError when naga lacks the feature
            continue
        found.add(f"wgsl:{name}")
    return frozenset(found)


def _c_calls():
    """wgpu-native's SetPipeline, SetBindGroup and DispatchWorkgroups as wgpu-py's cffi exposes them, or
    None where this wgpu-py lays them out otherwise (the public methods are used then)."""
    try:
        from wgpu.backends.wgpu_native import _api
        lib = _api.lib
        return (lib.wgpuComputePassEncoderSetPipeline, lib.wgpuComputePassEncoderSetBindGroup,
                lib.wgpuComputePassEncoderDispatchWorkgroups), _api.ffi.NULL
    except (ImportError, AttributeError):
        return None, None


_C, _NULL = _c_calls()


class _Encoded:
    """A program's dispatches (pipeline, bind group, grid) and, made on first replay, their C handles."""

    def __init__(self, dispatches: list):
        self.dispatches = dispatches        # (also keeps the Python objects, so the handles, alive)
        self.raw = None

    def raw_list(self) -> list:
        if self.raw is None:
            self.raw = [(p._internal, g._internal, *grid) for p, g, grid in self.dispatches]
        return self.raw


LOST_HINT = "open the model again; if it repeats, update the GPU driver or try a smaller model or context"


@contextmanager
def _gpu_errors(what: str):
    """wgpu's errors become PyshimErrors at the boundary (out of memory and a lost device keep classes
    of their own: a caller can retry after either, differently)."""
    import wgpu

    try:
        yield
    except wgpu.GPUOutOfMemoryError as exc:
        raise OutOfMemoryError(f"the GPU ran out of memory ({what}): {exc}",
                               hint="use a smaller model or context") from None
    except wgpu.GPUError as exc:
        if "device is lost" in str(exc).lower():   # wgpu-native says "Parent device is lost"
            raise DeviceLostError(f"the GPU device was lost ({what})", hint=LOST_HINT) from None
        raise PyshimError(f"WebGPU rejected {what}: {exc}") from None


# Bytes queue.write_buffer may stage before they are submitted to their buffers. wgpu keeps each write in
# staging memory of its own until a submission that follows it completes, so a model's upload held a second
# copy of its weights until the first step, which then paid for copying them all: Qwen2.5-7B's shape on
# lavapipe, resident set 9.5 -> 13.6 GB and 60-70 s in the first step, nearly all of it the kernel clearing
# fresh pages for the copies (2-core VM). Flushed as they go: peak 11.3 GB, load + first step 35 s.
WRITE_FLUSH_BYTES = 256 << 20


class NativeDevice(GPUDevice):
    def __init__(self, wgpu, adapter, device, caps: Capabilities):
        self._wgpu = wgpu
        self._adapter = adapter
        self._device = device
        self.caps = caps
        self._closed = False
        self._staged = 0            # bytes written since the last flush (WRITE_FLUSH_BYTES)
        self.write_flushes = 0

    @classmethod
    async def open(cls, *, power_preference: str = "high-performance") -> "NativeDevice":
        try:
            import wgpu
        except ImportError:
            raise GPUUnavailableError("the native backend needs the `wgpu` package", hint="pip install 'pyshim[dev]'") from None
        try:
            adapter = await wgpu.gpu.request_adapter_async(power_preference=power_preference)
        except Exception as exc:  # wgpu-native raises its own error types for "no adapter"
            raise GPUUnavailableError(f"no native WebGPU adapter: {exc}",
                                      hint="install a Vulkan driver (on Debian: apt-get install mesa-vulkan-drivers)") from None
        if adapter is None:
            raise GPUUnavailableError("no native WebGPU adapter", hint="install a Vulkan driver (on Debian: apt-get install mesa-vulkan-drivers)")
        features = frozenset(adapter.features)
        wanted = [f for f in OPTIONAL_FEATURES if f in features]
        limits = {name: int(adapter.limits[name.replace("_", "-")]) for name in PLANNING_LIMITS}
        required = {n.replace("_", "-"): limits[n] for n in ("max_buffer_size", "max_storage_buffer_binding_size",
                                                               "max_storage_buffers_per_shader_stage", "max_compute_workgroup_storage_size")}
        device = await adapter.request_device_async(required_features=wanted, required_limits=required)
        info = adapter.info
        caps = Capabilities(
            face="native", vendor=str(info.get("vendor", "")), architecture=str(info.get("architecture", "")),
            description=str(info.get("device", "")), backend=str(info.get("backend_type", "")),
            is_fallback=info.get("adapter_type") == "CPU", features=features | _language_features(device), limits=limits,
            # wgpu-py 0.32 spells the info keys "stackgroup_*"; later versions may fix the name
            subgroup_min_size=int(info.get("subgroup_min_size", info.get("stackgroup_min_size", 0)) or 0),
            subgroup_max_size=int(info.get("subgroup_max_size", info.get("stackgroup_max_size", 0)) or 0),
        )
        return cls(wgpu, adapter, device, caps)

    @property
    def raw(self):
        """The wgpu GPUDevice itself."""
        return self._device

    def buffer(self, size: int, *, label: str, uniform: bool = False, also_uniform: bool = False):
        self._check()
        usage = self._wgpu.BufferUsage
        kind = usage.UNIFORM if uniform else usage.STORAGE | (usage.UNIFORM if also_uniform else 0)
        with _gpu_errors(f"buffer {label} ({size} bytes)"):
            return self._device.create_buffer(label=label, size=max(4, (size + 3) // 4 * 4), usage=kind | usage.COPY_DST | usage.COPY_SRC)

    def _check(self) -> None:
        if self._closed:
            raise DeviceLostError("this GPU device was closed", hint="open the model again")

    def write(self, buffer, data, offset: int = 0) -> None:
        self._check()
        view = memoryview(data).cast("B")
        body = len(view) // 4 * 4            # WebGPU writes whole 4-byte words: the tail goes zero-padded
        with _gpu_errors(f"write of {len(view)} bytes"):
            if body:
                self._device.queue.write_buffer(buffer, offset, view[:body])
            if body < len(view):
                self._device.queue.write_buffer(buffer, offset + body, bytes(view[body:]).ljust(4, b"\0"))
            self._staged += len(view)
            if self._staged >= WRITE_FLUSH_BYTES:
                self._flush_writes()

    def _flush_writes(self) -> None:
        """The staged writes submitted (to their buffers), not waited for: each submission frees the staging of
        those that completed, so the staging stays near WRITE_FLUSH_BYTES and work on the GPU is not held up
        (a layer streamed from the store while earlier layers run). Waiting as well took the 7B's load +
        first step to 43 s instead of 35 and the peak to 10.7 GB instead of 11.3."""
        self._device.queue.submit([])
        self._staged = 0
        self.write_flushes += 1

    def copy(self, copies) -> None:
        self._check()
        with _gpu_errors(f"{len(copies)} buffer copies"):
            encoder = self._device.create_command_encoder()
            for src, src_offset, dst, dst_offset, size in copies:
                encoder.copy_buffer_to_buffer(src, src_offset, dst, dst_offset, size)
            self._device.queue.submit([encoder.finish()])

    async def pipeline(self, wgsl: str, *, label: str, entry: str = "main"):
        self._check()
        try:
            module = self._device.create_shader_module(label=label, code=wgsl)
            return self._device.create_compute_pipeline(label=label, layout="auto", compute={"module": module, "entry_point": entry})
        except Exception as exc:  # wgpu raises GPUValidationError with naga's report
            raise ShaderError(f"WGSL {label} does not compile: {exc}") from None

    def bind_group(self, pipeline, bindings: Sequence[Binding], *, label: str = ""):
        entries = []
        for i, b in enumerate(bindings):
            buf, offset, size = b if isinstance(b, tuple) else (b, 0, b.size)
            entries.append({"binding": i, "resource": {"buffer": buf, "offset": offset, "size": size}})
        with _gpu_errors(f"bind group {label}"):
            return self._device.create_bind_group(label=label, layout=pipeline.get_bind_group_layout(0), entries=entries)

    def submit(self, dispatches: Sequence[Dispatch], *, label: str = "") -> None:
        self.replay(self.encode(dispatches), label=label)

    # A step's dispatches are encoded by wgpu-native's C calls through wgpu-py's cffi handles where they are
    # there, without its Python wrappers (which check arguments and allocate per call): a SmolLM2 step's 366
    # dispatches take 2.1 ms to encode instead of 5.1 (lavapipe's machine). Validation still happens, at
    # the encoder's finish(), which raises through wgpu-py as before.
    def encode(self, dispatches: Sequence[Dispatch]):
        return _Encoded(list(dispatches))

    def set_dispatch(self, encoded, i: int, dispatch: Dispatch) -> None:
        encoded.dispatches[i] = dispatch
        encoded.raw = None

    def replay(self, encoded, start: int = 0, end: int | None = None, *, label: str = "", writes=()) -> None:
        for buffer, offset, data in writes:
            self.write(buffer, data, offset)
        self._check()
        end = len(encoded.dispatches) if end is None else end
        with _gpu_errors(f"command buffer {label}"):
            encoder = self._device.create_command_encoder(label=label)
            compute = encoder.begin_compute_pass()
            if _C is not None:
                set_pipeline, set_group, dispatch = _C
                handle, current = compute._internal, None
                for pipeline, group, x, y, z in encoded.raw_list()[start:end]:
                    if pipeline != current:        # consecutive dispatches of one pipeline set it once
                        set_pipeline(handle, pipeline)
                        current = pipeline
                    set_group(handle, 0, group, 0, _NULL)
                    dispatch(handle, x, y, z)
            else:
                current = None
                for pipeline, group, (x, y, z) in encoded.dispatches[start:end]:
                    if pipeline is not current:
                        compute.set_pipeline(pipeline)
                        current = pipeline
                    compute.set_bind_group(0, group)
                    compute.dispatch_workgroups(x, y, z)
            compute.end()
            self._device.queue.submit([encoder.finish()])

    async def read(self, buffer, size: int | None = None, offset: int = 0) -> bytes:
        size = buffer.size - offset if size is None else size
        padded = (size + 3) // 4 * 4
        usage = self._wgpu.BufferUsage
        self._check()
        with _gpu_errors(f"read of {size} bytes"):
            staging = self._device.create_buffer(size=padded, usage=usage.MAP_READ | usage.COPY_DST)
            encoder = self._device.create_command_encoder()
            encoder.copy_buffer_to_buffer(buffer, offset, staging, 0, padded)
            # wgpu-native (measured on lavapipe) blocks in this submit until the queued work is done, so the
            # wait starts before it (encoding the copy itself takes microseconds).
            waited = time.perf_counter()
            self._device.queue.submit([encoder.finish()])
        with _gpu_errors(f"read of {size} bytes"):
            await staging.map_async(self._wgpu.MapMode.READ)
        self.read_wait_s += time.perf_counter() - waited
        self.bytes_read += size
        data = bytes(staging.read_mapped())[:size]
        staging.unmap()
        staging.destroy()
        return data

    def release(self, buffer) -> None:
        if not self._closed:
            buffer.destroy()

    def destroy(self) -> None:
        self._closed = True
        self._device.destroy()
