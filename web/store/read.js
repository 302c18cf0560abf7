// Reading a stored model back: byte ranges (headers, small tensors), slices streamed chunk by chunk (the
// GPU loader), and the whole file's SHA-256 (each chunk's own hash checked on the way).

import * as db from "./db.js";
import { StoreError } from "./errors.js";
import { Sha256, sha256Hex } from "./sha256.js";
import { chunkSpan } from "./sources.js";

async function readyManifest(id) {
  const m = await db.getManifest(id);
  if (!m) throw new StoreError("NotFoundError", "no such model in the store");
  return m;
}

async function chunkRecord(manifest, index) {
  const record = manifest.chunks[index] ? await db.getChunk(manifest.id, index) : null;
  if (!record) {
    throw new StoreError("IncompleteError", `${manifest.name} is missing chunk ${index} (bytes ${chunkSpan(manifest, index).start}…)`,
      "resume the download");
  }
  return record;
}

// A chunk's bytes [start, end) (all of it by default). Chunks are stored as Blobs, which IndexedDB keeps
// out of line: a slice reads only its own bytes (an ArrayBuffer, as stores before Blobs hold, is read whole).
export async function chunkBytes(manifest, index, start = 0, end = undefined) {
  const { bytes } = await chunkRecord(manifest, index);
  if (bytes instanceof Blob) return new Uint8Array(await bytes.slice(start, end).arrayBuffer());
  return new Uint8Array(bytes).subarray(start, end);
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

// Like slicePieces, for a few small slices read while the model runs (streamed experts): each piece is
// read on its own from its chunk, never the whole 16 MiB chunk around it.
export async function* rangePieces(id, slices, manifest = null) {
  manifest ??= await readyManifest(id);
  for (const slice of slices) {
    if (slice.offset < 0 || slice.offset + slice.size > manifest.size) {
      throw new StoreError("RangeError", `bytes ${slice.offset}+${slice.size} are outside ${manifest.name} (${manifest.size} bytes)`);
    }
    let pos = slice.offset;
    const end = slice.offset + slice.size;
    while (pos < end) {
      const index = Math.floor(pos / manifest.chunkSize);
      const chunkStart = index * manifest.chunkSize;
      const take = Math.min(end, chunkStart + manifest.chunkSize) - pos;
      const bytes = await chunkBytes(manifest, index, pos - chunkStart, pos - chunkStart + take);
      if (bytes.length !== take) {
        throw new StoreError("IncompleteError", `chunk ${index} of ${manifest.name} is shorter than its place in the file`,
          "delete the model and download it again");
      }
      yield { slice, at: pos - slice.offset, bytes };
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
