// Which file a model name means, and getting it into the store (web/store) the way the site does:
// header first ("will it fit?"), then the chunks, resumable, each hashed, the whole file checked
// against its known SHA-256.
//
// A name is, in this order: a store id ("url:…", "file:…"); a URL or site path (anything with "://",
// a leading "/" or "./", or ending in .gguf); a short name from pyshim's catalog ("smollm2") or a
// file the dev server lists (/api/models, by id or name). Short names work without the dev server
// too: `pyshim setup` places those files under the site's models/.

import * as store from "../store/store.js";
import { StoreError } from "../store/errors.js";
import { KNOWN_FILES, expectedSha256 } from "../ui/catalog.js";
import { budgetBytes } from "./fit.js";
import { APIError } from "./openai.js";

const SITE = new URL("../", import.meta.url);

const fileName = (url) => decodeURIComponent(new URL(url).pathname.split("/").pop() || "");
const stem = (file) => file.replace(/\.gguf$/i, "");
const looksLikeURL = (s) => /^[a-z][a-z0-9+.-]*:\/\//i.test(s) || /^\.{0,2}\//.test(s) || /\.gguf([?#]|$)/i.test(s);

async function serverModels() {
  try {
    const response = await fetch(new URL("api/models", SITE));
    return response.ok ? ((await response.json()).models ?? []).filter((m) => !m.error) : [];
  } catch {
    return [];   // no dev server here, or offline: short names still resolve to the site's models/
  }
}

// -> {id} for a model already in the store, else {url, name}.
export async function locate(spec) {
  if (typeof spec !== "string" || !spec) {
    throw new APIError(400, `a model must be named by a non-empty string, got ${JSON.stringify(spec)}`, { param: "model" });
  }
  if (await store.getModel(spec)) return { id: spec };
  if (looksLikeURL(spec)) {
    const url = new URL(spec, SITE).href;
    return { url, name: stem(fileName(url)) };
  }
  const known = KNOWN_FILES.find((k) => k.short === spec.toLowerCase() || k.file === spec || stem(k.file) === spec);
  const listed = await serverModels();
  const entry = listed.find((m) => (known ? m.id === known.file : m.id === spec || m.name === spec));
  if (entry) return { url: new URL(entry.url, SITE).href, name: entry.name };
  if (known) return { url: new URL(`models/${known.file}`, SITE).href, name: stem(known.file) };
  const names = [...KNOWN_FILES.map((k) => k.short), ...listed.map((m) => m.name)];
  throw new APIError(404, `unknown model ${JSON.stringify(spec)}`, {
    param: "model", code: "model_not_found", hint: `use one of ${names.join(", ")}, a .gguf URL, or a stored model's id`,
  });
}

// "Will it fit?" for download()'s gate: Python's probe (through the engine Worker's probe-bytes) of the
// header bytes at `context` positions (capped at the model's own), judged there against the adapter's
// limits and the memory budget. Answers {need} while the header runs past the bytes given, else {ok,
// reasons, needBytes, budgetBytes, limits, summary}; a file that is not a usable GGUF throws an error
// marked `refusal`. `adapter`: gpu-selftest's adapter dict (null without WebGPU); `kvType`: the KV cache
// type it will run with (auto — the default, as the engine's: the plan pyshim.plan.auto makes, streaming
// included —, f32, f16, q8, q4); `stream`: the streaming the settings name ({streamed_layers, expert_slots}).
export async function checkFit(client, adapter, context, prefix, size, kvType = "auto", stream = {}) {
  const budget = budgetBytes();
  const summary = await client.request("probe-bytes", {
    bytes: prefix, file_size: size, context, kv_type: kvType, budget_bytes: budget, limits: adapter?.limits ?? null, judge: true,
    streamed_layers: stream.streamed_layers ?? null, expert_slots: stream.expert_slots ?? null,
  });
  if (summary.need !== undefined) return summary;
  if (summary.refused) {
    const { name, message, hint } = summary.refused;
    // PyshimError's text already ends with " — hint"; the UI shows the hint on its own line.
    const text = hint && message.endsWith(` — ${hint}`) ? message.slice(0, -hint.length - 3) : message;
    throw Object.assign(new StoreError(name, text, hint), { refusal: true });
  }
  const { fit } = summary;
  // engine "cpu": no adapter, so the WebAssembly engine runs it, judged against its own memory (Python's budget_bytes)
  const engine = fit.engine ?? "gpu";
  return { ok: fit.ok, reasons: fit.reasons, needBytes: fit.need_bytes, budgetBytes: engine === "cpu" ? fit.budget_bytes : budget,
    limits: adapter?.limits ?? null, engine, summary };
}

// Progress in one shape for every phase: {phase, loaded, total, fraction, bytesPerSec, etaSec}.
export function progressOf(phase, loaded, total, extra = {}) {
  return { phase, loaded, total, fraction: total ? loaded / total : null, ...extra };
}

// The model `where` (locate's answer) stored and verified, downloading what is missing -> its manifest.
export async function ensureStored(where, { client, adapter, context, kvType = "auto", onProgress = null, signal = null }) {
  const manifest = where.id ? await store.getModel(where.id)
    : await store.createFromURL(where.url, { name: where.name, expectedSha256: expectedSha256(fileName(where.url)) });
  if (manifest.status === "ready") return manifest;
  return store.download(manifest.id, {
    signal,
    checkFit: (prefix, size) => checkFit(client, adapter, context, prefix, size, kvType),
    onProgress: (p) => onProgress?.(progressOf(p.phase, p.doneBytes, p.totalBytes, { bytesPerSec: p.bytesPerSec, etaSec: p.etaSec })),
  });
}
