// Getting a model into the store: header first ("will it fit?"), then the missing chunks, a few in
// flight at once, each hashed and written atomically, then (when a checksum is known) the whole file
// verified and any chunk that arrived corrupted fetched again.
//
// Resuming is the normal path, not a special one: a download always fetches exactly the chunks the
// manifest does not yet list, so a reload, a dropped connection or a closed tab lose at most the
// chunks that were in flight.

import * as db from "./db.js";
import { StoreError, RETRYABLE, errorRecord, formatBytes } from "./errors.js";
import { sha256Hex } from "./sha256.js";
import { openURL, readChunk, chunkSpan } from "./sources.js";
import { growHeader } from "./header.js";
import { checkQuota } from "./quota.js";
import { chunkBytes, wholeFileSha256 } from "./read.js";

export const CONCURRENCY = 3;         // chunks in flight: enough to hide latency, little memory (3 × 16 MiB)
const MAX_TRIES = 4;                  // per chunk, for retryable failures
const RETRY_DELAY_MS = 500;           // doubled after each failed try

const sleep = (ms, signal) => new Promise((resolve, reject) => {
  const t = setTimeout(resolve, ms);
  signal?.addEventListener("abort", () => { clearTimeout(t); reject(signal.reason); }, { once: true });
});

const missingChunks = (m) => m.chunks.flatMap((sha, i) => (sha ? [] : [i]));
export const storedBytes = (m) => (m.chunks ?? []).reduce((n, sha, i) => n + (sha ? chunkSpan(m, i).end - chunkSpan(m, i).start : 0), 0);

// One download at a time per model, across tabs (a second tab would fetch the same chunks). `wait`: when
// another tab holds it, say so (`onBusy`) and queue for it instead of failing. A tab that was closed or
// reloaded lets go a moment after it is gone, so a resume that starts as a page opens can find it still
// held; and when the other tab is really downloading, this one takes over if it stops, or finds the model
// ready when it is done. `signal` ends the wait (Pause).
async function withModelLock(id, fn, { wait = false, signal = null, onBusy = null } = {}) {
  if (!navigator.locks) return fn();
  const name = `pyshim-model:${id}`;
  const busy = Symbol("busy");
  const result = await navigator.locks.request(name, { ifAvailable: true }, (lock) => (lock ? fn() : busy));
  if (result !== busy) return result;
  if (!wait) throw new StoreError("BusyError", "this model is already downloading in another pyshim tab", "watch it there, or close that tab");
  onBusy?.();
  return navigator.locks.request(name, signal ? { signal } : {}, () => fn());
}

class Progress {
  constructor(manifest, onProgress) {
    this.onProgress = onProgress;
    this.total = manifest.size;
    this.done = storedBytes(manifest);
    this.t0 = performance.now();
    this.fetched = 0;   // bytes fetched in this session: the rate ignores what was stored before
  }
  report(phase, manifest, extra = {}) {
    const seconds = (performance.now() - this.t0) / 1000;
    const rate = seconds > 0.2 ? this.fetched / seconds : null;
    const eta = rate ? (this.total - this.done) / rate : null;
    this.onProgress?.({ id: manifest.id, phase, doneBytes: this.done, totalBytes: this.total, bytesPerSec: rate, etaSec: eta, chunkCount: manifest.chunks.length, ...extra });
  }
}

async function readVerified(manifest, index, opts) {
  let delay = RETRY_DELAY_MS;
  for (let attempt = 1; ; attempt++) {
    try {
      const bytes = await readChunk(manifest, index, opts);
      const sha = await sha256Hex(bytes);
      const expected = manifest.expectedChunks?.[index];
      if (expected && expected !== sha) {
        throw new StoreError("ShortReadError", `chunk ${index} arrived corrupted (SHA-256 ${sha.slice(0, 12)}…, expected ${expected.slice(0, 12)}…)`);
      }
      return { bytes, sha };
    } catch (err) {
      if (!RETRYABLE.has(err.name) || attempt >= MAX_TRIES) throw err;
      opts.onRetry?.(index, err);
      await sleep(delay, opts.signal);
      delay *= 2;
    }
  }
}

async function storeChunk(manifest, index, opts, progress) {
  const { bytes, sha } = await readVerified(manifest, index, opts);
  let updated;
  try {
    updated = await db.putChunk(manifest.id, index, bytes, sha);
  } catch (err) {
    if (err?.name === "QuotaExceededError") {
      throw new StoreError("QuotaError", `the browser refused to store more of ${manifest.name}: its storage quota is full`,
        `free at least ${formatBytes(manifest.size - progress.done)} (delete stored models, or free disk space), then resume`);
    }
    throw err;
  }
  if (!updated) throw new StoreError("DeletedError", `${manifest.name} was deleted during the download`);
  progress.done += bytes.byteLength;
  progress.fetched += bytes.byteLength;
  return updated;
}

// The first `need` bytes of the file, from stored chunks (fetching the ones still missing).
async function headerBytes(manifest, need, opts, progress) {
  const last = Math.ceil(Math.min(need, manifest.size) / manifest.chunkSize);
  for (let i = 0; i < last; i++) {
    if (!manifest.chunks[i]) manifest = await storeChunk(manifest, i, opts, progress);
  }
  const out = new Uint8Array(Math.min(need, manifest.size));
  for (let i = 0; i < last; i++) {
    const { start, end } = chunkSpan(manifest, i);
    out.set(await chunkBytes(manifest, i, 0, Math.min(end, out.length) - start), start);
  }
  return { manifest, bytes: out };
}

// Asks `checkFit(prefix, size)` about a growing prefix of the stored chunks until it has enough header
// (store/header.js): it answers {need} or a verdict {ok, reasons, summary}; a verdict with ok false is a
// refusal, and so is an error it throws with `refusal: true` (the file is not a usable GGUF). Other
// errors are failures, not verdicts.
async function fitCheck(manifest, checkFit, opts, progress) {
  const readPrefix = async (need) => {
    let bytes;
    ({ manifest, bytes } = await headerBytes(manifest, need, opts, progress));
    progress.report("header", manifest);
    return bytes;
  };
  const { answer } = await growHeader(readPrefix, manifest.size, (bytes) => checkFit(bytes, manifest.size), { first: manifest.chunkSize });
  return { manifest, verdict: answer };
}

async function refuse(manifest, error) {
  // Keep the manifest (the UI shows why) but not the bytes: a refused model is never downloaded.
  for (const i of manifest.chunks.keys()) if (manifest.chunks[i]) await db.dropChunk(manifest.id, i);
  return db.updateManifest(manifest.id, (m) => { m.status = "refused"; m.error = errorRecord(error); });
}

async function fetchMissing(manifest, opts, progress, concurrency) {
  const queue = missingChunks(manifest);
  const inner = new AbortController();   // one fatal failure stops the other runners
  const stop = () => inner.abort(opts.signal?.reason);
  opts.signal?.addEventListener("abort", stop, { once: true });
  const runOpts = { ...opts, signal: inner.signal };
  let latest = manifest;
  const runner = async () => {
    while (queue.length) {
      const index = queue.shift();
      latest = await storeChunk(latest, index, runOpts, progress);
      progress.report("download", latest);
    }
  };
  try {
    await Promise.all(Array.from({ length: Math.min(concurrency, queue.length) }, () => runner().catch((err) => { stop(); throw err; })));
  } finally {
    opts.signal?.removeEventListener("abort", stop);
  }
  return db.getManifest(manifest.id);
}

// After a whole-file mismatch with no per-chunk reference: fetch every chunk again and, where the
// new copy differs from the stored one, a third time; two equal copies out of three win.
async function repair(manifest, opts, progress) {
  const replaced = [];
  for (let i = 0; i < manifest.chunks.length; i++) {
    const again = await readVerified(manifest, i, opts);
    progress.report("repair", manifest, { chunk: i });
    if (again.sha === manifest.chunks[i]) continue;
    const third = await readVerified(manifest, i, opts);
    if (third.sha === again.sha) {
      manifest = await db.putChunk(manifest.id, i, third.bytes, third.sha);
      replaced.push(i);
    } else if (third.sha !== manifest.chunks[i]) {
      throw new StoreError("ChecksumError", `chunk ${i} of ${manifest.name} differs on every download`, "the server's copy is unstable; try again later");
    }
  }
  return { manifest, replaced };
}

async function verify(manifest, opts, progress) {
  if (!manifest.expectedSha256) return db.updateManifest(manifest.id, (m) => { m.status = "ready"; m.error = null; });
  await db.updateManifest(manifest.id, (m) => { m.status = "verifying"; });
  const onChunk = (i) => progress.report("verify", manifest, { chunk: i });
  let sha = await wholeFileSha256(manifest.id, { onChunk });
  if (sha !== manifest.expectedSha256 && manifest.source.kind === "url") {
    const { replaced } = await repair(manifest, opts, progress);
    opts.onRepair?.(replaced);
    if (replaced.length) sha = await wholeFileSha256(manifest.id, { onChunk });
  }
  if (sha !== manifest.expectedSha256) {
    throw new StoreError("ChecksumError", `${manifest.name} has SHA-256 ${sha}, but ${manifest.expectedSha256} was expected`,
      "the file is not the one the catalog describes: delete it, and check the source");
  }
  return db.updateManifest(manifest.id, (m) => { m.status = "ready"; m.sha256 = sha; m.error = null; });
}

// Brings model `id` (created by createFromURL/createFromFile) to "ready", or throws. Options:
//   checkFit(prefix, size) -> {need} | {ok, reasons, summary}   (required: the "will it fit?" gate)
//   file (the File for an import), signal, onProgress(p), onRetry(index, err), onRepair(indices),
//   concurrency, whenBusy ("fail": a BusyError while another tab downloads it; "wait": onBusy(), then queue
//   behind that tab, see withModelLock), onBusy().
export async function download(id, { checkFit, file = null, signal = null, onProgress = null, onRetry = null, onRepair = null,
                                     concurrency = CONCURRENCY, whenBusy = "fail", onBusy = null } = {}) {
  return withModelLock(id, async () => {
    let manifest = await db.getManifest(id);
    if (!manifest) throw new StoreError("NotFoundError", "no such model in the store");
    if (manifest.status === "ready") return manifest;
    const opts = { signal, file, onRetry, onRepair };
    try {
      if (manifest.size == null) manifest = await open(manifest, signal);
      await checkQuota(manifest.size - storedBytes(manifest), manifest.name);
      manifest = await db.updateManifest(id, (m) => { m.status = "downloading"; m.error = null; });
      const progress = new Progress(manifest, onProgress);
      progress.report("header", manifest);
      let verdict;
      try {
        // A resumed download was judged when it started: it goes on without waiting for Python.
        if (manifest.fit?.ok && manifest.probe) verdict = { ...manifest.fit, summary: manifest.probe };
        else ({ manifest, verdict } = await fitCheck(manifest, checkFit, opts, progress));
      } catch (err) {
        if (!err.refusal) throw err;   // only the file's own faults (checkFit marks them) refuse it
        await refuse(manifest, err);
        throw Object.assign(err, { refused: true });
      }
      const { summary = null, ...fit } = verdict;
      manifest = await db.updateManifest(id, (m) => { m.probe = summary; m.fit = { reasons: [], ...fit }; });
      if (!verdict.ok) {
        const err = new StoreError("WontFitError", `${manifest.name} cannot run here: ${verdict.reasons.join("; ")}`,
          "choose a smaller model or quantization, or a shorter context");
        await refuse(manifest, err);
        throw Object.assign(err, { refused: true });
      }
      manifest = await fetchMissing(manifest, opts, progress, concurrency);
      if (missingChunks(manifest).length) throw new StoreError("IncompleteError", "some chunks are still missing", "resume the download");
      return await verify(manifest, opts, progress);
    } catch (err) {
      if (!err.refused) {
        const paused = err.name === "AbortError" || signal?.aborted;
        await db.updateManifest(id, (m) => {
          m.status = paused ? "paused" : "error";
          m.error = paused ? null : errorRecord(err);
        });
      }
      throw err;
    }
  }, { wait: whenBusy === "wait", signal, onBusy });
}

// First contact with a URL: its size and validators, and the first chunk (kept: it holds the header).
async function open(manifest, signal) {
  const first = await openURL(manifest.source.url, manifest.chunkSize, signal);
  if (first.size === 0) throw new StoreError("GGUFFormatError", "the file is empty", "check the address");
  const opened = await db.updateManifest(manifest.id, (m) => {
    m.size = first.size;
    m.etag = first.etag;
    m.lastModified = first.lastModified;
    m.chunks = new Array(Math.ceil(first.size / m.chunkSize)).fill(null);
  });
  await checkQuota(first.size, manifest.name);   // before the first chunk is kept
  const sha = await sha256Hex(first.bytes);
  return db.putChunk(manifest.id, 0, first.bytes, sha);
}
