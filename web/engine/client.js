// The in-page side of the engine Worker: requests by id, replies as promises, events to listeners.
// Requests whose shape Python defines (protocol.js) are checked before they are posted: a bad one
// rejects with a BadRequestError naming the field, and the Worker never sees it.

// Worker kinds -> their schema in protocol.js (the other kinds carry bytes or nothing).
const SCHEMA_OF = { load: "load", generate: "generate", complete: "complete", score: "score", bench: "bench", abort: "abort" };

export class EngineError extends Error {
  constructor({ name, message, hint, param }) {
    super(message);
    this.name = name || "EngineError";
    this.hint = hint || null;
    this.param = param ?? null;
  }
}

export const SHARED_WORKER_NAME = "pyshim-engine";

export class EngineClient extends EventTarget {
  // `shared`: connect to the origin's shared engine (shared.js, a SharedWorker) instead of starting a
  // dedicated Worker; the protocol is the same.
  constructor(workerURL = new URL("./worker.js", import.meta.url), { shared = false } = {}) {
    super();
    this.shared = shared;
    this.worker = shared
      ? new SharedWorker(new URL("./shared.js", import.meta.url), { type: "module", name: SHARED_WORKER_NAME })
      : new Worker(workerURL, { type: "module" });
    this.port = shared ? this.worker.port : this.worker;
    this.nextId = 1;
    this.pending = new Map();
    this.protocol = import("./protocol.js");      // loaded once; requests wait for it in the order they were made
    this.port.onmessage = (e) => this.#receive(e.data);
    this.worker.onerror = (e) => {
      // A worker that fails to load (syntax error, missing module) never answers: fail every waiter.
      const error = new EngineError({ name: "WorkerError", message: e.message || "the engine worker failed to start" });
      for (const { reject } of this.pending.values()) reject(error);
      this.pending.clear();
      this.dispatchEvent(new CustomEvent("error", { detail: error }));
    };
  }

  #receive(msg) {
    if (msg.event) {
      // Events with an id belong to one request (a generation's tokens); the rest are broadcast.
      if (msg.id !== undefined) this.pending.get(msg.id)?.onEvent?.(msg.event, msg.data);
      else this.dispatchEvent(new CustomEvent(msg.event, { detail: msg.data }));
      return;
    }
    const waiter = this.pending.get(msg.id);
    if (!waiter) return;
    this.pending.delete(msg.id);
    if (msg.ok) waiter.resolve(msg.result);
    else waiter.reject(new EngineError(msg.error));
  }

  // `onEvent(event, data)` receives the request's own stream (e.g. generate's "token" events);
  // `onId(id)` learns the request id at once (to abort it later with request("abort", {request_id})).
  request(kind, params = {}, { onEvent = null, onId = null } = {}) {
    const id = this.nextId++;
    onId?.(id);
    return this.protocol.then((protocol) => new Promise((resolve, reject) => {
      if (SCHEMA_OF[kind]) {
        try {
          protocol.validate(SCHEMA_OF[kind], params);
        } catch (err) {
          reject(new EngineError({ name: "BadRequestError", message: err.message, param: err.param }));
          return;
        }
      }
      this.pending.set(id, { resolve, reject, onEvent });
      this.port.postMessage({ id, kind, params });
    }));
  }

  // Ends a dedicated Worker; a shared one lives on while other pages use it, so only this page leaves.
  terminate() {
    if (this.shared) this.port.close();
    else this.worker.terminate();
  }
}
