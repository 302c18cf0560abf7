// Chat generation in the engine Worker: the protocol is fixed here, the engine behind it is not
// wired yet (the WebGPU executor lands separately). Until then `available()` is false and
// `generate` refuses with EngineUnavailableError, which the page shows as "engine not available yet".
//
// generate params:
//   {model_id,                       the model store id (web/store); the worker loads it on first use
//    messages: [{role, content}],     "system" | "user" | "assistant"; the chat template comes from the GGUF
//    context,                         KV cache positions (default: the page's setting)
//    sampling: {temperature, top_p, top_k, max_tokens, seed}}   temperature 0 = greedy
// events while it runs (posted with the request's id):
//   "load-progress" {done_bytes, total_bytes}   weights streaming from IndexedDB into GPU buffers
//   "token"         {text, token, index}        text is UTF-8-safe (a split character waits for its rest)
// result: {text, finish_reason, usage: {prompt_tokens, completion_tokens},
//          timings: {load_ms, prefill_ms, ttft_ms, decode_tok_per_s}, compacted: bool}
// abort {request_id}: the running generate resolves (not rejects) with finish_reason "abort".

const running = new Map();   // request id -> AbortController

export function available() {
  return false;
}

export async function generate(id, params, emit) {
  const controller = new AbortController();
  running.set(id, controller);
  try {
    throw Object.assign(new Error("text generation is not wired into the browser engine yet"), {
      name: "EngineUnavailableError",
      hint: "models can already be downloaded and checked; chat arrives with the WebGPU executor",
    });
  } finally {
    running.delete(id);
  }
}

export function abort(requestId) {
  const controller = running.get(requestId);
  controller?.abort();
  return Boolean(controller);
}
