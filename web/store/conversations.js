// Saved conversations: their own IndexedDB database, apart from the model store, so clearing models
// never touches chats and a chat write never waits behind a multi-GB model transaction.
//
//   conversations  key: id (string)   value: {id, title, titled, model: {id, name} | null, settings,
//                                             messages: [{role, content, stats?}], created, updated}
//
// `titled`: the user named it (a rename); otherwise the title follows the first message.
// Export/import speak one JSON shape (EXPORT_FORMAT); Markdown is export-only, for reading.

const DB_NAME = "pyshim-conversations";
const DB_VERSION = 1;
const STORE = "conversations";
export const EXPORT_FORMAT = "pyshim-conversations";
const EXPORT_VERSION = 1;
const ROLES = new Set(["system", "user", "assistant"]);
const TITLE_CHARS = 60;

let opening = null;

function openDB() {
  opening ??= new Promise((resolve, reject) => {
    const req = indexedDB.open(DB_NAME, DB_VERSION);
    req.onupgradeneeded = () => req.result.createObjectStore(STORE, { keyPath: "id" });
    req.onsuccess = () => {
      req.result.onversionchange = () => { req.result.close(); opening = null; };
      resolve(req.result);
    };
    req.onerror = () => { opening = null; reject(storageError(req.error)); };
    req.onblocked = () => { opening = null; reject(Object.assign(new Error("the chat store is held by an older pyshim tab"),
      { name: "StoreBlockedError", hint: "close the other pyshim tabs, then reload" })); };
  });
  return opening;
}

// What a failed write means to the visitor: the chat is still on screen, only saving failed.
function storageError(err) {
  const full = err?.name === "QuotaExceededError";
  return Object.assign(new Error(full ? "the browser's storage is full: this chat could not be saved"
    : `this chat could not be saved (${err?.message ?? err})`), {
    name: full ? "QuotaError" : "ChatStoreError",
    hint: full ? "delete old chats or a stored model; the chat stays in this tab meanwhile (Export keeps a copy)"
      : "it stays in this tab; Export keeps a copy",
  });
}

async function run(mode, fn) {
  const db = await openDB();
  return new Promise((resolve, reject) => {
    let out;
    let tx;
    try {
      tx = db.transaction(STORE, mode);
      const req = fn(tx.objectStore(STORE));
      if (req) req.onsuccess = () => { out = req.result; };
    } catch (err) {
      reject(storageError(err));
      return;
    }
    tx.oncomplete = () => resolve(out);
    tx.onabort = () => reject(storageError(tx.error));
    tx.onerror = () => {};   // the abort handler reports it
  });
}

export function newId() {
  return `c-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;
}

export function titleOf(messages) {
  const first = messages.find((m) => m.role === "user")?.content.trim().replace(/\s+/g, " ") ?? "";
  return first.length > TITLE_CHARS ? `${first.slice(0, TITLE_CHARS - 1)}…` : first || "New chat";
}

// Newest first.
export async function listConversations() {
  const all = await run("readonly", (s) => s.getAll());
  return all.sort((a, b) => b.updated - a.updated);
}

export const getConversation = (id) => run("readonly", (s) => s.get(id));

export async function saveConversation(conversation) {
  const saved = { ...conversation, updated: Date.now() };
  if (!saved.titled) saved.title = titleOf(saved.messages);
  await run("readwrite", (s) => s.put(saved));
  return saved;
}

export const deleteConversation = (id) => run("readwrite", (s) => s.delete(id));
export const deleteAllConversations = () => run("readwrite", (s) => s.clear());

// ---- export / import --------------------------------------------------------------------------------

export function exportJSON(conversations) {
  return JSON.stringify({ format: EXPORT_FORMAT, version: EXPORT_VERSION, exported: new Date().toISOString(), conversations }, null, 2);
}

function bad(message) {
  return Object.assign(new Error(`not a pyshim chat export: ${message}`), {
    name: "ImportError", hint: "pick a .json file that pyshim's Export wrote; nothing was imported",
  });
}

// The conversations of an export, checked whole before any is stored (a bad file imports nothing).
export function parseExport(text) {
  let data;
  try {
    data = JSON.parse(text);
  } catch {
    throw bad("the file is not JSON");
  }
  if (data?.format !== EXPORT_FORMAT || !Array.isArray(data.conversations)) throw bad(`no "format": "${EXPORT_FORMAT}" with a conversations list`);
  if (data.version > EXPORT_VERSION) throw bad(`it is version ${data.version}, written by a newer pyshim`);
  return data.conversations.map((c, i) => {
    if (!Array.isArray(c?.messages)) throw bad(`conversation ${i + 1} has no messages list`);
    const messages = c.messages.map((m, j) => {
      if (!ROLES.has(m?.role) || typeof m.content !== "string") throw bad(`message ${j + 1} of conversation ${i + 1} needs a role (user, assistant, system) and text`);
      return { role: m.role, content: m.content, ...(typeof m.stats === "string" && m.stats ? { stats: m.stats } : {}) };
    });
    const now = Date.now();
    return {
      id: typeof c.id === "string" && c.id ? c.id : newId(), titled: Boolean(c.titled),
      title: typeof c.title === "string" && c.title ? c.title : titleOf(messages),
      model: c.model && typeof c.model.id === "string" ? { id: c.model.id, name: String(c.model.name ?? c.model.id) } : null,
      settings: c.settings && typeof c.settings === "object" ? c.settings : null,
      messages, created: Number(c.created) || now, updated: Number(c.updated) || now,
    };
  });
}

// Stores an export's conversations; one whose id is already here comes in as a copy (nothing is
// overwritten). Returns the stored conversations.
export async function importConversations(text) {
  const incoming = parseExport(text);
  const have = new Set((await listConversations()).map((c) => c.id));
  const stored = incoming.map((c) => (have.has(c.id) ? { ...c, id: newId() } : c));
  await run("readwrite", (s) => { for (const c of stored) s.put(c); });
  return stored;
}

const WHO = { user: "You", assistant: "Model", system: "System" };

export function toMarkdown(conversations) {
  return conversations.map((c) => [
    `# ${c.title}`, "",
    `_${[c.model?.name, new Date(c.updated).toLocaleString()].filter(Boolean).join(" · ")}_`, "",
    ...c.messages.flatMap((m) => [`**${WHO[m.role] ?? m.role}:**`, "", m.content, ""]),
  ].join("\n")).join("\n---\n\n");
}
