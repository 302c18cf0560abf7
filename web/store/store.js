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
//   rangePieces(id, slices)  the same for a few small slices (streamed experts): only their bytes read
//   wholeFileSha256(id) -> hex                         (reads every chunk, checks its own hash too)
//
// A manifest: {id, name, source: {kind: "url", url} | {kind: "file", name, lastModified}, size, etag,
// lastModified, chunkSize, chunks: [sha256 | null per chunk], expectedSha256, expectedChunks, sha256,
// status: "new" | "downloading" | "paused" | "verifying" | "ready" | "error" | "refused",
// error: {name, message, hint} | null, probe (Python's header summary), fit {ok, reasons}, created, updated}.

import * as db from "./db.js";
import { StoreError } from "./errors.js";

export { download, storedBytes } from "./download.js";
export { checkQuota, requestPersist, storageEstimate } from "./quota.js";
export { rangePieces, readRange, slicePieces, wholeFileSha256 } from "./read.js";

export const CHUNK_SIZE = 16 << 20;    // 16 MiB: big enough for few requests, small enough to hold 3 in memory

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
