// Where a model's bytes come from: a URL read with HTTP Range requests, or a local File read with
// File.slice (never whole). Both answer readChunk(manifest, index, signal) -> ArrayBuffer of exactly
// the chunk's length, or throw a StoreError saying why not.

import { StoreError, formatBytes } from "./errors.js";

// "bytes 0-99/1234" -> {first, last, total}; null when absent or not in that form.
function parseContentRange(value) {
  const m = /^bytes (\d+)-(\d+)\/(\d+|\*)$/.exec((value ?? "").trim());
  return m ? { first: Number(m[1]), last: Number(m[2]), total: m[3] === "*" ? null : Number(m[3]) } : null;
}

// If-Range needs a strong validator: a strong ETag, else Last-Modified (RFC 9110 §13.1.5).
function validator(manifest) {
  if (manifest.etag && !manifest.etag.startsWith("W/")) return manifest.etag;
  return manifest.lastModified ?? null;
}

export function chunkSpan(manifest, index) {
  const start = index * manifest.chunkSize;
  return { start, end: Math.min(manifest.size, start + manifest.chunkSize) };  // end exclusive
}

const host = (url) => { try { return new URL(url).host; } catch { return url; } };

// The first request of a download: the first chunk's range, which also tells the file's size and
// validators. Returns {size, etag, lastModified, bytes}.
export async function openURL(url, chunkSize, signal) {
  const response = await rangeFetch(url, 0, chunkSize - 1, null, signal);
  if (response.status === 200) {
    // The whole file came back. Fine for a file smaller than a chunk; otherwise Range is ignored.
    const length = Number(response.headers.get("Content-Length"));
    if (!(length > 0 && length <= chunkSize)) {
      await response.body?.cancel();
      throw new StoreError("RangeNotSupportedError",
        `${host(url)} ignored the byte-range request (HTTP 200 instead of 206), so the download could not be resumed or checked chunk by chunk`,
        "use a server that supports HTTP Range requests, or download the file yourself and import it as a local file");
    }
    const bytes = await response.arrayBuffer();
    return { size: bytes.byteLength, etag: response.headers.get("ETag"), lastModified: response.headers.get("Last-Modified"), bytes };
  }
  const range = parseContentRange(response.headers.get("Content-Range"));
  if (!range || range.total == null || range.first !== 0) {
    await response.body?.cancel();
    throw new StoreError("RangeNotSupportedError", `${host(url)} answered the byte-range request without a usable Content-Range header`,
      "if the file is on another site, that site must expose Content-Range to scripts (CORS); otherwise import it as a local file");
  }
  const bytes = await response.arrayBuffer();
  if (bytes.byteLength !== range.last + 1) throw new StoreError("ShortReadError", `the first chunk ended after ${formatBytes(bytes.byteLength)}`);
  return { size: range.total, etag: response.headers.get("ETag"), lastModified: response.headers.get("Last-Modified"), bytes };
}

async function rangeFetch(url, first, last, ifRange, signal) {
  const headers = { Range: `bytes=${first}-${last}` };
  if (ifRange) headers["If-Range"] = ifRange;
  let response;
  try {
    // no-store: the HTTP cache would keep a second copy of every chunk next to IndexedDB's.
    response = await fetch(url, { headers, signal, cache: "no-store" });
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new StoreError("NetworkError", `the connection to ${host(url)} failed (${err.message})`,
      "check the network; the download resumes where it stopped");
  }
  if (response.status === 404 || response.status === 410) {
    throw new StoreError("NotFoundError", `${host(url)} has no file at ${url} (HTTP ${response.status})`, "check the address");
  }
  if (response.status === 416) {
    throw new StoreError("FileChangedError", `the file at ${url} is now shorter than when the download started (HTTP 416)`,
      "delete the partial download and start again");
  }
  if (response.status >= 500) throw new StoreError("ServerError", `${host(url)} answered HTTP ${response.status}`, "try again later");
  if (response.status !== 200 && response.status !== 206) {
    throw new StoreError("HTTPError", `${host(url)} answered HTTP ${response.status} ${response.statusText}`, "check the address and that the file is public");
  }
  return response;
}

async function readURLChunk(manifest, index, signal) {
  const { start, end } = chunkSpan(manifest, index);
  const ifRange = validator(manifest);
  const response = await rangeFetch(manifest.source.url, start, end - 1, ifRange, signal);
  const changed = (why) => new StoreError("FileChangedError",
    `the file at ${manifest.source.url} changed since the download started (${why})`,
    "delete this partial download and start again to get the new file");
  if (response.status === 200) {
    await response.body?.cancel();
    // With If-Range, a 200 means "the validator no longer matches": the file was replaced.
    if (ifRange) throw changed("the server sent the whole new file instead of the requested part");
    throw new StoreError("RangeNotSupportedError", `${host(manifest.source.url)} stopped honouring byte ranges (HTTP 200 instead of 206)`,
      "import the file from disk instead");
  }
  const range = parseContentRange(response.headers.get("Content-Range"));
  const etag = response.headers.get("ETag");
  if (range?.total != null && range.total !== manifest.size) {
    await response.body?.cancel();
    throw changed(`its size went from ${manifest.size} to ${range.total} bytes`);
  }
  if (manifest.etag && etag && etag !== manifest.etag) {
    await response.body?.cancel();
    throw changed(`its ETag went from ${manifest.etag} to ${etag}`);
  }
  if (range && (range.first !== start || range.last !== end - 1)) {
    await response.body?.cancel();
    throw new StoreError("ShortReadError", `asked for bytes ${start}-${end - 1}, got ${range.first}-${range.last}`);
  }
  let bytes;
  try {
    bytes = await response.arrayBuffer();
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new StoreError("NetworkError", `the connection dropped during chunk ${index} (${err.message})`, "the download resumes where it stopped");
  }
  if (bytes.byteLength !== end - start) {
    throw new StoreError("ShortReadError", `chunk ${index} has ${bytes.byteLength} bytes, expected ${end - start}`);
  }
  return bytes;
}

async function readFileChunk(manifest, index, file) {
  if (!file) {
    throw new StoreError("FileNeededError", `the import of ${manifest.name} was interrupted and the page no longer has the file`,
      "pick the same file again to continue the import");
  }
  if (file.size !== manifest.size || file.lastModified !== manifest.source.lastModified) {
    throw new StoreError("FileChangedError", `${file.name} is not the file whose import started (size or date differ)`,
      "pick the original file, or delete this import and start again");
  }
  const { start, end } = chunkSpan(manifest, index);
  return file.slice(start, end).arrayBuffer();
}

export function readChunk(manifest, index, { signal, file }) {
  return manifest.source.kind === "file" ? readFileChunk(manifest, index, file) : readURLChunk(manifest, index, signal);
}
