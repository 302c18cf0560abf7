// Chat generation in the engine Worker: the protocol is fixed here; the engine behind it plugs in
// with install(). Until one is installed `available()` is false and `generate` refuses with
// EngineUnavailableError, which the page shows as "chat is not available".
//
// generate params:
//   {model_id,                       the model store id (web/store); the engine loads it on first use,
//                                    reading weights with store.slicePieces (see worker "store-digest")
//    messages: [{role, content}],     "system" | "user" | "assistant"; the chat template comes from the GGUF
//    context,                         KV cache positions (the page's setting)
//    sampling: {temperature, top_p, top_k, max_tokens, seed}}   temperature 0 = greedy; seed null = random
// events while it runs (posted as {id, event, data} with the request's id):
//   "load-progress" {done_bytes, total_bytes}   weights streaming from IndexedDB into GPU buffers
//   "token"         {text, token, index}        text is UTF-8-safe (a split character waits for its rest)
// result: {text, finish_reason: "stop" | "length" | "abort", usage: {prompt_tokens, completion_tokens},
//          timings: {load_ms, prefill_ms, ttft_ms, decode_tok_per_s}, compacted: bool}
// abort {request_id}: the running generate resolves (it does not reject) with finish_reason "abort".

const running = new Map();   // request id -> AbortController
let engine = null;           // async ({params, emit, signal}) -> result, from install()

// The engine's entry point: `impl({params, emit(event, data), signal})` streams with emit, checks
// signal.aborted between tokens, and returns the result above.
export function install(impl) {
  engine = impl;
}

export function available() {
  return engine !== null;
}

export async function generate(id, params, emit) {
  if (!engine) {
    throw Object.assign(new Error("text generation is not wired into the browser engine yet"), {
      name: "EngineUnavailableError",
      hint: "models can already be downloaded and checked; chat arrives with the WebGPU executor",
    });
  }
  return track(id, (signal) => engine({ params, emit, signal }));
}

// Runs `work(signal)` as request `id`, abortable by abort(id). Requests that use the engine share one
// model and one KV cache, so they run one after another in arrival order (runs.js uses this too).
let queue = Promise.resolve();
export function track(id, work) {
  const controller = new AbortController();
  running.set(id, controller);
  const turn = queue.then(() => work(controller.signal));
  queue = turn.catch(() => {});
  return turn.finally(() => running.delete(id));
}

export function abort(requestId) {
  const controller = running.get(requestId);
  controller?.abort();
  return Boolean(controller);
}
