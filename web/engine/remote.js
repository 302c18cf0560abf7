// A remote model: an OpenAI-compatible server the user runs (vLLM, llama.cpp's server, Ollama's /v1),
// for a model too big for this device, behind the same interface as the in-page Engine:
//
//   const engine = await createEngine({ baseURL: "http://127.0.0.1:8080/v1", apiKey, model: "qwen2.5-32b" });
//   engine.chat.completions.create({messages, stream, tools, response_format, ...}, {signal})
//
// Requests are validated here first, by the same rules as a local model's (openai.js), then sent to
// `<baseURL>/chat/completions`; replies and stream chunks are the server's own. A failure says what to
// do: a server that does not answer, one that answers but does not allow this page's origin (CORS), a
// refused key, a base URL without /v1, a model the server does not serve. pyshim/serve/remote.py is the
// CPython twin.

import * as openai from "./openai.js";

const abortError = () => new DOMException("the request was aborted", "AbortError");

// Why fetch() failed without an answer: it cannot tell CORS from a dead server, but an opaque
// ("no-cors") request to the same URL can: it succeeds when the server answers at all.
async function unreachable(url, err) {
  let answers = false;
  try {
    await fetch(url, { mode: "no-cors", cache: "no-store" });
    answers = true;
  } catch { /* nothing answers */ }
  if (answers) {
    return new openai.APIError(503, `${url} answered but does not allow this page's origin (${location.origin}) to read it (CORS)`, {
      type: "server_error", code: "CORSError",
      hint: "start the server allowing this origin: llama.cpp's server allows any; Ollama: OLLAMA_ORIGINS=" + location.origin +
        "; vLLM: --allowed-origins",
    });
  }
  return new openai.APIError(503, `could not reach ${url}: ${err?.message ?? err}`, {
    type: "server_error", code: "RemoteError", hint: "is the server running, and is the base URL right (it usually ends in /v1)?",
  });
}

// A non-2xx answer as an APIError, the server's own message kept.
async function refused(response) {
  let message = null;
  try {
    const body = await response.json();
    message = typeof body?.error === "string" ? body.error : body?.error?.message ?? null;
  } catch { /* not JSON */ }
  const said = message ? `: ${message}` : "";
  const { status, url } = response;
  if (status === 401 || status === 403) {
    return new openai.APIError(status, `${url} refused the request (HTTP ${status})${said}`, { type: "authentication_error", code: "RemoteError", hint: "check the API key (apiKey)" });
  }
  if (status === 404) {
    return new openai.APIError(404, `${url} does not exist on that server (HTTP 404)${said}`, { code: "RemoteError", hint: "the base URL usually ends in /v1, e.g. http://127.0.0.1:8080/v1" });
  }
  if (status === 400 || status === 422) return new openai.APIError(400, `the server refused the request${said || ` (HTTP ${status})`}`);
  return new openai.APIError(status >= 500 ? status : 502, `the server failed the request (HTTP ${status})${said}`, { type: "server_error", code: "RemoteError", hint: "see the server's log" });
}

// Server-sent events of a streamed reply as chunk objects; ends at [DONE] or the end of the body.
async function* events(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      let end;
      while ((end = buffer.indexOf("\n")) >= 0) {
        const line = buffer.slice(0, end).trim();
        buffer = buffer.slice(end + 1);
        if (!line.startsWith("data:")) continue;            // event names, comments, keep-alives
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new openai.APIError(502, `the server failed the request: ${chunk.error.message ?? JSON.stringify(chunk.error)}`, { type: "server_error", code: "RemoteError" });
        yield chunk;
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

// `baseURL + path` with the key, as JSON; a dead server, CORS and refusals become errors that say which.
async function remoteFetch(baseURL, apiKey, path, init = {}, signal = null) {
  const url = baseURL + path;
  const headers = { Accept: "application/json", ...(init.body ? { "Content-Type": "application/json" } : {}),
    ...(apiKey ? { Authorization: `Bearer ${apiKey}` } : {}) };
  let response;
  try {
    response = await fetch(url, { ...init, headers, signal, cache: "no-store" });
  } catch (err) {
    if (signal?.aborted) throw abortError();
    throw await unreachable(url, err);
  }
  if (!response.ok) throw await refused(response);
  return response;
}

// The model names an OpenAI-compatible server lists at /models ([] when it has no listing: the first
// request will tell); throws as any request would for a dead server, CORS or a refused key.
export async function listRemoteModels({ baseURL, apiKey = null }) {
  let listing;
  try {
    listing = await (await remoteFetch(String(baseURL).replace(/\/+$/, ""), apiKey, "/models")).json();
  } catch (err) {
    if (err?.status === 404) return [];
    throw err;
  }
  return (listing?.data ?? []).map((m) => m?.id).filter(Boolean);
}

export class RemoteEngine {
  #pending = new Set();

  constructor({ baseURL, apiKey = null, model }) {
    if (!/^https?:\/\//.test(String(baseURL))) {
      throw new openai.APIError(400, `baseURL must be an http(s) URL, got ${JSON.stringify(baseURL)}`, { param: "baseURL", hint: "for example http://127.0.0.1:8080/v1" });
    }
    if (!model) throw new openai.APIError(400, "a remote engine needs `model`: the name the server serves it by", { param: "model" });
    this.baseURL = String(baseURL).replace(/\/+$/, "");
    this.apiKey = apiKey;
    this.model = { id: model, aliases: [], remote: this.baseURL };
    this.chat = { completions: { create: (body, options) => this.#chat(body, options) } };
    this.models = { list: async () => openai.modelList([model]) };
  }

  #fetch(path, init = {}, signal = null) {
    return remoteFetch(this.baseURL, this.apiKey, path, init, signal);
  }

  // The server answers and (when it lists its models) serves this one.
  async check() {
    const ids = await listRemoteModels({ baseURL: this.baseURL, apiKey: this.apiKey });
    if (ids.length && !ids.includes(this.model.id)) {
      throw new openai.APIError(404, `${this.baseURL} does not serve ${JSON.stringify(this.model.id)}; it serves ${ids.join(", ")}`, { code: "model_not_found", param: "model", hint: "use one of those names" });
    }
  }

  abort() {
    for (const controller of this.#pending) controller.abort();
  }

  stats() {
    return { model: this.model.id, remote: this.baseURL, running: this.#pending.size > 0 };
  }

  terminate() {
    this.abort();
  }

  async #chat(body, { signal = null } = {}) {
    openai.validateChatRequest(body, { models: [this.model] });     // the same refusals as a local model's
    const controller = new AbortController();
    if (signal?.aborted) controller.abort();
    else signal?.addEventListener("abort", () => controller.abort(), { once: true });
    this.#pending.add(controller);
    const request = { ...body, model: this.model.id };
    const done = () => this.#pending.delete(controller);
    try {
      const response = await this.#fetch("/chat/completions", { method: "POST", body: JSON.stringify(request) }, controller.signal);
      if (!request.stream) return await response.json().finally(done);
      const chunks = events(response);
      let stopped = false;
      return {
        controller,
        [Symbol.asyncIterator]: () => ({
          next: async () => {
            if (stopped) return { value: undefined, done: true };
            try {
              const item = await chunks.next();
              if (item.done) done();
              return item;
            } catch (err) {
              done();
              if (!controller.signal.aborted) throw err;
              stopped = true;       // stopped by the caller: a last chunk says so, as a local engine's does
              return { value: { object: "chat.completion.chunk", model: this.model.id, choices: [{ index: 0, delta: {}, finish_reason: "abort" }] }, done: false };
            }
          },
          return: async () => {
            controller.abort();
            done();
            await chunks.return();
            return { value: undefined, done: true };
          },
        }),
      };
    } catch (err) {
      done();
      throw err;
    }
  }
}

// createEngine({baseURL}): a RemoteEngine checked against its server.
export async function createRemoteEngine({ baseURL, apiKey = null, model }) {
  const engine = new RemoteEngine({ baseURL, apiKey, model });
  await engine.check();
  return engine;
}
