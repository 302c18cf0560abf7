// The IndexedDB layer: two object stores and promise helpers, nothing else.
//
//   models  key: model id (string)   value: the manifest (see manifest.js)
//   chunks  key: [model id, index]   value: {model, index, bytes: Blob (ArrayBuffer in older stores), sha256}
//
// A chunk counts as stored only when the manifest's `chunks[index]` holds its SHA-256, and both are
// written in ONE transaction (putChunk): a tab closed mid-write leaves neither, never half of one.

export const DB_NAME = "pyshim-models";
const DB_VERSION = 1;

let opening = null;

export function openDB() {
  opening ??= new Promise((resolve, reject) => {
    const req = indexedDB.open(DB_NAME, DB_VERSION);
    req.onupgradeneeded = () => {
      const db = req.result;
      if (!db.objectStoreNames.contains("models")) db.createObjectStore("models", { keyPath: "id" });
      if (!db.objectStoreNames.contains("chunks")) db.createObjectStore("chunks", { keyPath: ["model", "index"] });
    };
    req.onsuccess = () => {
      // Another tab upgrading the schema asks us to let go; reopen lazily next time.
      req.result.onversionchange = () => { req.result.close(); opening = null; };
      resolve(req.result);
    };
    req.onerror = () => { opening = null; reject(req.error); };
    req.onblocked = () => reject(Object.assign(new Error("the model store is held by an older pyshim tab"),
      { name: "StoreBlockedError", hint: "close the other pyshim tabs, then reload" }));
  });
  return opening;
}

function done(tx) {
  return new Promise((resolve, reject) => {
    tx.oncomplete = () => resolve();
    tx.onabort = () => reject(tx.error ?? new DOMException("transaction aborted", "AbortError"));
    tx.onerror = () => {};  // the abort handler reports it
  });
}

function result(req) {
  return new Promise((resolve, reject) => {
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error);
  });
}

export async function getManifest(id) {
  const db = await openDB();
  return result(db.transaction("models").objectStore("models").get(id));
}

export async function allManifests() {
  const db = await openDB();
  return result(db.transaction("models").objectStore("models").getAll());
}

export async function putManifest(manifest) {
  const db = await openDB();
  const tx = db.transaction("models", "readwrite");
  tx.objectStore("models").put(manifest);
  await done(tx);
}

// Reads the manifest inside the write transaction and lets `change` edit it, so concurrent chunk
// writes never lose each other's updates (IndexedDB serializes overlapping readwrite transactions).
export async function updateManifest(id, change) {
  const db = await openDB();
  const tx = db.transaction("models", "readwrite");
  const store = tx.objectStore("models");
  let updated = null;
  store.get(id).onsuccess = (e) => {
    const manifest = e.target.result;
    if (!manifest) return;
    change(manifest);
    store.put(manifest);
    updated = manifest;
  };
  await done(tx);
  return updated;
}

// Stores chunk `index` of model `id` and records its hash in the manifest, atomically. Returns the
// updated manifest, or null if the model was deleted meanwhile (the chunk is then not kept).
export async function putChunk(id, index, bytes, sha256) {
  const db = await openDB();
  const tx = db.transaction(["models", "chunks"], "readwrite");
  const models = tx.objectStore("models");
  let updated = null;
  models.get(id).onsuccess = (e) => {
    const manifest = e.target.result;
    if (!manifest) return;
    // a Blob: IndexedDB keeps it out of line, so a streamed expert reads a slice, not the chunk
    tx.objectStore("chunks").put({ model: id, index, bytes: new Blob([bytes]), sha256 });
    manifest.chunks[index] = sha256;
    manifest.updated = Date.now();
    models.put(manifest);
    updated = manifest;
  };
  await done(tx);
  return updated;
}

export async function getChunk(id, index) {
  const db = await openDB();
  return result(db.transaction("chunks").objectStore("chunks").get([id, index]));
}

// Forgets chunk `index` (a stored copy that failed verification) in the manifest and the chunk store.
export async function dropChunk(id, index) {
  const db = await openDB();
  const tx = db.transaction(["models", "chunks"], "readwrite");
  const models = tx.objectStore("models");
  models.get(id).onsuccess = (e) => {
    const manifest = e.target.result;
    if (!manifest) return;
    manifest.chunks[index] = null;
    models.put(manifest);
  };
  tx.objectStore("chunks").delete([id, index]);
  await done(tx);
}

export async function deleteModel(id) {
  const db = await openDB();
  const tx = db.transaction(["models", "chunks"], "readwrite");
  tx.objectStore("models").delete(id);
  tx.objectStore("chunks").delete(IDBKeyRange.bound([id, 0], [id, Infinity]));
  await done(tx);
}
