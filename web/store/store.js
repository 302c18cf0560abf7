// The model store's public API (plain ES module; works in pages and in workers).
//
//   createFromURL(url, {name, expectedSha256, expectedChunks, chunkSize}) -> manifest   (no network yet)
//   createFromFile(file, {expectedSha256, chunkSize})                     -> manifest
//   download(id, {checkFit, file, signal, onProgress, ...})               -> manifest "ready" (download.js)
//   listModels() / getModel(id) / deleteModel(id) / setFit(id, probe, fit)
//   storageEstimate() -> {usage, quota, persisted}    requestPersist() -> bool
//   readRange(id, offset, size) -> Uint8Array          (a copy; for headers and small reads)
//   slicePieces(id, slices)  async iterator of {slice, at, bytes}: each slice {offset, size, ...}
//                            arrives in pieces, chunk by chunk, each chunk read from IndexedDB once;
//                            `bytes` is a view valid until the next piece (copy or upload it at once).
//   wholeFileSha256(id) -> hex                         (reads every chunk, checks its own hash too)
//
// A manifest: {id, name, source: {kind: "url", url} | {kind: "file", name, lastModified}, size, etag,
// lastModified, chunkSize, chunks: [sha256 | null per chunk], expectedSha256, expectedChunks, sha256,
// status: "new" | "downloading" | "paused" | "verifying" | "ready" | "error" | "refused",
// error: {name, message, hint} | null, probe (Python's header summary), fit {ok, reasons}, created, updated}.

import * as db from "./db.js";
import { StoreError, formatBytes } from "./errors.js";
import { Sha256, sha256Hex } from "./sha256.js";
import { chunkSpan } from "./sources.js";

export { download, storedBytes } from "./download.js";

export const CHUNK_SIZE = 16 << 20;    // 16 MiB: big enough for few requests, small enough to hold 3 in memory
const QUOTA_MARGIN = 64 << 20;         // keep this much free: IndexedDB needs room for its own bookkeeping

export function urlModelId(url) {
  return `url:${new URL(url, globalThis.location?.href).href}`;
}

export const fileModelId = (file) => `file:${file.name}:${file.size}:${file.lastModified}`;

function baseManifest(id, name, source, { expectedSha256 = null, expectedChunks = null, chunkSize = CHUNK_SIZE } = {}) {
  const now = Date.now();
  return {
    id, name, source, size: null, etag: null, lastModified: null, chunkSize, chunks: [],
    expectedSha256: expectedSha256?.toLowerCase() ?? null, expectedChunks, sha256: null,
    status: "new", error: null, probe: null, fit: null, created: now, updated: now,
  };
}

// Idempotent: an existing manifest for the same source is returned as it is (that is how a reload
// finds its partial download again).
export async function createFromURL(url, options = {}) {
  const absolute = new URL(url, globalThis.location?.href).href;
  const id = urlModelId(absolute);
  const existing = await db.getManifest(id);
  if (existing) return existing;
  const name = options.name ?? decodeURIComponent(new URL(absolute).pathname.split("/").pop() || absolute);
  const manifest = baseManifest(id, name, { kind: "url", url: absolute }, options);
  await db.putManifest(manifest);
  return manifest;
}

export async function createFromFile(file, options = {}) {
  const id = fileModelId(file);
  const existing = await db.getManifest(id);
  if (existing) return existing;
  const manifest = baseManifest(id, file.name, { kind: "file", name: file.name, lastModified: file.lastModified }, options);
  manifest.size = file.size;
  manifest.chunks = new Array(Math.ceil(file.size / manifest.chunkSize)).fill(null);
  if (file.size === 0) throw new StoreError("GGUFFormatError", `${file.name} is empty`, "pick a .gguf model file");
  await db.putManifest(manifest);
  return manifest;
}

export const listModels = () => db.allManifests().then((ms) => ms.sort((a, b) => a.created - b.created));
export const getModel = (id) => db.getManifest(id);
export const deleteModel = (id) => db.deleteModel(id);

// Records a new "will it fit?" answer (after the context or the memory budget changed).
export const setFit = (id, probe, fit) => db.updateManifest(id, (m) => { m.probe = probe; m.fit = fit; });

export async function storageEstimate() {
  const storage = navigator.storage;
  if (!storage?.estimate) return { usage: null, quota: null, persisted: false };
  const { usage, quota } = await storage.estimate();
  const persisted = storage.persisted ? await storage.persisted() : false;
  return { usage, quota, persisted };
}

// Asks the browser not to evict the store under storage pressure; true when granted.
export async function requestPersist() {
  return navigator.storage?.persist ? navigator.storage.persist() : false;
}

// Throws a QuotaError naming the space needed when `bytes` more would not fit the origin's quota.
export async function checkQuota(bytes, name = "the model") {
  const { usage, quota } = await storageEstimate();
  if (quota == null || bytes <= 0) return;
  const free = quota - usage;
  if (bytes + QUOTA_MARGIN > free) {
    throw new StoreError("QuotaError",
      `${name} needs ${formatBytes(bytes)} more storage, but this browser allows this site only ${formatBytes(Math.max(0, free))} more`,
      `delete stored models or free ${formatBytes(bytes + QUOTA_MARGIN - free)} of disk space, then try again`);
  }
}

async function readyManifest(id) {
  const m = await db.getManifest(id);
  if (!m) throw new StoreError("NotFoundError", "no such model in the store");
  return m;
}

async function chunkBytes(manifest, index) {
  const record = manifest.chunks[index] ? await db.getChunk(manifest.id, index) : null;
  if (!record) {
    throw new StoreError("IncompleteError", `${manifest.name} is missing chunk ${index} (bytes ${chunkSpan(manifest, index).start}…)`,
      "resume the download");
  }
  return new Uint8Array(record.bytes);
}

export async function readRange(id, offset, size) {
  const manifest = await readyManifest(id);
  if (offset < 0 || size < 0 || offset + size > manifest.size) {
    throw new StoreError("RangeError", `bytes ${offset}+${size} are outside ${manifest.name} (${manifest.size} bytes)`);
  }
  const out = new Uint8Array(size);
  for await (const { at, bytes } of slicePieces(id, [{ offset, size }], manifest)) out.set(bytes, at);
  return out;
}

export async function* slicePieces(id, slices, manifest = null) {
  manifest ??= await readyManifest(id);
  const order = [...slices].sort((a, b) => a.offset - b.offset);
  let cached = { index: -1, bytes: null };   // the one chunk held in memory
  for (const slice of order) {
    let pos = slice.offset;
    const end = slice.offset + slice.size;
    while (pos < end) {
      const index = Math.floor(pos / manifest.chunkSize);
      if (cached.index !== index) cached = { index, bytes: await chunkBytes(manifest, index) };
      const chunkStart = index * manifest.chunkSize;
      const take = Math.min(end, chunkStart + cached.bytes.length) - pos;
      yield { slice, at: pos - slice.offset, bytes: cached.bytes.subarray(pos - chunkStart, pos - chunkStart + take) };
      pos += take;
    }
  }
}

export async function wholeFileSha256(id, { onChunk = null } = {}) {
  const manifest = await readyManifest(id);
  const hash = new Sha256();
  for (let i = 0; i < manifest.chunks.length; i++) {
    const bytes = await chunkBytes(manifest, i);
    if ((await sha256Hex(bytes)) !== manifest.chunks[i]) {
      await db.dropChunk(id, i);   // the stored copy rotted: forget it so a resume fetches it again
      throw new StoreError("ChecksumError", `chunk ${i} of ${manifest.name} no longer matches its hash`, "resume the download to fetch it again");
    }
    hash.update(bytes);
    onChunk?.(i);
  }
  return hash.hex();
}
