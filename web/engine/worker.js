// The engine Worker: hosts Pyodide, pyshim and (through Python) the WebGPU device, so the page never blocks.
//
// Protocol (see client.js): the page posts {id, kind, params}; the worker answers
// {id, ok: true, result} or {id, ok: false, error: {name, message, hint}}, and sends progress as
// {event, data} messages. Everything is loaded from this site's vendor/ folder: no request leaves it.

import { bootPython } from "./python.js";
import * as generation from "./generation.js";
import { chatEngine } from "./chat.js";
import { runHandlers } from "./runs.js";
import { lifecycleKinds } from "./lifecycle.js";

const SITE_ROOT = new URL("../", import.meta.url);  // relative URLs in requests are relative to the site
const HEADER_FIRST_FETCH = 1 << 20;  // most headers fit; a 262k-token vocabulary needs ~6 MB
const HEADER_MAX_ROUNDS = 8;

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

generation.install(chatEngine(async () => {
  await handlers.boot();
  return pyodide;
}));

const handlers = {
  async boot() {
    booting ??= boot();
    return booting;
  },
  async "gpu-selftest"() {
    await handlers.boot();
    return runPython("import json\nfrom pyshim.gpu.selftest import selftest\njson.dumps(await selftest())");
  },
  // Reads a GGUF header from the start of `url` with Range requests, fetching only as much as the
  // header needs, and returns Python's summary of it (architecture, sizes, memory).
  async "read-header"({ url }) {
    await handlers.boot();
    url = new URL(url, SITE_ROOT).href;
    let length = HEADER_FIRST_FETCH;
    for (let round = 0; round < HEADER_MAX_ROUNDS; round++) {
      const response = await fetch(url, { headers: { Range: `bytes=0-${length - 1}` } });
      if (!response.ok) throw Object.assign(new Error(`${url}: HTTP ${response.status}`), { name: "FetchError" });
      const fileSize = Number((response.headers.get("Content-Range") ?? "").split("/")[1]) || null;
      const bytes = new Uint8Array(await response.arrayBuffer());
      pyodide.globals.set("_prefix", bytes);
      pyodide.globals.set("_file_size", fileSize);
      const out = await runPython("import json\nfrom pyshim.plan.probe import probe\n" +
        "_r = json.dumps(probe(_prefix.to_py(), _file_size))\ndel _prefix, _file_size\n_r");
      if (out.need === undefined) return { ...out, fetched_bytes: bytes.length, rounds: round + 1 };
      if (response.status === 200 || (fileSize !== null && bytes.length >= fileSize)) {
        throw Object.assign(new Error("the file ends inside its GGUF header"), { name: "TruncatedError" });
      }
      length = Math.max(out.need, 2 * length);
    }
    throw Object.assign(new Error("the GGUF header is implausibly large"), { name: "GGUFFormatError" });
  },
  // "Will it fit?" from header bytes the page already holds (the model store's first chunk): Python's
  // probe summary at `context` positions, {need: n} when the header runs past the bytes given, or
  // {refused: {name, message, hint}}.
  async "probe-bytes"({ bytes, file_size = null, context = null, kv_type = "f32" }) {
    await handlers.boot();
    pyodide.globals.set("_prefix", bytes instanceof Uint8Array ? bytes : new Uint8Array(bytes));
    pyodide.globals.set("_probe_args", pyodide.toPy({ file_size, context, kv_type }));
    // A file pyshim cannot use (not GGUF, truncated, unsupported) answers {refused: {name, message, hint}};
    // anything else that goes wrong in Python is a bug and stays an error.
    return runPython("import json\nfrom pyshim.errors import PyshimError\nfrom pyshim.plan.probe import probe\n_a = _probe_args\n" +
      "try:\n    _r = probe(_prefix.to_py(), _a['file_size'], context=_a['context'], kv_type=_a['kv_type'])\n" +
      "except PyshimError as _e:\n    _r = {'refused': {'name': type(_e).__name__, 'message': str(_e), 'hint': _e.hint}}\n" +
      "del _prefix, _probe_args, _a\njson.dumps(_r)");
  },
  // SHA-256 of bytes [offset, offset + size) of a stored model, read in this worker through
  // store.slicePieces, chunk by chunk: the path the GPU loader takes (each piece -> queue.writeBuffer).
  async "store-digest"({ model_id, offset, size }) {
    const { slicePieces } = await import("../store/store.js");
    const { Sha256 } = await import("../store/sha256.js");
    const hash = new Sha256();
    let pieces = 0;
    for await (const { bytes } of slicePieces(model_id, [{ offset, size }])) {
      hash.update(bytes);
      pieces++;
    }
    return { sha256: hash.hex(), pieces };
  },
  // What this worker can do now; the page shows chat as unavailable until `generate` is true.
  async capabilities() {
    return { kinds: Object.keys(handlers), generate: generation.available() };
  },
  // Streams a reply: events {id, event: "token", data: {text, token, index}}, then the result
  // {text, finish_reason: "stop" | "length" | "abort", usage: {prompt_tokens, completion_tokens},
  //  timings: {load_ms, prefill_ms, ttft_ms, decode_tok_per_s}}. See generation.js for params.
  async generate(params, id) {
    return generation.generate(id, params, (event, data) => self.postMessage({ id, event, data }));
  },
  // Stops the generation started by request `request_id`; it resolves with finish_reason "abort".
  async abort({ request_id }) {
    return { aborted: generation.abort(request_id) };
  },
  // Runs Python source in the worker and returns the JSON its last expression holds (tests, debugging).
  async exec({ code }) {
    await handlers.boot();
    return runPython(code);
  },
};
Object.assign(handlers, lifecycleKinds(async () => { await handlers.boot(); return pyodide; }));

// complete, score, bench: raw prompts on the loaded model (runs.js has their protocol).
Object.assign(handlers, runHandlers({
  ensurePython: async () => { await handlers.boot(); return pyodide; },
  probe: (bytes, file_size) => handlers["probe-bytes"]({ bytes, file_size }),
}));

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
    const result = await handler(params ?? {}, id);
    self.postMessage({ id, ok: true, result });
  } catch (err) {
    self.postMessage({ id, ok: false, error: errorFields(err) });
  }
};
