// Booting Python: Pyodide from this site's vendor/ folder, numpy, and the vendored wheels (pyshim
// included). Used by the engine Worker, and usable in a page's main thread too (embedding, tests).

import { loadPyodide } from "../vendor/pyodide/pyodide.mjs";

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
  await timed(timings, onStep, "numpy", () => pyodide.loadPackage(manifest.pyodide_packages, { messageCallback: () => {} }));
  const urls = manifest.wheels.map((w) => new URL(w.url, VENDOR).href);
  await timed(timings, onStep, "wheels", async () => {
    pyodide.globals.set("_wheel_urls", pyodide.toPy(urls));
    await pyodide.runPythonAsync("import micropip\nawait micropip.install(_wheel_urls, deps=False)\ndel _wheel_urls");
  });
  const versions = await timed(timings, onStep, "import", async () => JSON.parse(await pyodide.runPythonAsync(
    "import json, sys, numpy, gguf, jinja2, pyshim\n" +
    "json.dumps({'pyshim': pyshim.__version__, 'python': sys.version.split()[0], 'numpy': numpy.__version__, 'jinja2': jinja2.__version__})")));
  return { pyodide, report: { timings, total_ms: performance.now() - t0, versions, pyodide: manifest.pyodide } };
}
