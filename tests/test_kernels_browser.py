"""The kernels in Chromium (Tint + SwiftShader here) against NumPy: every weight type's matvec (every
variant) and embedding, rmsnorm, rope, attention over a wrapped ring, glu and argmax; the int8 route
(quantize exactly as the NumPy emulation of llama.cpp's rounding, matvec_i8 per type and with several tokens per invocation, the grouped Q8_0 layout
and its repack, the f16 GELU).

Python builds each case (expanded WGSL, input bytes, params, grid) and the expected result; one page runs
all cases in one batch through plain WebGPU calls and returns the output bytes. One page per module."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import harness
import i8_emulation
from gpu_helpers import kv_slot, page_params, random_weight, step_map
from pyshim.gpu.kernels import (ARGMAX_CHUNK, GROUPED_TYPES, I8_ACTIVATIONS, I8_BLOCKS, I8_PAIR_TYPES, PARAMS, WEIGHT_TYPES, WG, argmax_keys,
                                argmax_pass1, attention_keys, groups, matvec_grid, matvec_i8_key, matvec_key, quantize_key,
                                rmsnorm_grid, rmsnorm_key, rope_theta, shader_block, xq_row_words,
                                embed_key, repack_bytes, repack_grid, repack_key,
                                I8_LANE_TYPES, I8_TOKEN_TYPES, I8_TOKENS, lanes_key, matvec_i8_grid)
from pyshim.plan.memory import group_bytes
from pyshim.gpu.policy import TOKEN_ROWS_NARROW
from pyshim.gpu.shaderc import Preprocessor, ShaderKey
from pyshim.exec.reference import dequantize_rows
from pyshim.models.rope import RopeSpec

pytestmark = pytest.mark.browser

RUN_JS = """async (cases) => {
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) return {error: "no adapter"};
  // the subgroup variants need the feature at device creation, as pyshim.gpu.browser requests it
  // the features and workgroup memory pyshim.gpu.browser asks for (the CPU-adapter matmul tile takes 24 KiB)
  const device = await adapter.requestDevice({requiredFeatures: adapter.features.has("subgroups") ? ["subgroups"] : [],
    requiredLimits: {maxComputeWorkgroupStorageSize: adapter.limits.maxComputeWorkgroupStorageSize}});
  const U = GPUBufferUsage;
  const bytes = (b64) => Uint8Array.from(atob(b64), c => c.charCodeAt(0));
  const pad = (n) => Math.max(16, Math.ceil(n / 16) * 16);
  const results = [];
  for (const c of cases) {
    device.pushErrorScope("validation");
    const module = device.createShaderModule({code: c.code});
    const pipeline = await device.createComputePipelineAsync({layout: "auto", compute: {module, entryPoint: "main"}});
    const buffers = c.inputs.map((b64, i) => {
      const data = bytes(b64);
      const asUniform = (c.uniform || []).includes(i);     // bound as a 64 KiB uniform array
      const buf = device.createBuffer({size: asUniform ? Math.max(65536, pad(data.length)) : pad(data.length),
                                       usage: U.STORAGE | U.COPY_DST | (asUniform ? U.UNIFORM : 0)});
      const padded = new Uint8Array(Math.ceil(data.length / 4) * 4); padded.set(data);
      device.queue.writeBuffer(buf, 0, padded);
      return buf;
    });
    const outs = c.outputs.map(o => {     // a byte size, or {size, init}: read-write data (in-place kernels)
      const buf = device.createBuffer({size: pad(o.size ?? o), usage: U.STORAGE | U.COPY_SRC | U.COPY_DST});
      if (o.init) device.queue.writeBuffer(buf, 0, bytes(o.init));
      return buf;
    });
    const params = device.createBuffer({size: pad(bytes(c.params).length), usage: U.UNIFORM | U.COPY_DST});
    device.queue.writeBuffer(params, 0, bytes(c.params));
    const all = [...buffers, ...outs, params];
    const group = device.createBindGroup({layout: pipeline.getBindGroupLayout(0),
      entries: all.map((buffer, binding) => ({binding, resource: {buffer}}))});
    const enc = device.createCommandEncoder();
    const pass = enc.beginComputePass();
    pass.setPipeline(pipeline); pass.setBindGroup(0, group); pass.dispatchWorkgroups(...c.grid); pass.end();
    const staging = outs.map(o => device.createBuffer({size: o.size, usage: U.MAP_READ | U.COPY_DST}));
    outs.forEach((o, i) => enc.copyBufferToBuffer(o, 0, staging[i], 0, o.size));
    device.queue.submit([enc.finish()]);
    const got = [];
    for (const s of staging) {
      await s.mapAsync(GPUMapMode.READ);
      got.push(btoa(String.fromCharCode(...new Uint8Array(s.getMappedRange()))));
      s.unmap();
    }
    const err = await device.popErrorScope();
    results.push({outputs: got, error: err ? err.message : null});
    [...all, ...staging].forEach(b => b.destroy());
  }
  device.destroy();
  return {adapter: adapter.info.architecture || adapter.info.vendor, results};
}"""


def b64(array) -> str:
    return base64.b64encode(np.ascontiguousarray(array).tobytes()).decode()


class Cases:
    def __init__(self):
        self.pre = Preprocessor()
        self.cases: list[dict] = []
        self.checks: list = []

    def add(self, name, key, inputs, outputs, params, grid, check, uniform=()):
        """`outputs`: byte sizes, or arrays for buffers the kernel rewrites in place (read back the same)."""
        outputs = [o if isinstance(o, int) else {"size": o.nbytes, "init": b64(o)} for o in outputs]
        self.cases.append({"code": self.pre.build(key), "inputs": [b64(x) for x in inputs], "outputs": outputs,
                           "params": b64(PARAMS[key.family].pack(**params)), "grid": list(grid), "uniform": list(uniform)})
        self.checks.append((name, check))


def close(want, rel=2e-5):
    scale = float(np.max(np.abs(want))) or 1.0

    def check(outs):
        got = np.frombuffer(outs[0], dtype=np.float32)[: want.size].reshape(want.shape)
        np.testing.assert_allclose(got, want, rtol=rel, atol=rel * scale)
    return check


def build_cases() -> Cases:
    c = Cases()
    rng = np.random.default_rng(2024)
    for qtype, (define, _, _) in WEIGHT_TYPES.items():
        per = shader_block(qtype)[0]
        k = 3 * max(per, 32) if per < 256 else 512
        m, n = 67, 2
        raw = random_weight(qtype, m, k, rng)
        x = rng.standard_normal((n, k), dtype=np.float32)
        want = x @ dequantize_rows(raw, qtype).reshape(m, k).T
        for reduce, subgroup in ((False, False), (True, False), (True, True)):
            c.add(f"matvec {qtype.name} reduce={reduce} subgroup={subgroup}",
                  matvec_key(qtype, reduce=reduce, subgroup=subgroup),
                  [raw, x], [n * m * 4], dict(m=m, k=k, n=n, row_bytes=raw.shape[1], w_off=0, x_off=0, y_off=0,
                                             bias_off=0, y_stride=m), matvec_grid(m, n, reduce), close(want))
        c.add(f"matvec {qtype.name} uniform x", matvec_key(qtype, uniform_x=True), [raw, x], [n * m * 4],
              dict(m=m, k=k, n=n, row_bytes=raw.shape[1], w_off=0, x_off=0, y_off=0, bias_off=0, y_stride=m),
              matvec_grid(m, n), close(want), uniform=[1])
        tokens = np.array([3, 0, 66, 3], dtype=np.uint32)
        want = dequantize_rows(raw[tokens.astype(np.int64)], qtype).reshape(len(tokens), k)
        c.add(f"embed {qtype.name}", ShaderKey.of("embed", **{define: True}, WG=WG), [raw, tokens], [want.nbytes],
              dict(d=k, n=len(tokens), row_bytes=raw.shape[1], w_off=0, tok_off=0, out_off=0, row0=0, rows=m),
              (groups(k // per), len(tokens), 1), close(want, rel=0))

    add_int8_cases(c, rng)
    add_subgroup_cases(c, rng)

    rows, d = 9, 64
    x = rng.standard_normal((rows, d), dtype=np.float32)
    w = rng.standard_normal(d, dtype=np.float32)
    want = (x / np.sqrt(np.mean(np.square(x, dtype=np.float64), axis=-1, keepdims=True) + 1e-6)).astype(np.float32) * w
    c.add("rmsnorm", ShaderKey.of("rmsnorm", WG=WG), [x, w], [x.nbytes],
          dict(rows=rows, d=d, eps=1e-6, x_off=0, y_off=0, w_off=0), (groups(rows), 1, 1), close(want))

    from pyshim.exec.reference import ReferenceOps
    ref = ReferenceOps.__new__(ReferenceOps)       # the plain f32 ops that need no weights
    spec = RopeSpec(dims=32, base=10000.0, neox=True, scaling="yarn", factor=4.0, n_ctx_orig=256)
    xr = rng.standard_normal((2, 3, 64), dtype=np.float32)
    pos = np.array([5, 300], dtype=np.int64)
    theta, mscale = rope_theta(spec)
    c.add("rope yarn neox", ShaderKey.of("rope", WG=WG, NEOX=True), [xr, pos.astype(np.uint32), theta], [xr.nbytes],
          dict(n=2, heads=3, head_dim=64, dims=32, mscale=mscale, x_off=0, y_off=0, pos_off=0), (groups(32), 3, 2),
          close(ref.rope(xr, pos, spec), rel=5e-4))

    # attention for one query at position 37 over a ring of two pages (32 slots, in scrambled order), window
    # 5, GQA 4:2, softcap
    heads, kvh, hd, cap, window, softcap, p = 4, 2, 32, 32, 5, 4.0, 37
    q = rng.standard_normal((1, heads, hd), dtype=np.float32)
    keys = rng.standard_normal((p + 1, kvh, hd), dtype=np.float32)
    vals = rng.standard_normal((p + 1, kvh, hd), dtype=np.float32)
    kc, vc = np.zeros((cap, kvh, hd), np.float32), np.zeros((cap, kvh, hd), np.float32)
    for j in range(p + 1):
        kc[kv_slot(j, cap)], vc[kv_slot(j, cap)] = keys[j], vals[j]
    seen = np.arange(p - window + 1, p + 1)
    want = np.zeros((1, heads * hd), np.float32)
    for h in range(heads):
        s = keys[seen, h // 2] @ q[0, h] * hd ** -0.5
        s = softcap * np.tanh(s / softcap)
        e = np.exp(s - s.max())
        want[0, h * hd:(h + 1) * hd] = (e / e.sum()) @ vals[seen, h // 2]
    params = dict(n=1, heads=heads, kv_heads=kvh, window=window, scale=hd ** -0.5, softcap=softcap, pos_off=0,
                  q_off=0, out_off=0, **page_params(1, cap))
    key, _ = attention_keys(hd, hd, True, 1)
    c.add("attention ring window softcap", key, [q, kc, vc, step_map(np.array([p]), cap)], [want.nbytes], params,
          (groups(heads), 1, 1), close(want, rel=1e-4))
    # the same split over 3 key ranges: pass 1 here, then the combine pass on a record buffer built in
    # NumPy the way pass 1 lays it out (each pass checked on its own)
    splits = 3
    key, combine = attention_keys(hd, hd, True, splits)
    share = -(-window // splits)
    records = np.zeros((heads, splits, hd // 4 + 1, 4), np.float32)
    for h in range(heads):
        for sp in range(splits):
            js = seen[sp * share:(sp + 1) * share]
            s = softcap * np.tanh(keys[js, h // 2] @ q[0, h] * hd ** -0.5 / softcap)
            mx = s.max() if len(js) else -3.0e38
            e = np.exp(s - mx)
            records[h, sp, 0, :2] = mx, e.sum()
            records[h, sp, 1:] = (e @ vals[js, h // 2]).reshape(-1, 4) if len(js) else 0
    c.add("attention split pass", key, [q, kc, vc, step_map(np.array([p]), cap)], [records.nbytes], params,
          (groups(heads), 1, splits), close(records, rel=1e-4))
    c.add("attention combine pass", combine, [records], [want.nbytes], params, (groups(heads), 1, 1),
          close(want, rel=1e-4))

    g, u = rng.standard_normal((2, 20), dtype=np.float32) * 4, rng.standard_normal((2, 20), dtype=np.float32)
    for act, define in (("silu", "ACT_SILU"), ("gelu_tanh", "ACT_GELU")):
        c.add(f"glu {act}", ShaderKey.of("glu", WG=WG, **{define: True}), [g, u], [g.nbytes],
              dict(n=2, f=20, gate_off=0, gate_stride=20, up_off=0, up_stride=20, out_off=0), (groups(5), 2, 1),
              close(ref.glu(g, u, act)))

    logits = rng.standard_normal(5000, dtype=np.float32)
    logits[4321] = 9.0
    parts = groups(len(logits), ARGMAX_CHUNK)

    def argmax_check(outs):
        partial = np.frombuffer(outs[0], dtype=np.uint32)[: 2 * parts].reshape(parts, 2)
        assert int(partial[np.argmax(partial[:, 0].view(np.float32)), 1]) == 4321
    c.add("argmax pass 1", ShaderKey.of("argmax", WG=WG, PASS1=True), [logits], [parts * 8],
          dict(len=len(logits), chunk=ARGMAX_CHUNK, x_off=0), (groups(parts), 1, 1), argmax_check)
    return c


def add_subgroup_cases(c: Cases, rng) -> None:
    """The subgroup matvec with a bias, in workgroups of one subgroup (4 = SwiftShader's size) and of 32;
    the one-workgroup-per-row rmsnorm (tree and subgroup sums); the subgroup argmax's two passes."""
    qtype, m, k, n = QT.Q5_K, 37, 1280, 2
    raw = random_weight(qtype, m, k, rng)
    x = rng.standard_normal((n, k), dtype=np.float32)
    bias = rng.standard_normal(m, dtype=np.float32)
    want = x @ dequantize_rows(raw, qtype).reshape(m, k).T + bias
    for wg, rows in ((4, 3), (32, 1)):
        c.add(f"matvec subgroup bias wg={wg}", ShaderKey.of("matvec", W_Q5_K=True, WG=wg, ROWS=rows, REDUCE=True, SUBGROUP=True, BIAS=True),
              [raw, x, bias], [n * m * 4], dict(m=m, k=k, n=n, row_bytes=raw.shape[1], w_off=0, x_off=0, y_off=0,
                                                bias_off=0, y_stride=m), (groups(m, rows), n, 1), close(want))
    rows, d = 5, 1028                          # 257 vec4s: 4 per invocation and one more
    x = rng.standard_normal((rows, d), dtype=np.float32)
    w = rng.standard_normal(d, dtype=np.float32)
    want = (x / np.sqrt(np.mean(np.square(x, dtype=np.float64), axis=-1, keepdims=True) + 1e-6)).astype(np.float32) * w
    for subgroup in (False, True):
        c.add(f"rmsnorm workgroup per row subgroup={subgroup}", rmsnorm_key(reduce=True, subgroup=subgroup), [x, w], [x.nbytes],
              dict(rows=rows, d=d, eps=1e-6, x_off=0, y_off=0, w_off=0), rmsnorm_grid(rows, reduce=True), close(want))
    logits = rng.standard_normal(5000, dtype=np.float32)
    logits[[4321, 1234, 1233]] = 9.0                      # ties across workgroups and within a subgroup
    chunk, parts, grid = argmax_pass1(len(logits), subgroup=True)
    pass1, pass2 = argmax_keys(subgroup=True)
    partial = np.zeros((parts, 2), np.uint32)
    for g in range(parts):
        best = g * chunk + int(np.argmax(logits[g * chunk:(g + 1) * chunk]))
        partial[g] = logits[best].view(np.uint32), best

    def exact(want):
        return lambda outs: np.testing.assert_array_equal(np.frombuffer(outs[0], np.uint32)[: want.size], want.ravel())
    c.add("argmax subgroup pass 1", pass1, [logits], [parts * 8], dict(len=len(logits), chunk=chunk, x_off=0), grid, exact(partial))
    c.add("argmax subgroup pass 2", pass2, [partial], [4], dict(len=parts, chunk=0, x_off=0), (1, 1, 1),
          exact(np.array([1233], np.uint32)))


def quantized_like(x: np.ndarray, fmt: str):
    """The int8 values exactly; the f32 metadata to 1 ulp: SwiftShader's f32 division (Q8_K's d = 1/iscale)
    is not always correctly rounded (WGSL allows 2.5 ulp), lavapipe's is (tests/test_kernels_i8.py)."""
    n, k = x.shape
    q_want, info_want = i8_emulation.quantize(x, fmt)

    def check(outs):
        q, info = i8_emulation.unpack(np.frombuffer(outs[0], np.uint32), n, k, fmt)
        np.testing.assert_array_equal(q, q_want)
        np.testing.assert_allclose(info, info_want, rtol=2.5e-7, atol=0)
    return check


def add_int8_cases(c: Cases, rng) -> None:
    """quantize (odd block counts, bit-exact), matvec_i8 for every type (storage and uniform x) and GELU_F16."""
    from pyshim.exec.llama_cpp import gelu_llama_cpp

    for fmt, k in (("q8_0", 224), ("q8_k", 768)):
        n = 2
        x = rng.standard_normal((n, k), dtype=np.float32) * 3
        x[0, 5] = 60.0
        c.add(f"quantize {fmt}", quantize_key(fmt), [x], [n * xq_row_words(k, fmt) * 4],
              dict(k=k, n=n, x_off=0, x_stride=k, q_off=0, row_words=xq_row_words(k, fmt)),
              (groups(k // I8_BLOCKS[fmt][0]), n, 1), quantized_like(x, fmt))
    for qtype, fmt in I8_ACTIVATIONS.items():
        if qtype in GROUPED_TYPES:                 # read in their grouped layout: add_grouped_cases
            continue
        k = 288 if fmt == "q8_0" else 768
        m = 67
        raw = random_weight(qtype, m, k, rng)
        for n, uniform in ((2, False), (1, True)):
            q, info = i8_emulation.quantize(rng.standard_normal((n, k), dtype=np.float32), fmt)
            want = i8_emulation.matvec(raw, qtype, q, info).astype(np.float32)
            c.add(f"matvec_i8 {qtype.name} uniform={uniform}", matvec_i8_key(qtype, uniform_x=uniform, rows=4),
                  [raw, i8_emulation.pack(q, info)], [n * m * 4],
                  dict(m=m, k=k, n=n, row_bytes=raw.shape[1], w_off=0, x_off=0, y_off=0, bias_off=0, y_stride=m,
                       pair_off=0, x_row_words=xq_row_words(k, fmt)), matvec_grid(m, n, rows=4), close(want, rel=1e-5),
                  uniform=[1] if uniform else [])
    for qtype in sorted(I8_TOKEN_TYPES - GROUPED_TYPES.keys()):     # several tokens per invocation (prefill)
        fmt = I8_ACTIVATIONS[qtype]                # (the K-quants piece by piece)
        k, m, n = 288 if fmt == "q8_0" else 768, 67, 11
        raw = random_weight(qtype, m, k, rng)
        q, info = i8_emulation.quantize(rng.standard_normal((n, k), dtype=np.float32), fmt)
        c.add(f"matvec_i8 {qtype.name} tokens", matvec_i8_key(qtype, rows=TOKEN_ROWS_NARROW, tokens=I8_TOKENS),
              [raw, i8_emulation.pack(q, info)], [n * m * 4],
              dict(m=m, k=k, n=n, row_bytes=raw.shape[1], w_off=0, x_off=0, y_off=0, bias_off=0, y_stride=m,
                   pair_off=0, x_row_words=xq_row_words(k, fmt)), matvec_i8_grid(m, n, TOKEN_ROWS_NARROW, I8_TOKENS),
              close(i8_emulation.matvec(raw, qtype, q, info).astype(np.float32), rel=1e-5))
    for qtype in sorted(I8_LANE_TYPES - GROUPED_TYPES.keys()):    # tokens in pairs (lanes.wgsl's words)
        fmt = I8_ACTIVATIONS[qtype]
        k, m, n = 288 if fmt == "q8_0" else 768, 67, 11
        raw = random_weight(qtype, m, k, rng)
        q, info = i8_emulation.quantize(rng.standard_normal((n, k), dtype=np.float32), fmt)
        words, pair_off = i8_emulation.with_lanes(q, info)
        c.add(f"matvec_i8 {qtype.name} lanes", matvec_i8_key(qtype, rows=TOKEN_ROWS_NARROW, tokens=I8_TOKENS, lanes=True),
              [raw, words], [n * m * 4],
              dict(m=m, k=k, n=n, row_bytes=raw.shape[1], w_off=0, x_off=0, y_off=0, bias_off=0, y_stride=m,
                   pair_off=pair_off, x_row_words=xq_row_words(k, fmt)), matvec_i8_grid(m, n, TOKEN_ROWS_NARROW, I8_TOKENS),
              close(i8_emulation.matvec(raw, qtype, q, info).astype(np.float32), rel=1e-5))
    k, n = 96, 5                                   # the pairs themselves, made from the rows in place
    q, info = i8_emulation.quantize(rng.standard_normal((n, k), dtype=np.float32), "q8_0")
    words, pair_off = i8_emulation.with_lanes(q, info)
    rows_only = words.copy()
    rows_only[pair_off:] = 0
    c.add("lanes", lanes_key(), [], [rows_only], dict(k=k, n=n, row_words=xq_row_words(k, "q8_0"), pair_off=pair_off),
          (groups(k // 4), (n + 1) // 2, 1), lambda outs, want=words: np.testing.assert_array_equal(np.frombuffer(outs[0], np.uint32), want))
    for qtype in sorted(I8_PAIR_TYPES):            # two blocks per call: rows of an even block count
        k, m = 320, 37
        raw = random_weight(qtype, m, k, rng)
        q, info = i8_emulation.quantize(rng.standard_normal((1, k), dtype=np.float32), "q8_0")
        c.add(f"matvec_i8 {qtype.name} pairs", matvec_i8_key(qtype, uniform_x=True, rows=4, pairs=True),
              [raw, i8_emulation.pack(q, info)], [m * 4],
              dict(m=m, k=k, n=1, row_bytes=raw.shape[1], w_off=0, x_off=0, y_off=0, bias_off=0, y_stride=m,
                   pair_off=0, x_row_words=xq_row_words(k, "q8_0")), matvec_grid(m, 1, rows=4),
              close(i8_emulation.matvec(raw, qtype, q, info).astype(np.float32), rel=1e-5), uniform=[1])
    add_grouped_cases(c, rng)
    g = rng.standard_normal((2, 40), dtype=np.float32) * 2
    u = rng.standard_normal((2, 40), dtype=np.float32)
    c.add("glu gelu f16 table", ShaderKey.of("glu", WG=WG, ACT_GELU=True, GELU_F16=True), [g, u], [g.nbytes],
          dict(n=2, f=40, gate_off=0, gate_stride=40, up_off=0, up_stride=40, out_off=0), (groups(10), 2, 1),
          close(gelu_llama_cpp(g) * u, rel=2e-3))


def add_grouped_cases(c: Cases, rng) -> None:
    """The int8 route's grouped Q4_0, Q8_0 and Q6_K: repack.wgsl in place (a partial last group), then matvec_i8
    and embed reading the layout as i8_emulation.grouped states it."""
    for qtype in sorted(GROUPED_TYPES):
        fmt, per = I8_ACTIVATIONS[qtype], shader_block(qtype)[0]
        m, k = 67, 9 * per if per == 32 else 3 * per
        raw = random_weight(qtype, m, k, rng)
        nbytes = repack_bytes(m, raw.shape[1], qtype)
        file_bytes = np.zeros(nbytes, np.uint8)
        file_bytes[:raw.size] = raw.reshape(-1)
        want = i8_emulation.grouped(raw, qtype)

        def is_grouped(outs, want=want):
            np.testing.assert_array_equal(np.frombuffer(outs[0], np.uint8)[:want.size], want)
        n_groups = nbytes // group_bytes(qtype)
        c.add(f"repack {qtype.name}", repack_key(qtype), [], [file_bytes], dict(groups=n_groups, first=0),
              repack_grid(n_groups), is_grouped)
        lane_cases = ((11, False, TOKEN_ROWS_NARROW, I8_TOKENS, True),) if qtype in I8_LANE_TYPES else ()
        for n, uniform, rows, tokens, lanes in ((2, False, 4, 1, False), (1, True, 4, 1, False),
                                                (11, False, TOKEN_ROWS_NARROW, I8_TOKENS, False)) + lane_cases:
            q, info = i8_emulation.quantize(rng.standard_normal((n, k), dtype=np.float32), fmt)
            words, pair_off = i8_emulation.with_lanes(q, info) if lanes else (i8_emulation.pack(q, info), 0)
            c.add(f"matvec_i8 {qtype.name} grouped uniform={uniform} tokens={tokens} lanes={lanes}",
                  matvec_i8_key(qtype, uniform_x=uniform, rows=rows, tokens=tokens if tokens > 1 else None, lanes=lanes),
                  [want, words], [n * m * 4],
                  dict(m=m, k=k, n=n, row_bytes=raw.shape[1], w_off=0, x_off=0, y_off=0, bias_off=0, y_stride=m,
                       pair_off=pair_off, x_row_words=xq_row_words(k, fmt)), matvec_i8_grid(m, n, rows, tokens),
                  close(i8_emulation.matvec(raw, qtype, q, info).astype(np.float32), rel=1e-5), uniform=[1] if uniform else [])
        tokens = np.array([3, 0, 66, 3], dtype=np.uint32)
        rows = dequantize_rows(raw[tokens.astype(np.int64)], qtype).reshape(len(tokens), k)
        c.add(f"embed {qtype.name} grouped", embed_key(qtype, grouped=True), [want, tokens], [rows.nbytes],
              dict(d=k, n=len(tokens), row_bytes=raw.shape[1], w_off=0, tok_off=0, out_off=0, row0=0, rows=m),
              (groups(k // per), len(tokens), 1), close(rows, rel=0))


def run_in_chromium(chromium, dev_server, cases: Cases) -> dict:
    """Every case run on one page's device: {"adapter", "results": [{"error", "outputs"}]}."""
    context = chromium.new_context()
    try:
        page, _ = harness.open_page(context, dev_server.url + "/manifest.webmanifest")
        harness.require_adapter(page)
        page.set_default_timeout(300_000)
        result = page.evaluate(RUN_JS, cases.cases)
    finally:
        context.close()
    assert "error" not in result, result
    return result


def assert_all_pass(cases: Cases, result: dict) -> None:
    """Every case ran and its outputs pass their check (the failures listed, one line each)."""
    failed = []
    for (name, check), res in zip(cases.checks, result["results"]):
        if res["error"]:
            failed.append(f"{name}: {res['error']}")
            continue
        try:
            check([base64.b64decode(o) for o in res["outputs"]])
        except AssertionError as exc:
            failed.append(f"{name}: {str(exc)[:300]}")
    assert not failed, f"on {result['adapter']}:\n" + "\n".join(failed)
    assert len(result["results"]) == len(cases.checks)


def test_every_kernel_case_in_chromium(chromium, dev_server):
    cases = build_cases()
    assert_all_pass(cases, run_in_chromium(chromium, dev_server, cases))
    assert len(cases.checks) > 20
