"""Open a GGUF file for running: header → ModelSpec → executor → a Runner with every weight bound.

Every check that can fail (architecture, tensor names, shapes, types, context size) happens here,
before any tensor data is read. `load` picks the executor by backend: "cpu" (the NumPy reference, in
the arithmetic the settings name), "gpu" (WGSL through the device face where Python runs) or "wasm" (the
WebAssembly SIMD engine).
"""

from __future__ import annotations

from pathlib import Path

from pyshim.errors import BadRequestError
from pyshim.exec.llama_cpp import OPS_FOR
from pyshim.exec.reference import ReferenceRunner
from pyshim.exec.runner import Runner
from pyshim.gguf.header import GGUFHeader
from pyshim.gguf.model import open_model
from pyshim.gguf.tensors import ByteSource, WeightStore, tensor_refs_from_header
from pyshim.models import build_model
from pyshim.plan import auto
from pyshim.plan.settings import Arithmetic, RunSettings

# gpu: the WebGPU executor (pyshim.gpu) through native wgpu or, in Pyodide, navigator.gpu; wasm: the
# WebAssembly CPU engine (pyshim.exec.wasm_runner), natively under wasmtime
BACKENDS = ("cpu", "gpu", "wasm")
# The reference keeps dequantized weights only where they take at most this share of the machine's memory.
CACHE_SHARE = 0.4
UNKNOWN_MEMORY = 8 << 30      # what physical_memory() assumes where the platform does not say (Pyodide)


def physical_memory() -> int:
    """Bytes of this machine's memory (UNKNOWN_MEMORY where it cannot be asked)."""
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return UNKNOWN_MEMORY


def dequantized_bytes(header: GGUFHeader) -> int:
    """f32 bytes of the file's matrices, as the reference holds them once dequantized."""
    return sum(4 * t.n_elements for t in header.tensors if len(t.shape) >= 2)


def load_reference(path: str | Path | None = None, *, header: GGUFHeader | None = None, source: ByteSource | None = None,
                   settings: RunSettings = RunSettings(), cache_weights: bool | None = None) -> ReferenceRunner:
    """The NumPy reference for a GGUF file (or a header plus a byte source), in `settings.arithmetic`
    (default f32). It computes immediately, so it needs no event loop: `runner.run(step)` works too.
    `cache_weights`: keep every weight dequantized after first use (fast); None: where they fit in
    CACHE_SHARE of this machine's memory (a 7B model's 30 GB of f32 would be killed for memory)."""
    header, source, spec = open_model(path, header=header, source=source)
    if cache_weights is None:
        cache_weights = dequantized_bytes(header) <= CACHE_SHARE * physical_memory()
    spec = settings.spec_for(spec)
    settings, choice = auto.resolve(settings, spec, header.tensors)
    n_ctx = settings.context_for(spec.context_length)
    store = WeightStore(tensor_refs_from_header(header), source)
    ops = OPS_FOR[settings.arithmetic or Arithmetic.F32](store, spec, n_ctx, cache_weights=cache_weights, kv_type=settings.kv_type)
    runner = ReferenceRunner(spec, header, ops, build_model(spec, ops, store if settings.scaled_keys else None, settings.rotated_keys), settings, n_ctx)
    runner.auto = choice and choice.as_dict()
    return runner


async def load(path: str | Path | None = None, *, header: GGUFHeader | None = None, source: ByteSource | None = None,
               backend: str = "cpu", settings: RunSettings = RunSettings(), **gpu_options) -> Runner:
    """A Runner for a GGUF file, or for a parsed header plus a byte source (Pyodide). `gpu_options` go to
    pyshim.exec.gpu_runner.load_gpu (device, upload_now, max_binding, policy)."""
    if backend not in BACKENDS:
        raise BadRequestError(f"backend {backend!r} is not available here", hint=f"use one of: {', '.join(BACKENDS)}")
    if backend == "gpu":
        from pyshim.exec.gpu_runner import load_gpu

        return await load_gpu(path, header=header, source=source, settings=settings, **gpu_options)
    if gpu_options:
        raise BadRequestError(f"{', '.join(sorted(gpu_options))}: gpu-backend options")
    if backend == "wasm":
        from pyshim.exec.wasm_runner import load_wasm

        return load_wasm(path, header=header, source=source, settings=settings)
    return load_reference(path, header=header, source=source, settings=settings)
