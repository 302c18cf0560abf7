// Booting Python: Pyodide from this site's vendor/ folder, numpy, and the vendored wheels (pyshim
// included). Used by the engine Worker, and usable in a page's main thread too (embedding, tests).

import { loadPyodide } from "../vendor/pyodide/pyodide.mjs";
import * as gpu from "./gpu.js";

const VENDOR = new URL("../vendor/", import.meta.url);

async function timed(timings, onStep, step, fn) {
  onStep({ step, state: "start" });
  const t0 = performance.now();
  const result = await fn();
  const ms = performance.now() - t0;
  timings.push({ step, ms });
  onStep({ step, state: "done", ms });
  return result;
}

export async function bootPython({ onStep = () => {}, stdout = () => {}, stderr = () => {} } = {}) {
  const timings = [];
  const t0 = performance.now();
  const manifest = await timed(timings, onStep, "manifest", async () => {
    const response = await fetch(new URL("manifest.json", VENDOR));
    if (!response.ok) {
      throw Object.assign(new Error(`vendor/manifest.json: HTTP ${response.status}`), {
        name: "SetupError", hint: "run `pyshim setup` on the server, then reload",
      });
    }
    return response.json();
  });
  const pyodide = await timed(timings, onStep, "pyodide", () =>
    loadPyodide({ indexURL: new URL("pyodide/", VENDOR).href, stdout, stderr }));
  // the browser GPU face's JavaScript half (pyshim/gpu/browser.py imports it by this name)
  pyodide.registerJsModule("pyshim_gpu_js", gpu);
  await timed(timings, onStep, "numpy", () => pyodide.loadPackage(manifest.pyodide_packages, { messageCallback: () => {} }));
  const urls = manifest.wheels.map((w) => new URL(w.url, VENDOR).href);
  // Calls into Python modules (pyimport), never Python source in a string. deps=False: micropip would
  // fail quietly on dependencies that are not reachable offline (the vendored set is complete).
  await timed(timings, onStep, "wheels", async () => {
    const micropip = pyodide.pyimport("micropip");
    try {
      await micropip.install.callKwargs(urls, { deps: false });
    } finally {
      micropip.destroy();
    }
  });
  const versions = await timed(timings, onStep, "import", async () => {
    const version = (name) => {
      const module = pyodide.pyimport(name);
      try { return name === "sys" ? module.version.split(" ")[0] : module.__version__; } finally { module.destroy(); }
    };
    pyodide.pyimport("gguf").destroy();      // imported now, so a broken wheel fails at boot, not at the first model
    return { pyshim: version("pyshim"), python: version("sys"), numpy: version("numpy"), jinja2: version("jinja2") };
  });
  return { pyodide, report: { timings, total_ms: performance.now() - t0, versions, pyodide: manifest.pyodide } };
}
