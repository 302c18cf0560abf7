// The chat: messages, composer, send/stop, new chat, system prompt and sampling settings.
//
// Model text is only ever set with textContent (through markdown.js, which builds text nodes), so a
// reply containing "<script>" shows those characters and nothing runs.

import { h, $, toast } from "./dom.js";
import { renderMarkdown } from "./markdown.js";
import { Engine } from "../engine/engine.js";
import { serveOpenAI } from "../engine/host.js";

const SETTINGS_KEY = "pyshim.chatSettings";
export const DEFAULT_SETTINGS = {
  system: "You are a helpful assistant.", temperature: 0.7, top_p: 0.95, top_k: 40, max_tokens: 512, seed: "", context: "",
  kv_type: "auto", arithmetic: "auto",
};

let state = { engine: null, unserve: null, canGenerate: false, model: null, messages: [], running: null };

export function settings() {
  try {
    return { ...DEFAULT_SETTINGS, ...JSON.parse(localStorage.getItem(SETTINGS_KEY) ?? "{}") };
  } catch {
    return { ...DEFAULT_SETTINGS };
  }
}

function saveSettings() {
  const s = {};
  for (const key of Object.keys(DEFAULT_SETTINGS)) {
    const el = $(`set-${key}`);
    s[key] = el.type === "number" ? (el.value === "" ? "" : Number(el.value)) : el.value;
  }
  localStorage.setItem(SETTINGS_KEY, JSON.stringify(s));
}

function loadSettings() {
  const s = settings();
  for (const key of Object.keys(DEFAULT_SETTINGS)) $(`set-${key}`).value = s[key];
}

function messageItem(role, text, stats = null) {
  const body = h("div", { class: "bubble" });
  renderMarkdown(body, text);
  return h("li", { class: `msg ${role}` }, h("div", { class: "who", text: role === "user" ? "You" : "Model" }), body,
    stats ? h("div", { class: "stats", text: stats }) : null);
}

function renderNotice() {
  const notice = $("notice");
  notice.replaceChildren();
  let title = null, detail = null;
  if (!state.canGenerate && !state.model?.remote) {   // a remote model needs no GPU here
    title = "Chat is not available";
    detail = "The engine could not start in this browser (see the status line above); models can still be downloaded, stored and checked.";
  } else if (!state.model) {
    title = "Pick a model";
    detail = "Download or import one on the left, then come back here.";
  } else if (state.model.status !== "ready") {
    title = `${state.model.name} is not ready`;
    detail = "Finish its download first.";
  }
  notice.hidden = !title;
  if (title) notice.append(h("strong", { text: title }), h("p", { text: detail }));
  const usable = (state.canGenerate || Boolean(state.model?.remote)) && state.model?.status === "ready";
  $("prompt").disabled = !usable;
  $("send").disabled = !usable || Boolean(state.running);
  $("prompt").placeholder = usable ? `Message ${state.model.name}…` : "Chat turns on when a model is ready and the engine is available";
  $("chat").dataset.state = usable ? "ready" : "unavailable";
}

function renderMessages() {
  const list = $("messages");
  list.replaceChildren(...state.messages.map((m) => messageItem(m.role, m.content, m.stats)));
  $("chat-empty").hidden = state.messages.length > 0;
  list.scrollTop = list.scrollHeight;
}

async function send() {
  const text = $("prompt").value.trim();
  if (!text || state.running) return;
  $("prompt").value = "";
  const s = settings();
  state.messages.push({ role: "user", content: text });
  const reply = { role: "assistant", content: "" };
  state.messages.push(reply);
  renderMessages();
  const bubble = $("messages").lastElementChild.querySelector(".bubble");
  const history = [...(s.system ? [{ role: "system", content: s.system }] : []), ...state.messages.slice(0, -1).map(({ role, content }) => ({ role, content }))];
  state.running = { stream: null };
  $("stop").hidden = false;
  renderNotice();
  try {
    // The same engine interface pages use (engine/engine.js): the Worker loads the model on first use;
    // a remote model's engine (engine/remote.js) sends the request to its server.
    const engine = state.model.remote ?? state.engine;
    if (!state.model.remote) engine.select(state.model, setupOf(s));
    const stream = await engine.chat.completions.create({
      messages: history, stream: true, temperature: s.temperature, top_p: s.top_p, top_k: s.top_k, max_tokens: s.max_tokens,
      seed: s.seed === "" ? null : s.seed,
    });
    state.running.stream = stream;
    let last = null;
    for await (const chunk of stream) {
      const { delta = {}, finish_reason = null } = chunk.choices?.[0] ?? {};   // a server may send a usage-only chunk
      if (delta.content) {
        reply.content += delta.content;
        renderMarkdown(bubble, reply.content);
      }
      if (finish_reason) last = chunk;
    }
    const finish = last?.choices?.[0]?.finish_reason;
    const t = last?.pyshim?.timings ?? {};
    reply.stats = [t.ttft_ms != null && `first token ${(t.ttft_ms / 1000).toFixed(2)} s`, t.decode_tok_per_s && `${t.decode_tok_per_s.toFixed(1)} tok/s`,
      finish === "abort" && "stopped", finish === "length" && "hit max tokens",
      last?.pyshim?.compacted && "older turns were compacted to fit the context (names, numbers and code kept)"].filter(Boolean).join(" · ");
  } catch (err) {
    state.messages.pop();
    toast("error", err.message, err.hint);
  } finally {
    state.running = null;
    $("stop").hidden = true;
    renderMessages();
    renderNotice();
  }
}

function stop() {
  state.running?.stream?.controller.abort();
}

function newChat() {
  stop();
  state.messages = [];
  renderMessages();
}

// The engine's setup from the settings (engine/engine.js select()).
function setupOf(s) {
  return { context: s.context, kvType: s.kv_type, arithmetic: s.arithmetic === "auto" ? null : s.arithmetic };
}

export function setModel(manifest) {
  state.model = manifest;
  // A stored model is also what this page serves to same-origin OpenAI clients at /v1 (engine/host.js).
  if (manifest?.status === "ready" && !manifest.remote && state.engine) state.engine.select(manifest, setupOf(settings()));
  $("chat-model").textContent = manifest ? manifest.name : "No model selected";
  const sub = { ready: manifest?.remote ? `On the server ${manifest.remote.baseURL}` : "Stored on this computer", refused: "Won't run on this GPU", error: "Download stopped", paused: "Download paused" };
  $("chat-sub").textContent = manifest ? (sub[manifest.status] ?? "Downloading…") : "Choose a model on the left";
  renderNotice();
}

// `client`: the page's EngineClient (or a test's stand-in for it); the chat drives it through one Engine.
export function setEngine(client, canGenerate) {
  if (state.engine?.client !== client) {
    state.unserve?.();
    state.engine = new Engine({ client });
    // Same-origin pages can reach this page's model through the service worker's /v1 endpoint.
    state.unserve = "serviceWorker" in navigator ? serveOpenAI(state.engine) : null;
    if (state.model?.status === "ready" && !state.model.remote) state.engine.select(state.model, setupOf(settings()));
  }
  state.canGenerate = canGenerate;
  renderNotice();
}

export function initChat() {
  loadSettings();
  $("settings").addEventListener("change", saveSettings);
  $("settings-toggle").addEventListener("click", () => {
    const open = $("settings").hidden;
    $("settings").hidden = !open;
    $("settings-toggle").setAttribute("aria-expanded", String(open));
  });
  $("composer").addEventListener("submit", (e) => { e.preventDefault(); send(); });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); send(); }
  });
  $("stop").addEventListener("click", stop);
  $("new-chat").addEventListener("click", newChat);
  renderMessages();
  renderNotice();
}
