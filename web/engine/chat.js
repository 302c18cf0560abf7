// The chat engine behind generation.js: loads a stored model into the GPU and streams replies.
//
// Loading follows Python's plan (pyshim/serve/worker_api.py): the header and the few small tensors go to
// Python; every weight tensor goes IndexedDB chunk → queue.writeBuffer straight into the GPU buffer
// Python created for it, so weights never pass through the wasm heap (memory stays near one chunk).

import * as store from "../store/store.js";

const WRITE_ALIGN = 4;   // writeBuffer wants offsets and sizes in whole 4-byte words

async function headerPrefix(manifest, py) {
  // The header is at the start of the file; read growing prefixes until Python can parse it.
  let length = Math.min(manifest.size, 1 << 20);
  for (;;) {
    const prefix = await store.readRange(manifest.id, 0, length);
    py.globals.set("_prefix", prefix);
    const need = py.runPython(
      "from pyshim.gguf.header import read_header, NeedMoreBytes\n" +
      `try:\n    read_header(_prefix.to_bytes(), file_size=${manifest.size}); _need = 0\n` +
      "except NeedMoreBytes as _e:\n    _need = _e.suggested\n_need");
    py.globals.delete("_prefix");
    if (!need) return prefix;
    if (length >= manifest.size) throw Object.assign(new Error("the file ends inside its GGUF header"), { name: "TruncatedError" });
    length = Math.min(manifest.size, Math.max(need, 2 * length));
  }
}

function writeAligned(device, buffer, offset, bytes) {
  if (offset % WRITE_ALIGN) throw Object.assign(new Error(`unaligned weight upload at ${offset}`), { name: "UploadError" });
  const whole = bytes.length - (bytes.length % WRITE_ALIGN);
  if (whole) device.queue.writeBuffer(buffer, offset, bytes, 0, whole);
  if (whole < bytes.length) {   // a tensor's last few bytes: pad to a word (its buffer is sized in words)
    const tail = new Uint8Array(WRITE_ALIGN);
    tail.set(bytes.subarray(whole));
    device.queue.writeBuffer(buffer, offset + whole, tail);
  }
}

// How a model is set up on the GPU besides its context: `arithmetic` "f32" | "int8" forces the executor's
// route (null: the adapter's default, int8 on CPU adapters); `kv_type` "f32" | "f16" | "q8" the KV cache.
export const setupOf = (params) => ({ arithmetic: params?.arithmetic ?? null, kv_type: params?.kv_type ?? "f32" });

// What session.loaded_key() holds for a model loaded so: "<id>@<context>", then "#<arithmetic>" when
// forced and "~<kv_type>" when not f32.
export const loadKey = (modelId, context, { arithmetic = null, kv_type = "f32" } = {}) =>
  `${modelId}@${context}${arithmetic ? `#${arithmetic}` : ""}${kv_type !== "f32" ? `~${kv_type}` : ""}`;

// Also used by runs.js (complete, score, bench): one loaded model, shared. `setup`: see setupOf.
export async function loadModel(py, modelId, context, emit, setup = setupOf(null)) {
  const manifest = await store.getModel(modelId);
  if (!manifest || manifest.status !== "ready") {
    throw Object.assign(new Error("this model is not fully stored yet"), { name: "ModelNotReadyError", hint: "finish its download first" });
  }
  const session = py.pyimport("pyshim.serve.worker_api");
  const prefix = await headerPrefix(manifest, py);
  const small = session.small_ranges(prefix, manifest.size).toJs();
  const ranges = [];
  const wanted = small.map(([offset, size]) => ({ offset, size }));
  const buffers = new Map(wanted.map((s) => [s, new Uint8Array(s.size)]));
  for await (const { slice, at, bytes } of store.slicePieces(modelId, wanted, manifest)) buffers.get(slice).set(bytes, at);
  for (const [s, bytes] of buffers) ranges.push([s.offset, bytes]);

  const loaded = await session.load(loadKey(modelId, context, setup), prefix, manifest.size, ranges, context, setup.arithmetic, setup.kv_type);
  const [device, uploads] = loaded.toJs({ depth: 2 });
  loaded.destroy();
  const slices = uploads.map((u) => {
    const [offset, size, buffer, bufferOffset] = u.toJs ? u.toJs() : u;
    return { offset, size, buffer, bufferOffset };
  });
  const total = slices.reduce((n, s) => n + s.size, 0);
  let done = 0;
  let lastReport = 0;
  for await (const { slice, at, bytes } of store.slicePieces(modelId, slices, manifest)) {
    writeAligned(device, slice.buffer, slice.bufferOffset + at, bytes);
    done += bytes.length;
    if (performance.now() - lastReport > 100 || done === total) {
      lastReport = performance.now();
      emit("load-progress", { done_bytes: done, total_bytes: total });
    }
  }
  await device.queue.onSubmittedWorkDone();
  await session.finish_load();
  session.destroy();
}

// Loads stored model `modelId` with a `context`-position KV cache unless the GPU holds it already;
// returns the milliseconds it took (0 when it was there). The Worker's `load` kind calls it too.
// `setup`: the arithmetic and KV type (setupOf); a model loaded otherwise is loaded again.
export async function ensureLoaded(py, modelId, context, emit, setup = setupOf(null)) {
  const session = py.pyimport("pyshim.serve.worker_api");
  const loaded = session.loaded_key() === loadKey(modelId, context, setup);
  session.destroy();
  if (loaded) return 0;
  const t0 = performance.now();
  await loadModel(py, modelId, context, emit, setup);
  return performance.now() - t0;
}

// Returns the generation.js engine: ({params, emit, signal}) -> result.
export function chatEngine(ensurePython) {
  return async ({ params, emit, signal }) => {
    const py = await ensurePython();
    const loadMs = await ensureLoaded(py, params.model_id, params.context, emit, setupOf(params));
    const session = py.pyimport("pyshim.serve.worker_api");
    let index = 0;
    const onText = (text, token) => emit("token", { text, token, index: index++ });
    const shouldStop = () => signal.aborted;
    const out = await session.chat(JSON.stringify(params.messages), JSON.stringify(params.sampling ?? {}), onText, shouldStop);
    session.destroy();
    const result = JSON.parse(out);
    result.timings.load_ms = loadMs;
    return result;
  };
}
