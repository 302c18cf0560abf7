// The chat: the open conversation's messages and their actions (copy, edit and resend, regenerate), the
// composer (Enter sends, Escape stops), what the engine is doing before the first token, and the
// sampling settings, which each conversation keeps with itself.
//
// Model text is only ever set with textContent (through markdown.js, which builds text nodes), so a
// reply containing "<script>" shows those characters and nothing runs.

import { h, $, toast, copyText, formatRate } from "./dom.js";
import { formatBytes } from "../store/errors.js";
import { renderMarkdown } from "./markdown.js";
import { phaseView } from "./phases.js";
import { Engine } from "../engine/engine.js";
import { serveOpenAI } from "../engine/host.js";
import * as chats from "../store/conversations.js";

const SETTINGS_KEY = "pyshim.chatSettings";     // the settings a new chat starts with
export const DEFAULT_SETTINGS = {
  system: "You are a helpful assistant.", temperature: 0.7, top_p: 0.95, top_k: 40, max_tokens: 512, seed: "", context: "",
  kv_type: "auto", arithmetic: "auto", device: "auto",
};

let state = {
  engine: null, unserve: null, canGenerate: false, model: null, running: null, editing: null, download: null,
  conversation: null,
  warm: null,               // the load ahead in flight, {key, phase}; `warmed` the key last loaded or asked for
  warmed: null,
  loadedAhead: null,        // what the last load ahead reported ({load_ms, device_reason, weights_kept}), for the next reply's stats
  onSaved: () => {},        // the conversation list redraws (ui/conversations.js)
  selectModel: () => null,  // asks the models panel for a stored model by id (ui/models.js)
};

function defaults() {
  try {
    return { ...DEFAULT_SETTINGS, ...JSON.parse(localStorage.getItem(SETTINGS_KEY) ?? "{}") };
  } catch {
    return { ...DEFAULT_SETTINGS };
  }
}

// The open conversation's settings (the defaults before one is open): also what "will it fit?" judges with.
export function settings() {
  return { ...DEFAULT_SETTINGS, ...(state.conversation?.settings ?? defaults()) };
}

function blank() {
  const now = Date.now();
  return { id: chats.newId(), title: "New chat", titled: false, model: null, settings: defaults(), messages: [], created: now, updated: now };
}

function readSettingsForm() {
  const s = {};
  for (const key of Object.keys(DEFAULT_SETTINGS)) {
    const el = $(`set-${key}`);
    s[key] = el.type === "number" ? (el.value === "" ? "" : Number(el.value)) : el.value;
  }
  return s;
}

function saveSettings() {
  const s = readSettingsForm();
  localStorage.setItem(SETTINGS_KEY, JSON.stringify(s));    // the next new chat starts with these
  state.conversation.settings = s;
  if (state.conversation.messages.length) persist(state.conversation);
}

function showSettings() {
  const s = settings();
  for (const key of Object.keys(DEFAULT_SETTINGS)) $(`set-${key}`).value = s[key];
}

// ---- saving -------------------------------------------------------------------------------------------

let saveError = null;   // shown once until a save succeeds again

async function persist(conversation) {
  if (!conversation.messages.length) return;
  try {
    Object.assign(conversation, await chats.saveConversation(conversation));
    saveError = null;
  } catch (err) {
    // The conversation stays in memory (and on screen): only the copy on disk is behind.
    if (!saveError) toast("error", err.message, err.hint);
    saveError = err;
  }
  state.onSaved(conversation);
}

// ---- rendering ----------------------------------------------------------------------------------------

// A small button under a message: its word, and what it does in full for screen readers and the tooltip.
function actionButton(action, word, label, onclick) {
  return h("button", { type: "button", class: "ghost small", dataset: { action }, "aria-label": label, title: label, onclick }, word);
}

function messageItem(m, i) {
  const messages = state.conversation.messages;
  const last = i === messages.length - 1;
  const idle = !state.running;
  if (state.editing === i) return editItem(m, i);
  const body = h("div", { class: "bubble" });
  renderMarkdown(body, m.content);
  const actions = h("div", { class: "msg-actions" }, actionButton("copy", "Copy", m.role === "user" ? "Copy message" : "Copy reply", () => copyText(m.content)));
  if (m.role === "user" && idle && state.canSend) actions.append(actionButton("edit", "Edit", "Edit and resend", () => startEdit(i)));
  if (m.role === "assistant" && last && idle && state.canSend) actions.append(actionButton("regenerate", "Regenerate", "Regenerate reply", regenerate));
  return h("li", { class: `msg ${m.role}`, dataset: { index: String(i) } },
    h("div", { class: "who", text: m.role === "user" ? "You" : "Model" }), body,
    m.stats ? h("div", { class: "stats", text: m.stats }) : null,
    m.content || m.role === "user" ? actions : null);
}

function editItem(m, i) {
  const area = h("textarea", { class: "edit-text", rows: 3, "aria-label": "Edit your message" });
  area.value = m.content;
  const submit = () => { const text = area.value.trim(); if (text) editAndResend(i, text); };
  area.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); submit(); }
    if (e.key === "Escape") { e.stopPropagation(); cancelEdit(); }
  });
  queueMicrotask(() => area.focus());
  return h("li", { class: "msg user editing", dataset: { index: String(i) } },
    h("div", { class: "who", text: "You" }), area,
    h("div", { class: "msg-actions" },
      h("button", { type: "button", class: "small", dataset: { action: "resend" }, text: "Send", onclick: submit }),
      h("button", { type: "button", class: "ghost small", dataset: { action: "cancel" }, text: "Cancel", onclick: cancelEdit })));
}

function renderMessages() {
  const list = $("messages");
  const { messages } = state.conversation;
  list.replaceChildren(...messages.map(messageItem));
  // A reply under way writes to the last bubble, whatever redrew the list meanwhile (the models panel's
  // refresh re-selects its model): the new one takes over, with the phase the old one showed.
  const run = state.running;
  if (run) {     // (none while another conversation is shown: it stops, and must not take this one's text)
    run.bubble = run.conv === state.conversation ? list.lastElementChild?.querySelector(".bubble") ?? null : null;
    if (!run.gotText && run.phase) showPhase(run.phase);
  }
  $("chat-empty").hidden = messages.length > 0;
  $("chat-title").textContent = messages.length ? state.conversation.title : "";
  const scroller = list.parentElement;
  scroller.scrollTop = scroller.scrollHeight;
}

function downloadLine(p) {
  if (!p?.totalBytes) return "Its download is starting.";
  const parts = [`${formatBytes(p.doneBytes)} of ${formatBytes(p.totalBytes)} stored`];
  if (p.bytesPerSec) parts.push(formatRate(p.bytesPerSec));
  if (p.etaSec != null && p.bytesPerSec) parts.push(`about ${Math.max(1, Math.round(p.etaSec))} s left`);
  return `${parts.join(" · ")}. The chat opens as soon as it is stored and checked.`;
}

function renderNotice() {
  const notice = $("notice");
  notice.replaceChildren();
  let title = null, detail = null, kind = "warn";
  const wanted = state.conversation?.model;
  if (!state.canGenerate && !state.model?.remote) {   // a remote model needs no GPU here
    title = "Chat is not available";
    detail = "The engine could not start in this browser (see the status line above); models can still be downloaded, stored and checked.";
  } else if (!state.model && wanted) {
    title = `This chat was with ${wanted.name}`;
    detail = wanted.id.startsWith("remote:")
      ? "That model is on a server: connect to it again in the Server tab (keys are never saved), or pick a stored model."
      : "That model is not stored in this browser now: pick another on the left to carry on.";
    kind = "info";
  } else if (!state.model) {
    title = "Pick a model";
    detail = "Download or import one on the left, then come back here.";
    kind = "info";
  } else if (["downloading", "verifying", "new"].includes(state.model.status)) {
    title = `${state.model.name} is downloading`;
    detail = downloadLine(state.download);
    kind = "info";
  } else if (state.model.status === "paused" || state.model.status === "error") {
    title = `${state.model.name} is not fully stored`;
    detail = "Resume its download on the left (it carries on from where it stopped).";
  } else if (state.model.status === "refused") {
    title = `${state.model.name} won't run on this GPU`;
    detail = "The panel above says why; pick another model.";
  } else if (state.warm && !state.running) {
    const view = phaseView(state.warm.phase);
    title = `Loading ${state.model.name} while you type`;
    detail = view ? [view.label, view.detail].filter(Boolean).join(": ") : "Starting…";
    kind = "info";
  }
  notice.hidden = !title;
  notice.dataset.kind = kind;
  if (title) notice.append(h("strong", { text: title }), h("p", { text: detail }));
  notice.dataset.phase = (!state.running && state.warm?.phase?.phase) || "";
  const usable = (state.canGenerate || Boolean(state.model?.remote)) && state.model?.status === "ready";
  state.canSend = usable;
  $("prompt").disabled = !usable;
  $("send").disabled = !usable || Boolean(state.running);
  $("prompt").placeholder = usable ? `Message ${state.model.name}…` : "Chat turns on when a model is ready and the engine is available";
  $("chat").dataset.state = usable ? "ready" : "unavailable";
}

// ---- what the engine is doing before the first token (phases.js words it) ----------------------------

function showPhase(p) {
  const run = state.running;
  if (!run || run.gotText || !run.bubble) return;
  const view = phaseView(p);
  if (!view) return;
  run.phase = p;
  const bar = h("span", { style: `width: ${view.fraction == null ? 100 : (100 * view.fraction).toFixed(1)}%` });
  run.bubble.replaceChildren(h("div", { class: "phase", role: "status", dataset: { phase: p.phase, indeterminate: String(view.fraction == null) } },
    h("span", { class: "phase-label", text: view.label }),
    h("div", { class: "bar" }, bar),
    h("span", { class: "phase-detail", text: view.detail })));
}

// ---- loading ahead -------------------------------------------------------------------------------------

// The model goes to the GPU while a message is being typed (engine.warm: the weights, then the programs'
// pipelines), so a reply starts with the conversation instead of with the load. The notice shows the
// phases; a message sent meanwhile waits for the load and its bubble shows them. One at a time, with the
// open conversation's settings (those the reply will ask for), and not twice for the same ones.
function warmKey(model, setup) {
  return `${model.id} ${JSON.stringify(setup)}`;
}

function warmAhead() {
  const model = state.model;
  if (!state.engine || !state.canGenerate || state.running || state.warm || model?.status !== "ready" || model.remote) return;
  const setup = setupOf(settings());
  const key = warmKey(model, setup);
  if (state.warmed === key) return;
  const warm = state.warm = { key, phase: null };
  state.warmed = key;
  state.engine.select(model, setup);
  renderNotice();
  state.engine.warm({ onProgress: (p) => { warm.phase = p; renderNotice(); showPhase(p); } })
    .then((result) => { if (result.load_ms > 0) state.loadedAhead = result; })
    // a reply waiting for it reports the same error; otherwise say it now, not on the first message
    .catch((err) => { if (!state.running) toast("error", `${model.name} did not load: ${err.message}`, err.hint); })
    .finally(() => { state.warm = null; renderNotice(); });
}

// ---- sending ------------------------------------------------------------------------------------------

async function respond() {
  const conv = state.conversation;
  const s = settings();
  const reply = { role: "assistant", content: "" };
  conv.messages.push(reply);
  conv.model = { id: state.model.id, name: state.model.name };
  const run = state.running = { conv, stream: null, gotText: false, bubble: null, phase: null };
  renderMessages();     // (the reply's bubble: run.bubble from here on)
  renderNotice();
  persist(conv);
  showPhase({ phase: state.model.remote ? "remote" : "queued" });
  const history = [...(s.system ? [{ role: "system", content: s.system }] : []),
    ...conv.messages.slice(0, -1).map(({ role, content }) => ({ role, content }))];
  $("stop").hidden = false;
  try {
    // The same engine interface pages use (engine/engine.js): the Worker loads the model on first use;
    // a remote model's engine (engine/remote.js) sends the request to its server.
    const engine = state.model.remote ?? state.engine;
    if (!state.model.remote) {
      engine.select(state.model, setupOf(s));
      state.warmed = warmKey(state.model, setupOf(s));   // what the Worker holds after this reply
    }
    const stream = await engine.chat.completions.create({
      messages: history, stream: true, temperature: s.temperature, top_p: s.top_p, top_k: s.top_k, max_tokens: s.max_tokens,
      seed: s.seed === "" ? null : s.seed,
    });
    if (state.running) state.running.stream = stream;
    let last = null;
    for await (const chunk of stream) {
      const { delta = {}, finish_reason = null } = chunk.choices?.[0] ?? {};   // a server may send a usage-only chunk
      if (delta.content) {
        reply.content += delta.content;
        run.gotText = true;
        if (run.bubble) renderMarkdown(run.bubble, reply.content);
      }
      if (finish_reason) last = chunk;
    }
    reply.stats = statsLine(last, state.loadedAhead);
    state.loadedAhead = null;
    if (!reply.content) run.bubble?.replaceChildren();
  } catch (err) {
    conv.messages.splice(conv.messages.indexOf(reply), 1);
    toast("error", err.message, err.hint);
  } finally {
    state.running = null;
    $("stop").hidden = true;
    renderMessages();
    renderNotice();
    persist(conv);
  }
}

// `ahead`: the load ahead this reply found done ({load_ms, device_reason, weights_kept}), reported as its own would be.
function statsLine(last, ahead = null) {
  const finish = last?.choices?.[0]?.finish_reason;
  let t = last?.pyshim?.timings ?? {};
  if (!(t.load_ms > 0) && ahead) {
    t = { ...t, load_ms: ahead.load_ms };
    last = { ...last, pyshim: { ...last?.pyshim, device_reason: ahead.device_reason, weights_kept: ahead.weights_kept } };
  }
  const cached = last?.usage?.prompt_tokens_details?.cached_tokens;   // the earlier turns' keys, kept
  // which engine runs the model and why, said when this reply loaded it (the verdict; the measurement
  // behind it is in engine.stats().device_reason)
  // (other settings of the model loaded: the Worker kept its weights on the GPU and made a new KV cache)
  const kept = t.load_ms > 0 && last?.pyshim?.weights_kept;
  const why = t.load_ms > 0 && !kept && last?.pyshim?.device_reason?.split(" (")[0];
  const took = `${(t.load_ms / 1000).toFixed(1)} s`;
  return [t.load_ms > 0 && (kept ? `settings applied in ${took}, the weights kept on the GPU` : `loaded in ${took}`), why,
    t.ttft_ms != null && `first token ${(t.ttft_ms / 1000).toFixed(2)} s`,
    cached > 0 && `${cached} of ${last.usage.prompt_tokens} prompt tokens reused`,
    t.decode_tok_per_s && `${t.decode_tok_per_s.toFixed(1)} tok/s`,
    finish === "abort" && "stopped", finish === "length" && "hit max tokens",
    last?.pyshim?.compacted && "older turns were compacted to fit the context (names, numbers and code kept)"].filter(Boolean).join(" · ");
}

function send() {
  const text = $("prompt").value.trim();
  if (!text || state.running || !state.canSend) return;
  $("prompt").value = "";
  state.conversation.messages.push({ role: "user", content: text });
  return respond();
}

// The last reply again, from the same messages (a sampled one comes out different; a greedy one the same).
function regenerate() {
  const messages = state.conversation.messages;
  if (state.running || messages.at(-1)?.role !== "assistant") return;
  messages.pop();
  return respond();
}

function startEdit(i) {
  if (state.running) return;
  state.editing = i;
  renderMessages();
}

function cancelEdit() {
  state.editing = null;
  renderMessages();
}

// Message i replaced by `text`; everything after it goes, and the model answers the edited message.
function editAndResend(i, text) {
  if (state.running) return;
  state.editing = null;
  const messages = state.conversation.messages;
  messages.splice(i, messages.length - i, { role: "user", content: text });
  return respond();
}

function stop() {
  state.running?.stream?.controller.abort();
}

// ---- conversations ------------------------------------------------------------------------------------

export function currentConversation() {
  return state.conversation;
}

// Shows `conversation` (a stored one, or null: a new chat), with its settings and its model when stored.
export async function openConversation(conversation) {
  stop();
  state.editing = null;
  state.conversation = conversation ?? blank();
  showSettings();
  renderMessages();
  const wanted = state.conversation.model;
  if (wanted && wanted.id !== state.model?.id) await state.selectModel(wanted.id);
  renderNotice();
  state.onSaved(null);
}

// A conversation deleted from the list: if it is the open one, a new chat takes its place.
export function forgetConversation(id) {
  if (!id || state.conversation?.id === id) openConversation(null);
}

// ---- models and engine --------------------------------------------------------------------------------

// The engine's setup from the settings (engine/engine.js select()).
function setupOf(s) {
  return { context: s.context, kvType: s.kv_type, arithmetic: s.arithmetic === "auto" ? null : s.arithmetic,
    device: s.device === "auto" ? null : s.device };
}

export function setModel(manifest) {
  if (state.model?.id !== manifest?.id) state.download = null;
  state.model = manifest;
  // A stored model is also what this page serves to same-origin OpenAI clients at /v1 (engine/host.js).
  if (manifest?.status === "ready" && !manifest.remote && state.engine) state.engine.select(manifest, setupOf(settings()));
  $("chat-model").textContent = manifest ? manifest.name : "No model selected";
  const sub = { ready: manifest?.remote ? `On the server ${manifest.remote.baseURL}` : "Stored on this computer", refused: "Won't run on this GPU", error: "Download stopped", paused: "Download paused" };
  $("chat-sub").textContent = manifest ? (sub[manifest.status] ?? "Downloading…") : "Choose a model on the left";
  renderNotice();
  renderMessages();    // which actions a message offers depends on whether it can be sent
  if ($("prompt").value.trim()) warmAhead();     // typed while it downloaded, or before the settings changed
}

// The selected model's download progress (ui/models.js), for the notice.
export function showDownload(id, progress) {
  if (id !== state.model?.id) return;
  state.download = progress;
  renderNotice();
}

// `client`: the page's EngineClient (or a test's stand-in for it); the chat drives it through one Engine.
export function setEngine(client, canGenerate) {
  if (state.engine?.client !== client) {
    state.unserve?.();
    state.engine = new Engine({ client, onProgress: showPhase });
    // Same-origin pages can reach this page's model through the service worker's /v1 endpoint.
    state.unserve = "serviceWorker" in navigator ? serveOpenAI(state.engine) : null;
    if (state.model?.status === "ready" && !state.model.remote) state.engine.select(state.model, setupOf(settings()));
  }
  state.canGenerate = canGenerate;
  renderNotice();
  renderMessages();
}

// `onSaved(conversation | null)`: the list redraws; `selectModel(id)`: the models panel selects a stored model.
export function initChat({ onSaved, selectModel }) {
  state.onSaved = onSaved;
  state.selectModel = selectModel;
  state.conversation = blank();
  showSettings();
  $("settings").addEventListener("change", saveSettings);
  $("settings-toggle").addEventListener("click", () => {
    const open = $("settings").hidden;
    $("settings").hidden = !open;
    $("settings-toggle").setAttribute("aria-expanded", String(open));
  });
  $("composer").addEventListener("submit", (e) => { e.preventDefault(); send(); });
  $("prompt").addEventListener("input", warmAhead);
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); send(); }
  });
  // Escape stops a reply from anywhere on the page (an edit box's Escape cancels the edit instead).
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && state.running) { e.preventDefault(); stop(); }
  });
  $("stop").addEventListener("click", stop);
  $("new-chat").addEventListener("click", () => openConversation(null));
  renderMessages();
  renderNotice();
}
