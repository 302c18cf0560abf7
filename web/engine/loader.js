// The store side of loading a model in the engine Worker. Python (pyshim/serve/worker_api.py) decides what
// to read; this module reads it from IndexedDB: the header prefix and the few small tensors for Python,
// and every weight tensor IndexedDB chunk → queue.writeBuffer straight into the GPU buffer Python created
// for it (or, on the CPU engine, into its WebAssembly memory), so weights never pass through Pyodide's
// heap (memory stays near one chunk).

import * as store from "../store/store.js";
import * as cpu from "./cpu.js";

const WRITE_ALIGN = 4;          // writeBuffer wants offsets and sizes in whole 4-byte words
const PROGRESS_EVERY_MS = 100;
// The queue keeps each writeBuffer's bytes in staging memory until it has run the copy. Written without a
// pause, a large model's weights pile up there and the writes crawl: in headless Chromium (SwiftShader)
// 4.5 GiB in 16 MiB writes went in at about 1 GB/s for the first GiB, then at 75 MB/s (44 s in all).
// Waiting for the queue after every FLUSH_BYTES keeps the staging small: the same 4.5 GiB in 9 s. Loading
// Qwen2.5-7B's shape (4.7 GB), the peaks: renderer 2.1 -> 1.3 GB, GPU process 6.0 -> 5.1 GB (load 42 -> 37 s).
export const FLUSH_BYTES = 256 << 20;

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

// Each piece {slice, at, bytes} (store.slicePieces) into its GPU buffer, slice.buffer at slice.bufferOffset +
// at; the queue drained after every `flushBytes` written and at the end. onBytes(n) after each piece.
export async function writePieces(device, pieces, onBytes = () => {}, flushBytes = FLUSH_BYTES) {
  let pending = 0;
  for await (const { slice, at, bytes } of pieces) {
    writeAligned(device, slice.buffer, slice.bufferOffset + at, bytes);
    pending += bytes.length;
    if (pending >= flushBytes) {
      pending = 0;
      await device.queue.onSubmittedWorkDone();
    }
    onBytes(bytes.length);
  }
  await device.queue.onSubmittedWorkDone();
}

// The onBytes(n) of a load's upload of `slices`: "load-progress" {done_bytes, total_bytes, elapsed_ms} at most
// every PROGRESS_EVERY_MS and at the end (none when `quiet`).
function progress(emit, slices, quiet) {
  const total = slices.reduce((n, s) => n + s.size, 0);
  const t0 = performance.now();
  let done = 0;
  let lastReport = 0;
  return (n) => {
    done += n;
    const now = performance.now();
    if (!quiet && (now - lastReport > PROGRESS_EVERY_MS || done === total)) {
      lastReport = now;
      emit("load-progress", { done_bytes: done, total_bytes: total, elapsed_ms: now - t0 });
    }
  };
}

// The `store` Python's loader calls (worker_api's docstring has the contract). `emit(event, data)`
// reports "load-progress" {done_bytes, total_bytes, elapsed_ms} while the weights go to the GPU
// (elapsed_ms since the upload began: the page's MB/s).
export function storeAccess(emit) {
  return {
    readPrefix: (modelId, length) => store.readRange(modelId, 0, length),
    async readRanges(modelId, rangesJSON) {
      const wanted = JSON.parse(rangesJSON).map(([offset, size]) => ({ offset, size }));
      const buffers = new Map(wanted.map((s) => [s, new Uint8Array(s.size)]));
      for await (const { slice, at, bytes } of store.slicePieces(modelId, wanted)) buffers.get(slice).set(bytes, at);
      return wanted.map((s) => buffers.get(s));
    },
    // `quiet`: no "load-progress" (pyshim/serve/engine_choice.py's probe: one matrix, not the model's load)
    async upload(modelId, device, uploadsProxy, quiet = false) {
      // Pyodide lends the list for this call only (it destroys the proxy itself): read it before any await.
      const slices = uploadsProxy.toJs({ depth: 2 }).map(([offset, size, buffer, bufferOffset]) => ({ offset, size, buffer, bufferOffset }));
      await writePieces(device, store.slicePieces(modelId, slices), progress(emit, slices, quiet));
    },
    cpuEngine: (threads, wide = false) => cpu.instantiate(threads ?? null, { wide }),
    wasm64: cpu.memory64Supported(),
    async uploadCpu(modelId, engine, uploadsProxy, quiet = false) {
      // [file offset, size, pointer] each: the CPU engine's matrices, store -> its memory
      const slices = uploadsProxy.toJs({ depth: 2 }).map(([offset, size, ptr]) => ({ offset, size, ptr }));
      await engine.uploadFrom(store.slicePieces(modelId, slices), progress(emit, slices, quiet));
    },
    async stream(modelId, device, uploadsProxy) {
      // A streamed expert's ranges (pyshim.gpu.expert_cache), between GPU steps: only those bytes are read
      // from IndexedDB, and the writes are queued before the step that reads them (no wait here).
      const slices = uploadsProxy.toJs({ depth: 2 }).map(([offset, size, buffer, bufferOffset]) => ({ offset, size, buffer, bufferOffset }));
      for await (const { slice, at, bytes } of store.rangePieces(modelId, slices)) {
        writeAligned(device, slice.buffer, slice.bufferOffset + at, bytes);
      }
    },
  };
}

// A model named by URL: its store id, downloading it into the store first when it is not there
// (resumable; header first through `checkFit`, the Worker's probe). One loading path for everything, so a
// benchmark measures the load users get, and a second run of the same URL loads from IndexedDB.
export async function storedFromURL(url, checkFit, emit) {
  const created = await store.createFromURL(url);
  if (created.status === "ready") return { id: created.id, store_ms: 0 };
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

// The stored model's manifest, refusing one that is not fully stored.
export async function readyModel(modelId) {
  const manifest = await store.getModel(modelId);
  if (!manifest) {
    throw Object.assign(new Error("this model is not in the store (never stored, or deleted: perhaps in another tab)"),
      { name: "ModelNotFoundError", hint: "store it again, or pick another model" });
  }
  if (manifest.status !== "ready") {
    throw Object.assign(new Error("this model is not fully stored yet"), { name: "ModelNotReadyError", hint: "finish its download first" });
  }
  return manifest;
}
