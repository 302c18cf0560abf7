"""Which engine runs a model when the settings leave it to pyshim (device "auto"): measured, not named.

No WebGPU adapter: the WebAssembly CPU engine. A fallback adapter (a software rasterizer such as
SwiftShader, which Chromium hands out where no GPU is usable) may be slower than the CPU engine on the
same cores, or not: a short probe decides. A real GPU is probed on its side first; only a slow one (an
old integrated GPU, a throttled phone) is measured against the CPU engine too. It times one matrix-vector product of the
model's largest first-layer matrix, with that matrix's own bytes, on both — the GPU's matvec kernel as
the adapter's policy picks it, the CPU engine's int8 matmul on its threads — and the faster runs the
model. Both engines are made for the probe; the loser is closed and the winner kept for the load.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Awaitable, Callable

import numpy as np
from gguf import GGMLQuantizationType as QT

from pyshim.errors import PyshimError
from pyshim.exec.wasm_ops import OP, OP_WORDS
from pyshim.gguf.header import TensorInfo

REPS = 8                 # timed products on each side, after one that warms up (compiles, faults pages in)
# A real GPU is measured against the CPU engine only when its matvec streamed the probe matrix slower than
# this. The CPU engine streams a few GB/s (SmolLM2's 0.55 MB 576×1536 Q4_1 in 0.17 ms on one thread here:
# 3.3 GB/s); integrated GPUs stream tens, discrete ones hundreds. Below it the CPU side of the probe
# (instantiating the module) is worth its time; above it the GPU wins by far.
SLOW_GPU_GB_S = 10.0
MIN_TIMED_S = 0.02       # ...or more, until this much time has passed: a small matrix is timed long enough


@dataclass(frozen=True)
class Choice:
    device: str              # "gpu" or "cpu"
    reason: str              # what the visitor is told
    gpu_ms: float | None = None
    cpu_ms: float | None = None

    def as_dict(self) -> dict:
        return {"device": self.device, "reason": self.reason, "gpu_ms": self.gpu_ms, "cpu_ms": self.cpu_ms}

    def on_wasm64(self) -> Choice:
        """The choice, its reason saying that the CPU engine runs its 64-bit build (the model needs it)."""
        return replace(self, reason=f"{self.reason}; on its 64-bit build (memory64): the model needs more than "
                                    "the 4 GB a 32-bit WebAssembly memory holds")


def probe_tensor(header) -> TensorInfo:
    """The largest matrix of the first block (an FFN matrix in a dense model): one decode step reads a few
    dozen like it, so their speed is the step's."""
    first = [t for t in header.tensors if t.name.startswith("blk.0.") and len(t.shape) == 2]
    return max(first or [t for t in header.tensors if len(t.shape) == 2], key=lambda t: t.nbytes)


async def gpu_matvec_s(device, tensor: TensorInfo, fill: Callable[[object], Awaitable[None]], arithmetic=None) -> float:
    """Seconds one matvec of `tensor` takes on `device` (its bytes put in place by `fill(buffer)`)."""
    from pyshim.gpu.kernels import PARAMS, KernelCache, matvec_grid, matvec_key
    from pyshim.gpu.policy import KernelPolicy

    k, m = tensor.shape                      # GGUF order: the row length first
    policy = KernelPolicy.for_device(device.caps, arithmetic)
    key = matvec_key(QT(int(tensor.type)), reduce=policy.reduce, rows=policy.matvec_rows, subgroup=policy.subgroup,
                     f16=policy.f16, reduce_wg=policy.reduce_wg, wg=policy.matvec_wg)
    pipeline = await KernelCache(device).get(key)
    w = device.buffer(-(-tensor.nbytes // 4) * 4, label="probe-w")
    x = device.buffer(4 * k, label="probe-x")
    y = device.buffer(4 * m, label="probe-y")
    params = device.buffer(PARAMS["matvec"].nbytes, label="probe-params", uniform=True)
    try:
        await fill(w)
        device.write(x, np.random.default_rng(0).standard_normal(k, dtype=np.float32))
        device.write(params, PARAMS["matvec"].pack(m=m, k=k, n=1, row_bytes=tensor.nbytes // m, w_off=0, x_off=0, y_off=0,
                                                   bias_off=0, bias_stride=0, y_stride=m))
        group = device.bind_group(pipeline, [w, x, y, params], label="probe")
        dispatch = (pipeline, group, matvec_grid(m, 1, policy.reduce, policy.matvec_rows, policy.matvec_wg))

        async def run(reps: int) -> None:
            device.submit([dispatch] * reps, label="probe")
            await device.read(y, 4)

        return await _timed(run)
    finally:
        for buffer in (w, x, y, params):
            device.release(buffer)


async def cpu_matvec_s(module, tensor: TensorInfo, fill: Callable[[int], Awaitable[None]]) -> float:
    """Seconds one matvec of `tensor` takes on the CPU engine `module` (its bytes put at a pointer by
    `fill(ptr)`), as a one-op program on all its threads: the int8 route, as decoding runs."""
    k, m = tensor.shape
    t = int(tensor.type)
    w = module.alloc(tensor.nbytes)
    await fill(w)
    x, y = module.alloc(4 * k), module.alloc(4 * m)
    module.write(x, np.random.default_rng(0).standard_normal(k, dtype=np.float32))
    scratch = module.alloc(module.call("matmul_scratch", t, 1, k))
    words = np.zeros(OP_WORDS, dtype=np.int64 if module.call("word_bytes") == 8 else np.int32)
    words[:11] = [OP["matmul"], x, 1, k, w, t, m, y, 0, 0, scratch]
    program = module.alloc(words.nbytes)
    module.write(program, words)

    async def run(reps: int) -> None:
        for _ in range(reps):
            module.call("run", program, 1)

    return await _timed(run)


async def _timed(run: Callable[[int], Awaitable[None]]) -> float:
    """Seconds per rep of `run(reps)`, after one warm-up rep."""
    await run(1)
    reps, spent = 0, 0.0
    while reps < REPS or spent < MIN_TIMED_S:
        start = time.perf_counter()
        await run(REPS)
        spent += time.perf_counter() - start
        reps += REPS
    return spent / reps


async def measure(device, module, tensor: TensorInfo, fill_gpu, fill_cpu, arithmetic=None) -> Choice:
    """The probe on both engines; the faster one, and why."""
    gpu_s = await gpu_matvec_s(device, tensor, fill_gpu, arithmetic)
    return decide(device, module, tensor, gpu_s, await cpu_matvec_s(module, tensor, fill_cpu))


def slow(tensor: TensorInfo, gpu_s: float) -> bool:
    """Whether a real GPU's probe matvec was slow enough that the CPU engine may beat it (SLOW_GPU_GB_S)."""
    return tensor.nbytes / gpu_s < SLOW_GPU_GB_S * 1e9


def fast_gpu(summary: str, tensor: TensorInfo, gpu_s: float) -> Choice:
    """A real GPU whose probe streamed past SLOW_GPU_GB_S: the CPU engine is not measured."""
    return Choice("gpu", f"WebGPU runs it on {summary}: a {_shape(tensor)} matvec took {1e3 * gpu_s:.3f} ms "
                         f"({tensor.nbytes / gpu_s / 1e9:.0f} GB/s), far past what the CPU engine streams", 1e3 * gpu_s)


def decide(device, module, tensor: TensorInfo, gpu_s: float, cpu_s: float) -> Choice:
    """The faster of the two probes, and why."""
    gpu_ms, cpu_ms = 1e3 * gpu_s, 1e3 * cpu_s
    threads = f"{module.threads} thread{'s' if module.threads > 1 else ''}"
    measured = (f"a {_shape(tensor)} matvec took {gpu_ms:.2f} ms on WebGPU ({device.caps.summary()}), {cpu_ms:.2f} ms on "
                f"the CPU engine ({threads})")
    faster = gpu_ms / cpu_ms if cpu_s < gpu_s else cpu_ms / gpu_ms
    if cpu_s < gpu_s:
        adapter = "this software adapter" if device.caps.is_fallback else "this GPU"
        return Choice("cpu", f"the CPU engine runs it: {faster:.1f}× faster than WebGPU on {adapter} ({measured})",
                      gpu_ms, cpu_ms)
    return Choice("gpu", f"WebGPU runs it: {faster:.1f}× faster than the CPU engine ({measured})", gpu_ms, cpu_ms)


def _shape(tensor: TensorInfo) -> str:
    return f"{tensor.shape[1]}×{tensor.shape[0]} {tensor.type.name}"


def cpu_can_run(spec, header, settings, *, wasm64: bool = True) -> str | None:
    """None when the CPU engine can run the model with these settings, else why not (then the GPU does,
    without a probe). `wasm64`: the browser runs the engine's 64-bit build (memory64)."""
    from pyshim.plan.memory import cpu_engine_fit, cpu_engine_plan

    if settings.streamed_layers or settings.expert_slots:
        return "weights streamed from the store run on the GPU only"
    try:
        est, context, kv_type = cpu_engine_plan(spec, header.tensors, settings)
    except PyshimError as exc:
        return str(exc)
    fit = cpu_engine_fit(spec, est, context, kv_type, wasm64=wasm64, seqs=settings.parallel)
    return None if fit.ok else "; ".join(fit.reasons)


def no_adapter(reason: str) -> Choice:
    return Choice("cpu", f"the CPU engine runs it: no WebGPU here ({reason})")


def named(device: str) -> Choice:
    return Choice(device, f"the settings ask for the {'GPU' if device == 'gpu' else 'CPU engine'}")


def real_gpu(summary: str) -> Choice:
    return Choice("gpu", f"WebGPU runs it on {summary}")

