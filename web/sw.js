// The service worker: makes the site an installable app that opens (and boots Python) offline.
//
// Strategy: network first, cache as fallback, for the site's own files. Online, every visit gets the
// current files (the dev server revalidates with ETags, so this costs a 304) and refreshes the cache;
// offline, the cache answers. The first visit is not controlled by a service worker yet, so install
// precaches the app shell and everything Python needs (Pyodide runtime, its packages, the wheels).
// Model files (IndexedDB holds them), /api/ and Range requests are never cached here.
//
// The files it serves carry COOP/COEP (cross-origin isolation, for the CPU engine's threads) wherever the
// site is hosted, from the visit after the one that installed it.
//
// It also answers the same-origin OpenAI endpoint under /v1/ by relaying to a page that serves an
// engine (engine/endpoint.js); it is a module worker for that import: register it with {type: "module"}.
//
// Upgrades: a new CACHE_VERSION installs next to the old cache, takes over at once (network first
// makes that safe), and deletes caches of older versions on activate.

import { handleEndpoint, handleMessage } from "./engine/endpoint.js";

const CACHE_VERSION = "v25";
const CACHE = `pyshim-shell-${CACHE_VERSION}`;
const CACHE_PREFIX = "pyshim-shell-";
const SCOPE = new URL(self.registration.scope);

const SHELL = [
  "./", "index.html", "app.js", "style.css", "manifest.webmanifest",
  "icons/icon.svg", "icons/icon-192.png", "icons/icon-512.png",
  "engine/client.js", "engine/worker.js", "engine/python.js", "engine/loader.js", "engine/fit.js", "engine/protocol.js",
  "store/store.js", "store/conversations.js", "store/db.js", "store/download.js", "store/sources.js", "store/errors.js", "store/sha256.js",
  "store/header.js", "store/quota.js", "store/read.js",
  "ui/dom.js", "ui/models.js", "ui/chat.js", "ui/catalog.js", "ui/fitpanel.js", "ui/markdown.js", "ui/phases.js", "ui/conversations.js",
  "pyshim.js", "pyshim-chat.js", "engine/engine.js", "engine/openai.js", "engine/resolve.js", "engine/shared.js",
  "examples/element.html", "examples/api.html",
  "engine/endpoint.js", "engine/host.js", "examples/openai.html", "examples/pyscript.html",
  "engine/grammar.js", "engine/remote.js", "engine/gpu.js", "engine/cpu.js", "engine/cpu-thread.js",
  "vendor/pyshim-cpu.wasm", "vendor/pyshim-cpu-mt.wasm", "vendor/pyshim-cpu-relaxed.wasm", "vendor/pyshim-cpu-mt-relaxed.wasm",
  "vendor/pyshim-cpu64.wasm", "vendor/pyshim-cpu64-mt.wasm", "vendor/pyshim-cpu64-relaxed.wasm", "vendor/pyshim-cpu64-mt-relaxed.wasm",
  "vendor/xgrammar/index.js",
  "vendor/manifest.json", "vendor/definitions.js",
];
const PYODIDE_CORE = ["pyodide.mjs", "pyodide.asm.js", "pyodide.asm.wasm", "python_stdlib.zip", "pyodide-lock.json"];

// Everything bootPython (engine/python.js) fetches, read from the same manifests it reads.
async function pythonFiles() {
  const manifest = await (await fetch(new URL("vendor/manifest.json", SCOPE), { cache: "no-cache" })).json();
  const lock = await (await fetch(new URL("vendor/pyodide/pyodide-lock.json", SCOPE), { cache: "no-cache" })).json();
  const packages = manifest.pyodide_packages.map((name) => {
    const entry = lock.packages[name];
    if (!entry) throw new Error(`pyodide-lock.json has no package ${name}`);
    return `vendor/pyodide/${entry.file_name}`;
  });
  return [...PYODIDE_CORE.map((f) => `vendor/pyodide/${f}`), ...packages, ...manifest.wheels.map((w) => `vendor/${w.url}`)];
}

self.addEventListener("install", (event) => {
  event.waitUntil((async () => {
    const cache = await caches.open(CACHE);
    const urls = [...SHELL, ...(await pythonFiles())].map((u) => new URL(u, SCOPE).href);
    // cache: "no-cache" revalidates with the server, so a stale HTTP-cache copy is never precached.
    await cache.addAll(urls.map((u) => new Request(u, { cache: "no-cache" })));
    await self.skipWaiting();
  })());
});

self.addEventListener("activate", (event) => {
  event.waitUntil((async () => {
    for (const key of await caches.keys()) {
      if (key.startsWith(CACHE_PREFIX) && key !== CACHE) await caches.delete(key);
    }
    await self.clients.claim();
  })());
});

function bypass(request, url) {
  if (request.method !== "GET" || url.origin !== SCOPE.origin || !url.pathname.startsWith(SCOPE.pathname)) return true;
  if (request.headers.has("range")) return true;
  const path = url.pathname.slice(SCOPE.pathname.length);
  return path.startsWith("models/") || path.startsWith("api/");
}

// Cross-origin isolation for static hosting: the site's own files go out with COOP/COEP, as the dev
// server's --isolated sends them, so a page this worker controls may share memory between Workers (the
// CPU engine's threads, web/engine/cpu.js) on any host. Everything it loads is same-origin.
const ISOLATION = {
  "Cross-Origin-Opener-Policy": "same-origin",
  "Cross-Origin-Embedder-Policy": "require-corp",
  "Cross-Origin-Resource-Policy": "same-origin",
};

function isolated(response) {
  if (response.type !== "basic" && response.type !== "default") return response;     // opaque: as it came
  const headers = new Headers(response.headers);
  for (const [name, value] of Object.entries(ISOLATION)) if (!headers.has(name)) headers.set(name, value);
  return new Response(response.body, { status: response.status, statusText: response.statusText, headers });
}

async function networkFirst(request) {
  const cache = await caches.open(CACHE);
  try {
    const response = await fetch(request);
    if (response.status === 200 && response.type === "basic") await cache.put(request, response.clone());
    return isolated(response);
  } catch (err) {
    const cached = await cache.match(request, { ignoreSearch: true });
    if (cached) return isolated(cached);
    throw err;
  }
}

self.addEventListener("message", (event) => handleMessage(event));

self.addEventListener("fetch", (event) => {
  if (handleEndpoint(event, SCOPE)) return;   // the same-origin OpenAI endpoint, /v1/ (engine/endpoint.js)
  const url = new URL(event.request.url);
  if (bypass(event.request, url)) return;
  event.respondWith(networkFirst(event.request));
});
