// The engine Worker: hosts Pyodide, pyshim and (through Python) the WebGPU device, so the page never blocks.
//
// Protocol (see client.js): the page posts {id, kind, params}; the worker answers {id, ok: true, result}
// or {id, ok: false, error: {name, message, hint, param}}, and sends events as {id, event, data} (a
// request's own: "started", "token", "load-progress" {done_bytes, total_bytes, elapsed_ms}, "progress"
// {phase: "compile" | "prefill", done, total} (pipelines built while loading; the prompt's tokens read
// before the first new one), "store-progress") or {event, data} (broadcast: boot steps, stdout).
// Params are plain JSON objects whose shapes pyshim/serve/protocol.py defines; Python's side of every
// kind is one module, pyshim.serve.worker_api, called here with JSON text — no Python source lives in
// this file. Everything is loaded from this site's vendor/ folder: no request leaves it.
//
// Kinds: boot, gpu-selftest, read-header {url}, probe-bytes {bytes, file_size, context, kv_type,
// budget_bytes, limits, judge}, store-digest {model_id, offset, size}, capabilities, load {model_id,
// settings}, unload, generate {model_id, messages, settings, sampling}, complete {model_id | model_url,
// prompt | prompt_ids, stop_token_ids, settings, sampling}, score {model_id | model_url, text | ids,
// settings, top_k}, bench {model_id | model_url, prompt | prompt_ids, settings, max_tokens, ignore_eos,
// kernels}, abort {request_id}, stats, exec {code} (tests: Python source from the test, not from here).
// Results: worker_api's docstrings. Requests that use the model queue in Python (one model, one KV cache).

import { bootPython } from "./python.js";
import { memory64Supported } from "./cpu.js";
import { readyModel, storeAccess, storedFromURL } from "./loader.js";
import { growHeader } from "../store/header.js";
import { grammarAccess } from "./grammar.js";

const SITE_ROOT = new URL("../", import.meta.url);  // relative URLs in requests are relative to the site

let pyodide = null;
let api = null;          // the pyshim.serve.worker_api module (a PyProxy)
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
  api = pyodide.pyimport("pyshim.serve.worker_api");
  api.use_grammar(grammarAccess);      // constrained decoding (response_format) through XGrammar's wasm
  return booted.report;
}

async function ready() {
  booting ??= boot();
  await booting;
  return api;
}

// A worker_api call: JSON text back, or the envelope {__error__: {name, message, hint, param}} of a
// PyshimError (anything else thrown in Python is a bug and arrives as a PythonError).
async function call(fn, ...args) {
  const out = JSON.parse(await (await ready())[fn](...args));
  if (out && out.__error__) throw Object.assign(new Error(out.__error__.message), out.__error__);
  return out;
}

// (the CPU engine's limit, for a page without WebGPU, depends on whether this browser has memory64)
const probe = (bytes, request) => call("probe", bytes, JSON.stringify({ ...request, wasm64: memory64Supported() }));

// "Will it fit?" for a download's gate (store/download.js): the Worker's probe, judged against `limits`.
const checkFit = (request) => async (prefix, size) => {
  const summary = await probe(prefix, { ...request, file_size: size, judge: true });
  if (summary.need !== undefined) return summary;
  if (summary.refused) throw Object.assign(new Error(summary.refused.message), { ...summary.refused, refusal: true });
  return { ok: summary.fit.ok, reasons: summary.fit.reasons, summary };
};

// This worker's adapter limits, for "will it fit?" of the models it downloads itself (null: no WebGPU).
let limits = null;
const adapterLimits = () => (limits ??= call("selftest").then((gpu) => gpu.adapter.limits, () => null));

// The request's model, by store id or by URL (stored first: resumable, checked); then the call.
async function withModel(fn, params, id, extra = null) {
  const events = (event, data) => self.postMessage({ id, event, data: typeof data === "string" ? JSON.parse(data) : data });
  let { model_id, model_url, ...rest } = params;
  let store_ms = 0;
  if (!model_id) {
    if (!model_url) throw Object.assign(new Error("name the model by model_id (a store id) or model_url"), { name: "BadRequestError", param: "model_id" });
    const context = rest.settings?.context ?? null;
    ({ id: model_id, store_ms } = await storedFromURL(new URL(model_url, SITE_ROOT).href,
      checkFit({ context, kv_type: rest.settings?.kv_type ?? "auto", limits: await adapterLimits(),
        budget_bytes: rest.settings?.budget_bytes ?? null, streamed_layers: rest.settings?.streamed_layers ?? null,
        expert_slots: rest.settings?.expert_slots ?? null }), events));
  }
  const manifest = await readyModel(model_id);
  const result = await call(fn, JSON.stringify({ ...rest, model_id }), manifest.size, storeAccess(events), id, events);
  if (store_ms && result.timings) result.timings.store_ms = store_ms;
  return extra ? { ...result, ...extra(store_ms) } : result;
}

const handlers = {
  async boot() {
    booting ??= boot();
    return booting;
  },
  async "gpu-selftest"() {
    return call("selftest");
  },
  // Reads a GGUF header from the start of `url` with Range requests, fetching only as much as the header
  // needs (store/header.js), and returns Python's summary of it (architecture, sizes, memory).
  async "read-header"({ url }) {
    url = new URL(url, SITE_ROOT).href;
    let fileSize = null;
    let fetched = 0;
    const readPrefix = async (length) => {
      const response = await fetch(url, { headers: { Range: `bytes=0-${length - 1}` } });
      if (!response.ok) throw Object.assign(new Error(`${url}: HTTP ${response.status}`), { name: "FetchError" });
      const bytes = new Uint8Array(await response.arrayBuffer());
      fileSize = response.status === 200 ? bytes.length : Number((response.headers.get("Content-Range") ?? "").split("/")[1]) || null;
      fetched = bytes.length;
      return bytes;
    };
    const { answer, rounds } = await growHeader(readPrefix, null, (bytes) => probe(bytes, { file_size: fileSize }));
    if (answer.refused) throw Object.assign(new Error(answer.refused.message), answer.refused);
    return { ...answer, fetched_bytes: fetched, rounds };
  },
  // "Will it fit?" from header bytes the page already holds (the store's first chunk): Python's probe
  // summary, {need: n} when the header runs past the bytes given, or {refused: {name, message, hint}};
  // with `judge`, the verdict `fit` against the adapter's `limits` and the memory budget.
  async "probe-bytes"({ bytes, ...request }) {
    return probe(bytes instanceof Uint8Array ? bytes : new Uint8Array(bytes), request);
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
  // What this worker can do; the page shows chat as unavailable until `generate` is true.
  async capabilities() {
    return { kinds: Object.keys(handlers), generate: true };
  },
  async load(params, id) {
    return withModel("load", params, id);
  },
  async unload(params, id) {
    return call("unload", id);
  },
  // Streams a reply ("token" events {text, token, index}); resolves with {text, finish_reason, usage,
  // timings, compacted}. An aborted generation resolves with finish_reason "abort".
  async generate(params, id) {
    return withModel("generate", params, id);
  },
  async complete(params, id) {
    return withModel("complete", params, id);
  },
  async score(params, id) {
    return withModel("score", params, id);
  },
  async bench(params, id) {
    return withModel("bench", params, id, (store_ms) => ({ store_ms }));
  },
  // Stops request `request_id` (running, queued, or still on its way).
  async abort(params) {
    return call("abort", JSON.stringify(params));
  },
  async stats() {
    return call("stats");
  },
  // Runs Python source from the caller and returns the JSON its last expression holds (tests, debugging).
  async exec({ code }) {
    await ready();
    const out = await pyodide.runPythonAsync(code);
    return out === undefined ? null : JSON.parse(out);
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
  return { name, message, hint: err?.hint ?? null, param: err?.param ?? null };
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
