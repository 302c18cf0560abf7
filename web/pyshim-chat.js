// <pyshim-chat>: a chat box that runs a GGUF model in the page. One script tag, one element:
//
//   <script type="module" src="https://<site>/pyshim-chat.js"></script>
//   <pyshim-chat model="smollm2" system="You are a helpful assistant."></pyshim-chat>
//
// Attributes: model (required: a short name, .gguf URL or store id), system, context (KV positions),
// max-tokens, temperature, placeholder, shared (the origin's shared engine: pages share the weights),
// base-url and api-key (the model is that OpenAI-compatible server's: web/engine/remote.js).
// Download and load progress, errors and the reply stream show inside the element; Stop ends the
// reply. Elements naming the same model and context share one engine (one copy of the weights; their
// requests queue).
//
// Theming from outside with CSS custom properties: --pyshim-font, --pyshim-bg, --pyshim-fg,
// --pyshim-muted, --pyshim-border, --pyshim-accent, --pyshim-accent-fg, --pyshim-user-bg,
// --pyshim-assistant-bg, --pyshim-error, --pyshim-radius, --pyshim-height; and ::part(log | message |
// user | assistant | composer | input | send | stop | status | progress | error).
// The host's data-state is "loading", "ready", "busy" or "error". Events (bubbling, composed):
// "pyshim-ready" {model}, "pyshim-reply" {text, finish_reason, ttft_ms}, "pyshim-error" {name, message}.
//
// Model text is only ever set with textContent: a reply holding markup shows it as characters.

import { createEngine } from "./pyshim.js";

const DEFAULT_CONTEXT = 2048;       // a chat box's conversations are short; a smaller cache loads faster
const DEFAULT_MAX_TOKENS = 256;
const DEFAULT_TEMPERATURE = 0.7;
const engines = new Map();          // "model@context" -> Promise<Engine>, shared by the page's elements

const STYLE = `
:host { display: block; font: 15px/1.5 var(--pyshim-font, system-ui, sans-serif); color: var(--pyshim-fg, #1d2330);
  background: var(--pyshim-bg, #fff); border: 1px solid var(--pyshim-border, #d5d9e2); border-radius: var(--pyshim-radius, 10px);
  overflow: hidden; }
.box { display: flex; flex-direction: column; height: var(--pyshim-height, 26rem); }
.status { padding: .45rem .8rem; font-size: .85em; color: var(--pyshim-muted, #5b6475); border-bottom: 1px solid var(--pyshim-border, #d5d9e2); }
.progress { height: 3px; background: transparent; }
.progress > span { display: block; height: 100%; width: 0; background: var(--pyshim-accent, #3a5bd9); transition: width .2s; }
.log { flex: 1; overflow-y: auto; margin: 0; padding: .8rem; list-style: none; display: flex; flex-direction: column; gap: .6rem; }
.message { max-width: 85%; padding: .5rem .75rem; border-radius: var(--pyshim-radius, 10px); white-space: pre-wrap; overflow-wrap: anywhere; }
.user { align-self: flex-end; background: var(--pyshim-user-bg, #e6ebfb); }
.assistant { align-self: flex-start; background: var(--pyshim-assistant-bg, #f3f4f7); }
.assistant:empty::after { content: "…"; color: var(--pyshim-muted, #5b6475); }
.stats { display: block; font-size: .8em; color: var(--pyshim-muted, #5b6475); margin-top: .25rem; }
.error { margin: 0 .8rem .6rem; padding: .5rem .75rem; border-radius: var(--pyshim-radius, 10px); color: var(--pyshim-error, #a3242b);
  background: color-mix(in srgb, var(--pyshim-error, #a3242b) 10%, transparent); }
.error[hidden] { display: none; }
.hint { display: block; font-size: .9em; opacity: .85; }
form { display: flex; gap: .5rem; padding: .6rem .8rem; border-top: 1px solid var(--pyshim-border, #d5d9e2); }
textarea { flex: 1; resize: none; font: inherit; color: inherit; background: transparent; padding: .4rem .6rem;
  border: 1px solid var(--pyshim-border, #d5d9e2); border-radius: var(--pyshim-radius, 10px); }
button { font: inherit; padding: .4rem .9rem; border-radius: var(--pyshim-radius, 10px); cursor: pointer;
  border: 1px solid var(--pyshim-accent, #3a5bd9); background: var(--pyshim-accent, #3a5bd9); color: var(--pyshim-accent-fg, #fff); }
button.stop { background: transparent; color: var(--pyshim-accent, #3a5bd9); }
button[hidden] { display: none; }
button:disabled, textarea:disabled { opacity: .55; cursor: default; }
`;

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "text") node.textContent = value;
    else if (key === "part") node.setAttribute("part", value);
    else node[key] = value;
  }
  node.append(...children);
  return node;
}

function percent(fraction) {
  return fraction == null ? "" : ` ${Math.round(100 * fraction)}%`;
}

const PHASE_TEXT = {
  boot: "Starting Python and the GPU…", header: "Checking the model…", download: "Downloading", verify: "Verifying",
  repair: "Re-checking", load: "Loading onto the GPU", compile: "Preparing the GPU programs", ready: "Ready",
};

export class PyshimChat extends HTMLElement {
  #messages = [];
  #running = null;      // the reply's Stream while one streams
  #dom = null;

  static get observedAttributes() { return ["model", "context", "base-url", "api-key"]; }

  constructor() {
    super();
    const root = this.attachShadow({ mode: "open" });
    const d = this.#dom = {
      status: el("div", { className: "status", part: "status", text: "" }),
      bar: el("span"),
      log: el("ol", { className: "log", part: "log" }),
      error: el("div", { className: "error", part: "error", hidden: true, role: "alert" }),
      input: el("textarea", { rows: 2, part: "input", disabled: true }),
      send: el("button", { type: "submit", part: "send", text: "Send", disabled: true }),
      stop: el("button", { type: "button", className: "stop", part: "stop", text: "Stop", hidden: true }),
    };
    d.input.setAttribute("aria-label", "Message");
    d.log.setAttribute("aria-live", "polite");
    const form = el("form", { part: "composer" }, d.input, d.send, d.stop);
    form.addEventListener("submit", (e) => { e.preventDefault(); this.send(d.input.value); });
    d.input.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); this.send(d.input.value); }
    });
    d.stop.addEventListener("click", () => this.stop());
    root.append(el("style", { text: STYLE }),
      el("div", { className: "box" }, d.status, el("div", { className: "progress", part: "progress" }, d.bar), d.log, d.error, form));
    this.engine = null;
    this.lastReply = null;   // {text, finish_reason, ttft_ms, usage}
  }

  connectedCallback() {
    if (!this.engine) this.#load();
  }

  attributeChangedCallback(name, old, value) {
    if (old !== null && old !== value && this.isConnected) this.#load();
  }

  get #context() { return Number(this.getAttribute("context")) || DEFAULT_CONTEXT; }

  #setState(state, status) {
    this.dataset.state = state;
    if (status !== undefined) this.#dom.status.textContent = status;
    const usable = state === "ready";
    this.#dom.input.disabled = !usable;
    this.#dom.send.disabled = !usable;
    this.#dom.stop.hidden = state !== "busy";
  }

  #showError(err) {
    const { error } = this.#dom;
    error.replaceChildren(el("strong", { text: err.message }), err.hint ? el("span", { className: "hint", text: err.hint }) : "");
    error.hidden = false;
    this.dispatchEvent(new CustomEvent("pyshim-error", { bubbles: true, composed: true, detail: { name: err.name, message: err.message } }));
  }

  #progress(p) {
    this.#dom.bar.style.width = p.fraction == null ? "0" : `${(100 * p.fraction).toFixed(1)}%`;
    this.#dom.status.textContent = `${PHASE_TEXT[p.phase] ?? p.phase}${p.phase === "ready" ? "" : percent(p.fraction)}`;
  }

  async #load() {
    const model = this.getAttribute("model");
    this.#dom.error.hidden = true;
    if (!model) {
      this.#setState("error", "No model");
      this.#showError({ name: "ConfigError", message: "this chat box names no model", hint: 'add model="smollm2" (or a .gguf URL) to <pyshim-chat>' });
      return;
    }
    this.#setState("loading", PHASE_TEXT.boot);
    const shared = this.hasAttribute("shared");
    const baseURL = this.getAttribute("base-url"), apiKey = this.getAttribute("api-key");
    const key = baseURL ? `${model}@${baseURL}@${apiKey ?? ""}` : `${model}@${this.#context}${shared ? "@shared" : ""}`;
    try {
      // Elements sharing an engine each want its progress; the first one's callback starts it.
      if (!engines.has(key)) {
        const listeners = new Set();
        const promise = createEngine({ model, context: this.#context, shared, baseURL, apiKey, onProgress: (p) => listeners.forEach((f) => f(p)) });
        engines.set(key, Object.assign(promise, { listeners }));
        promise.catch(() => engines.delete(key));   // a failed load may be retried by another element
      }
      const pending = engines.get(key);
      const onProgress = (p) => this.#progress(p);
      pending.listeners.add(onProgress);
      try {
        this.engine = await pending;
      } finally {
        pending.listeners.delete(onProgress);
      }
      this.#dom.bar.style.width = "0";
      this.#setState("ready", `${model} · ready`);
      this.#dom.input.placeholder = this.getAttribute("placeholder") ?? `Message ${model}…`;
      this.dispatchEvent(new CustomEvent("pyshim-ready", { bubbles: true, composed: true, detail: { model } }));
    } catch (err) {
      this.#setState("error", "Could not load the model");
      this.#showError(err);
    }
  }

  #bubble(role, text) {
    const item = el("li", { className: `message ${role}`, part: `message ${role}`, text });
    this.#dom.log.append(item);
    this.#dom.log.scrollTop = this.#dom.log.scrollHeight;
    return item;
  }

  // Sends `text` as the user's next message and streams the reply; resolves with lastReply.
  async send(text) {
    text = String(text ?? "").trim();
    if (!text || this.dataset.state !== "ready") return null;
    this.#dom.input.value = "";
    this.#dom.error.hidden = true;
    this.#messages.push({ role: "user", content: text });
    this.#bubble("user", text);
    const reply = el("span");
    const item = this.#bubble("assistant", "");
    item.append(reply);
    this.#setState("busy");
    const system = this.getAttribute("system");
    const messages = [...(system ? [{ role: "system", content: system }] : []), ...this.#messages];
    const t0 = performance.now();
    let ttft = null, content = "", last = null;
    try {
      this.#running = await this.engine.chat.completions.create({
        messages, stream: true,
        max_tokens: Number(this.getAttribute("max-tokens")) || DEFAULT_MAX_TOKENS,
        temperature: this.hasAttribute("temperature") ? Number(this.getAttribute("temperature")) : DEFAULT_TEMPERATURE,
      });
      for await (const chunk of this.#running) {
        const choice = chunk.choices?.[0];      // a remote server may send a usage-only chunk
        const piece = choice?.delta?.content;
        if (piece) {
          ttft ??= performance.now() - t0;
          content += piece;
          reply.textContent = content;
          this.#dom.log.scrollTop = this.#dom.log.scrollHeight;
        }
        if (choice?.finish_reason) last = chunk;
      }
      this.#messages.push({ role: "assistant", content });
      const finish = last?.choices[0].finish_reason ?? "stop";
      const tps = last?.pyshim?.timings?.decode_tok_per_s;
      const notes = [ttft != null && `first token ${(ttft / 1000).toFixed(1)} s`, tps && `${tps.toFixed(1)} tok/s`,
        finish === "abort" && "stopped", finish === "length" && "hit max tokens"].filter(Boolean);
      item.append(el("span", { className: "stats", text: notes.join(" · ") }));
      this.lastReply = { text: content, finish_reason: finish, ttft_ms: ttft, usage: last?.usage ?? null };
      this.dispatchEvent(new CustomEvent("pyshim-reply", { bubbles: true, composed: true, detail: this.lastReply }));
    } catch (err) {
      this.#messages.pop();
      item.remove();
      this.#showError(err);
    } finally {
      this.#running = null;
      this.#setState("ready");
    }
    return this.lastReply;
  }

  stop() {
    this.#running?.controller.abort();
  }

  clear() {
    this.stop();
    this.#messages = [];
    this.#dom.log.replaceChildren();
  }
}

if (!customElements.get("pyshim-chat")) customElements.define("pyshim-chat", PyshimChat);
