// The page side of the same-origin OpenAI endpoint (the service worker's engine/endpoint.js): a page
// that holds an engine serves it, so that `fetch("/v1/chat/completions")` and the official OpenAI SDK
// (with `baseURL` = the site's /v1) reach that engine from this page or any other page of the site.
//
//   import { createEngine } from "../pyshim.js";
//   import { serveOpenAI, endpointReady } from "../engine/host.js";
//   const engine = await createEngine({ model: "smollm2" });
//   const stop = serveOpenAI(engine);        // answers the service worker's probes and requests
//   const baseURL = await endpointReady();   // the service worker is installed and controls this page
//
// The message protocol is described in endpoint.js. The engine validates every request and its Worker queues it
// (engine.js), whoever sends it; this side only relays, with a heartbeat so the service worker can
// tell a slow reply (a long queue, SwiftShader) from a page that was closed.

import * as openai from "./openai.js";
import { CLAIM, HEARTBEAT_MS, PROBE, REQUEST } from "./endpoint.js";

const SITE = new URL("../", import.meta.url);
const CREATE = {
  "chat.completions": (engine, body, options) => engine.chat.completions.create(body, options),
  completions: (engine, body, options) => engine.completions.create(body, options),
};

const isStream = (result) => result != null && typeof result[Symbol.asyncIterator] === "function";

// The ids and aliases `engine` answers to (none until a model is selected or loaded).
function modelsOf(engine) {
  return engine.model ? [{ id: engine.model.id, aliases: engine.model.aliases ?? [] }] : [];
}

// Runs one relayed request on `engine`, posting its reply on `port` (endpoint.js's protocol).
async function serve(engine, { endpoint, body }, port) {
  const controller = new AbortController();
  const alive = setInterval(() => port.postMessage({ type: "alive" }), HEARTBEAT_MS);
  port.onmessage = (e) => {
    if (e.data?.type === "cancel") controller.abort();
  };
  try {
    const create = CREATE[endpoint];
    if (!create) throw new openai.APIError(404, `this page does not serve ${endpoint}`, { code: "unknown_url" });
    const result = await create(engine, body, { signal: controller.signal });
    if (isStream(result)) {
      port.postMessage({ type: "accepted" });
      for await (const chunk of result) port.postMessage({ type: "chunk", chunk });
      port.postMessage({ type: "done" });
    } else {
      port.postMessage({ type: "done", body: result });
    }
  } catch (err) {
    const error = openai.errorFromEngine(err);
    port.postMessage({ type: "error", status: error.status, body: error.body });
  } finally {
    clearInterval(alive);
    port.close();
  }
}

// Serves `engine` to the service worker's /v1 endpoint until the returned function is called.
export function serveOpenAI(engine, { container = navigator.serviceWorker } = {}) {
  const onMessage = (event) => {
    const msg = event.data;
    const port = event.ports?.[0];
    if (!port || !msg) return;
    if (msg.type === PROBE) port.postMessage({ type: "host", models: modelsOf(engine) });
    else if (msg.type === REQUEST) serve(engine, msg, port);
  };
  container.addEventListener("message", onMessage);
  container.startMessages();   // messages wait in a queue until this (or an onmessage setter)
  return () => container.removeEventListener("message", onMessage);
}

// Installs the site's service worker (a module worker) and waits until it controls this page, so
// that requests to /v1 reach it. -> the endpoint's base URL (for the OpenAI SDK's `baseURL`).
export async function endpointReady({ site = SITE, container = navigator.serviceWorker } = {}) {
  const registration = await container.register(new URL("sw.js", site), { type: "module" });
  await container.ready;
  if (!container.controller) {
    const controlled = new Promise((resolve) => container.addEventListener("controllerchange", resolve, { once: true }));
    // A page loaded before the service worker activated is not controlled until it claims clients.
    (registration.active ?? (await container.ready).active).postMessage({ type: CLAIM });
    await controlled;
  }
  return new URL("v1", registration.scope).href;
}
