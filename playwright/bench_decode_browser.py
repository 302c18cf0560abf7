"""Decode on the GPU executor inside the site's engine Worker (Pyodide + WebGPU; SwiftShader here), with
the adapter's streaming roofline measured in the same Worker: tok/s, weights/s, efficiency, host time.

    .venv/bin/python playwright/bench_decode_browser.py [--int8 auto|on|off|both] [smollm2 gemma3 ...]

The Worker fetches the model from the dev server into its heap (a stand-in for the site's IndexedDB
upload path), loads it with pyshim.exec.gpu_runner.load_gpu, prefills 16 tokens and times 8 greedy steps
(argmax on the GPU, 4 bytes read back). `submit_ms` is the Python + FFI cost of encoding one step; `cpu_ms_per_step` a whole greedy step's time
outside GPU waits (Python, FFI, encoding, the token's writes and readback).
`--int8`: the executor's default (auto), the int8 matvecs on or off, or both one after the other (the
same page and minute, for a before/after).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "playwright"))

import harness  # noqa: E402

ROOFLINE_MIB = 64
STEPS = 8
TTFT_PROMPT = 37        # the site's first chat turn with its template is about this long

CODE = """
import json, statistics, time
import numpy as np
from js import fetch
from pyshim.gguf.header import read_header
from pyshim.gguf.tensors import BufferSource
from pyshim.gpu.kernels import PARAMS, WG, KernelCache, groups
from pyshim.exec.gpu_runner import load_gpu
from pyshim.exec.runner import Step, Want
from pyshim.gpu.shaderc import ShaderKey
from pyshim.plan.settings import RunSettings

data = (await (await fetch("/models/{fname}")).arrayBuffer()).to_bytes()
runner = await load_gpu(header=read_header(data, file_size=len(data)), source=BufferSource(data),
                        settings=RunSettings(context=64, arithmetic={arithmetic!r}))
dev = runner.device

async def greedy(ids, start):
    return (await runner.step(Step.of(ids, start, want=Want.ARGMAX)))[0].token

# roofline: the plain vec4 f32 read-and-reduce, (T(2r) - T(r)) / r
nbytes = {mib} << 20
src = dev.buffer(nbytes, label="stream")
dev.write(src, np.ones(nbytes // 4, np.float32))
threads = groups(nbytes // 16, 256)
out = dev.buffer(threads * 4, label="out")
p = dev.buffer(16, label="p", uniform=True)
dev.write(p, PARAMS["stream"].pack(n4=nbytes // 16, per_thread=256))
pipe = await runner.ops.kernels.get(ShaderKey.of("stream", WG=WG))
d = [(pipe, dev.bind_group(pipe, [src, out, p]), (groups(threads), 1, 1))]
async def run(count):
    t0 = time.perf_counter(); dev.submit(d * count); await dev.read(out, 4); return time.perf_counter() - t0
await run(1)
t_roof = max(statistics.median([await run(4) for _ in range(3)]) - statistics.median([await run(2) for _ in range(3)]), 1e-9) / 2
src.destroy()

tok = await greedy(list(range(100, 116)), 0)
p0 = time.perf_counter()
tok = await greedy(list(range(100, 116)), 0)      # the prefill again, its program built
prefill = time.perf_counter() - p0
ttft = []              # first token of a TTFT_PROMPT-token prompt: with its program built, then again
for _ in range(2):
    p0 = time.perf_counter()
    await greedy(list(range(200, 200 + {ttft_prompt})), 0)
    ttft.append(time.perf_counter() - p0)
tok = await greedy([tok], 16)
t0, w0 = time.perf_counter(), dev.read_wait_s
for i in range({steps}):
    tok = await greedy([tok], 17 + i)
step = (time.perf_counter() - t0) / {steps}
cpu_step = step - (dev.read_wait_s - w0) / {steps}
prog = await runner.program(1, Want.ARGMAX)
h0 = time.perf_counter()
dev.replay(prog.encoded)
submit = time.perf_counter() - h0
await dev.read(prog.argmax, 4)
elements = sum(int(np.prod(w.shape)) for w in runner.ops.slots.slots.values())
roof_gbs, roof_gel = nbytes / t_roof / 1e9, nbytes / 4 / t_roof / 1e9
gbs, gel = runner.weight_bytes / step / 1e9, elements / step / 1e9
json.dumps({{"adapter": dev.caps.summary(), "int8": runner.ops.policy.int8, "prefill_tok_s": 16 / prefill, "ttft_s": ttft, "roofline_GBps": roof_gbs, "roofline_Gelem_s": roof_gel,
            "tok_s": 1 / step, "step_ms": step * 1e3, "weights_GBps": gbs, "weights_Gelem_s": gel,
            "efficiency_pct": 100 * max(gbs / roof_gbs, gel / roof_gel), "dispatches": len(prog.ready),
            "submit_ms": submit * 1e3, "cpu_ms_per_step": cpu_step * 1e3, "host_share_pct": 100 * submit / step}})
"""


def main() -> int:
    from playwright.sync_api import sync_playwright

    from pyshim.setup import vendoring
    from pyshim.setup.catalog import resolve_model

    args = sys.argv[1:]
    mode = "auto"
    if args[:1] == ["--int8"]:
        mode, args = args[1], args[2:]
    choices = {"auto": [None], "on": ["int8"], "off": ["f32"], "both": ["f32", "int8"]}[mode]
    names = args or ["smollm2"]
    vendoring.refresh_pyshim()           # the Worker installs pyshim from this checkout's wheel
    with harness.DevServer() as server, sync_playwright() as p:
        browser = harness.launch_chromium(p)
        page, _ = harness.open_page(browser.new_context(), server.url)
        harness.wait_for_boot(page)
        for name, arithmetic in [(n, c) for n in names for c in choices]:
            code = CODE.format(fname=resolve_model(name).name, mib=ROOFLINE_MIB, steps=STEPS, arithmetic=arithmetic, ttft_prompt=TTFT_PROMPT)
            r = harness.engine_request(page, "exec", {"code": code}, timeout_ms=900_000)
            print(f"{name} (int8 {r['int8']}) on {r['adapter']}: prefill {r['prefill_tok_s']:.2f} tok/s, first token of {TTFT_PROMPT} in {r['ttft_s'][0]:.1f} s (new program) / {r['ttft_s'][1]:.1f} s; {r['tok_s']:.2f} tok/s ({r['step_ms']:.0f} ms/token), weights "
                  f"{r['weights_GBps']:.3f} GB/s = {r['weights_Gelem_s']:.3f} G/s; roofline {r['roofline_GBps']:.2f} GB/s = "
                  f"{r['roofline_Gelem_s']:.3f} G f32/s; efficiency {r['efficiency_pct']:.0f}%; {r['dispatches']} dispatches, "
                  f"submit {r['submit_ms']:.2f} ms ({r['host_share_pct']:.1f}% of the step), CPU side of a step {r['cpu_ms_per_step']:.2f} ms")
            print(json.dumps(r))
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
