// The JavaScript half of pyshim's browser GPU face (pyshim/gpu/browser.py is the Python half; Python
// reaches this module as `pyshim_gpu_js`, registered by engine/python.js).
//
// Why it exists: a decode step is a few hundred dispatches, and each WebGPU call made from Python
// crosses Pyodide's FFI (setPipeline, setBindGroup, dispatchWorkgroups: three crossings a dispatch).
// On a real GPU that CPU side is the whole cost of a step. So a recorded program's dispatch list is
// handed over once (`program`), and a step is one call (`replay`) that encodes and submits it here.
// Readbacks take a staging buffer from a small pool instead of creating and destroying one each time.

// A program's dispatches, kept on this side: pipelines, bind groups and a flat Uint32Array of grids.
// `encodeMs` adds up the time replays spent before submitting (writes, encoding): the CPU side of a step
// here, measured before the GPU starts on it (on a CPU adapter the GPU's threads then share the cores).
export function program(pipelines, groups, grids) {
  return { pipelines, groups, grids: Uint32Array.from(grids), encodeMs: 0 };
}

// Replace dispatch i's bind group (a weight slot pointed at another buffer between steps).
export function setGroup(prog, i, group) {
  prog.groups[i] = group;
}

// A step: `writes` ([buffer, byte offset, [u32 words]] each: its token ids and positions) queued, then
// dispatches [start, end) of `prog` encoded in one compute pass and submitted; with `read` ([buffer,
// byte offset, size]) the answer is copied to a staging buffer from `pool` in the same command buffer,
// and the call resolves to its bytes (a Uint8Array of their own). Consecutive dispatches of one pipeline
// set it once.
export function replay(device, prog, start, end, label, writes = null, read = null, pool = null) {
  const t0 = performance.now();
  if (writes) for (const [buffer, offset, words] of writes) device.queue.writeBuffer(buffer, offset, Uint32Array.from(words));
  const encoder = device.createCommandEncoder({ label });
  const pass = encoder.beginComputePass();
  const { pipelines, groups, grids } = prog;
  let current = null;
  for (let i = start; i < end; i++) {
    const pipeline = pipelines[i];
    if (pipeline !== current) {
      pass.setPipeline(pipeline);
      current = pipeline;
    }
    pass.setBindGroup(0, groups[i]);
    pass.dispatchWorkgroups(grids[3 * i], grids[3 * i + 1], grids[3 * i + 2]);
  }
  pass.end();
  if (!read) {
    const commands = encoder.finish();
    prog.encodeMs += performance.now() - t0;
    device.queue.submit([commands]);
    return undefined;
  }
  const [buffer, offset, size] = read;
  const staging = takeStaging(device, pool, size);
  encoder.copyBufferToBuffer(buffer, offset, staging, 0, staging.size);
  const commands = encoder.finish();
  prog.encodeMs += performance.now() - t0;
  device.queue.submit([commands]);
  return mapped(pool, staging, size);
}

// Staging buffers for readbacks, by padded size, reused once unmapped. A handful of sizes occur in a
// run (4 bytes for greedy, the top-k pairs, a logits row), so the pool stays small; STAGING_KEEP bounds
// how many idle buffers of one size stay alive.
const STAGING_KEEP = 4;

export function stagingPool() {
  return { idle: new Map() };
}

function takeStaging(device, pool, size) {
  const padded = Math.ceil(size / 4) * 4;
  return pool.idle.get(padded)?.pop() ?? device.createBuffer({
    label: "readback", size: padded, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
  });
}

// The staging buffer's first `size` bytes once the GPU has written them; the buffer goes back to the pool.
async function mapped(pool, staging, size) {
  try {
    await staging.mapAsync(GPUMapMode.READ);
  } catch (error) {
    staging.destroy();
    throw error;
  }
  const out = new Uint8Array(staging.getMappedRange().slice(0, size));
  staging.unmap();
  let idle = pool.idle.get(staging.size);
  if (!idle) pool.idle.set(staging.size, (idle = []));
  if (idle.length < STAGING_KEEP) idle.push(staging);
  else staging.destroy();
  return out;
}

// Copy `size` bytes at `offset` of `buffer` back to the CPU: resolves to a Uint8Array of their own.
export function read(device, pool, buffer, offset, size) {
  const staging = takeStaging(device, pool, size);
  const encoder = device.createCommandEncoder();
  encoder.copyBufferToBuffer(buffer, offset, staging, 0, staging.size);
  device.queue.submit([encoder.finish()]);
  return mapped(pool, staging, size);
}

// Free every idle staging buffer (the device is going away).
export function clearPool(pool) {
  for (const idle of pool.idle.values()) for (const staging of idle) staging.destroy();
  pool.idle.clear();
}
