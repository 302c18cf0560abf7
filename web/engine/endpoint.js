// The service worker's same-origin OpenAI endpoint: `POST v1/chat/completions`, `POST v1/completions`
// and `GET v1/models` under the site's scope, so a client written for OpenAI's API (the official SDK
// with `baseURL` set to the site's /v1) talks to the model a page of this site has loaded.
//
// The service worker cannot run the engine (no WebGPU, no Worker, killed when idle). Pages that hold an
// engine serve it (web/engine/host.js); this module picks one and relays over a MessageChannel:
//
//   SW -> page   client.postMessage({type: PROBE}, [port])     page -> SW   {type: "host", models: [{id, aliases}]}
//   SW -> page   client.postMessage({type: REQUEST, endpoint, body}, [port])
//   page -> SW   {type: "accepted"}     a stream passed validation and is queued (the SSE response starts)
//                {type: "chunk", chunk} one chunk of a stream
//                {type: "done", body?}  the end; for a non-streamed request `body` is the whole response
//                {type: "error", status, body}   OpenAI's error object ({error: {message, type, param, code}})
//                {type: "alive"}        every HEARTBEAT_MS while the request waits or runs
//   SW -> page   {type: "cancel"}       the caller went away (its stream was cancelled, its fetch aborted)
//   page -> SW   registration.active.postMessage({type: CLAIM})   control me now (host.js endpointReady)
//
// Which page: the caller itself when it serves the requested model, else the first other same-origin
// window that does (the relay costs ~4 ms when the caller hosts, ~60 ms through another page). The engine's Worker queues its requests (pyshim/serve/scheduler.py), so requests from several
// pages to one engine run one after another, never mixed. Nothing is kept between requests: the
// browser may stop and restart this service worker at any time, so every request probes afresh.

import * as openai from "./openai.js";

export const PROBE = "pyshim-openai:probe";
export const REQUEST = "pyshim-openai:request";
export const CLAIM = "pyshim-openai:claim";   // a page asks the service worker to control it now
export const HEARTBEAT_MS = 10_000;   // a host's "alive" period
// The service worker's timings (an object so that tests can shorten them).
export const TIMING = {
  probeMs: 400,            // pages without host.js never answer a probe
  callerGraceMs: 50,       // how much longer the caller may take than another host to claim its own request
  hostSilenceMs: 120_000,  // no message for this long: the host page is gone (timers in a hidden tab run ~1/min)
  respondByMs: 240_000,    // answer a non-streamed request by then (Chromium stops a worker at 5 minutes)
  padMs: 10_000,           // whitespace this often in a late JSON body; also the watchdog's period
};
const POSTS = { "chat/completions": "chat.completions", completions: "completions" };
const NO_HOST = "no page of this site is serving a model: open one that loads a model (e.g. examples/openai.html) and retry";

const encoder = new TextEncoder();

function errorResponse(status, message, { type = "invalid_request_error", param = null, code = null } = {}) {
  return json(status, { error: { message, type, param, code } });
}

function json(status, body) {
  return new Response(JSON.stringify(body), { status, headers: { "Content-Type": "application/json" } });
}

// -> "chat/completions" | "completions" | "models" | other text after v1/, or null when `url` is not under scope/v1/.
export function endpointOf(url, scope) {
  const u = new URL(url);
  const base = new URL("v1/", scope);
  if (u.origin !== base.origin || !u.pathname.startsWith(base.pathname)) return null;
  return u.pathname.slice(base.pathname.length).replace(/\/$/, "");
}

// Asks one client whether it serves an engine: -> {client, models} or null (no answer in time).
function probe(client) {
  return new Promise((resolve) => {
    const channel = new MessageChannel();
    const timer = setTimeout(() => { channel.port1.close(); resolve(null); }, TIMING.probeMs);
    channel.port1.onmessage = (e) => {
      clearTimeout(timer);
      channel.port1.close();
      const models = e.data?.type === "host" && Array.isArray(e.data.models) ? e.data.models : [];
      resolve(models.length ? { client, models } : null);
    };
    client.postMessage({ type: PROBE }, [channel.port2]);
  });
}

const serves = (host, model) => model == null || host.models.some((m) => m.id === model || (m.aliases ?? []).includes(model));

// The first of `probes` to answer as a host serving `model`, or null once all have settled.
function firstServing(probes, model) {
  return new Promise((resolve) => {
    let left = probes.length;
    if (!left) resolve(null);
    for (const p of probes) {
      p.then((h) => {
        if (h && serves(h, model)) resolve(h);
        if (--left === 0) resolve(null);
      });
    }
  });
}

// The host for `model` (any when null), preferring the calling client; {host} or {hosts} (every host
// that answered, none serving `model`) when there is none. A caller without host.js never answers its
// probe: once another host has answered it is waited for only TIMING.callerGraceMs more.
async function findHost(callerId, model) {
  const clients = await self.clients.matchAll({ type: "window", includeUncontrolled: true });
  const probes = clients.map((client) => probe(client));
  const callerIndex = clients.findIndex((c) => c.id === callerId);
  const callerProbe = callerIndex >= 0 ? probes[callerIndex] : Promise.resolve(null);
  const other = firstServing(probes.filter((_, i) => i !== callerIndex), model);
  const grace = other.then((h) => (h ? new Promise((r) => setTimeout(() => r(null), TIMING.callerGraceMs)) : callerProbe));
  const caller = await Promise.race([callerProbe, grace]);
  if (caller && serves(caller, model)) return { host: caller };
  const host = await other;
  if (host) return { host };
  return { hosts: (await Promise.all(probes)).filter(Boolean) };
}

async function listModels() {
  const clients = await self.clients.matchAll({ type: "window", includeUncontrolled: true });
  const hosts = (await Promise.all(clients.map(probe))).filter(Boolean);
  const ids = [...new Set(hosts.flatMap((h) => h.models.map((m) => m.id)))];
  return json(200, openai.modelList(ids));
}

// A 200 response whose body is written as the reply arrives: Server-Sent Events for a stream, or
// (late JSON) whitespace until the whole JSON is ready. -> {response, write(text), close()}.
function openBody(contentType, onCancel) {
  let controller;
  const body = new ReadableStream({ start: (c) => { controller = c; }, cancel: onCancel });
  return {
    response: new Response(body, { status: 200, headers: { "Content-Type": contentType, "Cache-Control": "no-cache" } }),
    write: (text) => controller.enqueue(encoder.encode(text)),
    close: () => controller.close(),
  };
}

// Relays one request to `host` and answers with JSON or, for a stream, Server-Sent Events.
//
// Lifetime, as measured in Chromium 156: a fetch event left unanswered for 5 minutes stops the service
// worker (the caller sees a network error at 308 s, whatever else arrives meanwhile), and so does a
// fetch event kept open with waitUntil; a response whose body is still being written is not cut (a
// 390-s stream completed). So streams answer as soon as the host accepts them, and a non-streamed
// reply still unfinished after TIMING.respondByMs is answered 200 with whitespace (JSON allows it)
// until its JSON is ready; a failure after that point can only be a JSON error body under status 200.
function relay(event, host, endpoint, body, stream) {
  const channel = new MessageChannel();
  const port = channel.port1;
  let lastHeard = Date.now();
  let settle;            // resolves the response promise
  let out = null;        // the body being written, once a 200 has been answered
  let finished = false;

  const end = () => {
    if (finished) return;
    finished = true;
    clearInterval(watchdog);
    clearTimeout(late);
    port.close();
  };
  const fail = (status, errorBody) => {
    if (!out) settle(json(status, errorBody));
    else {
      // In a stream, OpenAI's clients raise an `error` event as an APIError.
      out.write(stream ? openai.sseData(errorBody) : JSON.stringify(errorBody));
      out.close();
    }
    end();
  };
  const cancel = () => {
    if (!finished) port.postMessage({ type: "cancel" });
    end();
  };
  const watchdog = setInterval(() => {
    if (Date.now() - lastHeard > TIMING.hostSilenceMs) {
      fail(503, { error: { message: "the page serving the model stopped answering (closed or reloaded?)", type: "server_error", param: null, code: "host_gone" } });
    } else if (out && !stream) {
      out.write(" ");   // keeps the late JSON response's body moving
    }
  }, TIMING.padMs);
  const late = stream ? null : setTimeout(() => {
    out = openBody("application/json", cancel);
    settle(out.response);
  }, TIMING.respondByMs);
  event.request.signal?.addEventListener("abort", cancel);

  port.onmessage = (e) => {
    const msg = e.data ?? {};
    lastHeard = Date.now();
    if (finished) return;
    if (msg.type === "accepted" && stream && !out) {
      out = openBody("text/event-stream; charset=utf-8", cancel);
      settle(out.response);
    } else if (msg.type === "chunk" && stream && out) {
      out.write(openai.sseData(msg.chunk));
    } else if (msg.type === "done") {
      if (stream) {
        out?.write(openai.SSE_DONE);
        out?.close();
      } else if (out) {
        out.write(JSON.stringify(msg.body));
        out.close();
      } else {
        settle(json(200, msg.body));
      }
      end();
    } else if (msg.type === "error") {
      fail(msg.status ?? 500, msg.body);
    }
  };
  const response = new Promise((resolve) => { settle = resolve; });
  host.client.postMessage({ type: REQUEST, endpoint, body }, [channel.port2]);
  return response;
}

async function post(event, name) {
  const endpoint = POSTS[name];
  let body;
  try {
    body = await event.request.json();
  } catch (err) {
    return errorResponse(400, `the request body is not valid JSON: ${err.message}`);
  }
  const validate = endpoint === "completions" ? openai.validateCompletionRequest : openai.validateChatRequest;
  // The request's own shape first: any string names a model here; which models exist is the hosts' to say.
  let request;
  try {
    request = validate(body, { models: [typeof body?.model === "string" ? body.model : "(any)"] });
  } catch (err) {
    if (err instanceof openai.APIError) return json(err.status, err.body);
    throw err;
  }
  const model = typeof body.model === "string" ? body.model : null;
  const found = await findHost(event.clientId, model);
  if (found.host) return relay(event, found.host, endpoint, body, request.stream);
  if (!found.hosts.length) return errorResponse(503, NO_HOST, { type: "server_error", code: "no_engine" });
  try {
    validate(body, { models: found.hosts.flatMap((h) => h.models) });   // throws: unknown model, naming what is served
  } catch (err) {
    if (err instanceof openai.APIError) return json(err.status, err.body);
    throw err;
  }
  return errorResponse(503, NO_HOST, { type: "server_error", code: "no_engine" });
}

async function answer(event, name) {
  if (name in POSTS) {
    if (event.request.method !== "POST") return errorResponse(405, `use POST for /v1/${name}`, { code: "method_not_allowed" });
    return post(event, name);
  }
  if (name === "models") {
    if (event.request.method !== "GET") return errorResponse(405, "use GET for /v1/models", { code: "method_not_allowed" });
    return listModels();
  }
  return errorResponse(404, `no endpoint /v1/${name}: this site answers /v1/chat/completions, /v1/completions and /v1/models`, { code: "unknown_url" });
}

// The fetch handler's share: true when it answered `event` (a request under scope/v1/).
export function handleEndpoint(event, scope) {
  const name = endpointOf(event.request.url, scope);
  if (name === null) return false;
  event.respondWith(answer(event, name).catch((err) => errorResponse(500, `the endpoint failed: ${err.message}`, { type: "server_error" })));
  return true;
}

// A page registered the service worker after loading, so nothing controls it yet: take it over, so
// that its fetches to /v1 come here (clients.claim() only runs on activation otherwise).
export function handleMessage(event) {
  if (event.data?.type !== CLAIM) return false;
  event.waitUntil(self.clients.claim());
  return true;
}
