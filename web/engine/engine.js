// The engine interface: one object that pages, the site's own chat, the <pyshim-chat> element and the
// service worker's /v1 endpoint all talk to. It drives the engine Worker through EngineClient
// (client.js) and speaks OpenAI's shapes (openai.js).
//
//   await engine.load(model, {onProgress, context, signal})   store it (download if needed), then GPU
//   engine.select(storeId, {context})    use a stored model; it reaches the GPU on the first request,
//   or at once with await engine.warm() -> {load_ms, device, device_reason}
//   (both also take kvType: "auto" | "f32" | "f16" | "q8" | "q4", the KV cache — auto, the default, with
//    context null picks both from the GPU budget (pyshim/plan/auto.py) —, and arithmetic: null | "f32" | "int8",
//    the executor's route — null: the adapter's default; changing either reloads the GPU)
//   new Engine({rope}) / createEngine({rope}): {scaling: "none"|"linear"|"yarn", scale, yarnOrigCtx}, each
//    optional, overrides the GGUF's rope scaling as llama.cpp's --rope-scaling/--rope-scale/--yarn-orig-ctx do
//   new Engine({expertSlots}) / createEngine({expertSlots}): a mixture of experts keeps that many experts of
//    each layer on the GPU and streams the rest from the store (null: auto decides from the GPU budget);
//    {streamedLayers}: the last that many layers stream from the store through two rotating GPU buffers
//   new Engine({parallel}) / createEngine({parallel}): up to that many requests run at once, their decode
//    steps batched on the GPU (continuous batching; null: one at a time), sharing a KV cache in pages;
//    {kvPages}: how many pages of 16 positions (null: room for every request's whole context; fewer: a
//    request that finds none free fails with KVCacheFullError, the others run on)
//   new Engine({device}) / createEngine({device}): "gpu" (WebGPU), "cpu" (the WebAssembly engine,
//    web/engine/cpu.js) or "auto"/null (the CPU engine without an adapter, the GPU on a real one, the faster
//    of the two by a measured matvec on a software adapter: pyshim/serve/engine_choice.py);
//    select(model, {device}) changes it (the model reloads); stats().device says which runs and
//    stats().device_reason why; {threads}:
//    the CPU engine's threads (null: the cores, in a cross-origin isolated page; else one)
//   await engine.chat.completions.create({messages, model, temperature, top_p, max_tokens, stop, seed,
//                                         stream}, {signal})  -> chat.completion | async iterator of chunks
//   await engine.completions.create({prompt, ...}, {signal})  -> text_completion | async iterator
//   engine.abort()      stops the running request and everything queued behind it
//   engine.stats()      {model, context, kv_type, arithmetic, device, device_reason, running, queued, requests, last, load}
//   await engine.models.list()   OpenAI's model list
//   await engine.unload()        frees the GPU;  engine.terminate()  ends a Worker this engine started
//
// onProgress (load's, or the constructor's for everything) sees {phase, loaded, total, fraction,
// bytesPerSec, etaSec} (resolve.js progressOf), phases in this order: "boot" (Python and the GPU check);
// storing the model (../store/download.js, bytes): "header", "download", "verify" (and "repair" when the
// whole file's SHA-256 is wrong); "load" (its weights store -> GPU: bytes, bytesPerSec, etaSec), "compile"
// (the GPU programs' pipelines), "ready" (load() done); then on each request "prefill" (the prompt's
// tokens read before the first new one). A model only select()ed gets "load" and "compile" in its first
// request, before "prefill".
//
// Requests start in the order they were made, each in a sequence of its own: one at a time, or with
// {parallel: N} up to N at once (pyshim/serve/batching.py: each reply is the one it gets alone); the queue
// is the engine Worker's (pyshim/serve/scheduler.py), the one every page of a shared engine goes through. A request is validated before it is posted: bad ones reject at once with an
// APIError (status 400, OpenAI's error object in `body`), by the rules Python applies (protocol.js).

import { EngineClient } from "./client.js";
import * as openai from "./openai.js";
import { DEFINITIONS } from "./protocol.js";
import { ensureStored, locate, progressOf } from "./resolve.js";
import { budgetBytes } from "./fit.js";
import { createRemoteEngine } from "./remote.js";

// The Worker's loading and prompt events ("load-progress", "progress") in onProgress's shape; null for others.
function workerProgress(event, data) {
  if (event === "load-progress") {
    const bytesPerSec = data.elapsed_ms > 0 ? (1000 * data.done_bytes) / data.elapsed_ms : null;
    const etaSec = bytesPerSec ? (data.total_bytes - data.done_bytes) / bytesPerSec : null;
    return progressOf("load", data.done_bytes, data.total_bytes, { bytesPerSec, etaSec });
  }
  if (event === "progress") return progressOf(data.phase, data.done, data.total);
  return null;
}

// A queue of values one side pushes and the other iterates; `close(err)` ends it (with err, throws).
class Channel {
  #items = [];
  #waiters = [];
  #closed = false;
  #error = null;

  push(value) {
    const waiter = this.#waiters.shift();
    if (waiter) waiter.resolve({ value, done: false });
    else this.#items.push(value);
  }

  close(error = null) {
    this.#closed = true;
    this.#error = error;
    for (const w of this.#waiters.splice(0)) error ? w.reject(error) : w.resolve({ value: undefined, done: true });
  }

  next() {
    if (this.#items.length) return Promise.resolve({ value: this.#items.shift(), done: false });
    if (this.#closed) {
      const error = this.#error;
      this.#error = null;   // thrown once; afterwards the iterator is simply done
      return error ? Promise.reject(error) : Promise.resolve({ value: undefined, done: true });
    }
    return new Promise((resolve, reject) => this.#waiters.push({ resolve, reject }));
  }
}

// What a stream returns: an async iterator of chunks, with OpenAI's `controller` to stop it early.
class Stream {
  constructor(channel, controller) {
    this.controller = controller;
    this[Symbol.asyncIterator] = () => ({
      next: () => channel.next(),
      return: async () => {   // the consumer broke out of its loop: stop generating for it
        controller.abort();
        return { value: undefined, done: true };
      },
    });
  }
}

const abortError = () => new DOMException("the request was aborted", "AbortError");
export const DEFAULT_CONTEXT = DEFINITIONS.default_context;

export class Engine {
  #pending = new Set();        // AbortControllers of the requests made and not settled
  #started = new Set();        // those the Worker has taken out of its queue ("started" events)
  #ready = null;               // boot + GPU self-test, once
  #requests = 0;
  #last = null;
  #loadInfo = null;

  // `client`: an EngineClient to share (the site's own); without one the engine starts its own
  // Worker, or with `shared` connects to the origin's SharedWorker (shared.js): one Python, GPU device
  // and model for every page that asks for it. `onProgress`: default listener for download and load.
  constructor({ client = null, context = null, onProgress = null, shared = false, kvType = "auto", arithmetic = null,
    rope = null, expertSlots = null, streamedLayers = null, parallel = null, kvPages = null, device = null, threads = null } = {}) {
    this.client = client ?? new EngineClient(undefined, { shared });
    this.ownsClient = !client;
    this.context = context;
    this.kvType = kvType;
    this.arithmetic = arithmetic;
    this.rope = rope;
    this.expertSlots = expertSlots;
    this.streamedLayers = streamedLayers;
    this.parallel = parallel;
    this.kvPages = kvPages;
    this.device = device;
    this.threads = threads;
    this.onProgress = onProgress;
    this.model = null;   // {id, storeId, name, aliases}
    this.adapter = null;
    this.chat = { completions: { create: (body, options) => this.#chat(body, options) } };
    this.completions = { create: (body, options) => this.#complete(body, options) };
    this.models = { list: async () => openai.modelList(this.model ? [this.model.id] : []) };
  }

  // Python booted and the GPU checked, once per engine; the adapter is what "will it fit?" judges by.
  ready() {
    this.#ready ??= (async () => {
      await this.client.request("boot");
      if (this.device === "cpu") return null;
      let gpu;
      try {
        gpu = await this.client.request("gpu-selftest");
      } catch (err) {
        if (this.device === "gpu") throw err;
        this.adapter = null;      // no WebGPU here: models run on the CPU engine
        return null;
      }
      if (!gpu.ok) throw Object.assign(new Error("the GPU self-test failed: this adapter computes wrong results"), { name: "GPUError" });
      this.adapter = gpu.adapter;
      return gpu;
    })();
    this.#ready.catch(() => { this.#ready = null; });   // a failed start (a null adapter under load) may be retried
    return this.#ready;
  }

  // The load settings every model-using request carries (pyshim.plan.settings.RunSettings).
  #settings() {
    const rope = this.rope ?? {};
    return {
      context: Number(this.context) || null, kv_type: this.kvType, arithmetic: this.arithmetic || null,
      rope_scaling: rope.scaling ?? null, rope_scale: rope.scale ?? null, yarn_orig_ctx: rope.yarnOrigCtx ?? null,
      budget_bytes: this.kvType === "auto" ? Math.round(budgetBytes()) : null,   // what "auto" plans against
      expert_slots: this.expertSlots ?? null,
      streamed_layers: this.streamedLayers ?? null,
      parallel: this.parallel ?? null,
      kv_pages: this.kvPages ?? null,
      device: this.device ?? null,
      threads: this.threads ?? null,
    };
  }

  async load(model, { onProgress = this.onProgress, context = this.context, signal = null, kvType = this.kvType, arithmetic = this.arithmetic } = {}) {
    const t0 = performance.now();
    const where = await locate(model);   // an unknown name fails here, before Python boots
    onProgress?.(progressOf("boot", 0, null));
    await this.ready();
    const manifest = await ensureStored(where, { client: this.client, adapter: this.adapter, context, kvType, onProgress, signal });
    const stored = performance.now();
    this.select(manifest, { context: Math.min(context, manifest.probe?.context_length || context), id: model, kvType, arithmetic });
    if (signal?.aborted) throw abortError();
    await this.warm({ onProgress });
    this.#loadInfo = { store_ms: stored - t0, gpu_ms: performance.now() - stored };
    return this.model;
  }

  // The select()ed model onto the GPU now, with the settings select() gave, so that the first request finds
  // it there (the site's chat calls it while a message is being typed): {load_ms (0: it was loaded with
  // them already), device, device_reason, weights_kept (true: other settings of the model loaded before,
  // whose weights stayed on the GPU)}. Its phases go to onProgress, "load" and "compile" then "ready".
  async warm({ onProgress = this.onProgress } = {}) {
    if (!this.model) throw new Error("no model selected: call select() or load() first");
    const result = await this.client.request("load", { model_id: this.model.storeId, settings: this.#settings() }, {
      onEvent: (event, data) => {
        const progress = workerProgress(event, data);
        if (progress) onProgress?.(progress);
      },
    });
    onProgress?.(progressOf("ready", 1, 1));
    return result;
  }

  // Uses stored model `manifest` (or its id) from now on, without loading it yet: the Worker loads
  // it on the first request. `id` is the name requests and responses use (default: the store id).
  select(manifest, { context = this.context, id = null, kvType = this.kvType, arithmetic = this.arithmetic, device = this.device } = {}) {
    const storeId = typeof manifest === "string" ? manifest : manifest.id;
    const name = typeof manifest === "string" ? null : manifest.name;
    this.device = device;
    this.context = context;
    this.kvType = kvType;
    this.arithmetic = arithmetic;
    this.model = { id: id ?? storeId, storeId, name, aliases: [storeId, name].filter(Boolean) };
    return this.model;
  }

  async unload() {
    await this.client.request("unload");
    this.model = null;
  }

  abort() {
    for (const controller of this.#pending) controller.abort();
  }

  stats() {
    return {
      model: this.model?.id ?? null, context: this.context, kv_type: this.kvType, arithmetic: this.arithmetic,
      device: this.#last?.device ?? this.device ?? null, device_reason: this.#last?.device_reason ?? null, running: this.#started.size > 0, queued: this.#pending.size - this.#started.size,
      requests: this.#requests, last: this.#last, load: this.#loadInfo,
    };
  }

  terminate() {
    this.abort();
    if (this.ownsClient) this.client.terminate();
  }

  #models() {
    return this.model ? [{ id: this.model.id, aliases: this.model.aliases }] : [];
  }

  // One generation in the Worker: `kind` "generate" or "complete", token texts to `onText`. Aborting
  // tells the Worker: a running request stops (finish_reason "abort"), a waiting one never starts.
  async #generate(kind, params, controller, onText) {
    let requestId = null;
    const onAbort = () => {
      if (requestId != null) this.client.request("abort", { request_id: requestId });
    };
    controller.signal.addEventListener("abort", onAbort);
    try {
      if (controller.signal.aborted) return { text: "", finish_reason: "abort", usage: {}, timings: {} };
      const result = await this.client.request(kind, params, {
        onId: (id) => { requestId = id; },
        onEvent: (event, data) => {
          if (event === "started") this.#started.add(controller);
          else if (event === "token" && data.text) onText(data.text);
          else {
            const progress = workerProgress(event, data);
            if (progress) this.onProgress?.(progress);
          }
        },
      });
      this.#requests++;
      this.#last = { finish_reason: result.finish_reason, usage: openai.usageOf(result.usage), timings: result.timings ?? {}, compacted: Boolean(result.compacted), device: result.device ?? null,
        device_reason: result.device_reason ?? null };
      return result;
    } catch (err) {
      if (err?.name === "AbortedError") throw abortError();
      throw openai.errorFromEngine(err);
    } finally {
      controller.signal.removeEventListener("abort", onAbort);
      this.#started.delete(controller);
    }
  }

  // Posts a validated request (the Worker queues it); streams (an iterator of chunks) or answers with one object.
  #run({ kind, params, stream, signal, base, whole, piece, first }) {
    const controller = new AbortController();
    if (signal?.aborted) controller.abort();
    else signal?.addEventListener("abort", () => controller.abort(), { once: true });
    this.#pending.add(controller);
    const extra = (r) => ({ timings: r.timings ?? {}, compacted: Boolean(r.compacted), device: r.device ?? null,
      device_reason: r.device_reason ?? null, weights_kept: Boolean(r.weights_kept) });
    const job = (onText) => this.#generate(kind, params, controller, onText).finally(() => this.#pending.delete(controller));
    if (!stream) {
      return job(() => {}).then((r) => whole(base, { text: r.text, finish_reason: r.finish_reason, usage: r.usage,
        tool_calls: r.tool_calls ?? null, extra: extra(r) }));
    }
    const channel = new Channel();
    if (first) channel.push(first);
    job((text) => channel.push(piece(base, text))).then(
      (r) => {
        if (r.tool_calls?.length) channel.push(openai.chatChunk(base, openai.toolCallsDelta(r.tool_calls)));
        channel.push(piece(base, null, { finish_reason: r.finish_reason, usage: r.usage, extra: extra(r) }));
        channel.close();
      },
      (err) => channel.close(err));
    return new Stream(channel, controller);
  }

  async #chat(body, { signal = null } = {}) {
    const request = openai.validateChatRequest(body, { models: this.#models() });
    const base = openai.responseBase("chatcmpl", request.model);
    return this.#run({
      kind: "generate", stream: request.stream, signal, base,
      params: { model_id: this.model.storeId, settings: this.#settings(), messages: request.messages, sampling: openai.workerSampling(request) },
      whole: openai.chatCompletion,
      first: openai.chatChunk(base, { role: "assistant", content: "" }),
      piece: (b, text, last) => (last ? openai.chatChunk(b, {}, last) : openai.chatChunk(b, { content: text })),
    });
  }

  // Raw text completion through the Worker's `complete` kind (no chat template).
  async #complete(body, { signal = null } = {}) {
    const request = openai.validateCompletionRequest(body, { models: this.#models() });
    const base = openai.responseBase("cmpl", request.model);
    return this.#run({
      kind: "complete", stream: request.stream, signal, base,
      params: { model_id: this.model.storeId, settings: this.#settings(), prompt: request.prompt, sampling: openai.workerSampling(request) },
      whole: openai.textCompletion,
      first: null,
      piece: (b, text, last) => (last ? openai.textChunk(b, "", last) : openai.textChunk(b, text)),
    });
  }
}

// The public entry (re-exported by web/pyshim.js): an engine with its own Worker, with `model`
// stored (downloaded through the store when missing, with progress) and loaded onto the GPU.
// `shared`: use the origin's shared engine (see Engine); pages sharing one should ask for the same
// model and context, or each switch reloads the GPU. `baseURL` (with `apiKey`): `model` is served by
// that OpenAI-compatible server instead (remote.js): no Worker, no download, the same calls.
export async function createEngine({ model = null, context = null, onProgress = null, signal = null, shared = false,
  kvType = "auto", arithmetic = null, rope = null, expertSlots = null, streamedLayers = null, parallel = null, kvPages = null, baseURL = null,
  apiKey = null, device = null, threads = null } = {}) {
  if (baseURL) return createRemoteEngine({ baseURL, apiKey, model });
  const engine = new Engine({ context, onProgress, shared, kvType, arithmetic, rope, expertSlots, streamedLayers, parallel, kvPages, device, threads });
  if (model) {
    try {
      await engine.load(model, { onProgress, context, signal });
    } catch (err) {
      engine.terminate();
      throw err;
    }
  }
  return engine;
}
