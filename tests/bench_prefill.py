"""Prefill benchmark (not a test): one step of a P-token prompt per model and per kernel choice on the
native adapter, prefill tok/s by wall clock and by process CPU time (on CPU adapters like lavapipe the
"GPU" is this process's threads, so CPU time stays meaningful on a shared machine).

    .venv/bin/python tests/bench_prefill.py [--models smollm2,gemma3] [--tokens 64] [--variants default,f32_tiled,...]
    .venv/bin/python tests/bench_prefill.py --kernels [--tokens 64]      # one matmul per kernel and tile shape

Variants: the arithmetic and kernel policy overrides (see VARIANTS). (The many-token f32 matvec, 2-16
tokens per invocation, measured 2x slower than one token and than the tiled matmul here, is gone:
shaders/README.md.)"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from english_text import long_english_text  # noqa: E402
from pyshim.gpu import kernels, policy  # noqa: E402

TRIALS = 2
VARIANTS = {
    "default": {},                                            # the adapter's defaults (int8 route on CPU adapters)
    "default+tiled_attn": {"policy": {"tiled_attention": True}},
    "f32": {"arithmetic": "f32", "policy": {"tiled_attention": False}},
    "f32_tiled": {"arithmetic": "f32", "policy": {"tiled_attention": True}},
}


async def prefill(name: str, tokens: int, options: dict) -> dict:
    from pyshim.exec.gpu_runner import load_gpu
    from pyshim.exec.runner import Step
    from pyshim.plan.settings import RunSettings
    from pyshim.setup.catalog import resolve_model
    from pyshim.text.tokenizer import Tokenizer

    runner = await load_gpu(resolve_model(name), settings=RunSettings(context=max(256, tokens), arithmetic=options.get("arithmetic")),
                            policy=options.get("policy"))
    try:
        ids = Tokenizer.from_metadata(runner.header.metadata).encode(long_english_text(4))[:tokens]
        await runner.step(Step.of(ids))                       # builds the programs
        walls, cpus = [], []
        for _ in range(TRIALS):
            w0, c0 = time.perf_counter(), time.process_time()
            await runner.step(Step.of(ids))
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
        adapter = runner.device.caps.summary()
    finally:
        runner.close()
    return {"adapter": adapter, "tok_s": tokens / statistics.median(walls), "tok_per_cpu_s": tokens / statistics.median(cpus)}


# (type, rows, cols) of the kernel rows: SmolLM2's FFN up/gate and Gemma 3 270M's FFN down
KERNEL_SHAPES = [("Q4_1", 1536, 576), ("Q4_K", 640, 2048)]
KERNEL_TILES = [policy.MATMUL_TILE_CPU, policy.MATMUL_TILE, (64, 64, 32, 8, 8), (32, 64, 64, 4, 16), (16, 16, 256, 2, 2)]
KERNEL_REPS = 4


def kernel_rows(tokens: int) -> None:
    """ms of process CPU per many-token matmul: the barrier-free matvec (lavapipe's f32 route) and the
    tiled matmul in several tile shapes (results checked against the matvec's)."""
    import numpy as np
    from gguf import GGMLQuantizationType as QT
    from gpu_helpers import GPU, random_weight

    gpu = GPU()
    dev = gpu.device

    def run(key, grid, inputs, m, k, row_bytes):
        pipe = gpu.run(gpu.kernels.get(key))
        out = dev.buffer(tokens * m * 4, label="y")
        params = dev.buffer(kernels.PARAMS[key.family].nbytes, label="p", uniform=True)
        dev.write(params, kernels.PARAMS[key.family].pack(m=m, k=k, n=tokens, row_bytes=row_bytes, w_off=0, x_off=0,
                                                          y_off=0, bias_off=0, y_stride=m))
        group = dev.bind_group(pipe, inputs + [out, params])
        cpus = []
        for _ in range(TRIALS + 1):
            c0 = time.process_time()
            dev.submit([(pipe, group, grid)] * KERNEL_REPS)
            gpu.run(dev.read(out, 4))
            cpus.append((time.process_time() - c0) / KERNEL_REPS)
        return min(cpus) * 1e3, np.frombuffer(gpu.run(dev.read(out, tokens * m * 4)), np.float32)

    rng = np.random.default_rng(0)
    for name, m, k in KERNEL_SHAPES:
        qtype = QT[name]
        raw = random_weight(qtype, m, k, rng)
        inputs = [gpu.upload(raw), gpu.upload(rng.standard_normal((tokens, k), dtype=np.float32))]
        rows = policy.KernelPolicy.for_device(dev.caps).matvec_rows
        ms, want = run(kernels.matvec_key(qtype, rows=rows), kernels.matvec_grid(m, tokens, rows=rows), inputs, m, k, raw.shape[1])
        print(f"{name} {m}x{k}, {tokens} tokens: matvec rows{rows} {ms:7.1f} ms CPU", flush=True)
        for tile in KERNEL_TILES:
            if (tile[0] + tile[1]) * tile[2] * 4 > dev.caps.limits["max_compute_workgroup_storage_size"]:
                continue
            ms, got = run(kernels.matmul_key(qtype, tile=tile), kernels.matmul_grid(m, tokens, tile), inputs, m, k, raw.shape[1])
            assert np.allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
            print(f"    tiled {tile}: {ms:7.1f} ms CPU", flush=True)
    gpu.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--kernels", action="store_true", help="the matmul kernel rows instead of whole models")
    args = ap.parse_args()
    if args.kernels:
        kernel_rows(args.tokens)
        return 0
    for name in args.models.split(","):
        for variant in args.variants.split(","):
            r = asyncio.run(prefill(name, args.tokens, VARIANTS[variant]))
            print(f"{name:8s} {variant:20s} {args.tokens} tokens: {r['tok_s']:6.1f} tok/s wall, "
                  f"{r['tok_per_cpu_s']:6.1f} tok per CPU-s  [{r['adapter']}]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
