// Runs under Node (tests/test_endpoint_protocol.py): the service worker's /v1 endpoint (web/engine/endpoint.js)
// and the page side (web/engine/host.js) talking over real MessageChannels, with fake clients and a fake
// engine that queues like engine.js and answers a request's last message reversed, word by word.
// Prints one JSON object of observations; the Python test asserts on them.

import * as endpoint from "../web/engine/endpoint.js";
import { serveOpenAI } from "../web/engine/host.js";
import * as openai from "../web/engine/openai.js";

const SCOPE = "https://site.test/app/";
const STEP_MS = 5;

// A fake engine with the interface host.js drives: validation first, then one request at a time.
function fakeEngine(id) {
  let tail = Promise.resolve();
  let running = 0;
  const engine = {
    model: { id, aliases: [`url:${id}.gguf`] },
    overlapped: false,
    cancelled: 0,
    requests: 0,
    chat: {
      completions: {
        create: async (body, { signal } = {}) => {
          engine.requests++;
          const request = openai.validateChatRequest(body, { models: [engine.model] });
          if (request.messages.at(-1).content === "fail late") {
            await new Promise((r) => setTimeout(r, 20 * STEP_MS));
            throw new openai.APIError(500, "the GPU was lost", { type: "server_error", code: "DeviceLostError" });
          }
          const words = request.messages.at(-1).content.split(" ").reverse().slice(0, request.max_tokens);
          const base = openai.responseBase("chatcmpl", request.model);
          const job = (onPiece) => {
            const run = tail.then(async () => {
              if (++running > 1) engine.overlapped = true;
              try {
                let i = 0;
                for (; i < words.length; i++) {
                  if (signal?.aborted) { engine.cancelled++; return { finish_reason: "abort", n: i }; }
                  await new Promise((r) => setTimeout(r, STEP_MS));
                  onPiece((i ? " " : "") + words[i]);
                }
                return { finish_reason: "stop", n: i };
              } finally { running--; }
            });
            tail = run.catch(() => {});
            return run;
          };
          if (!request.stream) {
            let text = "";
            const r = await job((p) => { text += p; });
            return openai.chatCompletion(base, { text, finish_reason: r.finish_reason, usage: { prompt_tokens: 3, completion_tokens: r.n } });
          }
          const queue = [openai.chatChunk(base, { role: "assistant", content: "" })];
          let wake = null;
          let finished = false;
          job((p) => { queue.push(openai.chatChunk(base, { content: p })); wake?.(); }).then((r) => {
            queue.push(openai.chatChunk(base, {}, { finish_reason: r.finish_reason, usage: { prompt_tokens: 3, completion_tokens: r.n } }));
            finished = true;
            wake?.();
          });
          return {
            async *[Symbol.asyncIterator]() {
              for (;;) {
                if (queue.length) yield queue.shift();
                else if (finished) return;
                else await new Promise((r) => { wake = r; });
              }
            },
          };
        },
      },
    },
  };
  // Raw completions: the same relay, another endpoint; answered whole, upper-cased.
  engine.completions = {
    create: async (body) => {
      const request = openai.validateCompletionRequest(body, { models: [engine.model] });
      const text = request.prompt.toUpperCase();
      return openai.textCompletion(openai.responseBase("cmpl", request.model), { text, finish_reason: "stop", usage: { prompt_tokens: 1, completion_tokens: 1 } });
    },
  };
  return engine;
}

// A page: a client the service worker can message, with a ServiceWorkerContainer-like target.
function fakePage(id, engine = null) {
  const container = new EventTarget();
  container.startMessages = () => {};
  const client = {
    id,
    postMessage(data, ports) { setTimeout(() => container.dispatchEvent(Object.assign(new Event("message"), { data, ports }))); },
  };
  if (engine) serveOpenAI(engine, { container });
  return client;
}

let pages = [];
globalThis.self = { clients: { matchAll: async () => pages, claim: async () => {} } };

// Sends one request through the endpoint as page `callerId`; -> {status, type, body | text}.
async function send(callerId, path, { method = "POST", body = undefined, raw = undefined, abortAfterMs = null } = {}) {
  const controller = new AbortController();
  const request = new Request(new URL(path, SCOPE), {
    method, signal: controller.signal,
    ...(method === "POST" ? { body: raw ?? JSON.stringify(body), headers: { "Content-Type": "application/json" } } : {}),
  });
  let responded;
  const waits = [];
  const event = { request, clientId: callerId, respondWith: (p) => { responded = p; }, waitUntil: (p) => waits.push(p) };
  if (!endpoint.handleEndpoint(event, SCOPE)) return { handled: false };
  const response = await responded;
  const type = response.headers.get("content-type");
  if (abortAfterMs !== null) {
    const reader = response.body.getReader();
    await reader.read();
    await new Promise((r) => setTimeout(r, abortAfterMs));
    await reader.cancel();
    await Promise.all(waits);
    return { status: response.status, type, cancelled: true };
  }
  const text = await response.text();
  await Promise.all(waits);
  return { status: response.status, type, ...(type.startsWith("application/json") ? { body: JSON.parse(text), padding: text.length - text.trimStart().length } : { text }) };
}

const chat = (content, extra = {}) => ({ model: "m1", messages: [{ role: "user", content }], max_tokens: 50, temperature: 0, ...extra });
const out = {};

out.outside = endpoint.endpointOf("https://site.test/other/v1/models", SCOPE);
out.not_v1 = (await send("a", "index.html", { method: "GET" })).handled;

pages = [fakePage("plain")];   // a page of the site that serves nothing
out.no_host = await send("plain", "v1/chat/completions", { body: chat("a b") });
out.no_host_bad = await send("plain", "v1/chat/completions", { body: chat("a b", { max_tokens: -1 }) });
out.no_host_models = await send("plain", "v1/models", { method: "GET" });

const e1 = fakeEngine("m1");
const e2 = fakeEngine("m2");
pages = [fakePage("plain"), fakePage("h1", e1), fakePage("h2", e2)];
out.models = await send("plain", "v1/models", { method: "GET" });
out.whole = await send("plain", "v1/chat/completions", { body: chat("one two three") });
out.stream = await send("plain", "v1/chat/completions", { body: chat("one two three", { stream: true }) });
out.alias = await send("plain", "v1/chat/completions", { body: chat("x y", { model: "url:m2.gguf" }) });
out.unknown_model = await send("plain", "v1/chat/completions", { body: chat("x", { model: "gpt-4" }) });
out.completion = await send("plain", "v1/completions", { body: { model: "m2", prompt: "once upon" } });
out.completion_bad = await send("plain", "v1/completions", { body: { model: "m2", prompt: "" } });
out.bad_json = await send("plain", "v1/chat/completions", { raw: "{nope" });
out.wrong_method = await send("plain", "v1/chat/completions", { method: "GET" });
out.unknown_path = await send("plain", "v1/embeddings", { body: {} });
out.bad_in_host = await send("plain", "v1/chat/completions", { body: chat("x", { stop: ["1", "2", "3", "4", "5"] }) });

// Several callers at once, to the same engine: each gets its own answer, and the engine never overlapped.
const questions = ["alpha beta gamma delta", "red green blue", "one two three four five six", "a b"];
const answers = await Promise.all(questions.map((q, i) => send(i % 2 ? "h2" : "plain", "v1/chat/completions", { body: chat(q, { stream: i % 2 === 0 }) })));
out.concurrent = answers.map((a, i) => ({ question: questions[i], status: a.status, body: a.body ?? null, text: a.text ?? null }));
out.e1_overlapped = e1.overlapped;

// The caller serves the model itself: it answers, not the first host in the list.
const e3 = fakeEngine("m1");
pages = [fakePage("h1", e1), fakePage("h3", e3)];
const e1Requests = e1.requests;
out.prefers_caller = await send("h3", "v1/chat/completions", { body: chat("p q") });
out.served_by_caller = e3.requests === 1 && e1.requests === e1Requests;

// The caller goes away mid-stream: the host is told and the engine stops.
pages = [fakePage("h1", e1)];
const before = e1.cancelled;
out.cancel = await send("h1", "v1/chat/completions", { body: chat("w ".repeat(40).trim(), { stream: true }), abortAfterMs: 3 * STEP_MS });
await new Promise((r) => setTimeout(r, 20 * STEP_MS));
out.cancelled_in_engine = e1.cancelled - before;

// A non-streamed reply slower than TIMING.respondByMs: answered 200 at once, whitespace, then its JSON;
// a late failure can then only be a JSON error body.
Object.assign(endpoint.TIMING, { respondByMs: 4 * STEP_MS, padMs: 2 * STEP_MS });
out.late = await send("h1", "v1/chat/completions", { body: chat("w ".repeat(30).trim()) });
out.late_failure = await send("h1", "v1/chat/completions", { body: chat("fail late") });
out.early_failure = await send("h1", "v1/chat/completions", { body: chat("x", { max_tokens: 0 }) });

console.log(JSON.stringify(out));
