"""Opening the engine that runs a stored model in the page's Worker (pyshim.serve.worker_api loads with it):
WebGPU, the WebAssembly CPU engine, or for "auto" the faster of the two by a measured probe. The weights
are placed, not uploaded: the caller has the store write them."""

from __future__ import annotations

from pyshim.plan.settings import RunSettings


async def open_engine(model_id: str, header, source, settings: RunSettings, store):
    """(runner, engine_choice.Choice): the engine the settings name, or for "auto" the one
    pyshim.serve.engine_choice picks — the CPU engine without an adapter, the GPU on a real one, the faster
    of the two by a measured probe on a fallback adapter. Weights are not uploaded yet."""
    from pyshim.errors import GPUUnavailableError
    from pyshim.exec.gpu_runner import load_gpu
    from pyshim.exec.wasm_module import PageModule
    from pyshim.gguf.spec import ModelSpec
    from pyshim.gpu import open_device
    from pyshim.serve import engine_choice

    if settings.device == "cpu":
        return await load_cpu(header, source, settings, store), engine_choice.named("cpu")
    try:
        device = await open_device()
    except GPUUnavailableError as exc:
        if settings.device == "gpu":
            raise
        return await load_cpu(header, source, settings, store), engine_choice.no_adapter(exc.message)
    module = None
    try:
        choice = engine_choice.named("gpu") if settings.device == "gpu" else engine_choice.real_gpu(device.caps.summary())
        if settings.device == "auto":
            why_not = engine_choice.cpu_can_run(settings.spec_for(ModelSpec.from_header(header)), header, settings,
                                                wasm64=bool(store.wasm64))
            if why_not:
                choice = engine_choice.Choice("gpu", f"WebGPU runs it ({device.caps.summary()}); the CPU engine cannot: {why_not}")
            else:
                tensor = engine_choice.probe_tensor(header)

                async def fill_gpu(buffer):
                    await store.upload(model_id, device.raw, [(tensor.offset, tensor.nbytes, buffer, 0)], True)

                async def fill_cpu(ptr):
                    await store.uploadCpu(model_id, module.engine, [(tensor.offset, tensor.nbytes, ptr)], True)

                gpu_s = await engine_choice.gpu_matvec_s(device, tensor, fill_gpu, settings.arithmetic)
                if device.caps.is_fallback or engine_choice.slow(tensor, gpu_s):
                    module = PageModule(await cpu_engine(header, settings, store))
                    choice = engine_choice.decide(device, module, tensor, gpu_s,
                                                  await engine_choice.cpu_matvec_s(module, tensor, fill_cpu))
                else:
                    choice = engine_choice.fast_gpu(device.caps.summary(), tensor, gpu_s)
        if choice.device == "cpu":
            device.destroy()
            device, probed, module = None, module, None       # the probe's engine loads the model (it closes it on failure)
            return await load_cpu(header, source, settings, store, probed), choice
        runner = await load_gpu(header=header, source=source, settings=settings, device=device, upload_now=False)
        runner.owns_device, device = True, None
        return runner, choice
    finally:
        if module is not None:
            module.close()
        if device is not None:
            device.destroy()


async def load_cpu(header, source, settings: RunSettings, store, module=None):
    """The WebAssembly engine (web/engine/cpu.js's instance of vendor/pyshim-cpu*.wasm: `module`, or a new
    one), its matrices placed but not uploaded yet; its helper threads end when loading fails."""
    from pyshim.exec.wasm_module import PageModule
    from pyshim.exec.wasm_runner import load_wasm

    module = module or PageModule(await cpu_engine(header, settings, store))
    try:
        return load_wasm(header=header, source=source, settings=settings, module=module, upload_now=False)
    except BaseException:
        module.close()
        raise


async def cpu_engine(header, settings: RunSettings, store):
    """A fresh CPU engine in the page: its 64-bit build where the model needs more than 4 GiB (cpu.js refuses
    that, saying so, in a browser without memory64)."""
    from pyshim.exec.wasm_runner import needs_wide
    from pyshim.gguf.spec import ModelSpec

    return await store.cpuEngine(settings.threads, needs_wide(settings.spec_for(ModelSpec.from_header(header)), header, settings))
