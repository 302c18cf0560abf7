// Models: the picker (dev server, catalog, URL, local file, a remote server), the stored list with progress, the
// storage meter, and the download controller that drives web/store with the "will it fit?" gate.

import * as store from "../store/store.js";
import { formatBytes, RETRYABLE } from "../store/errors.js";
import { budgetBytes, setBudgetMiB, DEFAULT_CONTEXT } from "../engine/fit.js";
import { checkFit as fitVerdict } from "../engine/resolve.js";
import { createRemoteEngine, listRemoteModels } from "../engine/remote.js";
import { h, $, formatDuration, formatRate, toast } from "./dom.js";
import { CATALOG, expectedSha256 } from "./catalog.js";
import { renderFit } from "./fitpanel.js";

const active = new Map();      // model id -> {controller, progress}
let selectedId = null;
let ctx = null;                // {engine, adapter: Promise, settings: () => {context}, onSelect}

const STATUS_TEXT = {
  new: "Waiting", downloading: "Downloading", paused: "Paused", verifying: "Verifying",
  ready: "Ready", error: "Stopped", refused: "Won't run here",
};

// ---- the "will it fit?" gate handed to store.download ------------------------------------------

async function checkFit(prefix, size) {
  const s = ctx.settings();
  // "auto" (the default) with no context named: Python picks the longest context and the KV type that fit
  const kvType = s.kv_type || "auto";
  const context = Number(s.context) || (kvType === "auto" ? null : DEFAULT_CONTEXT);
  return fitVerdict(ctx.engine, await ctx.adapter, context, prefix, size, kvType);
}

// ---- downloads ---------------------------------------------------------------------------------

// `resumed`: a download this page carries on by itself (resumeInterrupted), which waits for a tab that
// still holds it rather than failing as busy.
async function run(manifest, file = null, { resumed = false } = {}) {
  if (active.has(manifest.id)) return;
  const controller = new AbortController();
  const entry = { controller, progress: null, repaired: null };
  active.set(manifest.id, entry);
  select(manifest.id);
  refresh();
  if (!window.pyshimPersist) window.pyshimPersist = store.requestPersist().catch(() => false);
  try {
    const done = await store.download(manifest.id, {
      checkFit, file, signal: controller.signal, whenBusy: resumed ? "wait" : "fail",
      onBusy: () => { entry.progress = { phase: "busy", doneBytes: store.storedBytes(manifest), totalBytes: manifest.size }; refresh(); },
      onProgress: (p) => {
        const phaseChanged = entry.progress?.phase !== p.phase;
        entry.progress = p;
        if (phaseChanged) refresh();   // size, architecture and status text change with the phase
        else updateProgress(manifest.id);
      },
      onRepair: (chunks) => { entry.repaired = chunks; },
    });
    const repaired = entry.repaired?.length ? ` (${entry.repaired.length} corrupted chunk${entry.repaired.length > 1 ? "s" : ""} fetched again)` : "";
    toast("ok", `${done.name} is stored and verified${done.sha256 ? " (SHA-256 matches)" : ""}${repaired}.`);
  } catch (err) {
    if (err.name !== "AbortError") toast("error", err.message, err.hint);
  } finally {
    active.delete(manifest.id);
    await refresh();
  }
}

export async function addURL(url, name = null) {
  let absolute;
  try {
    absolute = new URL(url, location.href);
    if (!/^https?:$/.test(absolute.protocol)) throw new TypeError("not http(s)");
  } catch {
    toast("error", `“${url}” is not a web address`, "paste a link to a .gguf file, starting with https://");
    return;
  }
  const fileName = decodeURIComponent(absolute.pathname.split("/").pop() || "");
  const manifest = await store.createFromURL(absolute.href, { name: name ?? fileName, expectedSha256: expectedSha256(fileName) });
  await run(manifest);
}

export async function addFile(file) {
  if (!/\.gguf$/i.test(file.name)) toast("info", `${file.name} does not end in .gguf; checking its header anyway.`);
  try {
    const manifest = await store.createFromFile(file, { expectedSha256: expectedSha256(file.name, file.size) });
    await run(manifest, file);
  } catch (err) {
    toast("error", err.message, err.hint);
  }
}

function pause(id) {
  active.get(id)?.controller.abort(new DOMException("paused by the user", "AbortError"));
}

const STORAGE_SETTLE_MS = 30_000;   // how long the storage line follows a delete

async function remove(id) {
  pause(id);
  await store.deleteModel(id);
  if (selectedId === id) select(null);
  await refresh();
  // the browser deletes the chunks' Blob files some seconds after the transaction: count the storage
  // again each second for a while, so the line shows what the delete freed
  const timer = setInterval(async () => showStorage(await store.listModels()), 1000);
  setTimeout(() => clearInterval(timer), STORAGE_SETTLE_MS);
}

function select(id) {
  selectedId = id;
  for (const li of $("stored").children) li.classList.toggle("selected", li.dataset.id === id);
  return store.getModel(id ?? "").then((m) => { renderFit(m); ctx.onSelect(m ?? null); return m ?? null; }, () => null);
}

// A stored model chosen from elsewhere (a conversation reopened): its manifest, or null (not stored
// now; nothing is selected then, so the chat says which model the conversation wants).
export async function selectModel(id) {
  const m = id ? await store.getModel(id).catch(() => null) : null;
  return select(m ? m.id : null);
}

// ---- rendering ---------------------------------------------------------------------------------

function progressLine(m, p) {
  const done = p?.doneBytes ?? store.storedBytes(m);
  const total = p?.totalBytes ?? m.size;
  if (p?.phase === "header") return "Reading the header…";
  if (p?.phase === "busy") return "Downloading in another tab: this one carries on when that one stops…";
  if (p?.phase === "verify" || m.status === "verifying") return `Verifying SHA-256… ${p?.chunk != null ? `${p.chunk + 1} of ${p.chunkCount ?? m.chunks.length}` : ""}`;
  if (p?.phase === "repair") return `Re-checking chunk ${p.chunk + 1} of ${p.chunkCount ?? m.chunks.length}…`;
  const parts = [`${formatBytes(done)} of ${formatBytes(total)}`];
  if (p?.bytesPerSec) parts.push(formatRate(p.bytesPerSec));
  if (p?.etaSec != null && p.bytesPerSec) parts.push(`${formatDuration(p.etaSec)} left`);
  return parts.join(" · ");
}

function updateProgress(id) {
  const li = $("stored").querySelector(`li[data-id="${CSS.escape(id)}"]`);
  const entry = active.get(id);
  if (!li || !entry?.progress) return;
  const p = entry.progress;
  const fraction = p.totalBytes ? p.doneBytes / p.totalBytes : 0;
  li.querySelector(".bar > span").style.width = `${(100 * fraction).toFixed(1)}%`;
  li.querySelector(".progress-text").textContent = progressLine({ chunks: [], status: "downloading" }, p);
  li.dataset.phase = p.phase;
  if (id === selectedId) ctx.onDownloadProgress?.(id, p);
}

function storedRow(m) {
  const entry = active.get(m.id);
  const busy = Boolean(entry);
  const status = busy ? "downloading" : m.status;
  const stored = store.storedBytes(m);
  const fraction = m.size ? stored / m.size : 0;
  const source = m.source.kind === "file" ? "local file" : new URL(m.source.url).host;
  const actions = h("div", { class: "row-actions" });
  if (busy) actions.append(h("button", { class: "ghost small", text: "Pause", onclick: () => pause(m.id) }));
  else if (["new", "paused", "error"].includes(m.status)) {
    if (m.source.kind === "url") actions.append(h("button", { class: "small", text: "Resume", onclick: () => run(m) }));
    else actions.append(h("label", { class: "button small" }, "Pick file to resume",
      h("input", { type: "file", accept: ".gguf", hidden: true, onchange: (e) => e.target.files[0] && run(m, e.target.files[0]) })));
  }
  actions.append(h("button", { class: "ghost small danger", text: "Delete", "aria-label": `Delete ${m.name}`, onclick: () => remove(m.id) }));
  const li = h("li", { dataset: { id: m.id, status }, class: m.id === selectedId ? "selected" : null },
    h("div", { class: "row-main", onclick: () => select(m.id) },
      h("div", { class: "row-title" }, h("span", { class: "name", text: m.name }), h("span", { class: `pill ${status}`, text: STATUS_TEXT[status] ?? status })),
      h("div", { class: "meta", text: [m.size != null && formatBytes(m.size), m.probe?.architecture, source, m.sha256 ? "SHA-256 ✓" : null].filter(Boolean).join(" · ") })),
    status === "ready" || status === "refused" ? null : h("div", { class: "progress" },
      h("div", { class: "bar" }, h("span", { style: `width: ${(100 * fraction).toFixed(1)}%` })),
      h("div", { class: "progress-text", text: progressLine(m, entry?.progress) })),
    m.error && !busy ? h("div", { class: "row-error" }, h("div", { text: m.error.message }), m.error.hint ? h("div", { class: "hint", text: m.error.hint }) : null) : null,
    actions);
  return li;
}

export async function refresh() {
  const models = await store.listModels();
  $("stored").replaceChildren(...models.map(storedRow));
  $("stored-empty").hidden = models.length > 0;
  renderServerModels(models);
  for (const id of active.keys()) updateProgress(id);
  await showStorage(models);
  const selected = models.find((m) => m.id === selectedId);
  if (selected) { renderFit(selected); ctx.onSelect(selected); }
  window.pyshimModels = models;   // for tests and the console
  return models;
}

async function showStorage(models) {
  const { usage, quota, persisted } = await store.storageEstimate();
  const inModels = models.reduce((n, m) => n + store.storedBytes(m), 0);
  $("storage-text").textContent = quota == null ? "Storage size unknown in this browser"
    : `${models.length ? `${formatBytes(inModels)} in models · ` : ""}${formatBytes(usage)} used of ${formatBytes(quota)} available to this site${persisted ? " · persistent" : ""}`;
  $("storage-bar").style.width = quota ? `${Math.min(100, (100 * usage) / quota).toFixed(2)}%` : "0";
  window.pyshimStorage = { usage, quota, persisted, inModels };
}

// ---- the picker --------------------------------------------------------------------------------

function pickItem(name, detail, size, onclick, label = "Download") {
  return h("li", {},
    h("div", {}, h("div", { class: "name", text: name }), h("div", { class: "meta", text: [detail, size].filter(Boolean).join(" · ") })),
    h("button", { class: "small", text: label, onclick }));
}

let serverModels = [];

function renderServerModels(stored) {
  const have = new Set(stored.map((m) => m.id));
  $("models").replaceChildren(...serverModels.map((m) => {
    if (m.error) return h("li", { class: "broken" }, h("div", {}, h("div", { class: "name", text: m.name }), h("div", { class: "meta bad", text: m.error })));
    const detail = [m.architecture, m.quant?.split(",")[0]].filter(Boolean).join(" · ");
    const item = pickItem(m.name, detail, formatBytes(m.size), () => addURL(m.url, m.name));
    if (have.has(store.urlModelId(m.url))) Object.assign(item.querySelector("button"), { textContent: "Stored", disabled: true });
    return item;
  }));
}

async function listServerModels() {
  try {
    const response = await fetch("api/models");
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    serverModels = (await response.json()).models;
    $("server-note").textContent = serverModels.length ? "GGUF files the dev server found on this computer." : "The dev server found no GGUF files. Run `pyshim setup` to place the default models.";
    renderServerModels(await store.listModels());
  } catch {
    $("server-note").textContent = "No dev server here (or offline): use the catalog, a URL or a local file.";
    $("models").replaceChildren();
  }
}

function showCatalog() {
  $("catalog").replaceChildren(...CATALOG.map((c) => pickItem(c.name, c.detail, `~${formatBytes(c.approxBytes)}`, () => addURL(c.url, c.name))));
}

function wirePicker() {
  for (const tab of document.querySelectorAll("[role=tab]")) {
    tab.addEventListener("click", () => {
      for (const t of document.querySelectorAll("[role=tab]")) t.setAttribute("aria-selected", String(t === tab));
      for (const p of document.querySelectorAll("[role=tabpanel]")) p.hidden = p.id !== tab.getAttribute("aria-controls");
    });
  }
  $("url-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const url = $("url-input").value.trim();
    if (url) addURL(url);
  });
  for (const id of ["remote-url", "remote-key"]) $(id).addEventListener("change", offerRemoteModels);
  $("remote-form").addEventListener("submit", (e) => {
    e.preventDefault();
    connectRemote($("remote-url").value.trim(), $("remote-model").value.trim(), $("remote-key").value || null);
  });
  $("file-input").addEventListener("change", (e) => {
    for (const file of e.target.files) addFile(file);
    e.target.value = "";
  });
  const zone = $("dropzone");
  zone.addEventListener("dragover", (e) => { e.preventDefault(); zone.classList.add("over"); });
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", (e) => {
    e.preventDefault();
    zone.classList.remove("over");
    for (const file of e.dataTransfer.files) addFile(file);
  });
}

// The server's own list of models, offered in the model field as soon as its address is typed (the
// first one filled in when the field is empty); a server that cannot be reached says so already here.
let remoteAsk = 0;     // the latest listing or connection: an older answer never overwrites its note

async function offerRemoteModels() {
  const baseURL = $("remote-url").value.trim();
  if (!/^https?:\/\/./.test(baseURL)) return;
  const ask = ++remoteAsk;
  try {
    const ids = await listRemoteModels({ baseURL, apiKey: $("remote-key").value || null });
    if (ask !== remoteAsk) return;
    $("remote-models").replaceChildren(...ids.map((id) => h("option", { value: id })));
    if (ids.length && !$("remote-model").value) $("remote-model").value = ids[0];
    $("remote-note").textContent = ids.length ? `${new URL(baseURL).host} serves ${ids.join(", ")}.` : `${new URL(baseURL).host} lists no models: type the model's name.`;
  } catch (err) {
    if (ask === remoteAsk) $("remote-note").textContent = err.message;
  }
}

// A model on an OpenAI-compatible server: checked (it answers, allows this origin, serves the model),
// then chosen for the chat like a stored one. The key stays in this page's memory only.
export async function connectRemote(baseURL, model, apiKey = null) {
  ++remoteAsk;
  $("remote-note").textContent = `Connecting to ${baseURL}…`;
  try {
    const engine = await createRemoteEngine({ baseURL, apiKey, model });
    const host = new URL(baseURL).host;
    $("remote-note").textContent = `Connected: ${model} on ${host}.`;
    for (const li of $("stored").children) li.classList.remove("selected");
    ctx.onSelect({ id: `remote:${engine.baseURL}#${model}`, name: `${model} · ${host}`, status: "ready", remote: engine });
    return engine;
  } catch (err) {
    $("remote-note").textContent = err.message;
    toast("error", err.message, err.hint);
    return null;
  }
}

// Downloads a reload or a closed tab interrupted carry on by themselves (URL sources only: a local
// file must be picked again). Ones the user paused, or that failed for good, wait for a click.
async function resumeInterrupted(models) {
  for (const m of models) {
    const interrupted = m.status === "downloading" || m.status === "verifying" || (m.status === "error" && RETRYABLE.has(m.error?.name));
    if (interrupted && m.source.kind === "url") run(m, null, { resumed: true });
  }
}

export async function initModels(context) {
  ctx = context;
  wirePicker();
  wireBudget();
  showCatalog();
  listServerModels();
  const models = await refresh();
  const ready = models.filter((m) => m.status === "ready");
  if (ready.length) await select(ready[ready.length - 1].id);
  resumeInterrupted(models);
}

// The context or the memory budget changed: judge the selected stored model again from its header
// bytes (already in IndexedDB), so the panel always answers for the current settings.
async function rejudgeSelected() {
  const m = selectedId ? await store.getModel(selectedId) : null;
  if (!m?.probe?.header_bytes || !m.chunks[0]) return;
  try {
    const header = await store.readRange(m.id, 0, Math.min(m.size, Math.max(m.probe.header_bytes, m.chunkSize)));
    const { summary = null, ...fit } = await checkFit(header, m.size);
    await store.setFit(m.id, summary, { reasons: [], ...fit });
  } catch (err) {
    toast("error", err.message, err.hint);
  }
  await refresh();
}

function wireBudget() {
  const input = $("set-gpu-budget");
  input.value = Math.round(budgetBytes() / 2 ** 20);
  input.addEventListener("change", () => {
    setBudgetMiB(Number(input.value));
    rejudgeSelected();
  });
  // On the form, so chat.js's listener (added first) has saved the new context before this reads it.
  $("settings").addEventListener("change", (e) => { if (e.target.id === "set-context") rejudgeSelected(); });
}

export const selectedModel = () => (selectedId ? store.getModel(selectedId) : Promise.resolve(null));
