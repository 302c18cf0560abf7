"""The GPU executor's ops: pyshim.models.ops.Ops *recorded* into programs of WGSL dispatches.

Each op takes an output `Tensor` over a virtual activation buffer and appends a dispatch to the program
being recorded; nothing runs. A program is recorded once per step shape by running the model's forward
over handles (pyshim.exec.gpu_runner does), then built (pyshim.gpu.program) and replayed per step: the
step writes its token ids and positions (2 small writes), submits once and reads back its answer.

What an op dispatches follows the `KernelPolicy` (pyshim.gpu.policy, from the adapter's features and
limits): barrier-free or workgroup-reduction matvecs, the int8 route (llama.cpp's CPU arithmetic: each
matmul input quantized once to int8 blocks, then integer dot products; shaders/README.md), the tiled
matmul and prefill attention for steps of several tokens. Weights come from the weight slots
(pyshim.gpu.slots), keys and values from the paged KV cache (pyshim.gpu.kv) through the step map: each
token's position, its sequence and the page tables, written by the step, so a program serves any sequence.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import numpy as np

from pyshim.errors import OutOfMemoryError, TensorShapeError, UnsupportedError
from pyshim.gguf.tensors import WeightStore
from pyshim.gpu.device import GPUDevice
from pyshim.gpu.expert_cache import ExpertCache
from pyshim.gpu.experts import ExpertOps
from pyshim.gpu.fused import Attention, F32Values, FusedOps, Norm, Rope, drop_unread
from pyshim.gpu.sampling_ops import SamplingOps
from pyshim.gpu.layer_stream import LayerStream
from pyshim.gpu.kernels import (I8_ACTIVATIONS, I8_BLOCKS, I8_LANE_TYPES, I8_TOKEN_TYPES, I8_TOKENS, PARAMS, glu_key,
                                UNIFORM_X_BYTES, UNIFORM_X_VEC4, WG, GROUPED_TYPES, KernelCache,
                                attention_combine_grid, attention_grid, attention_keys,
                                attention_prefill_grid, attention_prefill_key, attention_record_bytes, embed_key, groups,
                                i8_pairs, rope_key,
                                kv_write_grid, kv_write_key, matmul_grid, matmul_key, matvec_grid, matvec_i8_grid,
                                lanes_key, lanes_words, matvec_i8_key, matvec_key, quantize_key, rmsnorm_grid, rmsnorm_key, rope_theta,
                                shader_block, xq_row_words)
from pyshim.gpu.kv import GpuKV
from pyshim.gpu.policy import KernelPolicy
from pyshim.gpu.pool import Activation, ActivationPool, Allocator
from pyshim.gpu.program import Dispatch, Program, Stop, Tensor
from pyshim.gpu.shaderc import ShaderKey
from pyshim.gpu.slots import WeightSlot, WeightSlots
from pyshim.models.key_scales import hadamard_norm
from pyshim.models.ops import ACTIVATIONS, AttnSpec
from pyshim.models.rope import RopeSpec
from pyshim.plan.settings import PREFILL_CHUNK


class _Addend(NamedTuple):
    """What a matvec's BIAS binding adds to row r of token t: buf[off + t * stride + r] (a bias: stride 0;
    a residual: its row width)."""

    buf: Any
    off: int
    stride: int


def _addend_binding(add: _Addend | None) -> list:
    return [] if add is None else [add.buf]


def _addend_params(add: _Addend | None, row0: int) -> dict:
    """A weight part's bias_off/bias_stride: its first row's addend."""
    return {"bias_off": 0, "bias_stride": 0} if add is None else {"bias_off": add.off + row0, "bias_stride": add.stride}


ROTATE_MAX_HEAD = 512           # rope.wgsl's ROTATE holds a head in workgroup memory


class GpuOps(FusedOps, ExpertOps, SamplingOps):
    """`pyshim.models.ops.Ops` recorded for the GPU. Tensors are `Tensor` handles; weights `WeightSlot`s
    (the mixture-of-experts ops are in pyshim.gpu.experts)."""

    def __init__(self, device: GPUDevice, store: WeightStore, spec, n_ctx: int, policy: KernelPolicy, *,
                 kv_type: str = "f32", max_chunk: int = PREFILL_CHUNK, max_binding: int | None = None,
                 upload_now: bool = True, kernels: KernelCache | None = None, expert_slots: int | None = None,
                 streamed_layers: int | None = None, max_seqs: int = 1, kv_pages: int | None = None,
                 weights_of: "GpuOps | None" = None):
        """`max_chunk`: most tokens per step (sizes the sliding-window rings); `max_binding` lowers the
        device's storage binding limit (tests force tensors split by rows with it); `upload_now=False`
        leaves the quantized weights' bytes to the caller, who follows `slots.uploads` (the browser's store
        writes them from IndexedDB without passing them through Python); `expert_slots`: the routed experts
        are streamed from the store into a cache of that many per MoE layer (pyshim.gpu.expert_cache);
        `streamed_layers`: the last that many layers' matrices are streamed through two rotating sets of
        buffers (pyshim.gpu.layer_stream); `max_seqs`: the sequences the KV cache holds (a batched decode
        step runs one token of each of several); `kv_pages`: the pages of its pool (default: every
        sequence's whole context). `weights_of`: ops of the same model whose weights these take over, with
        their device, pipelines and binding limit (the store, policy and streaming arguments are then
        theirs too; pyshim.exec.gpu_runner.reload_gpu) — that one must have released its own state
        (`release_state`) and is not used again."""
        self.spec, self.n_ctx, self.max_chunk = spec, n_ctx, max_chunk
        if weights_of is not None:
            w = weights_of
            self.device, self.policy, self.kernels, self.allocator, self.max_binding = w.device, w.policy, w.kernels, w.allocator, w.max_binding
            self.slots, self.expert_cache, self.layer_stream = w.slots, w.expert_cache, w.layer_stream
            # made from weights (or shapes) alone: a step's expert ids, the joined biases, a norm's ones
            self._stop_bufs, self._joined, self._ones = w._stop_bufs, w._joined, w._ones
        else:
            self.device, self.policy = device, policy
            self.kernels = kernels or KernelCache(device)
            self.allocator = Allocator(device)
            self.max_binding = min(int(device.caps.limits["max_storage_buffer_binding_size"]), max_binding or 1 << 62)
            self.slots = WeightSlots(device, self.allocator, store, limit=min(self.max_binding, int(device.caps.limits["max_buffer_size"])),
                                     grouped_types=GROUPED_TYPES if policy.int8 else (), row_group=policy.row_group_for,
                                     upload_now=upload_now)
            if expert_slots and streamed_layers:
                raise UnsupportedError("experts and layers are not streamed together: choose one")
            self.expert_cache = ExpertCache(self.slots, expert_slots) if expert_slots else None
            self.layer_stream = LayerStream(self.slots, spec.n_layers, streamed_layers) if streamed_layers else None
            self._stop_bufs: list = []         # one per MoE layer of a step, when experts are streamed
            self._joined: dict[tuple, Any] = {}    # several weights' biases in one buffer (pyshim.gpu.fused)
            self._ones: dict[int, F32Values] = {}     # f32 ones of each width: the weight of a norm that has none
        self.kv = GpuKV(self.allocator, spec, n_ctx, max_chunk, kv_type, n_seqs=max_seqs, n_pages=kv_pages,
                        max_binding=self.max_binding)
        self.pool = ActivationPool(self.allocator, UNIFORM_X_BYTES)
        self.tokens_buf = self.allocator.buffer(max_chunk * 4, "tokens")
        self.positions_buf = self.allocator.buffer(self.kv.map_words * 4, "step_map")     # positions first
        self._program: Program | None = None
        self._batched = False       # the step being recorded is a batched decode step
        self._quantized: dict[tuple[Tensor, str], tuple[Activation, int]] = {}
        self._groups: dict[Tensor, Activation] = {}
        self._theta: dict[tuple, tuple[Any, float, Any]] = {}

    @property
    def kv_type(self) -> str:
        return self.kv.kv_type

    @property
    def uploads(self):
        return self.slots.uploads

    def release_state(self) -> None:
        """Free what is not the model's weights — the KV cache, the activation pool, the step buffers, the
        rope tables — so that other ops may take the weights over (`weights_of`) without both states held
        at once. The programs recorded over these ops must be released first; these ops are spent."""
        for buf in [*self.kv.buffers(), *(b for _, b in self.pool.buffers), self.tokens_buf, self.positions_buf,
                    *(buf for buf, _, _ in self._theta.values())]:
            self.allocator.release(buf)
        self.pool.buffers, self._theta = [], {}
        self.kv = None

    def memory(self) -> dict[str, int]:
        """Device bytes by kind (buffer sizes as allocated, rounded up to 16)."""
        weights, kv, total = self.slots.nbytes, self.kv.nbytes, self.allocator.allocated
        return {"weights": weights, "kv": kv, "activations": self.pool.nbytes,
                "other": total - weights - kv - self.pool.nbytes, "total": total}

    # --- recording ---
    def begin(self, n: int, batched: bool = False) -> Program:
        """Record a step of `n` tokens: of one sequence at consecutive positions, or (`batched`) a batched
        decode step whose token i is some sequence's next one (which, the step map says). A batched step
        runs every token through the one-token kernels' arithmetic (the matvecs' token rows, decode
        attention), so each sequence gets the tokens it gets alone."""
        self._batched = batched
        self._program = Program(n)
        self._quantized = {}
        self._groups = {}           # router ids -> their pairs grouped by expert (pyshim.gpu.experts)
        self._guess = None          # a guess at the next MoE layer's experts, for the next router's stop
        self._producers = {}        # id(activation) -> (its dispatch, what it computed): what a consumer may fold in
        return self._program

    def end(self) -> Program:
        program, self._program = self._program, None
        drop_unread(program, [d for d, _ in self._producers.values()])
        return program

    def tokens(self, n: int) -> Tensor:
        return Tensor(self.tokens_buf, 0, (n,))

    def positions(self, n: int) -> Tensor:
        return Tensor(self.positions_buf, 0, (n,))

    def _tensor(self, shape: Sequence[int], label: str) -> Tensor:
        shape = tuple(int(s) for s in shape)
        nbytes = int(np.prod(shape)) * 4
        if nbytes > self.max_binding:
            raise OutOfMemoryError(f"activation {label} {shape} is larger than a storage binding ({self.max_binding} B)",
                                   hint="score or prefill in smaller chunks")
        return Tensor(Activation(max(16, nbytes), label), 0, shape)

    def _record(self, family: str, key, bindings: list, grid: tuple[int, int, int], **params) -> None:
        if self._program is None:
            raise RuntimeError("GPU ops run only while a program is being recorded")
        if self.layer_stream is not None:
            self._stop_for_layer(bindings)
        self._program.dispatches.append(Dispatch(key, bindings, PARAMS[family].pack(**params), grid))

    def _stop_for_layer(self, bindings: list) -> None:
        """Before the first dispatch that reads a streamed layer's weights, a stop that puts them in place."""
        for b in bindings:
            layer = self.layer_stream.part_layer.get(id(b[0] if isinstance(b, tuple) else b))
            if layer is not None and not any(s.stream_layer == layer for s in self._program.stops):
                self._program.stops.append(Stop(len(self._program.dispatches), stream_layer=layer))
                return

    @staticmethod
    def _key(family: str, **defines) -> ShaderKey:
        return ShaderKey.of(family, WG=WG, **defines)

    # --- weights ---
    def has_weight(self, name: str) -> bool:
        return name in self.slots

    def scalar(self, name: str) -> float:
        return float(self.slots.bind(name, (1,)).values[0])

    def weight(self, name: str, shape: Sequence[int]) -> WeightSlot:
        if self.expert_cache is not None and len(shape) == 3:
            return self.expert_cache.bind(name, shape)
        if self.layer_stream is not None and self.layer_stream.streams(name, shape):
            return self.layer_stream.bind(name, shape)
        return self.slots.bind(name, shape)

    # --- ops ---
    def embed(self, table: WeightSlot, tokens: Tensor) -> Tensor:
        n, d = tokens.shape[0], table.shape[1]
        out = self._tensor((n, d), "embed")
        per = shader_block(table.ref.qtype)[0]
        key = embed_key(table.ref.qtype, table.grouped, table.row_group)
        for part in table.parts:
            self._record("embed", key, [part, tokens.buf, out.buf], (groups(d // per), n, 1), d=d, n=n,
                         row_bytes=table.ref.row_bytes, w_off=0, tok_off=tokens.off, out_off=out.off,
                         row0=part.row0, rows=part.rows)
        return out

    def matmul(self, x: Tensor, w: WeightSlot, bias: WeightSlot | None = None, residual: Tensor | None = None) -> Tensor:
        n, k = x.shape
        m = w.shape[0]
        if bias is not None and residual is not None:       # one BIAS binding: the residual's add goes apart
            return self.add(residual, self.matmul(x, w, bias))
        # the epilogue's addend: a bias (the same for every token) or the residual (a row per token)
        add = None if bias is None and residual is None else (
            _Addend(bias.f32_buf, 0, 0) if bias is not None else _Addend(residual.buf, residual.off, m))
        out = self._tensor((n, m), "matmul")
        fmt = I8_ACTIVATIONS.get(w.ref.qtype) if self.policy.int8 else None
        if fmt is not None and k % I8_BLOCKS[fmt][0] == 0:
            return self._matmul_i8(x, w, add, out, fmt)
        if n > 1 and not self._batched:
            return self._matmul_tiled(x, w, add, out)
        reduce = self.policy.reduce
        uniform_x = n == 1 and not reduce and isinstance(x.buf, Activation) and x.off + k <= 4 * UNIFORM_X_VEC4
        key = matvec_key(w.ref.qtype, bias=add is not None, reduce=reduce, uniform_x=uniform_x,
                         rows=self.policy.matvec_rows, subgroup=self.policy.subgroup, f16=self.policy.f16,
                         reduce_wg=self.policy.reduce_wg, wg=self.policy.matvec_wg)
        x_binding = (x.buf, 0, UNIFORM_X_BYTES) if uniform_x else x.buf
        for part in w.parts:
            bindings = [part, x_binding] + _addend_binding(add) + [out.buf]
            # a part writes its rows of every token: y_off shifts by row0 and the row stride stays m
            self._record("matvec", key, bindings, matvec_grid(part.rows, n, reduce, self.policy.matvec_rows, self.policy.matvec_wg),
                         m=part.rows, k=k, n=n, row_bytes=w.ref.row_bytes, w_off=part.offset, x_off=x.off, y_off=out.off + part.row0,
                         y_stride=m, **_addend_params(add, part.row0))
        return out

    def _matmul_tiled(self, x: Tensor, w: WeightSlot, add, out: Tensor) -> Tensor:
        n, k = x.shape
        m = w.shape[0]
        tile = self.policy.matmul_tile
        key = matmul_key(w.ref.qtype, bias=add is not None, tile=tile, f16=self.policy.f16)
        for part in w.parts:
            bindings = [part, x.buf] + _addend_binding(add) + [out.buf]
            self._record("matmul", key, bindings, matmul_grid(part.rows, n, tile), m=part.rows, k=k, n=n,
                         row_bytes=w.ref.row_bytes, w_off=part.offset, x_off=x.off, y_off=out.off + part.row0,
                         y_stride=m, **_addend_params(add, part.row0))
        return out

    def _quantize(self, x: Tensor, fmt: str) -> tuple[Activation, int]:
        """x's rows as int8 blocks (quantize.wgsl), recorded once per (activation, format) in a program:
        q, k and v (or gate and up) share one quantization of their input. -> (buffer, words per row)."""
        key = (x, fmt)
        if key not in self._quantized:
            n, k = x.shape
            row_words = xq_row_words(k, fmt)
            # (room for lanes.wgsl's token pairs after the rows where the policy may take them)
            words = lanes_words(n, k, row_words)[1] if n > 1 and self.policy.i8_lanes else n * row_words
            xq = Activation(max(16, words * 4), "xq")
            grid = (groups(k // I8_BLOCKS[fmt][0]), n, 1)
            norm = self._producer(x, Norm) if self.policy.norm_in_quantize else None
            attn = self._producer(x, Attention)
            if attn is not None and attn.spec.head_dim_v % I8_BLOCKS[fmt][0] == 0:
                # the attention pass again, its output rounded to int8 blocks as it is written (the f32 one
                # then goes unread and is dropped)
                quantized, _ = attention_keys(attn.spec.head_dim, attn.spec.head_dim_v, attn.spec.softcap > 0, 1,
                                              attn.kv_type, f16=self.policy.f16, quant=fmt)
                self._record("attention", quantized, [attn.q.buf, attn.kc, attn.vc, attn.positions.buf, xq], attn.grid,
                             **{**attn.params, "out_off": 0, "row_words": row_words})
            elif norm is not None and norm.x.shape == x.shape:   # the norm before this matmul, in the same pass
                self._record("quantize", quantize_key(fmt, norm=True), [norm.x.buf, norm.w.f32_buf, xq], grid,
                             k=k, n=n, x_off=norm.x.off, x_stride=k, q_off=0, row_words=row_words, eps=norm.eps)
            else:
                self._record("quantize", quantize_key(fmt), [x.buf, xq], grid,
                             k=k, n=n, x_off=x.off, x_stride=k, q_off=0, row_words=row_words)
            self._quantized[key] = (xq, row_words)
        return self._quantized[key]

    def _lanes(self, x: Tensor, fmt: str) -> int:
        """x's quantized rows also as token pairs (lanes.wgsl), recorded once per (activation, format) in a
        program -> the pairs' word offset in the same buffer."""
        key = (x, fmt, "lanes")
        if key not in self._quantized:
            n, k = x.shape
            xq, row_words = self._quantize(x, fmt)
            pair_off, _ = lanes_words(n, k, row_words)
            self._record("lanes", lanes_key(), [xq], (groups(k // 4), (n + 1) // 2, 1),
                         k=k, n=n, row_words=row_words, pair_off=pair_off)
            self._quantized[key] = (xq, pair_off)
        return self._quantized[key][1]

    def _matmul_i8(self, x: Tensor, w: WeightSlot, add, out: Tensor, fmt: str) -> Tensor:
        n, k = x.shape
        m = w.shape[0]
        xq, row_words = self._quantize(x, fmt)
        # steps of several tokens unpack each weight block once for I8_TOKENS of them, where the type can
        tokens = I8_TOKENS if n > 1 and w.ref.qtype in I8_TOKEN_TYPES else 1
        if tokens > 1 and self._batched:
            tokens = min(tokens, n)
        # (a batched step's few tokens take the one-token rows: SwiftShader natively, 4 SmolLM2 sequences a
        # step, 4 rows 435 ms against 8 rows 505-509, the prompts' 8)
        rows_per = ((self.policy.matvec_rows if self._batched else self.policy.token_rows) if tokens > 1
                    else self.policy.one_token_rows(w.ref.qtype, k, row_group=w.row_group))
        lanes = self.policy.i8_lanes and tokens > 1 and w.ref.qtype in I8_LANE_TYPES
        tokens += tokens % 2 if lanes else 0            # (in pairs: a last odd token's pair is itself twice)
        pair_off = self._lanes(x, fmt) if lanes else 0
        # the step's quantized rows bound as a uniform where they fit: one broadcast load per read on CPU adapters
        # (lavapipe, 4 tokens of Q4_1 1536x576: 0.62 -> 0.47 ms, best of 4; 8 of Q4_K 1536x1536 3.4 -> 2.4 ms;
        # SwiftShader level)
        uniform_x = (lanes_words(n, k, row_words)[1] if lanes else n * row_words) * 4 <= UNIFORM_X_BYTES
        key = matvec_i8_key(w.ref.qtype, bias=add is not None, uniform_x=uniform_x, rows=rows_per,
                            pairs=tokens == 1 and self.policy.i8_pairs and i8_pairs(w.ref.qtype, k),
                            tokens=tokens if tokens > 1 else None, lanes=lanes, wg=self.policy.matvec_wg, row_group=w.row_group,
                            spread=self.policy.phase_spread(w.ref.qtype, k, rows_per, w.row_group))
        x_binding = (xq, 0, UNIFORM_X_BYTES) if uniform_x else xq
        for part in w.parts:
            bindings = [part, x_binding] + _addend_binding(add) + [out.buf]
            self._record("matvec_i8", key, bindings, matvec_i8_grid(part.rows, n, rows_per, tokens, self.policy.matvec_wg),
                         m=part.rows, k=k, n=n, row_bytes=w.ref.row_bytes, w_off=part.offset, x_off=0, y_off=out.off + part.row0,
                         y_stride=m, x_row_words=row_words, pair_off=pair_off, **_addend_params(add, part.row0))
        return out

    def rmsnorm(self, x: Tensor, w: WeightSlot | None, eps: float, residual: Tensor | None = None) -> Tensor:
        d = x.shape[-1]
        rows = x.size // d
        if w is None:               # (gemma4's values) a weight of ones: x * inv * 1.0 is x * inv
            if d not in self._ones:
                ones = np.ones(d, np.float32)
                self._ones[d] = F32Values(self.allocator.buffer(ones.nbytes, f"ones{d}"))
                self.device.write(self._ones[d].f32_buf, ones)
            w = self._ones[d]
        out = self._tensor(x.shape, "rmsnorm")
        reduce = self.policy.reduce
        key = rmsnorm_key(reduce=reduce, subgroup=self.policy.subgroup, residual=residual is not None)
        inputs = [x.buf, w.f32_buf] + ([residual.buf] if residual is not None else [])
        self._record("rmsnorm", key, inputs + [out.buf], rmsnorm_grid(rows, reduce), rows=rows, d=d, eps=eps, x_off=x.off,
                     y_off=out.off, w_off=0, r_off=residual.off if residual is not None else 0)
        if residual is None:        # the next op may norm its input itself (the int8 route's quantize, rope)
            self._produced(out, Norm(x, w, eps))
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

    def rope(self, x: Tensor, positions: Tensor, spec: RopeSpec, freq_factors: WeightSlot | None = None,
             scale: np.ndarray | None = None, rotation: int = 0) -> Tensor:
        n, heads, hd = x.shape
        # the angle table, with the scales after it (rope.wgsl's SCALE reads them there): one per layer and side
        cache_key = (spec, None if freq_factors is None else freq_factors.name, None if scale is None else id(scale))
        if cache_key not in self._theta:
            theta, mscale = rope_theta(spec, None if freq_factors is None else freq_factors.values)
            table = theta if scale is None else np.concatenate([theta, scale.reshape(-1)]).astype(np.float32)
            buf = self.allocator.buffer(table.nbytes, "rope_theta")
            self.device.write(buf, table)
            self._theta[cache_key] = (buf, mscale, scale)     # (the scale kept: its id is the key)
        theta_buf, mscale, _ = self._theta[cache_key]
        out = self._tensor(x.shape, "rope")
        norm = self._producer(x, Norm)
        if norm is not None and norm.x.shape != x.shape:
            norm = None                 # only a norm of each head (qwen3, gemma3) folds into the rotation
        src = x if norm is None else norm.x
        # with a rotation, a workgroup a head turns it in workgroup memory (in the same pass)
        if rotation and hd > ROTATE_MAX_HEAD:
            raise UnsupportedError(f"a q4 cache rotates heads of up to {ROTATE_MAX_HEAD} values, this model's are {hd}",
                                   hint="use kv_type q8")
        grid = (1, heads, n) if rotation else (groups(hd // 2), heads, n)
        self._record("rope", rope_key(spec.neox, norm is not None, scale is not None, rotation > 0),
                     [src.buf, positions.buf, theta_buf] + ([norm.w.f32_buf] if norm is not None else []) + [out.buf],
                     grid, n=n, heads=heads, head_dim=hd, dims=spec.dims, mscale=mscale, x_off=src.off, y_off=out.off,
                     pos_off=positions.off, eps=norm.eps if norm is not None else 0.0, scale_off=spec.dims // 2,
                     rot=rotation, rnorm=float(hadamard_norm(rotation)) if rotation else 0.0)
        if scale is None:               # (scaled keys are stored as the rope leaves them: kv_write does not fold it)
            self._produced(out, Rope(src, positions, spec, theta_buf, mscale, norm))
        return out

    def attention(self, q: Tensor, k: Tensor, v: Tensor, positions: Tensor, spec: AttnSpec) -> Tensor:
        n = q.shape[0]
        if spec.head_dim % 4 or spec.head_dim_v % 4:
            raise UnsupportedError(f"head dims {spec.head_dim}/{spec.head_dim_v} are not multiples of 4")
        rope = self._producer(k, Rope)
        if rope is not None and (rope.positions != positions or rope.x.shape != k.shape):
            rope = None
        out = self._tensor((n, spec.n_heads * spec.head_dim_v), "attention")
        layer = self.kv.layer(spec.layer)
        self._kv_write(k, v, positions, spec, layer, rope, n)
        if self.policy.tiled_attention and n > 1 and not self._batched and spec.n_heads // spec.n_kv_heads <= WG:
            # the step's positions are consecutive (what attention_prefill.wgsl needs)
            key = attention_prefill_key(spec.head_dim, spec.head_dim_v, spec.softcap > 0, self.kv_type)
            self._record("attention_prefill", key, [q.buf, layer.k, layer.v, positions.buf, out.buf],
                         attention_prefill_grid(n, spec.n_heads, spec.n_kv_heads),
                         **self._attention_params(q, positions, spec, layer, out, n))
            return out
        self._decode_attention(q, positions, spec, layer, out, n)
        return out

    def _attention_params(self, q: Tensor, positions: Tensor, spec: AttnSpec, layer, out: Tensor, n: int) -> dict:
        return dict(n=n, heads=spec.n_heads, kv_heads=spec.n_kv_heads, window=spec.window, scale=spec.scale,
                    softcap=spec.softcap, pos_off=positions.off, q_off=q.off, out_off=out.off, **self._pages(layer))

    def _pages(self, layer) -> dict:
        """Where the kernels find a token's sequence and the layer's page table in the step map."""
        return dict(table_len=layer.table_len, seq_off=self.kv.seq_off, table_off=layer.table_off)

    def _kv_write(self, k: Tensor, v: Tensor, positions: Tensor, spec: AttnSpec, layer, rope, n: int) -> None:
        """The step's keys and values into the layer's pages; with `rope` (the keys' recorded rotation) the
        rotation and head norm are done on their way in: nothing else reads them."""
        kv_type = self.kv_type
        k_row, v_row = spec.n_kv_heads * spec.head_dim, spec.n_kv_heads * spec.head_dim_v
        common = dict(n=n, k_row=k_row, v_row=v_row, pos_off=positions.off, v_off=v.off, **self._pages(layer))
        if rope is None:
            self._record("kv_write", kv_write_key(kv_type), [k.buf, v.buf, positions.buf, layer.k, layer.v],
                         kv_write_grid(kv_type, k_row, v_row, n), k_off=k.off, **common)
            return
        norm = rope.norm
        self._record("kv_write", kv_write_key(kv_type, rope=True, neox=rope.spec.neox, k_norm=norm is not None),
                     [rope.x.buf, v.buf, positions.buf, rope.theta] + ([norm.w.f32_buf] if norm is not None else [])
                     + [layer.k, layer.v],
                     kv_write_grid(kv_type, k_row, v_row, n), k_off=rope.x.off, head_dim=spec.head_dim,
                     dims=rope.spec.dims, mscale=rope.mscale, eps=norm.eps if norm is not None else 0.0, **common)

    def _decode_attention(self, q: Tensor, positions: Tensor, spec: AttnSpec, layer, out: Tensor, n: int) -> None:
        """Decode attention (one invocation or workgroup per head, token and split of the keys), each token
        over its own sequence's pages."""
        params = self._attention_params(q, positions, spec, layer, out, n)
        splits, lanes = self.policy.attn_splits, self.policy.attn_lanes
        key, combine = attention_keys(spec.head_dim, spec.head_dim_v, spec.softcap > 0, splits, self.kv_type,
                                      f16=self.policy.f16, lanes=lanes)
        grid = attention_grid(spec.n_heads, n, splits, lanes)
        bindings = [q.buf, layer.k, layer.v, positions.buf]
        if combine is None:
            self._record("attention", key, bindings + [out.buf], grid, **params)
            # the int8 route's quantize of this output may be done by the attention pass itself
            self._produced(out, Attention(q, layer.k, layer.v, positions, spec, self.kv_type, params, grid))
            return
        records = Activation(n * spec.n_heads * splits * attention_record_bytes(spec.head_dim_v), "attn_partial")
        self._record("attention", key, bindings + [records], grid, **params)     # records from 0: the pass's own buffer
        self._record("attention", combine, [records, out.buf], attention_combine_grid(spec.n_heads, spec.head_dim_v, n),
                     **params)

    def glu(self, gate: Tensor, up: Tensor, act: str) -> Tensor:
        if act not in ACTIVATIONS:
            raise UnsupportedError(f"activation {act!r} is not one of {ACTIVATIONS}")
        n, f = gate.shape
        out = self._tensor((n, f), "glu")
        key = glu_key(act, self.policy.int8, f16=self.policy.f16 and not self.policy.int8)
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

    def drop(self, program: Program) -> None:
        """Free the buffers only `program` uses; its activations stay in the shared pool."""
        program.release(self.allocator, self.device)
