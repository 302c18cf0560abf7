"""The GPU executor: the ops interface recorded into programs of WGSL dispatches.

`GpuOps` implements `pyshim.models.ops.Ops` by *recording*: each op takes a virtual output buffer (a pool
`Slot`, given a real buffer by liveness at build time) and appends a dispatch (shader key, bindings,
params, grid) to the program being recorded; nothing runs. A program
is recorded once per step shape (token count n, all-logits or not) by running the model's forward
over handles; then `build()` compiles its pipelines (cached by ShaderKey), writes every params struct
into one uniform arena and creates the bind groups. A step is: write the token ids and positions
(2 small writes), one submit (one command buffer, one compute pass), one read (logits, or 4 bytes of
argmax). Weights stay in their GGUF blocks, one buffer per tensor (split by rows past the binding
limit), uploaded straight from the byte source, or left to the caller along `uploads` (the browser); the
int8 route's Q8_0 ones are then rearranged in place on the GPU before the first step (`repack`).
Kernel variants follow the adapter: barrier-free matvecs (2 rows per invocation, 4 on SwiftShader, x
as a uniform for one-token steps) and unsplit attention on CPU adapters; workgroup-reduction matvecs
and rmsnorms (summed by subgroupAdd where the device has subgroups) and key-split attention on GPUs. On
CPU adapters whose WGSL has dot4I8Packed, quantized weights take the int8 route (llama.cpp's CPU
arithmetic: each matmul input quantized once to int8 blocks, then integer dot products; see
shaders/README.md).

KV cache: per layer a K and a V ring of f32 [cap, kv_heads, head_dim]; cap = n_ctx for full layers,
window + max_chunk - 1 for sliding-window layers (a chunk never evicts a key its queries need).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from gguf import GGMLQuantizationType as QT

from pyshim.errors import BadRequestError, OutOfMemoryError, TensorShapeError, UnsupportedError
from pyshim.gpu.device import GPUDevice
from pyshim.gpu.pool import ActivationPool, Slot, physical
from pyshim.gpu.kernels import (ATTN_SPLITS_GPU, I8_ACTIVATIONS, I8_BLOCKS, KV_TYPES_GPU, PARAMS, Q8_BLOCK, TOPK, TOPK_CHUNK,
                                WG, KernelCache,
                                attention_keys, attention_record_bytes, barrier_free_rows, default_int8, default_subgroup, groups, i8_pairs,
                                argmax_keys, argmax_pass1, kv_write_key, rmsnorm_grid, rmsnorm_key, subgroups_usable,
                                attention_prefill_grid, attention_prefill_key, matmul_grid, matmul_key, matmul_tile,
                                matvec_grid, matvec_i8_key, matvec_key, quantize_key, rope_theta, shader_block,
                                weight_define, xq_row_words, UNIFORM_X_BYTES, UNIFORM_X_VEC4,
                                GROUPED_TYPES, REPACK_GROUP_BYTES, embed_key, repack_bytes, repack_grid,
                                I8_TOKEN_ROWS, I8_TOKEN_TYPES, I8_TOKENS, matvec_i8_grid)
from pyshim.models.ops import ACTIVATIONS, AttnSpec
from pyshim.exec.reference import SUPPORTED_TYPES, dequantize_rows
from pyshim.models.rope import RopeSpec
from pyshim.gguf.tensors import TensorRef, WeightStore

MAX_CHUNK = 256         # most tokens in one recorded step (pyshim.serve.generation.PREFILL_CHUNK)


@dataclass(frozen=True)
class Tensor:
    """An activation: `shape` f32 elements, row-major, at element offset `off` of `buf`."""

    buf: Any
    off: int
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))


@dataclass(frozen=True)
class Upload:
    """Copy file bytes [file_offset, file_offset + nbytes) into `buffer` at `buffer_offset`."""

    tensor: str
    file_offset: int
    nbytes: int
    buffer: Any
    buffer_offset: int


class GpuWeight:
    """A bound tensor: 2-D ones as GGUF blocks in `parts` [(buffer, first row, rows)] (`grouped`: Q8_0
    rearranged by repack.wgsl), 1-D ones (norms, biases, rope factors) as f32 `values` and a buffer of them."""

    def __init__(self, ref: TensorRef, shape: tuple[int, ...], grouped: bool = False):
        self.ref = ref
        self.shape = shape
        self.grouped = grouped
        self.parts: list[tuple[Any, int, int]] = []
        self.values: np.ndarray | None = None
        self.f32_buf = None


@dataclass
class Dispatch:
    key: Any                 # ShaderKey
    bindings: list           # buffers, in binding order, params excluded
    params: np.ndarray       # uint32 words
    grid: tuple[int, int, int]


class Program:
    """Recorded dispatches of one step shape, then built into pipelines, bind groups and a uniform arena."""

    def __init__(self, n: int):
        self.n = n
        self.dispatches: list[Dispatch] = []
        self.output: Tensor | None = None
        self.argmax: Any = None          # buffer holding the winning id (when recorded)
        self.topk: Any = None            # buffer holding the TOPK (value, id) pairs (when recorded)
        self.uniforms: Any = None        # the params arena, made by build()
        self.ready: list = []

    async def build(self, device: GPUDevice, kernels: KernelCache, pool: ActivationPool) -> None:
        keep = [b for b in (self.output.buf if self.output is not None else None, self.argmax) if isinstance(b, Slot)]
        pool.assign([d.bindings for d in self.dispatches], keep)
        align = max(16, device.caps.limits.get("min_uniform_buffer_offset_alignment", 256))
        slots = [(d.params.nbytes + align - 1) // align * align for d in self.dispatches]
        arena = np.zeros(sum(slots) // 4, dtype=np.uint32)
        offsets, at = [], 0
        for d, slot in zip(self.dispatches, slots):
            arena[at // 4: at // 4 + d.params.size] = d.params
            offsets.append(at)
            at += slot
        uniforms = self.uniforms = device.buffer(max(16, arena.nbytes), label=f"params_n{self.n}", uniform=True)
        device.write(uniforms, arena)
        self.ready = []
        for d, off in zip(self.dispatches, offsets):
            pipeline = await kernels.get(d.key)
            bindings = [physical(b) for b in d.bindings] + [(uniforms, off, d.params.nbytes)]
            group = device.bind_group(pipeline, bindings, label=d.key.label)
            self.ready.append((pipeline, group, d.grid))


class GpuOps:
    """`pyshim.models.ops.Ops` recorded for the GPU. Tensors are `Tensor` handles; weights `GpuWeight`s."""

    def __init__(self, device: GPUDevice, store: WeightStore, spec, n_ctx: int, kernels: KernelCache | None = None,
                 *, max_chunk: int = MAX_CHUNK, max_binding: int | None = None, upload_now: bool = True,
                 reduce: bool | None = None, multi_token: bool = False, attn_splits: int | None = None,
                 tiled_matmul: bool | None = None, tiled_attention: bool | None = None,
                 int8: bool | None = None, kv_type: str = "f32", subgroup: bool | None = None):
        """`max_chunk`: most tokens per step (sizes the sliding-window rings); `max_binding` lowers the
        device's storage binding limit (tests use it to force tensors split by rows); `upload_now=False`
        leaves the quantized weights' bytes to the caller, who follows `uploads` (the browser's store
        writes them from IndexedDB without passing them through Python); `reduce` picks the matvec variant
        (default: workgroup reductions on real GPUs, barrier-free on CPU adapters); `multi_token` uses the
        many-token matvec for steps of several tokens (slower on lavapipe, see kernels.MATMUL_TOKENS);
        `tiled_matmul`: the workgroup-tiled matmul (matmul.wgsl) for the f32 route's steps of several tokens
        (default on unless `multi_token` asks for the many-token matvec: faster than the matvec on real GPUs
        by design and on CPU adapters as measured, see kernels.MATMUL_TILE_CPU); `tiled_attention`: the
        key-tiled prefill attention (attention_prefill.wgsl; default on real GPUs only: no clear gain on CPU
        adapters); True forces either anywhere (tests);
        `attn_splits`: key-range splits in attention (default 1 on CPU adapters, ATTN_SPLITS_GPU on GPUs);
        `int8`: quantized weights against int8-quantized activations (llama.cpp's arithmetic, see
        kernels.default_int8 for the default; only with the barrier-free matvec); `kv_type`: the KV cache's
        element type, "f32", "f16" (halves packed in u32s) or "q8" (int8 blocks), on any adapter; `subgroup`: the
        reduction matvec sums with subgroupAdd (default where kernels.default_subgroup says; True forces it,
        and the reduction matvec, on any device with subgroups: how CPU adapters test it)."""
        if kv_type not in KV_TYPES_GPU:
            raise BadRequestError(f"KV cache type {kv_type!r} is not available on the GPU", hint=f"use one of: {', '.join(KV_TYPES_GPU)}")
        if kv_type == "q8" and (spec.head_dim_k % Q8_BLOCK or spec.head_dim_v % Q8_BLOCK):
            raise UnsupportedError(f"a q8 KV cache needs head sizes that are multiples of {Q8_BLOCK} (this model's: "
                                   f"{spec.head_dim_k}/{spec.head_dim_v})", hint="use kv_type f16")
        self.kv_type = kv_type
        self.device = device
        self.kernels = kernels or KernelCache(device)
        self.store = store
        self.spec = spec
        self.n_ctx = n_ctx
        self.max_chunk = max_chunk
        self.reduce = (not device.caps.is_fallback or bool(subgroup)) if reduce is None else reduce
        self.subgroup = self.reduce and (default_subgroup(device.caps) if subgroup is None else subgroup)
        if self.subgroup and not subgroups_usable(device.caps):
            raise UnsupportedError("this device has no subgroups (or no subgroup_id builtin)", hint="leave subgroup unset")
        self.multi_token = multi_token
        self.tiled_matmul = (not multi_token) if tiled_matmul is None else tiled_matmul
        self.tiled_attention = (not device.caps.is_fallback) if tiled_attention is None else tiled_attention
        self.attn_splits = attn_splits or (1 if device.caps.is_fallback else ATTN_SPLITS_GPU)
        self.matvec_rows = barrier_free_rows(device.caps)
        self.int8 = (default_int8(device.caps) if int8 is None else int8) and not self.reduce
        self._quantized: dict[tuple[Tensor, str], tuple[Slot, int]] = {}
        self.max_binding = min(int(device.caps.limits["max_storage_buffer_binding_size"]), max_binding or 1 << 62)
        self._bound: dict[str, GpuWeight] = {}
        self._program: Program | None = None
        self._theta: dict[tuple, tuple[Any, float]] = {}
        self.allocated = 0                                 # bytes of every buffer made (weights, KV, activation pool...)
        self.pool = ActivationPool(lambda n, label: self._buffer(n, label, also_uniform=True), UNIFORM_X_BYTES)
        self.upload_now = upload_now
        self.uploads: list[Upload] = []                    # every file range -> buffer copy the weights need
        self._repacks: list[tuple[Any, int]] = []          # (buffer, groups) to rearrange once uploaded
        self.tokens_buf = self._buffer(max_chunk * 4, "tokens")
        self.positions_buf = self._buffer(max_chunk * 4, "positions")
        self.kv = []                                       # per layer (k ring, v ring, cap)
        for il in range(spec.n_layers):
            window = spec.sliding_window if spec.swa_layers[il] else 0
            cap = min(n_ctx, window + max_chunk - 1) if window else n_ctx
            element = KV_TYPES_GPU[kv_type]
            k = self._buffer(int(cap * spec.n_kv_heads * spec.head_dim_k * element), f"k{il}")
            v = self._buffer(int(cap * spec.n_kv_heads * spec.head_dim_v * element), f"v{il}")
            self.kv.append((k, v, cap))

    # --- buffers and recording ---
    def _buffer(self, nbytes: int, label: str, also_uniform: bool = False):
        nbytes = max(16, (int(nbytes) + 15) // 16 * 16)
        if nbytes > self.device.caps.limits["max_buffer_size"]:
            raise OutOfMemoryError(f"buffer {label} needs {nbytes} bytes, more than the device allows",
                                   hint="use a smaller context or prefill chunk")
        self.allocated += nbytes
        return self.device.buffer(nbytes, label=label, also_uniform=also_uniform)

    def _tensor(self, shape: Sequence[int], label: str) -> Tensor:
        shape = tuple(int(s) for s in shape)
        nbytes = int(np.prod(shape)) * 4
        if nbytes > self.max_binding:
            raise OutOfMemoryError(f"activation {label} {shape} is larger than a storage binding ({self.max_binding} B)",
                                   hint="score or prefill in smaller chunks")
        return Tensor(Slot(max(16, nbytes), label), 0, shape)

    def _record(self, family: str, key, bindings: list, grid: tuple[int, int, int], **params) -> None:
        if self._program is None:
            raise RuntimeError("GPU ops run only while a program is being recorded")
        self._program.dispatches.append(Dispatch(key, bindings, PARAMS[family].pack(**params), grid))

    def begin(self, n: int) -> Program:
        self._program = Program(n)
        self._quantized = {}
        return self._program

    def end(self) -> Program:
        program, self._program = self._program, None
        return program

    def tokens(self, n: int) -> Tensor:
        return Tensor(self.tokens_buf, 0, (n,))

    def positions(self, n: int) -> Tensor:
        return Tensor(self.positions_buf, 0, (n,))

    @property
    def bound_bytes(self) -> int:
        return sum(w.ref.nbytes for w in self._bound.values())

    def memory(self) -> dict[str, int]:
        """Device bytes by kind (buffer sizes as allocated, rounded up to 16)."""
        kv = sum(int(k.size) + int(v.size) for k, v, _ in self.kv)
        weights = sum(int(b.size) for w in self._bound.values() for b, _, _ in w.parts)
        weights += sum(int(w.f32_buf.size) for w in self._bound.values() if w.f32_buf is not None)
        return {"weights": weights, "kv": kv, "activations": self.pool.nbytes,
                "other": self.allocated - weights - kv - self.pool.nbytes, "total": self.allocated}

    # --- weights ---
    def has_weight(self, name: str) -> bool:
        return name in self.store

    def weight(self, name: str, shape: Sequence[int]) -> GpuWeight:
        ref = self.store.info(name)
        if ref.qtype not in SUPPORTED_TYPES:
            raise UnsupportedError(f"tensor {name!r} has type {ref.qtype.name}, which pyshim does not run",
                                   hint="supported: " + ", ".join(sorted(t.name for t in SUPPORTED_TYPES)))
        if tuple(ref.shape) != tuple(shape):
            raise TensorShapeError(f"tensor {name!r} has shape {tuple(ref.shape)}, expected {tuple(shape)} (NumPy order)",
                                   hint="the file does not match its own hyperparameters")
        if name in self._bound:
            return self._bound[name]
        # the int8 route reads Q8_0 grouped (see kernels.GROUPED_TYPES): matmul takes that route for them
        w = GpuWeight(ref, tuple(shape), grouped=self.int8 and len(shape) == 2 and ref.qtype in GROUPED_TYPES)
        if len(shape) == 1:     # norms, biases, rope factors: small, needed as f32 (also on the CPU side)
            w.values = dequantize_rows(self.store.raw(name), ref.qtype).reshape(-1).astype(np.float32)
            w.f32_buf = self._buffer(w.values.nbytes, name)
            self.device.write(w.f32_buf, w.values)
        else:
            if shape[-1] % shader_block(ref.qtype)[0]:
                raise UnsupportedError(f"tensor {name!r}: rows of {shape[-1]} are not whole {ref.qtype.name} kernel blocks")
            limit = min(self.max_binding, int(self.device.caps.limits["max_buffer_size"]))
            pad = REPACK_GROUP_BYTES if w.grouped else 0        # grouped parts round up to whole groups
            rows_per_part = max(1, (limit - pad) // ref.row_bytes)
            for row0 in range(0, shape[0], rows_per_part):
                rows = min(rows_per_part, shape[0] - row0)
                nbytes = repack_bytes(rows, ref.row_bytes) if w.grouped else rows * ref.row_bytes
                buf = self._buffer(nbytes, f"{name}[{row0}:]")
                upload = Upload(name, ref.offset + row0 * ref.row_bytes, rows * ref.row_bytes, buf, 0)
                self.uploads.append(upload)
                if self.upload_now:
                    self.device.write(buf, self.store.source.read(upload.file_offset, upload.nbytes))
                if w.grouped:
                    self._repacks.append((buf, nbytes // REPACK_GROUP_BYTES))
                w.parts.append((buf, row0, rows))
        self._bound[name] = w
        return w

    async def repack(self) -> None:
        """Rearrange the grouped weights in place (repack.wgsl): once, after their bytes are uploaded and
        before the first step (GpuRunner calls it). One submit for all of them."""
        if not self._repacks:
            return
        repacks, self._repacks = self._repacks, []
        program = self.begin(0)
        key = self._key("repack")
        for buf, n_groups in repacks:
            self._record("repack", key, [buf], repack_grid(n_groups), groups=n_groups)
        self.end()
        await program.build(self.device, self.kernels, self.pool)
        self.device.submit(program.ready, label="repack")
        self.drop(program)

    # --- ops ---
    def embed(self, table: GpuWeight, tokens: Tensor) -> Tensor:
        n, d = tokens.shape[0], table.shape[1]
        out = self._tensor((n, d), "embed")
        per = shader_block(table.ref.qtype)[0]
        key = embed_key(table.ref.qtype, table.grouped)
        for buf, row0, rows in table.parts:
            self._record("embed", key, [buf, tokens.buf, out.buf], (groups(d // per), n, 1), d=d, n=n,
                         row_bytes=table.ref.row_bytes, w_off=0, tok_off=tokens.off, out_off=out.off,
                         row0=row0, rows=rows)
        return out

    def matmul(self, x: Tensor, w: GpuWeight, bias: GpuWeight | None = None) -> Tensor:
        n, k = x.shape
        m = w.shape[0]
        out = self._tensor((n, m), "matmul")
        fmt = I8_ACTIVATIONS.get(w.ref.qtype) if self.int8 else None
        if fmt is not None and k % I8_BLOCKS[fmt][0] == 0:
            return self._matmul_i8(x, w, bias, out, fmt)
        if self.tiled_matmul and n > 1:
            return self._matmul_tiled(x, w, bias, out)
        multi = self.multi_token and n > 1      # several tokens per invocation share each decoded weight
        uniform_x = (not self.reduce and not multi and n == 1 and isinstance(x.buf, Slot)
                     and x.off + k <= 4 * UNIFORM_X_VEC4)
        key = matvec_key(w.ref.qtype, bias=bias is not None, reduce=self.reduce, multi=multi, uniform_x=uniform_x,
                         rows=self.matvec_rows, subgroup=self.subgroup)
        x_binding = (x.buf, 0, UNIFORM_X_BYTES) if uniform_x else x.buf
        for buf, row0, rows in w.parts:
            bindings = [buf, x_binding] + ([bias.f32_buf] if bias is not None else []) + [out.buf]
            # a part writes its rows of every token: y_off shifts by row0 and the row stride stays m
            self._record("matvec", key, bindings, matvec_grid(rows, n, self.reduce, multi, self.matvec_rows), m=rows, k=k, n=n, row_bytes=w.ref.row_bytes,
                         w_off=0, x_off=x.off, y_off=out.off + row0, bias_off=row0, y_stride=m)
        return out

    def _matmul_tiled(self, x: Tensor, w: GpuWeight, bias: GpuWeight | None, out: Tensor) -> Tensor:
        n, k = x.shape
        m = w.shape[0]
        tile = matmul_tile(self.device.caps)
        key = matmul_key(w.ref.qtype, bias=bias is not None, tile=tile)
        for buf, row0, rows in w.parts:
            bindings = [buf, x.buf] + ([bias.f32_buf] if bias is not None else []) + [out.buf]
            self._record("matmul", key, bindings, matmul_grid(rows, n, tile), m=rows, k=k, n=n, row_bytes=w.ref.row_bytes,
                         w_off=0, x_off=x.off, y_off=out.off + row0, bias_off=row0, y_stride=m)
        return out

    def _quantize(self, x: Tensor, fmt: str) -> tuple[Slot, int]:
        """x's rows as int8 blocks (quantize.wgsl), recorded once per (activation, format) in a program:
        q, k and v (or gate and up) share one quantization of their input. -> (slot, words per row)."""
        key = (x, fmt)
        if key not in self._quantized:
            n, k = x.shape
            row_words = xq_row_words(k, fmt)
            slot = Slot(max(16, n * row_words * 4), "xq")
            self._record("quantize", quantize_key(fmt), [x.buf, slot], (groups(k // I8_BLOCKS[fmt][0]), n, 1),
                         k=k, n=n, x_off=x.off, x_stride=k, q_off=0, row_words=row_words)
            self._quantized[key] = (slot, row_words)
        return self._quantized[key]

    def _matmul_i8(self, x: Tensor, w: GpuWeight, bias: GpuWeight | None, out: Tensor, fmt: str) -> Tensor:
        n, k = x.shape
        m = w.shape[0]
        xq, row_words = self._quantize(x, fmt)
        uniform_x = n == 1 and row_words * 4 <= UNIFORM_X_BYTES
        # steps of several tokens unpack each weight block once for I8_TOKENS of them, where the type can
        tokens = I8_TOKENS if n > 1 and w.ref.qtype in I8_TOKEN_TYPES else 1
        rows_per = I8_TOKEN_ROWS if tokens > 1 else self.matvec_rows
        key = matvec_i8_key(w.ref.qtype, bias=bias is not None, uniform_x=uniform_x, rows=rows_per,
                            pairs=tokens == 1 and i8_pairs(w.ref.qtype, k, self.device.caps),
                            tokens=tokens if tokens > 1 else None)
        x_binding = (xq, 0, UNIFORM_X_BYTES) if uniform_x else xq
        for buf, row0, rows in w.parts:
            bindings = [buf, x_binding] + ([bias.f32_buf] if bias is not None else []) + [out.buf]
            self._record("matvec_i8", key, bindings, matvec_i8_grid(rows, n, rows_per, tokens), m=rows, k=k, n=n,
                         row_bytes=w.ref.row_bytes, w_off=0, x_off=0, y_off=out.off + row0, bias_off=row0, y_stride=m,
                         x_row_words=row_words)
        return out

    def rmsnorm(self, x: Tensor, w: GpuWeight, eps: float) -> Tensor:
        d = x.shape[-1]
        rows = x.size // d
        out = self._tensor(x.shape, "rmsnorm")
        self._record("rmsnorm", rmsnorm_key(reduce=self.reduce, subgroup=self.subgroup), [x.buf, w.f32_buf, out.buf],
                     rmsnorm_grid(rows, self.reduce), rows=rows, d=d, eps=eps, x_off=x.off, y_off=out.off, w_off=0)
        return out

    def view(self, x: Tensor, shape: Sequence[int]) -> Tensor:
        shape = tuple(int(s) for s in shape)
        if int(np.prod(shape)) != x.size:
            raise TensorShapeError(f"cannot view {x.shape} as {shape}")
        return Tensor(x.buf, x.off, shape)

    def split(self, x: Tensor, sizes: Sequence[int]) -> list[Tensor]:
        n, total = x.shape
        parts, at = [], 0
        for size in sizes:
            if n == 1:
                parts.append(Tensor(x.buf, x.off + at, (1, size)))
            else:       # rows of a split are strided: copy them out so every kernel sees contiguous rows
                out = self._tensor((n, size), "split")
                self._record("eltwise", self._key("eltwise", OP_COPY=True), [x.buf, out.buf], (groups(size // 4), n, 1),
                             n=n, width=size, a_off=x.off + at, a_stride=total, b_off=0, b_stride=0, y_off=out.off, s=0.0)
                parts.append(out)
            at += size
        return parts

    def rope(self, x: Tensor, positions: Tensor, spec: RopeSpec, freq_factors: GpuWeight | None = None) -> Tensor:
        n, heads, hd = x.shape
        cache_key = (spec, None if freq_factors is None else freq_factors.ref.name)
        if cache_key not in self._theta:
            theta, mscale = rope_theta(spec, None if freq_factors is None else freq_factors.values)
            buf = self._buffer(theta.nbytes, "rope_theta")
            self.device.write(buf, theta)
            self._theta[cache_key] = (buf, mscale)
        theta_buf, mscale = self._theta[cache_key]
        out = self._tensor(x.shape, "rope")
        self._record("rope", self._key("rope", NEOX=spec.neox), [x.buf, positions.buf, theta_buf, out.buf],
                     (groups(hd // 2), heads, n), n=n, heads=heads, head_dim=hd, dims=spec.dims, mscale=mscale,
                     x_off=x.off, y_off=out.off, pos_off=positions.off)
        return out

    def attention(self, q: Tensor, k: Tensor, v: Tensor, positions: Tensor, spec: AttnSpec) -> Tensor:
        n = q.shape[0]
        kc, vc, cap = self.kv[spec.layer]
        k_row, v_row = spec.n_kv_heads * spec.head_dim, spec.n_kv_heads * spec.head_dim_v
        if spec.head_dim % 4 or spec.head_dim_v % 4:
            raise UnsupportedError(f"head dims {spec.head_dim}/{spec.head_dim_v} are not multiples of 4")
        self._record("kv_write", kv_write_key(self.kv_type), [k.buf, v.buf, positions.buf, kc, vc],
                     (groups(max(k_row, v_row) // (Q8_BLOCK if self.kv_type == "q8" else 4)), n, 1), n=n, k_row=k_row, v_row=v_row, cap=cap,
                     pos_off=positions.off, k_off=k.off, v_off=v.off)
        out = self._tensor((n, spec.n_heads * spec.head_dim_v), "attention")
        params = dict(n=n, heads=spec.n_heads, kv_heads=spec.n_kv_heads, cap=cap, window=spec.window, scale=spec.scale,
                      softcap=spec.softcap, pos_off=positions.off, q_off=q.off, out_off=out.off)
        if self.tiled_attention and n > 1 and spec.n_heads // spec.n_kv_heads <= WG:
            # the step's positions are consecutive (what attention_prefill.wgsl needs)
            key = attention_prefill_key(spec.head_dim, spec.head_dim_v, spec.softcap > 0, self.kv_type)
            self._record("attention_prefill", key, [q.buf, kc, vc, positions.buf, out.buf],
                         attention_prefill_grid(n, spec.n_heads, spec.n_kv_heads), **params)
            return out
        key, combine = attention_keys(spec.head_dim, spec.head_dim_v, spec.softcap > 0, self.attn_splits, self.kv_type)
        grid = (groups(spec.n_heads), n, self.attn_splits)
        if combine is None:
            self._record("attention", key, [q.buf, kc, vc, positions.buf, out.buf], grid, **params)
            return out
        records = Slot(n * spec.n_heads * self.attn_splits * attention_record_bytes(spec.head_dim_v), "attn_partial")
        self._record("attention", key, [q.buf, kc, vc, positions.buf, records], grid, **params)
        self._record("attention", combine, [records, out.buf], (groups(spec.n_heads), n, 1), **params)
        return out

    def glu(self, gate: Tensor, up: Tensor, act: str) -> Tensor:
        if act not in ACTIVATIONS:
            raise UnsupportedError(f"activation {act!r} is not one of {ACTIVATIONS}")
        n, f = gate.shape
        out = self._tensor((n, f), "glu")
        # the int8 route follows llama.cpp's CPU arithmetic, its f16 GELU table included
        key = self._key("glu", ACT_SILU=act == "silu", ACT_GELU=act == "gelu_tanh", GELU_F16=act == "gelu_tanh" and self.int8)
        self._record("glu", key, [gate.buf, up.buf, out.buf], (groups(f // 4), n, 1), n=n, f=f, gate_off=gate.off,
                     gate_stride=f, up_off=up.off, up_stride=f, out_off=out.off)
        return out

    def _eltwise(self, op: str, a: Tensor, b: Tensor | None, s: float) -> Tensor:
        width = a.shape[-1]
        rows = a.size // width
        out = self._tensor(a.shape, op.lower())
        bindings = [a.buf] + ([b.buf] if b is not None else []) + [out.buf]
        self._record("eltwise", self._key("eltwise", **{op: True}), bindings, (groups(width // 4), rows, 1),
                     n=rows, width=width, a_off=a.off, a_stride=width, b_off=b.off if b is not None else 0,
                     b_stride=width, y_off=out.off, s=s)
        return out

    def add(self, a: Tensor, b: Tensor) -> Tensor:
        return self._eltwise("OP_ADD", a, b, 0.0)

    def scale(self, x: Tensor, s: float) -> Tensor:
        return self._eltwise("OP_SCALE", x, None, s)

    def softcap(self, x: Tensor, cap: float) -> Tensor:
        return self._eltwise("OP_SOFTCAP", x, None, cap)

    def last(self, x: Tensor) -> Tensor:
        n, d = x.shape
        return Tensor(x.buf, x.off + (n - 1) * d, (1, d))

    def record_argmax(self, logits: Tensor):
        """Greedy sampling of the last row on the GPU; returns the 1-word result buffer."""
        vocab = logits.shape[-1]
        off = logits.off + (logits.size // vocab - 1) * vocab
        chunk, parts, grid = argmax_pass1(vocab, self.subgroup)
        pass1, pass2 = argmax_keys(self.subgroup)
        partial = Slot(parts * 8, "argmax_partial")
        result = self._buffer(16, "argmax")
        self._record("argmax", pass1, [logits.buf, partial], grid, len=vocab, chunk=chunk, x_off=off)
        self._record("argmax", pass2, [partial, result], (1, 1, 1), len=parts, chunk=0, x_off=0)
        return result

    def drop(self, program: Program) -> None:
        """Free the buffers only `program` uses (its params arena and sampled-token results); its
        activations stay in the shared pool."""
        for buf in (program.argmax, program.topk):
            if buf is not None and not isinstance(buf, Slot):
                self.allocated -= int(buf.size)
                self.device.release(buf)
        if program.uniforms is not None:
            self.device.release(program.uniforms)
        program.ready = []

    def record_topk(self, logits: Tensor):
        """The TOPK largest logits of the last row as (f32 bits, id) pairs, largest first; returns their buffer."""
        vocab = logits.shape[-1]
        off = logits.off + (logits.size // vocab - 1) * vocab
        parts = groups(vocab, TOPK_CHUNK)
        partial = Slot(parts * TOPK * 8, "topk_partial")
        result = self._buffer(TOPK * 8, "topk")
        self._record("topk", self._key("topk", K=TOPK, PASS1=True), [logits.buf, partial], (groups(parts), 1, 1),
                     len=vocab, chunk=TOPK_CHUNK, x_off=off)
        self._record("topk", self._key("topk", K=TOPK, PASS2=True), [partial, result], (1, 1, 1), len=parts * TOPK, chunk=0, x_off=0)
        return result

    @staticmethod
    def _key(family: str, qtype: QT | None = None, **defines):
        from pyshim.gpu.shaderc import ShaderKey

        if qtype is not None:
            defines[weight_define(qtype)] = True
        return ShaderKey.of(family, WG=WG, **defines)
