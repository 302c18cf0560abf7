// The benchmark's peer: wllama (llama.cpp compiled to wasm, vendored by `pyshim setup`) runs the same
// GGUF from the dev server with the same prompts, greedy. playwright/bench.py calls
// window.wllamaBench.run(params) in a fresh page per run and reads the figures it returns.
//
// params: {model_url, n_threads, n_gpu_layers (0 = CPU only; wllama offloads to WebGPU by default),
//          n_ctx, prompts: [{name, text, max_tokens}]}
// result: {cross_origin_isolated, multithread, threads, load_ms,
//          prompts: [{name, prompt_tokens, prefill_ms, prefill_tok_s, ttft_ms,
//                     decode_tokens, decode_ms, decode_tok_s, text}]}

import { Wllama } from "../vendor/wllama/index.js";

const WASM_URL = new URL("../vendor/wllama/wllama.wasm", import.meta.url).href;
const status = document.getElementById("status");

async function complete(wllama, { text, max_tokens }) {
  const t0 = performance.now();
  let ttft = null;
  let out = "";
  let timings = null;
  await wllama.createCompletion({
    prompt: text,
    max_tokens,
    temperature: 0,
    top_k: 1,
    ignore_eos: true,        // the same token count on every engine, whatever the text says
    cache_prompt: false,     // each prompt is prefilled from scratch
    stream: true,
    onData: (chunk) => {
      const piece = chunk.choices?.[0]?.text ?? "";
      if (piece && ttft === null) ttft = performance.now() - t0;
      out += piece;
      if (chunk.timings) timings = chunk.timings;
    },
  });
  if (!timings) throw new Error("wllama returned no timings");
  return {
    prompt_tokens: timings.prompt_n,
    prefill_ms: timings.prompt_ms,
    prefill_tok_s: timings.prompt_per_second,
    ttft_ms: ttft,
    // llama.cpp counts the first sampled token in predicted_n; it comes out of the prefill pass.
    decode_tokens: timings.predicted_n,
    decode_ms: timings.predicted_ms,
    decode_tok_s: timings.predicted_per_second,
    wall_ms: performance.now() - t0,
    text: out,
  };
}

async function run({ model_url, n_threads = 1, n_gpu_layers = 0, n_ctx = 1024, prompts = [] }) {
  const wllama = new Wllama({ default: WASM_URL }, { suppressNativeLog: true });
  const t0 = performance.now();
  status.textContent = `loading ${model_url}…`;
  await wllama.loadModelFromUrl(new URL(model_url, location.href).href, { n_threads, n_gpu_layers, n_ctx, useCache: false });
  const result = {
    cross_origin_isolated: self.crossOriginIsolated,
    multithread: wllama.isMultithread(),
    threads: wllama.getNumThreads(),
    n_gpu_layers,
    load_ms: performance.now() - t0,
    prompts: [],
  };
  for (const p of prompts) {
    status.textContent = `running ${p.name}…`;
    result.prompts.push({ name: p.name, ...(await complete(wllama, p)) });
  }
  await wllama.exit();
  status.textContent = "done";
  return result;
}

window.wllamaBench = { run };
status.textContent = "ready";
