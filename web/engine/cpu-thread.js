// A helper thread of pyshim's threaded CPU engine (cpu.js starts threads - 1 of these): its own instance
// of the threaded module over the engine's shared memory, with its own C stack, then the module's worker
// loop, which sleeps between programs (Atomics.wait) and never returns.

self.onmessage = async ({ data: { module, memory, tid, stackTop } }) => {
  try {
    const { exports } = await WebAssembly.instantiate(module, { env: { memory } });
    const sp = exports.__stack_pointer;         // (an i64 global in the 64-bit build)
    sp.value = typeof sp.value === "bigint" ? BigInt(stackTop) : stackTop;
    self.postMessage({ ready: tid });
    exports.worker(tid);
  } catch (err) {
    self.postMessage({ error: String(err?.message ?? err) });
  }
};
