// Raw-prompt requests in the engine Worker (Python side: pyshim/serve/runs.py). The model is the chat's
// (chat.js ensureLoaded): one model on the GPU at a time, shared by chat and these kinds, kept between
// requests; the requests themselves run one at a time (generation.track).
//
// Every kind names its model by `model_id` (a store id) or `model_url`. A URL goes through the store:
// downloaded once into IndexedDB (Range chunks, hashed, resumable; header first through Python's probe),
// then loaded IndexedDB → GPU along Python's upload plan like any stored model. One loading path for
// everything, so `bench` measures the load users get, and a second run of the same URL loads from disk.
// `context` (KV positions) defaults to the loaded model's when it is the same model, else DEFAULT_CONTEXT.
// `arithmetic` ("f32" | "int8", optional) forces the executor's route (on CPU adapters int8 is the default,
// matching the reference's llama.cpp emulation; f32 matches the plain reference); results say which ran.
//
// complete {model_id | model_url, context, arithmetic?, prompt (string) | prompt_ids (int list), stop_token_ids?,
//           sampling: {temperature, top_p, top_k, min_p, max_tokens, seed, stop: [strings], ignore_eos,
//                      repetition_penalty, presence_penalty, frequency_penalty}}
//   events  {id, event: "token", data: {text, token, index}}   (text UTF-8-safe; the last piece has token -1)
//           {id, event: "load-progress" | "store-progress", data: {...}}
//   result  {text, token_ids, finish_reason: "stop" | "length" | "abort", arithmetic: "f32" | "int8",
//            usage: {prompt_tokens, completion_tokens, total_tokens},
//            timings: {load_ms, store_ms?, prefill_ms, ttft_ms, decode_ms, decode_tok_per_s, cpu_ms}}
//            cpu_ms: the part of decode_ms not spent awaiting the GPU (Python, FFI, encoding)
//   aborted like generate: abort {request_id} resolves it with finish_reason "abort".
// score    {model_id | model_url, context, arithmetic?, text | ids, top_k = 10}
//   result  {ids, top_ids, top_logits, top_logprobs, arithmetic}   row i: the top-k predicted after ids[..i]
// bench    {model_url | model_id, context, prompt | prompt_ids, max_tokens, ignore_eos = true}
//   result  {prompt_tokens, load_ms, ttft_ms, prefill_ms, decode_tokens, decode_ms, decode_tok_per_s,
//            cpu_ms, cpu_share (= cpu_ms / decode_ms), text, peak_gpu_bytes, planned_gpu_bytes}
//            greedy, as playwright/bench_engines.py reads it; peak = allocated so far, planned = pyshim.plan.memory

import * as store from "../store/store.js";
import { ensureLoaded, setupOf } from "./chat.js";
import { track } from "./generation.js";

const SITE_ROOT = new URL("../", import.meta.url);
const DEFAULT_CONTEXT = 2048;   // KV positions when the request names none and another model is loaded
const PROGRESS_EVERY_MS = 100;

const badRequest = (message, hint = null) => Object.assign(new Error(message), { name: "BadRequestError", hint });

// A model URL's store id, downloading it into the store first when it is not there (resumable).
async function storedFromURL(url, probe, emit) {
  const created = await store.createFromURL(new URL(url, SITE_ROOT).href);
  if (created.status === "ready") return { id: created.id, store_ms: 0 };
  const checkFit = async (prefix, size) => {
    const summary = await probe(prefix, size);
    if (summary.need !== undefined) return summary;
    if (summary.refused) return { ok: false, reasons: [summary.refused.message], summary };
    return { ok: true, reasons: [], summary };
  };
  let last = 0;
  const onProgress = (p) => {
    if (performance.now() - last < PROGRESS_EVERY_MS) return;
    last = performance.now();
    emit("store-progress", { done_bytes: p.doneBytes, total_bytes: p.totalBytes, phase: p.phase });
  };
  const t0 = performance.now();
  const ready = await store.download(created.id, { checkFit, onProgress });
  if (ready.status !== "ready") {
    throw Object.assign(new Error(ready.error?.message ?? `the model could not be stored (${ready.status})`),
      { name: ready.error?.name ?? "ModelNotReadyError", hint: ready.error?.hint ?? null });
  }
  return { id: ready.id, store_ms: performance.now() - t0 };
}

// Loads the request's model unless it is the loaded one; returns {load_ms, store_ms}.
async function ensureModel(py, params, probe, emit) {
  let modelId = params.model_id;
  let storeMs = 0;
  if (!modelId) {
    if (!params.model_url) throw badRequest("name the model by model_id (a store id) or model_url");
    ({ id: modelId, store_ms: storeMs } = await storedFromURL(params.model_url, probe, emit));
  }
  let context = params.context;
  if (context == null) {   // the loaded model's own context when it is this model (chat.js loadKey)
    const session = py.pyimport("pyshim.serve.worker_api");
    const loaded = (session.loaded_key() ?? "").match(/^(.*)@(\d+)(#\w+)?(~\w+)?$/);
    session.destroy();
    context = loaded && loaded[1] === modelId ? Number(loaded[2]) : DEFAULT_CONTEXT;
  }
  return { load_ms: await ensureLoaded(py, modelId, context, emit, setupOf(params)), store_ms: storeMs };
}

// Calls pyshim.serve.runs.<fn>(request JSON, ...extra) and parses its JSON answer.
async function callRuns(py, fn, request, ...extra) {
  const runs = py.pyimport("pyshim.serve.runs");
  try {
    return JSON.parse(await runs[fn](JSON.stringify(request), ...extra));
  } finally {
    runs.destroy();
  }
}

const modelless = ({ model_id, model_url, context, arithmetic, kv_type, ...rest }) => rest;

// The handlers worker.js adds to its own. ensurePython() -> pyodide (booted); probe(prefix, size) ->
// Python's header summary (the worker's probe-bytes).
export function runHandlers({ ensurePython, probe }) {
  return {
    async complete(params, id) {
      const emit = (event, data) => self.postMessage({ id, event, data });
      return track(id, async (signal) => {
        const py = await ensurePython();
        const { load_ms, store_ms } = await ensureModel(py, params, probe, emit);
        let index = 0;
        const onText = (text, token) => emit("token", { text, token, index: index++ });
        const result = await callRuns(py, "complete", modelless(params), onText, () => signal.aborted);
        result.timings.load_ms = load_ms;
        if (store_ms) result.timings.store_ms = store_ms;
        return result;
      });
    },
    async score(params, id) {
      const emit = (event, data) => self.postMessage({ id, event, data });
      return track(id, async () => {
        const py = await ensurePython();
        await ensureModel(py, params, probe, emit);
        return callRuns(py, "score", modelless(params));
      });
    },
    async bench(params, id) {
      const emit = (event, data) => self.postMessage({ id, event, data });
      return track(id, async () => {
        const py = await ensurePython();
        const { load_ms, store_ms } = await ensureModel(py, params, probe, emit);
        return { ...(await callRuns(py, "bench", modelless(params))), load_ms, store_ms };
      });
    },
  };
}
