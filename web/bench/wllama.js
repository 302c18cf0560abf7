// The benchmark's peer: wllama (llama.cpp compiled to wasm, vendored by `pyshim setup`) runs the same
// GGUF from the dev server with the same prompts, greedy. playwright/bench.py calls
// window.wllamaBench.run(params) in a fresh page per run and reads the figures it returns.
//
// params: {model_url, n_threads, webgpu (false: CPU only), check_f16 (default true), load_timeout_ms,
//          n_ctx, prompts: [{name, text, max_tokens}]}
// result: {cross_origin_isolated, multithread, threads, webgpu, gpu_layers, n_layers, gpu_device, load_ms,
//          prompts: [{name, prompt_tokens, prefill_ms, prefill_tok_s, ttft_ms,
//                     decode_tokens, decode_ms, decode_tok_s, text}]}
//      or, with webgpu, when the adapter or wllama refuses: {refused: "why", adapter, log_tail}
//
// WebGPU is wllama's LoadModelParams.n_gpu_layers (its README, "WebGPU support"): 0 keeps the model on the
// CPU and skips the WebGPU device; any other value offloads that many layers (its default, 99999, all of
// them) to llama.cpp's WebGPU backend. That backend needs `shader-f16`; without it wllama does not fail,
// it quietly loads the model on the CPU (measured on SwiftShader) — so the page checks the adapter first
// and then reads llama.cpp's own log ("offloaded N/M layers to GPU") to know where the layers went.

import { Wllama } from "../vendor/wllama/index.js";

const WASM_URL = new URL("../vendor/wllama/wllama.wasm", import.meta.url).href;
const ALL_LAYERS = 99999;            // wllama's own default for n_gpu_layers: offload every layer
const ADAPTER_TIMEOUT_MS = 10_000;   // requestAdapter() answers in well under a second when it answers at all
const LOAD_TIMEOUT_MS = 300_000;     // a load that hangs in the WebGPU backend must not hang the benchmark
const LOG_TAIL = 12;                 // llama.cpp log lines kept with a refusal (those about devices first)
const DEVICE_LINE = /webgpu|gpu|device|model buffer/i;
const status = document.getElementById("status");

function withTimeout(promise, ms, what) {
  let timer;
  const timeout = new Promise((_, reject) => { timer = setTimeout(() => reject(new Error(`${what} did not finish within ${ms / 1000} s`)), ms); });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

// The page's WebGPU adapter, as llama.cpp's WebGPU backend would see it: {ok, reason, adapter}.
async function checkAdapter({ check_f16 }) {
  if (!navigator.gpu) return { ok: false, reason: "navigator.gpu is missing (WebGPU is off in this browser)" };
  let adapter;
  try {
    adapter = await withTimeout(navigator.gpu.requestAdapter(), ADAPTER_TIMEOUT_MS, "requestAdapter()");
  } catch (e) {
    return { ok: false, reason: String(e.message || e) };
  }
  if (!adapter) return { ok: false, reason: "requestAdapter() returned null" };
  const info = adapter.info || {};
  const brief = { vendor: info.vendor, architecture: info.architecture, description: info.description,
                  is_fallback: !!(info.isFallbackAdapter ?? adapter.isFallbackAdapter), features: [...adapter.features].sort() };
  const name = [brief.vendor, brief.architecture, brief.description].filter(Boolean).join(" ") || "this adapter";
  if (check_f16 && !adapter.features.has("shader-f16")) {
    return { ok: false, adapter: brief,
             reason: `the adapter (${name}) has no shader-f16, which llama.cpp's WebGPU backend requires` };
  }
  return { ok: true, adapter: brief };
}

// The log lines worth showing with a refusal: those about devices and buffers, else the last ones.
function logTail(lines) {
  const about = lines.filter((line) => DEVICE_LINE.test(line));
  return (about.length ? about : lines).slice(-LOG_TAIL);
}

// Where llama.cpp put the layers, from its load log: {gpu_layers, n_layers, gpu_device}.
function placement(lines) {
  const out = { gpu_layers: null, n_layers: null, gpu_device: null };
  for (const line of lines) {
    const offloaded = line.match(/offloaded (\d+)\/(\d+) layers to GPU/);
    if (offloaded) { out.gpu_layers = Number(offloaded[1]); out.n_layers = Number(offloaded[2]); }
    const device = line.match(/ggml_webgpu: adapter_info: (.*)/);
    if (device) out.gpu_device = device[1].trim();
  }
  return out;
}

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

async function run({ model_url, n_threads = 1, webgpu = false, check_f16 = true, load_timeout_ms = LOAD_TIMEOUT_MS,
                     n_ctx = 1024, prompts = [] }) {
  let adapter = null;
  if (webgpu) {
    status.textContent = "checking the WebGPU adapter…";
    const check = await checkAdapter({ check_f16 });
    adapter = check.adapter ?? null;
    if (!check.ok) return { refused: check.reason, adapter, log_tail: [] };
  }
  // With WebGPU, llama.cpp's log (INFO lines arrive as debug) is kept to see where the layers went.
  const log = [];
  const keep = (...args) => log.push(args.map(String).join(" "));
  const config = webgpu ? { suppressNativeLog: false, logger: { debug: keep, log: keep, warn: keep, error: keep } }
                        : { suppressNativeLog: true };
  const wllama = new Wllama({ default: WASM_URL }, config);
  const t0 = performance.now();
  status.textContent = `loading ${model_url}…`;
  const loading = wllama.loadModelFromUrl(new URL(model_url, location.href).href,
                                          { n_threads, n_gpu_layers: webgpu ? ALL_LAYERS : 0, n_ctx, useCache: false });
  if (!webgpu) {
    await loading;
  } else {
    try {
      await withTimeout(loading, load_timeout_ms, "wllama's model load with WebGPU");
    } catch (e) {
      return { refused: `wllama's WebGPU load failed: ${String(e.message || e).trim()}`, adapter, log_tail: logTail(log) };
    }
  }
  const placed = placement(log);
  if (webgpu && !placed.gpu_layers) {
    await wllama.exit().catch(() => {});
    const seen = placed.n_layers === null ? "llama.cpp logged no layer offload" : `offloaded 0/${placed.n_layers} layers`;
    return { refused: `wllama loaded the model on the CPU (${seen}): its WebGPU backend found no usable device`,
             adapter, log_tail: logTail(log) };
  }
  const result = {
    cross_origin_isolated: self.crossOriginIsolated,
    multithread: wllama.isMultithread(),
    threads: wllama.getNumThreads(),
    webgpu,
    ...(webgpu ? { ...placed, adapter } : {}),
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
