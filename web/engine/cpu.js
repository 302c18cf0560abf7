// The JavaScript half of pyshim's CPU engine in the page: the WebAssembly module built from
// shaders/wasm/engine.c (vendor/pyshim-cpu.wasm), instantiated here and driven from Python through the
// small face pyshim/exec/wasm_module.py's PageModule expects — alloc, write, read, call — so that a
// step is a few calls: its token ids and positions written, one `run` of the recorded program, 4 bytes
// (a greedy id) or the logits read back. Weights never pass through Python: `uploadFrom` copies store
// pieces straight into the module's memory.
//
// Threads: in a cross-origin isolated page (the dev server's --isolated; the service worker adds
// COOP/COEP for static hosting) the threaded build (pyshim-cpu-mt.wasm) runs over a shared memory, with
// `threads - 1` helper Workers (cpu-thread.js) each holding an instance of its own; `run` then runs the
// program on all of them. Elsewhere one thread.
//
// Each build has a relaxed-SIMD twin (-relaxed.wasm: the int8 dot products in one instruction), used
// where this browser validates relaxed SIMD (Chrome 114+); the plain SIMD128 build elsewhere. And each
// has a 64-bit twin (pyshim-cpu64*.wasm: memory64, up to 16 GiB), which Python asks for (`wide`) only for
// a model past wasm32's 4 GiB: its pointers are BigInts on this side (V8 runs it as fast as the 32-bit
// build: README, "Past 4 GiB").

const MODULE_URLS = Object.fromEntries(["", "64"].flatMap((bits) => ["single", "threaded"].flatMap((kind) => ["", "-relaxed"].map((relaxed) => [
  `${kind}${bits}${relaxed}`, new URL(`../vendor/pyshim-cpu${bits}${kind === "threaded" ? "-mt" : ""}${relaxed}.wasm`, import.meta.url),
]))));
const WIDE_MAX_PAGES = 262144;              // a browser's largest 64-bit memory: 16 GiB (pyshim.plan.memory)
// The exports whose arguments are pointers, by position: BigInts for the 64-bit build (its other integer
// arguments stay Numbers); only those the engine's Python calls through this face
const POINTER_ARGS = { alloc: [0], run: [0], run_mt: [0] };
export const MAX_THREADS = 8;               // engine.c's MAX_THREADS
const HELPER_STACK = 1 << 20;               // a helper's C stack
const HELPER_READY_MS = 30_000;

const compiled = {};     // each build compiled once per Worker; each load gets a fresh instance (fresh memory)

async function compile(kind) {
  compiled[kind] ??= (async () => {
    const response = await fetch(MODULE_URLS[kind]);
    if (!response.ok) {
      throw Object.assign(new Error(`${MODULE_URLS[kind].pathname}: HTTP ${response.status}`), {
        name: "SetupError", hint: "run `pyshim setup` on the server (it builds the CPU engine), then reload",
      });
    }
    return WebAssembly.compile(await response.arrayBuffer());
  })();
  try {
    return await compiled[kind];
  } catch (err) {
    delete compiled[kind];     // a later load may try again
    throw err;
  }
}

// The threads a load gets: the number asked for (null: the machine's cores, at most MAX_THREADS), one
// where the page cannot share memory between Workers.
export function threadsFor(asked) {
  if (!globalThis.crossOriginIsolated || typeof SharedArrayBuffer === "undefined") return 1;
  const cores = globalThis.navigator?.hardwareConcurrency || 1;
  return Math.max(1, Math.min(MAX_THREADS, asked ?? cores));
}

// `threads - 1` helpers over `memory`, each started in the module's worker loop; resolves once all are in it.
async function startHelpers(module, memory, alloc, threads) {
  const helpers = [];
  const ready = [];
  for (let tid = 1; tid < threads; tid++) {
    const worker = new Worker(new URL("./cpu-thread.js", import.meta.url), { type: "module", name: `pyshim-cpu-${tid}` });
    const stackTop = alloc(HELPER_STACK) + HELPER_STACK;
    ready.push(new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(Object.assign(new Error(`CPU engine thread ${tid} did not start`), { name: "SetupError" })), HELPER_READY_MS);
      worker.onmessage = (e) => { clearTimeout(timer); e.data?.error ? reject(new Error(e.data.error)) : resolve(); };
      worker.onerror = (e) => { clearTimeout(timer); reject(new Error(`CPU engine thread ${tid}: ${e.message}`)); };
    }));
    worker.postMessage({ module, memory, tid, stackTop });
    helpers.push(worker);
  }
  try {
    await Promise.all(ready);
  } catch (err) {
    for (const w of helpers) w.terminate();
    throw err;
  }
  return helpers;
}

// Whether this browser runs WebAssembly SIMD128 (the module needs it): a module of one function,
// (func (result v128) i32.const 0 i8x16.splat), validates only where SIMD does.
export function simdSupported() {
  const probe = new Uint8Array([0, 97, 115, 109, 1, 0, 0, 0, 1, 5, 1, 96, 0, 1, 123, 3, 2, 1, 0, 10, 8, 1, 6, 0,
    65, 0, 253, 15, 11]);
  return WebAssembly.validate(probe);
}

// Whether it runs relaxed SIMD too: (func (result v128) three i8x16.splat of 0, then
// i32x4.relaxed_dot_i8x16_i7x16_add_s) validates only where it does.
export function relaxedSimdSupported() {
  const splat0 = [65, 0, 253, 15];
  const probe = new Uint8Array([0, 97, 115, 109, 1, 0, 0, 0, 1, 5, 1, 96, 0, 1, 123, 3, 2, 1, 0, 10, 19, 1, 17, 0,
    ...splat0, ...splat0, ...splat0, 253, 147, 2, 11]);
  return WebAssembly.validate(probe);
}

// Whether this browser runs 64-bit WebAssembly memories (memory64: Chrome 133+, Firefox 134+): a module
// of one memory with the 64-bit flag validates only where it does.
export function memory64Supported() {
  return WebAssembly.validate(new Uint8Array([0, 97, 115, 109, 1, 0, 0, 0, 5, 3, 1, 4, 0]));
}

// The threaded 64-bit build's shared memory (the descriptor's field was `index` before it was `address`,
// whose sizes are BigInts)
function sharedMemory64(initial) {
  try {
    return new WebAssembly.Memory({ initial: BigInt(initial), maximum: BigInt(WIDE_MAX_PAGES), shared: true, address: "i64" });
  } catch {
    return new WebAssembly.Memory({ initial, maximum: WIDE_MAX_PAGES, shared: true, index: "i64" });
  }
}

// A fresh engine: its own memory, grown as Python allocates weights, caches and activations; `threads`
// (null: the cores) where the page is cross-origin isolated; `relaxed` (null: where the browser has it)
// picks the relaxed-SIMD build; `wide` the 64-bit build (a model past 4 GiB; refused without memory64).
export async function instantiate(asked = null, { relaxed = null, wide = false } = {}) {
  if (!simdSupported()) {
    throw Object.assign(new Error("this browser's WebAssembly has no SIMD, which pyshim's CPU engine needs"), {
      name: "UnsupportedError", hint: "use a current Chrome, Edge, Firefox or Safari (16.4+)",
    });
  }
  if (wide && !memory64Supported()) {
    throw Object.assign(new Error("this model needs more than the 4 GB a 32-bit WebAssembly engine addresses, and this browser has no 64-bit WebAssembly memory (memory64)"), {
      name: "UnsupportedError", hint: "use Chrome or Edge 133+ or Firefox 134+, a browser with WebGPU, or a smaller model",
    });
  }
  const threads = threadsFor(asked);
  relaxed = (relaxed ?? true) && relaxedSimdSupported();
  const suffix = (wide ? "64" : "") + (relaxed ? "-relaxed" : "");
  let instance, memory, helpers = [], module;
  if (threads > 1) {
    module = await compile("threaded" + suffix);
    // (at least the module's own minimum, 257 pages; at most the memory it was linked for: wasm32's
    // 4 GiB less a page, or 16 GiB)
    memory = wide ? sharedMemory64(512) : new WebAssembly.Memory({ initial: 512, maximum: 65535, shared: true });
    instance = await WebAssembly.instantiate(module, { env: { memory } });
  } else {
    instance = await WebAssembly.instantiate(await compile("single" + suffix), {});
  }
  const exports = instance.exports;
  exports._initialize();
  memory ??= exports.memory;
  // the 64-bit build's pointers cross as BigInts, and come back as them
  const invoke = !wide ? (name, args) => exports[name](...args) : (name, args) => {
    const big = POINTER_ARGS[name] ?? [];
    const out = exports[name](...args.map((a, i) => (big.includes(i) ? BigInt(a) : a)));
    return typeof out === "bigint" ? Number(out) : out;
  };
  const alloc = (nbytes) => (wide ? invoke("alloc", [nbytes]) : exports.alloc(nbytes) >>> 0);
  if (threads > 1) helpers = await startHelpers(module, memory, alloc, threads);
  const bytes = () => new Uint8Array(memory.buffer);     // a new view after each memory growth
  return {
    threads,
    relaxed,
    wide,
    alloc,
    // `data`: a Python buffer (a PyProxy: copied from its memory without a conversion) or a typed array
    write(ptr, data) {
      if (data && typeof data.getBuffer === "function") {
        const view = data.getBuffer("u8");
        try {
          bytes().set(view.data, ptr);
        } finally {
          view.release();
        }
      } else {
        bytes().set(data instanceof Uint8Array ? data : new Uint8Array(data.buffer, data.byteOffset, data.byteLength), ptr);
      }
    },
    read(ptr, nbytes) {
      return bytes().slice(ptr, ptr + nbytes);
    },
    call(name, ...args) {
      if (name === "run" && threads > 1) return invoke("run_mt", [...args, threads]);
      return invoke(name, args);
    },
    close() {     // the helpers end with the engine (a Worker blocked in Atomics.wait is terminated)
      for (const w of helpers) w.terminate();
      helpers = [];
    },
    memoryBytes() {
      return memory.buffer.byteLength;
    },
    // Store pieces ({slice: {ptr}, at, bytes}) from an async iterator into memory.
    async uploadFrom(pieces, onBytes = () => {}) {
      for await (const { slice, at, bytes: piece } of pieces) {
        bytes().set(piece, slice.ptr + at);
        onBytes(piece.length);
      }
    },
  };
}
