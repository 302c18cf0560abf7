// OpenAI-shaped requests and responses as pure functions: validation, and the objects a reply is
// built into. No engine, no DOM, no network: the in-page engine (engine.js) and the service worker's
// /v1 endpoint import the very same functions, so both accept and refuse exactly the same requests.
//
// The rules and messages mirror pyshim/api.py (the Python API), with OpenAI's parameter names:
//   validateChatRequest(body, {models})       -> normalized request | throws APIError (status 400)
//   validateCompletionRequest(body, {models}) -> normalized request | throws APIError
//   chatCompletion / chatChunk / textCompletion / textChunk / modelList   builders
//   errorFromEngine(err) -> APIError          an engine failure as an OpenAI error (400, 503 or 500)
//   sseData(obj), SSE_DONE                    Server-Sent Events framing of chunks

export const DEFAULT_MAX_TOKENS = 256;     // as pyshim/api.py
export const DEFAULT_TEMPERATURE = 1.0;    // OpenAI's default; 0 is greedy
export const ROLES = ["system", "user", "assistant"];
export const MAX_STOP_STRINGS = 4;
export const SSE_DONE = "data: [DONE]\n\n";

// An OpenAI error: `status` for HTTP, `body` exactly what OpenAI's API answers
// ({error: {message, type, param, code}}), `hint` what the user can do about it.
export class APIError extends Error {
  constructor(status, message, { type = "invalid_request_error", param = null, code = null, hint = null } = {}) {
    super(message);
    this.name = "APIError";
    this.status = status;
    this.hint = hint;
    this.body = { error: { message, type, param, code } };
  }

  get param() { return this.body.error.param; }
  get type() { return this.body.error.type; }
  get code() { return this.body.error.code; }
}

const bad = (param, message, code = null) => new APIError(400, message, { param, code });
const show = (value) => (value === undefined ? "undefined" : JSON.stringify(value));
const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
const isNumber = (v) => typeof v === "number" && Number.isFinite(v);
const absent = (v) => v === undefined || v === null;   // OpenAI treats null as "use the default"

// `models`: the ids this engine answers to (the first is the default), or objects {id, aliases}.
function checkModel(model, models) {
  const entries = models.map((m) => (typeof m === "string" ? { id: m, aliases: [] } : { aliases: [], ...m }));
  if (absent(model)) {
    if (!entries.length) throw bad("model", "no model is loaded", "model_not_found");
    return entries[0].id;
  }
  if (typeof model !== "string") throw bad("model", `\`model\` must be a string, got ${show(model)}`);
  const hit = entries.find((e) => e.id === model || e.aliases.includes(model));
  if (!hit) {
    const serves = entries.length ? `this engine serves ${entries.map((e) => show(e.id)).join(", ")}` : "no model is loaded";
    throw bad("model", `unknown model ${show(model)}: ${serves}`, "model_not_found");
  }
  return hit.id;
}

function checkRange(body, name, low, high, fallback) {
  const value = body[name];
  if (absent(value)) return fallback;
  if (!isNumber(value) || value < low || value > high) throw bad(name, `\`${name}\` must be a number in [${low}, ${high}], got ${show(value)}`);
  return value;
}

function checkMaxTokens(body) {
  // Newer OpenAI clients send max_completion_tokens; both mean the same here.
  const name = absent(body.max_completion_tokens) ? "max_tokens" : "max_completion_tokens";
  const value = body[name];
  if (absent(value)) return DEFAULT_MAX_TOKENS;
  if (!Number.isInteger(value) || value < 1) throw bad(name, `\`${name}\` must be a positive integer, got ${show(value)}`);
  return value;
}

function checkStop(stop) {
  if (absent(stop)) return [];
  const stops = typeof stop === "string" ? [stop] : stop;
  if (!Array.isArray(stops) || stops.length > MAX_STOP_STRINGS || !stops.every((s) => typeof s === "string" && s)) {
    throw bad("stop", `\`stop\` must be a non-empty string or a list of up to ${MAX_STOP_STRINGS} of them`);
  }
  return stops;
}

// The sampling fields chat and text completions share; `top_k` is pyshim's extension (0 = off).
function checkSampling(body) {
  const top_p = checkRange(body, "top_p", 0, 1, 1.0);
  if (top_p === 0) throw bad("top_p", "`top_p` must be greater than 0");
  const top_k = body.top_k ?? 0;
  if (!Number.isInteger(top_k) || top_k < 0) throw bad("top_k", `\`top_k\` must be a non-negative integer, got ${show(top_k)}`);
  const seed = body.seed ?? null;
  if (seed !== null && !Number.isInteger(seed)) throw bad("seed", `\`seed\` must be an integer, got ${show(seed)}`);
  const stream = body.stream ?? false;
  if (typeof stream !== "boolean") throw bad("stream", `\`stream\` must be true or false, got ${show(stream)}`);
  const n = body.n ?? 1;
  if (n !== 1) throw bad("n", `only one choice per request is supported (\`n\` = 1), got ${show(n)}`);
  return {
    temperature: checkRange(body, "temperature", 0, 2, DEFAULT_TEMPERATURE), top_p, top_k,
    max_tokens: checkMaxTokens(body), stop: checkStop(body.stop), seed, stream,
  };
}

function checkBody(body) {
  if (!isObject(body)) throw bad(null, `the request must be a JSON object, got ${show(body)}`);
}

// -> {model, messages: [{role, content}], temperature, top_p, top_k, max_tokens, stop: [..], seed, stream}
export function validateChatRequest(body, { models = [] } = {}) {
  checkBody(body);
  const { messages } = body;
  if (!Array.isArray(messages) || !messages.length) throw bad("messages", "`messages` must be a non-empty list of {role, content}");
  messages.forEach((m, i) => {
    if (!isObject(m) || !ROLES.includes(m.role) || typeof m.content !== "string") {
      throw bad(`messages[${i}]`, `messages[${i}] must be {role: one of ${ROLES.join(", ")}, content: a string}`);
    }
  });
  const sampling = checkSampling(body);
  return { model: checkModel(body.model, models), messages: messages.map(({ role, content }) => ({ role, content })), ...sampling };
}

// -> {model, prompt, temperature, top_p, top_k, max_tokens, stop, seed, stream}
export function validateCompletionRequest(body, { models = [] } = {}) {
  checkBody(body);
  let { prompt } = body;
  if (Array.isArray(prompt) && prompt.length === 1) prompt = prompt[0];   // OpenAI allows a batch; one is fine
  if (typeof prompt !== "string" || !prompt) throw bad("prompt", "`prompt` must be a non-empty string");
  const sampling = checkSampling(body);
  return { model: checkModel(body.model, models), prompt, ...sampling };
}

// The Worker's `sampling` dict (web/engine/generation.js) for a normalized request. `stop` only when
// there are stop strings, so a plain request's sampling is exactly what the site always sent.
export function workerSampling(request) {
  const { temperature, top_p, top_k, max_tokens, seed, stop } = request;
  return { temperature, top_p, top_k, max_tokens, seed, ...(stop.length ? { stop } : {}) };
}

// ---- builders -----------------------------------------------------------------------------------

export function newId(prefix) {
  const bytes = crypto.getRandomValues(new Uint8Array(12));
  return `${prefix}-${Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("")}`;
}

// What every object of one response shares: {id, created, model}.
export const responseBase = (prefix, model) => ({ id: newId(prefix), created: Math.floor(Date.now() / 1000), model });

export function usageOf(usage = {}) {
  const prompt_tokens = usage.prompt_tokens ?? 0;
  const completion_tokens = usage.completion_tokens ?? 0;
  return { prompt_tokens, completion_tokens, total_tokens: prompt_tokens + completion_tokens };
}

// `extra`: pyshim's own fields ({timings, compacted}), under `pyshim` where OpenAI clients ignore them.
export function chatCompletion(base, { text, finish_reason, usage, extra = null }) {
  return {
    ...base, object: "chat.completion",
    choices: [{ index: 0, message: { role: "assistant", content: text }, logprobs: null, finish_reason }],
    usage: usageOf(usage), ...(extra ? { pyshim: extra } : {}),
  };
}

// A stream's chunks: the first has delta {role: "assistant", content: ""}, then {content}, and the
// last an empty delta with finish_reason and usage.
export function chatChunk(base, delta, { finish_reason = null, usage = null, extra = null } = {}) {
  return {
    ...base, object: "chat.completion.chunk",
    choices: [{ index: 0, delta, logprobs: null, finish_reason }],
    ...(usage ? { usage: usageOf(usage) } : {}), ...(extra ? { pyshim: extra } : {}),
  };
}

export function textCompletion(base, { text, finish_reason, usage, extra = null }) {
  return {
    ...base, object: "text_completion",
    choices: [{ index: 0, text, logprobs: null, finish_reason }],
    usage: usageOf(usage), ...(extra ? { pyshim: extra } : {}),
  };
}

export function textChunk(base, text, { finish_reason = null, usage = null, extra = null } = {}) {
  return {
    ...base, object: "text_completion",
    choices: [{ index: 0, text, logprobs: null, finish_reason }],
    ...(usage ? { usage: usageOf(usage) } : {}), ...(extra ? { pyshim: extra } : {}),
  };
}

export function modelList(ids) {
  return { object: "list", data: ids.map((id) => ({ id, object: "model", created: 0, owned_by: "pyshim" })) };
}

// An engine failure ({name, message, hint} from the Worker) as an OpenAI error: the request's own
// fault is 400, an engine that cannot run here 503, anything else 500.
export function errorFromEngine(err) {
  if (err instanceof APIError) return err;
  const name = err?.name ?? "Error";
  const message = String(err?.message ?? err);
  const hint = err?.hint ?? null;
  if (name === "BadRequestError" || name === "ModelNotReadyError") return new APIError(400, message, { code: name, hint });
  if (name === "EngineUnavailableError" || name === "WorkerError") return new APIError(503, message, { type: "server_error", code: name, hint });
  return new APIError(500, message, { type: "server_error", code: name, hint });
}

export const sseData = (obj) => `data: ${JSON.stringify(obj)}\n\n`;
