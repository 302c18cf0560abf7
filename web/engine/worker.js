// The engine Worker: hosts Pyodide, pyshim and (through Python) the WebGPU device, so the page never blocks.
//
// Protocol (see client.js): the page posts {id, kind, params}; the worker answers
// {id, ok: true, result} or {id, ok: false, error: {name, message, hint}}, and sends progress as
// {event, data} messages. Everything is loaded from this site's vendor/ folder: no request leaves it.

import { bootPython } from "./python.js";

let pyodide = null;
let booting = null;

function emit(event, data) {
  self.postMessage({ event, data });
}

async function boot() {
  const booted = await bootPython({
    onStep: (step) => emit("boot-step", step),
    stdout: (s) => emit("stdout", s),
    stderr: (s) => emit("stderr", s),
  });
  pyodide = booted.pyodide;
  return booted.report;
}

// Python calls answer with JSON strings, so nothing crosses the boundary as a proxy that could leak.
async function runPython(code) {
  const out = await pyodide.runPythonAsync(code);
  return out === undefined ? null : JSON.parse(out);
}

const handlers = {
  async boot() {
    booting ??= boot();
    return booting;
  },
  async "gpu-selftest"() {
    await handlers.boot();
    return runPython("import json\nfrom pyshim.gpu.selftest import selftest\njson.dumps(await selftest())");
  },
  // Runs Python source in the worker and returns the JSON its last expression holds (tests, debugging).
  async exec({ code }) {
    await handlers.boot();
    return runPython(code);
  },
};

function errorFields(err) {
  // Python exceptions arrive as PythonError whose message is the traceback; keep its last line.
  let name = err?.name ?? "Error";
  let message = String(err?.message ?? err);
  if (name === "PythonError") {
    const last = message.trim().split("\n").pop();
    const m = last.match(/^([\w.]+): (.*)$/s);
    if (m) [name, message] = [m[1].split(".").pop(), m[2]];
  }
  return { name, message, hint: err?.hint ?? null };
}

self.onmessage = async (e) => {
  const { id, kind, params } = e.data;
  const handler = handlers[kind];
  try {
    if (!handler) throw Object.assign(new Error(`unknown request kind ${kind}`), { name: "BadRequestError" });
    const result = await handler(params ?? {});
    self.postMessage({ id, ok: true, result });
  } catch (err) {
    self.postMessage({ id, ok: false, error: errorFields(err) });
  }
};
