// The JavaScript half of pyshim's CPU engine in the page: the WebAssembly module built from
// shaders/wasm/engine.c (vendor/pyshim-cpu.wasm), instantiated here and driven from Python through the
// small face pyshim/exec/wasm_module.py's PageModule expects — alloc, write, read, call — so that a
// step is a few calls: its token ids and positions written, one `run` of the recorded program, 4 bytes
// (a greedy id) or the logits read back. Weights never pass through Python: `uploadFrom` copies store
// pieces straight into the module's memory.

const MODULE_URL = new URL("../vendor/pyshim-cpu.wasm", import.meta.url);

let compiled = null;     // the module compiled once per Worker; each load gets a fresh instance (fresh memory)

async function compile() {
  compiled ??= (async () => {
    const response = await fetch(MODULE_URL);
    if (!response.ok) {
      throw Object.assign(new Error(`vendor/pyshim-cpu.wasm: HTTP ${response.status}`), {
        name: "SetupError", hint: "run `pyshim setup` on the server (it builds the CPU engine), then reload",
      });
    }
    return WebAssembly.compile(await response.arrayBuffer());
  })();
  try {
    return await compiled;
  } catch (err) {
    compiled = null;     // a later load may try again
    throw err;
  }
}

// Whether this browser runs WebAssembly SIMD128 (the module needs it): a module of one function,
// (func (result v128) i32.const 0 i8x16.splat), validates only where SIMD does.
export function simdSupported() {
  const probe = new Uint8Array([0, 97, 115, 109, 1, 0, 0, 0, 1, 5, 1, 96, 0, 1, 123, 3, 2, 1, 0, 10, 8, 1, 6, 0,
    65, 0, 253, 15, 11]);
  return WebAssembly.validate(probe);
}

// A fresh engine: its own memory, grown as Python allocates weights, caches and activations.
export async function instantiate() {
  if (!simdSupported()) {
    throw Object.assign(new Error("this browser's WebAssembly has no SIMD, which pyshim's CPU engine needs"), {
      name: "UnsupportedError", hint: "use a current Chrome, Edge, Firefox or Safari (16.4+)",
    });
  }
  const instance = await WebAssembly.instantiate(await compile(), {});
  const exports = instance.exports;
  exports._initialize();
  const bytes = () => new Uint8Array(exports.memory.buffer);     // a new view after each memory growth
  return {
    alloc(nbytes) {
      return exports.alloc(nbytes) >>> 0;
    },
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
      return exports[name](...args);
    },
    memoryBytes() {
      return exports.memory.buffer.byteLength;
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
