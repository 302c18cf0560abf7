// Worker kinds behind the engine interface's load() and unload() (web/engine/engine.js).
//
//   load {model_id, context, arithmetic?, kv_type?}
//                              the stored model into GPU buffers now, rather than on the first request;
//                              events "load-progress" {done_bytes, total_bytes}; result {load_ms}
//                              (0 when that model and context were loaded already)
//   unload {}                  frees the GPU device and its buffers; result {unloaded: true}

import { ensureLoaded, setupOf } from "./chat.js";
import { track } from "./generation.js";

// `ensurePython()` -> the booted Pyodide (the Worker's boot, shared with its other kinds). Both wait
// their turn behind running generations (generation.track): the GPU holds one model for all of them.
export function lifecycleKinds(ensurePython) {
  return {
    async load(params, id) {
      const py = await ensurePython();
      const emit = (event, data) => self.postMessage({ id, event, data });
      return track(id, async () => ({ load_ms: await ensureLoaded(py, params.model_id, params.context, emit, setupOf(params)) }));
    },
    async unload(params, id) {
      const py = await ensurePython();
      return track(id, async () => {
        const session = py.pyimport("pyshim.serve.worker_api");
        session.unload();
        session.destroy();
        return { unloaded: true };
      });
    },
  };
}
