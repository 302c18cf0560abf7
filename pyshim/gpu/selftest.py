"""A first WGSL dispatch that proves the whole path works: Python → WebGPU → a shader → numbers back.

y[i] = 2·a[i] + b[i] over a length that is not a multiple of the workgroup size, with a uniform
holding n, checked against NumPy. Runs the same in the browser (Pyodide) and natively.
"""

from __future__ import annotations

import time

import numpy as np

from pyshim.gpu import open_device
from pyshim.gpu.device import GPUDevice

WORKGROUP = 64
SELFTEST_N = 1000  # deliberately not a multiple of WORKGROUP

AXPY_WGSL = f"""
struct Params {{ n: u32 }}
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

@compute @workgroup_size({WORKGROUP})
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{
    let i = gid.x;
    if (i >= params.n) {{ return; }}
    y[i] = 2.0 * a[i] + b[i];
}}
"""


async def selftest(device: GPUDevice | None = None, n: int = SELFTEST_N) -> dict:
    start = time.perf_counter()
    device = device or await open_device()
    rng = np.random.default_rng(1234)
    a = rng.standard_normal(n, dtype=np.float32)
    b = rng.standard_normal(n, dtype=np.float32)
    buf_a, buf_b = device.buffer(a.nbytes, label="a"), device.buffer(b.nbytes, label="b")
    buf_y = device.buffer(a.nbytes, label="y")
    params = device.buffer(16, label="params", uniform=True)
    device.write(buf_a, a)
    device.write(buf_b, b)
    device.write(params, np.array([n, 0, 0, 0], dtype=np.uint32))
    pipeline = await device.pipeline(AXPY_WGSL, label="selftest_axpy")
    group = device.bind_group(pipeline, [buf_a, buf_b, buf_y, params])
    device.submit([(pipeline, group, ((n + WORKGROUP - 1) // WORKGROUP, 1, 1))], label="selftest")
    y = np.frombuffer(await device.read(buf_y, a.nbytes), dtype=np.float32)
    expected = 2 * a + b
    err = float(np.max(np.abs(y - expected)))
    return {
        "ok": bool(err <= 1e-6),
        "n": n,
        "max_abs_err": err,
        "first": [float(v) for v in y[:3]],
        "expected_first": [float(v) for v in expected[:3]],
        "adapter": device.caps.as_dict(),
        "ms": (time.perf_counter() - start) * 1e3,
    }
