// The engine Worker as a SharedWorker: the pages of one origin that ask for a shared engine
// (createEngine({shared: true})) share one Python, one GPU device and one loaded model.
//
// Each page speaks the dedicated Worker's protocol (client.js ↔ worker.js) over its own port. Request
// ids are page-local, so they are renamed here to ids unique across pages and back on the way out;
// events without an id (boot steps, stdout) go to every page. The Worker's one queue (pyshim/serve/scheduler.py)
// runs the pages' generations one after another, never interleaved in the one KV cache.
// Measured first (playwright/sharedworker_webgpu.py): WebGPU and IndexedDB work in a SharedWorker.

import "./worker.js";   // installs its handlers as self.onmessage; posts through self.postMessage below

const ports = new Set();
const routes = new Map();    // shared id -> {port, id}: where a request's replies and events go
const localIds = new Map();  // port -> Map(page id -> shared id), to rename abort's request_id
let nextId = 1;

// worker.js and its modules post replies {id, ok, ...}, request events {id, event} and broadcasts {event}.
self.postMessage = (msg) => {
  if (msg.id === undefined) {
    for (const port of ports) port.postMessage(msg);
    return;
  }
  const route = routes.get(msg.id);
  if (!route) return;
  route.port.postMessage({ ...msg, id: route.id });
  if (msg.ok !== undefined) {   // the final reply: forget the route
    routes.delete(msg.id);
    localIds.get(route.port)?.delete(route.id);
  }
};

self.onconnect = (event) => {
  const port = event.ports[0];
  ports.add(port);
  localIds.set(port, new Map());
  port.onmessage = (e) => {
    const { id, kind, params } = e.data;
    const shared = nextId++;
    routes.set(shared, { port, id });
    localIds.get(port).set(id, shared);
    const renamed = kind === "abort" ? { ...params, request_id: localIds.get(port).get(params?.request_id) ?? -1 } : params;
    self.onmessage({ data: { id: shared, kind, params: renamed } });
  };
  port.start();
};
