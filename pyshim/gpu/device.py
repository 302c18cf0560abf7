"""The device interface both faces implement, and the adapter's capabilities read once at open.

Handles (buffers, pipelines, bind groups) are the face's own objects, opaque to callers. The shape
follows what a token needs: everything is created at load; a step is `submit()` of one list of
dispatches (one command buffer, one compute pass) and at most one small `read()`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Awaitable, Sequence

# The limits pyshim plans with, by their WebGPU names in snake_case.
PLANNING_LIMITS = (
    "max_buffer_size",
    "max_storage_buffer_binding_size",
    "max_storage_buffers_per_shader_stage",
    "max_compute_workgroup_storage_size",
    "max_compute_invocations_per_workgroup",
    "max_compute_workgroup_size_x",
    "max_compute_workgroups_per_dimension",
    "min_storage_buffer_offset_alignment",
    "min_uniform_buffer_offset_alignment",
    "max_uniform_buffer_binding_size",
)


@dataclass(frozen=True)
class Capabilities:
    face: str                     # "browser" or "native"
    vendor: str
    architecture: str
    description: str
    backend: str                  # "WebGPU", "Vulkan", "Metal", ...
    is_fallback: bool             # a CPU adapter (SwiftShader, lavapipe): barrier-free kernels win there
    features: frozenset[str]
    limits: dict[str, int] = field(hash=False)
    subgroup_min_size: int = 0    # lanes of a subgroup, as the adapter reports them (0: unknown)
    subgroup_max_size: int = 0

    @property
    def has_f16(self) -> bool:
        return "shader-f16" in self.features

    @property
    def has_subgroups(self) -> bool:
        return "subgroups" in self.features or "subgroup" in self.features

    @property
    def has_timestamps(self) -> bool:
        return "timestamp-query" in self.features

    def summary(self) -> str:
        kind = "CPU fallback adapter" if self.is_fallback else "GPU"
        return f"{self.vendor} {self.architecture or self.description} ({self.backend}, {kind}, f16 {'yes' if self.has_f16 else 'no'})"

    def as_dict(self) -> dict[str, Any]:
        return {
            "face": self.face, "vendor": self.vendor, "architecture": self.architecture, "description": self.description,
            "backend": self.backend, "is_fallback": self.is_fallback, "features": sorted(self.features), "limits": dict(self.limits),
            "subgroup_min_size": self.subgroup_min_size, "subgroup_max_size": self.subgroup_max_size, "summary": self.summary(),
        }


# A binding is a whole buffer or (buffer, offset, size) in bytes.
Binding = Any | tuple[Any, int, int]
Dispatch = tuple[Any, Any, tuple[int, int, int]]  # (pipeline, bind group, workgroup counts)
Write = tuple[Any, int, Any]                       # (buffer, byte offset, a NumPy array's bytes) queued before a step


class GPUDevice(ABC):
    caps: Capabilities
    # Seconds spent awaiting readbacks, i.e. waiting for the GPU to finish queued work. A decode step's
    # wall time minus its share of this is its CPU side (Python, FFI, encoding): what bench reports.
    read_wait_s: float = 0.0
    # Bytes copied back from the device by read() (a greedy decode step reads 4).
    bytes_read: int = 0

    @abstractmethod
    def buffer(self, size: int, *, label: str, uniform: bool = False, also_uniform: bool = False) -> Any:
        """A storage (or uniform) buffer that can be written, bound and read back; `also_uniform`: a storage
        buffer that may also be bound as a uniform (the decode matvec reads x that way on CPU adapters)."""

    @abstractmethod
    def write(self, buffer: Any, data, offset: int = 0) -> None:
        """Queue a write of bytes or a contiguous NumPy array at `offset`."""

    @abstractmethod
    def copy(self, copies: Sequence[tuple[Any, int, Any, int, int]]) -> None:
        """Queue copies (src, src_offset, dst, dst_offset, size: multiples of 4) between buffers, as one
        command buffer in order with the work around it."""

    @abstractmethod
    async def pipeline(self, wgsl: str, *, label: str, entry: str = "main") -> Any:
        """A compute pipeline; a WGSL error raises ShaderError with the compiler's messages."""

    @abstractmethod
    def bind_group(self, pipeline: Any, bindings: Sequence[Binding], *, label: str = "") -> Any:
        """Bindings 0..n-1 of group 0, in order (pyshim's convention: inputs, outputs, params last)."""

    @abstractmethod
    def submit(self, dispatches: Sequence[Dispatch], *, label: str = "") -> None:
        """One command buffer with one compute pass running the dispatches in order."""

    def encode(self, dispatches: Sequence[Dispatch]) -> Any:
        """A built program's dispatches handed to the face once, for `replay` (the browser keeps them on
        the JavaScript side, so that a step is one FFI call instead of three a dispatch)."""
        return list(dispatches)

    def set_dispatch(self, encoded: Any, i: int, dispatch: Dispatch) -> None:
        """Dispatch i of an encoded program changed (its bind group was made again)."""
        encoded[i] = dispatch

    def replay(self, encoded: Any, start: int = 0, end: int | None = None, *, label: str = "", writes: Sequence[Write] = ()) -> None:
        """Queue `writes`, then submit dispatches [start, end) of an encoded program, as `submit` would."""
        for buffer, offset, data in writes:
            self.write(buffer, data, offset)
        self.submit(encoded[start:end], label=label)

    def encoding_ms(self, encoded: Any) -> float | None:
        """Milliseconds `replay` has spent so far encoding this program's dispatches before submitting them,
        where the face measures it apart (the browser, in JavaScript); None where it does not."""
        return None

    def replay_read(self, encoded: Any, start: int, end: int | None, read: tuple[Any, int, int], *, label: str = "",
                    writes: Sequence[Write] = ()) -> Awaitable[bytes]:
        """`replay`, then the bytes of `read` = (buffer, size, offset) once the GPU has run them: a step and
        its answer (the browser makes it one FFI call and one command buffer). The work is submitted before
        this returns; the awaitable only waits."""
        self.replay(encoded, start, end, label=label, writes=writes)
        return self.read(*read)

    @abstractmethod
    async def read(self, buffer: Any, size: int | None = None, offset: int = 0) -> bytes:
        """Copy bytes out of a buffer (waits for the work queued before it)."""

    @abstractmethod
    def release(self, buffer: Any) -> None:
        """Free one buffer made by buffer() (work already submitted that uses it still completes)."""

    @abstractmethod
    def destroy(self) -> None:
        """Release the device; later calls fail."""
