// OpenAI-shaped requests and responses as pure functions: validation, and the objects a reply is
// built into. No engine, no DOM, no network: the in-page engine (engine.js) and the service worker's
// /v1 endpoint import the very same functions, so both accept and refuse exactly the same requests.
//
// The rules and messages are pyshim/serve/protocol.py's (protocol.js applies them), which the Python API
// applies too:
//   validateChatRequest(body, {models})       -> normalized request | throws APIError (status 400)
//   validateCompletionRequest(body, {models}) -> normalized request | throws APIError
//   chatCompletion / chatChunk / textCompletion / textChunk / modelList   builders
//   errorFromEngine(err) -> APIError          an engine failure as an OpenAI error (400, 503 or 500)
//   sseData(obj), SSE_DONE                    Server-Sent Events framing of chunks

import { DEFINITIONS, ProtocolError, show, validate } from "./protocol.js";

export const DEFAULT_MAX_TOKENS = DEFINITIONS.default_max_tokens;
export const DEFAULT_TEMPERATURE = DEFINITIONS.default_temperature;   // OpenAI's default; 0 is greedy
export const ROLES = DEFINITIONS.roles;
export const MAX_STOP_STRINGS = DEFINITIONS.max_stop_strings;
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
const absent = (v) => v === undefined || v === null;   // OpenAI treats null as "use the default"

// `models`: the ids this engine answers to (the first is the default), or objects {id, aliases}.
function checkModel(model, models) {
  const entries = models.map((m) => (typeof m === "string" ? { id: m, aliases: [] } : { aliases: [], ...m }));
  if (absent(model)) {
    if (!entries.length) throw bad("model", "no model is loaded", "model_not_found");
    return entries[0].id;
  }
  const hit = entries.find((e) => e.id === model || e.aliases.includes(model));
  if (!hit) {
    const serves = entries.length ? `this engine serves ${entries.map((e) => show(e.id)).join(", ")}` : "no model is loaded";
    throw bad("model", `unknown model ${show(model)}: ${serves}`, "model_not_found");
  }
  return hit.id;
}

// The request checked against its shape (pyshim/serve/protocol.py, through protocol.js), as an APIError.
function checked(kind, body) {
  try {
    return validate(kind, body);
  } catch (err) {
    if (err instanceof ProtocolError) throw bad(err.param, err.message);
    throw err;
  }
}

// The sampling fields chat and text completions share, normalized; `top_k`, `min_p` and the penalties
// are pyshim's (llama.cpp's) extensions, off by default.
function sampling(request) {
  const { temperature, top_p, top_k, min_p, repetition_penalty, presence_penalty, frequency_penalty, seed, stream } = request;
  const stop = absent(request.stop) ? [] : typeof request.stop === "string" ? [request.stop] : request.stop;
  const max_tokens = request.max_completion_tokens ?? request.max_tokens;   // newer OpenAI clients send the first
  const response_format = absent(request.response_format) ? null : request.response_format;
  const { tools = null, tool_choice = null, parallel_tool_calls = null } = request;
  return { temperature, top_p, top_k, min_p, repetition_penalty, presence_penalty, frequency_penalty, max_tokens, stop, seed, stream,
    response_format, tools, tool_choice, parallel_tool_calls };
}

// -> {model, messages: [{role, content}], temperature, top_p, top_k, ..., max_tokens, stop: [..], seed, stream}
export function validateChatRequest(body, { models = [] } = {}) {
  const request = checked("chat.completions", body);
  const message = ({ role, content, tool_calls, tool_call_id }) => ({ role, content, ...(tool_calls ? { tool_calls } : {}),
    ...(tool_call_id ? { tool_call_id } : {}) });
  return { model: checkModel(request.model, models), messages: request.messages.map(message), ...sampling(request) };
}

// -> {model, prompt, temperature, top_p, top_k, ..., max_tokens, stop, seed, stream}
export function validateCompletionRequest(body, { models = [] } = {}) {
  const request = checked("completions", body);
  const prompt = Array.isArray(request.prompt) ? request.prompt[0] : request.prompt;   // OpenAI allows a batch; one is fine
  return { model: checkModel(request.model, models), prompt, ...sampling(request) };
}

// The Worker's `sampling` object for a normalized request (its shape: the Worker kinds' in protocol.js).
export function workerSampling(request) {
  const { temperature, top_p, top_k, min_p, repetition_penalty, presence_penalty, frequency_penalty, max_tokens, seed, stop, response_format,
    tools, tool_choice, parallel_tool_calls } = request;
  const present = (fields) => Object.fromEntries(Object.entries(fields).filter(([, v]) => !absent(v)));
  return { temperature, top_p, top_k, min_p, repetition_penalty, presence_penalty, frequency_penalty, max_tokens, seed,
    ...(stop.length ? { stop } : {}), ...present({ response_format, tools, tool_choice, parallel_tool_calls }) };
}

// ---- builders -----------------------------------------------------------------------------------

export function newId(prefix) {
  const bytes = crypto.getRandomValues(new Uint8Array(12));
  return `${prefix}-${Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("")}`;
}

// What every object of one response shares: {id, created, model}.
export const responseBase = (prefix, model) => ({ id: newId(prefix), created: Math.floor(Date.now() / 1000), model });

// OpenAI's usage; prompt_tokens_details.cached_tokens: the prompt's tokens whose keys the cache kept from
// an earlier request (a chat's history), not run again.
export function usageOf(usage = {}) {
  const prompt_tokens = usage.prompt_tokens ?? 0;
  const completion_tokens = usage.completion_tokens ?? 0;
  const details = usage.prompt_tokens_details ? { prompt_tokens_details: usage.prompt_tokens_details } : {};
  return { prompt_tokens, completion_tokens, total_tokens: prompt_tokens + completion_tokens, ...details };
}

// `extra`: pyshim's own fields ({timings, compacted}), under `pyshim` where OpenAI clients ignore them.
// A reply that called tools has content null and the calls in `tool_calls` (finish_reason "tool_calls").
export function chatCompletion(base, { text, finish_reason, usage, tool_calls = null, extra = null }) {
  const message = tool_calls?.length ? { role: "assistant", content: null, tool_calls } : { role: "assistant", content: text };
  return {
    ...base, object: "chat.completion",
    choices: [{ index: 0, message, logprobs: null, finish_reason }],
    usage: usageOf(usage), ...(extra ? { pyshim: extra } : {}),
  };
}

// A stream's chunks: the first has delta {role: "assistant", content: ""}, then {content}, and the
// last an empty delta with finish_reason and usage; calls come whole in one delta {tool_calls: [{index, …}]}
// before it (toolCallsDelta).
export function chatChunk(base, delta, { finish_reason = null, usage = null, extra = null } = {}) {
  return {
    ...base, object: "chat.completion.chunk",
    choices: [{ index: 0, delta, logprobs: null, finish_reason }],
    ...(usage ? { usage: usageOf(usage) } : {}), ...(extra ? { pyshim: extra } : {}),
  };
}

export const toolCallsDelta = (calls) => ({ tool_calls: calls.map((call, index) => ({ index, ...call })) });

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
  const bad = ["BadRequestError", "ContextOverflowError", "ChatTemplateError", "ModelNotReadyError"];
  if (bad.includes(name)) return new APIError(400, message, { code: name, hint, param: err?.param ?? null });
  if (name === "EngineUnavailableError" || name === "WorkerError") return new APIError(503, message, { type: "server_error", code: name, hint });
  return new APIError(500, message, { type: "server_error", code: name, hint });
}

export const sseData = (obj) => `data: ${JSON.stringify(obj)}\n\n`;
