"""How device "auto" picks an engine (pyshim.serve.engine_choice): the probe natively, on lavapipe (a
fallback adapter, as SwiftShader is in Chromium) against the CPU engine under wasmtime, with a real
model's matrix; and which models the CPU engine is not offered. The page's use of it: test_site_cpu.py."""

from __future__ import annotations

import numpy as np
import pytest

from pyshim.exec.wasm_module import NativeModule
from pyshim.gguf.header import read_header_from_file
from pyshim.gguf.spec import ModelSpec
from pyshim.plan.settings import RunSettings
from pyshim.serve.engine_choice import cpu_can_run, decide, fast_gpu, measure, probe_tensor, slow
from pyshim.setup.catalog import resolve_model


@pytest.mark.parametrize("threads", [1, 2])
def test_probe_times_one_matvec_on_both_and_picks_the_faster(loop, device, threads):
    path = resolve_model("smollm2")
    header = read_header_from_file(path)
    tensor = probe_tensor(header)
    assert tensor.name.startswith("blk.0.ffn_") and len(tensor.shape) == 2
    data = np.fromfile(path, dtype=np.uint8, count=tensor.nbytes, offset=tensor.offset)
    module = NativeModule(threads=threads)
    filled = []

    async def fill_gpu(buffer):
        device.write(buffer, np.concatenate([data, np.zeros(-len(data) % 4, np.uint8)]))
        filled.append("gpu")

    async def fill_cpu(ptr):
        module.write(ptr, data)
        filled.append("cpu")

    try:
        choice = loop.run_until_complete(measure(device, module, tensor, fill_gpu, fill_cpu))
    finally:
        module.close()
    print(choice)
    assert filled == ["gpu", "cpu"] and choice.gpu_ms > 0 and choice.cpu_ms > 0
    assert choice.device == ("cpu" if choice.cpu_ms < choice.gpu_ms else "gpu")
    assert f"{tensor.shape[1]}×{tensor.shape[0]} {tensor.type.name}" in choice.reason
    assert f"({threads} thread" in choice.reason and device.caps.summary() in choice.reason


def test_a_real_gpu_is_measured_against_the_cpu_engine_only_when_slow():
    """A real adapter's probe matvec streaming 50 GB/s keeps the GPU without instantiating the CPU engine;
    one at 2 GB/s (an old integrated GPU) is measured against it, and the CPU engine may win."""
    from types import SimpleNamespace

    tensor = probe_tensor(read_header_from_file(resolve_model("smollm2")))
    assert not slow(tensor, tensor.nbytes / 50e9) and slow(tensor, tensor.nbytes / 2e9)
    choice = fast_gpu("NVIDIA H200", tensor, tensor.nbytes / 1e12)
    assert choice.device == "gpu" and "(1000 GB/s)" in choice.reason and choice.cpu_ms is None
    igpu = SimpleNamespace(caps=SimpleNamespace(is_fallback=False, summary=lambda: "an old integrated GPU"))
    choice = decide(igpu, SimpleNamespace(threads=2), tensor, gpu_s=2e-3, cpu_s=1e-3)
    assert choice.device == "cpu" and "2.0× faster than WebGPU on this GPU" in choice.reason
    assert decide(igpu, SimpleNamespace(threads=2), tensor, gpu_s=1e-3, cpu_s=3e-3).device == "gpu"


def test_the_cpu_engine_is_not_offered_what_it_cannot_run(tmp_path):
    from site_helpers import header_only_gguf
    from pyshim.gguf.header import read_header

    def header(**kw):
        data, total = header_only_gguf(tmp_path / "m.gguf", n_vocab=1000, n_embd=1024, n_ff=1024, **kw)
        h = read_header(data, file_size=total)
        return ModelSpec.from_header(h), h

    spec, h = header(n_layers=2)
    assert cpu_can_run(spec, h, RunSettings()) is None
    assert "streamed" in cpu_can_run(spec, h, RunSettings(streamed_layers=1))
    spec, h = header(n_layers=96)           # 4.6 GB with an f32 cache of 4096 positions: past 4 GiB
    assert "over the 4096.0 MiB" in cpu_can_run(spec, h, RunSettings(context=4096), wasm64=False)
    assert cpu_can_run(spec, h, RunSettings(context=4096, kv_type="q4"), wasm64=False) is None
    assert cpu_can_run(spec, h, RunSettings(context=4096)) is None       # (the 64-bit build: 16 GiB)
    spec, h = header(n_layers=2, experts=4)
    assert cpu_can_run(spec, h, RunSettings()) is None      # (mixtures of experts run on the CPU engine too)
    spec, h = header(n_layers=2, experts=320)
    assert "at most 256 experts, not 320" in cpu_can_run(spec, h, RunSettings())
