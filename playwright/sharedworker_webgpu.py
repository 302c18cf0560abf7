"""Does WebGPU work inside a SharedWorker in this Chromium? (the question behind one engine per page
versus one engine shared by every page of the origin; see web/engine/engine.js)

Opens two pages of the dev server's origin and connects both to one SharedWorker (the same script URL),
which requests an adapter and a device once, then for each page runs a small compute shader on that
device, reads the result back and opens IndexedDB. Prints one JSON line: per page, whether it worked,
the milliseconds, and how many pages the worker serves (2 on the second: one device for both). Run: .venv/bin/python playwright/sharedworker_webgpu.py
"""

from __future__ import annotations

import json

import harness

N = 1 << 20   # floats written by the shader and checked on readback

WORKER_JS = r"""
let connections = 0;
let shared = null;   // {adapter, device}: requested once, used for every page
onconnect = async (e) => {
  const port = e.ports[0];
  const out = {navigator_gpu: Boolean(self.navigator.gpu), connections: ++connections};
  try {
    const t0 = performance.now();
    shared ??= await navigator.gpu.requestAdapter().then(async (adapter) => ({adapter, device: await adapter.requestDevice()}));
    const { adapter, device } = shared;
    out.adapter = adapter.info?.architecture || adapter.info?.vendor || "?";
    const n = N_VALUES;
    const module = device.createShaderModule({code: `@group(0) @binding(0) var<storage, read_write> a: array<f32>;
      @compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3u) { a[g.x] = f32(g.x) * 2.0; }`});
    const pipeline = device.createComputePipeline({layout: "auto", compute: {module, entryPoint: "main"}});
    const buffer = device.createBuffer({size: n * 4, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC});
    const readback = device.createBuffer({size: n * 4, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
    const bindGroup = device.createBindGroup({layout: pipeline.getBindGroupLayout(0), entries: [{binding: 0, resource: {buffer}}]});
    const encoder = device.createCommandEncoder();
    const pass = encoder.beginComputePass();
    pass.setPipeline(pipeline); pass.setBindGroup(0, bindGroup); pass.dispatchWorkgroups(n / 64); pass.end();
    encoder.copyBufferToBuffer(buffer, 0, readback, 0, n * 4);
    device.queue.submit([encoder.finish()]);
    await readback.mapAsync(GPUMapMode.READ);
    const v = new Float32Array(readback.getMappedRange());
    out.correct = v[12345] === 24690 && v[n - 1] === (n - 1) * 2;
    out.ms = Math.round(performance.now() - t0);
    out.indexeddb = await new Promise((resolve) => { const r = indexedDB.open("sharedworker-probe"); r.onsuccess = () => resolve(true); r.onerror = () => resolve(false); });
  } catch (err) {
    out.error = String(err);
  }
  port.postMessage(out);
};
""".replace("N_VALUES", str(N))

# The first page makes the script's blob URL; the second connects to the same URL, so the same worker.
CONNECT_JS = """async ([code, url]) => {
  url ??= URL.createObjectURL(new Blob([code], {type: 'text/javascript'}));
  const worker = new SharedWorker(url, {name: 'probe'});
  const out = await new Promise((resolve) => { worker.port.onmessage = (e) => resolve(e.data); worker.port.start(); });
  return {...out, url};
}"""


def main() -> int:
    from playwright.sync_api import sync_playwright

    with harness.DevServer() as server, sync_playwright() as p:
        browser = harness.launch_chromium(p)
        context = browser.new_context()
        results, url = [], None
        for _ in range(2):
            page, _watch = harness.open_page(context, server.url + "api/health")
            results.append(page.evaluate(CONNECT_JS, [WORKER_JS, url]))
            url = results[-1].pop("url")
        print(json.dumps({"chromium": browser.version, "pages": results}))
        browser.close()
    return 0 if all(r.get("correct") for r in results) and results[-1]["connections"] == 2 else 1


if __name__ == "__main__":
    raise SystemExit(main())
