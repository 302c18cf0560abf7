"""The ops interface recorded as a program for the CPU engine (shaders/wasm/engine.c).

Like the GPU executor, a forward pass is recorded once per step shape and replayed: each op becomes
OP_WORDS words (opcode, then pointers, sizes, floats as their bits; int32, or int64 for the 64-bit build)
that the module's `run` executes in one call. Tensors are places in one activation arena shared by every program (only one runs
at a time); after recording, each tensor gets an offset by first fit, freed after its last use, so a
512-token prefill needs a few of its activations at once, not all of them. Weights are copied into the
module's memory once, as GGUF blocks (the norms' and biases' as f32), and KV caches are allocated per
sequence on first use: per layer [n_ctx, kv heads] rows of a head's values in the cache's type (f32, f16,
or q8/q4 blocks of 32: engine.c's kv_store_row), indexed by position.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from gguf import GGMLQuantizationType as QT

from pyshim.errors import UnsupportedError
from pyshim.exec.wasm_module import Module
from pyshim.gguf.tensors import WeightStore, dequantize_rows
from pyshim.gguf.types import check_runnable
from pyshim.models.key_scales import hadamard_norm
from pyshim.models.ops import ACTIVATIONS, AttnSpec, RouterSpec
from pyshim.models.rope import RopeSpec, pair_tables
from pyshim.plan.settings import MAX_THREADS, Arithmetic, kv_type as kv_type_named

OP_WORDS = 20
ABI = 7                          # what the ops mean (engine.c's `abi`: 2 the matmul's PER_TOKEN flag, 3 the experts' ops, 4 rope's scales,
                                 # 5 the Hadamard rotation, 6 the 64-bit build's words, 7 the router's per-expert scales)
GATING = {"softmax": 0, "sigmoid": 1}   # the router's gating word (engine.c's route)
MAX_EXPERTS = 256                # engine.c: the router's probabilities of a row live on the stack
OP = {name: i for i, name in enumerate(("embed", "matmul", "rmsnorm", "rope", "attention", "glu", "add", "scale",
                                         "softcap", "copy_cols", "argmax", "topk", "route", "expert_matmul", "expert_sum",
                                         "sigmoid_gate", "hadamard"), start=1)}
F32_ROUTE = 0x100                # or-ed into a matmul's type word (engine.c)
PER_TOKEN = 0x200                # or-ed too: a batched decode step, each token's arithmetic the one it has alone
GLU_ACT = {"silu": 0, "gelu_tanh": 1}
GELU_LLAMA_CPP = 2               # tanh-GELU through f16, as llama.cpp's CPU backend (the int8 route's)
ALIGN = 64
KV_CODE = {"f32": 0, "f16": 1, "q8": 2, "q4": 3}   # the cache's type word (engine.c's KV_*)
MAX_HEAD_DIM = 512               # engine.c: a cached row is read back into a stack buffer of this many values


class Buf:
    """A region of the activation arena; its offset is set once the program is laid out."""

    def __init__(self, nbytes: int):
        self.nbytes = -(-nbytes // ALIGN) * ALIGN
        self.offset: int | None = None


@dataclass
class Tensor:
    buf: Buf
    shape: tuple[int, ...]
    off: int = 0                 # bytes into buf

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass
class Fixed:
    """Memory outside the arena (weights, caches, inputs): a pointer already known."""

    ptr: int
    shape: tuple[int, ...] = ()


@dataclass
class Weight:
    ptr: int
    qtype: QT
    shape: tuple[int, ...]


@dataclass
class F:
    """A float argument (stored as its bits)."""

    value: float


@dataclass
class WasmProgram:
    ops: list[list] = field(default_factory=list)      # [opcode, args...] with Tensors, Fixed, Weights, F, ints
    output: Tensor | None = None
    arena_bytes: int = 0
    arena_ptr: int = 0           # the arena its pointers were encoded against (a later, larger one leaves it in place)
    ptr: int = 0                 # the encoded ops in the module's memory
    count: int = 0

    def bufs(self, op: list) -> list[Buf]:
        return [a.buf for a in op[1:] if isinstance(a, Tensor)]


class WasmOps:
    """`pyshim.models.ops.Ops` recorded for the CPU engine; `begin(n, seq)` ... `end()` around a forward
    (`begin(n, seqs=...)`: a batched decode step, token t sequence seqs[t]'s next one)."""

    def __init__(self, module: Module, store: WeightStore, spec, n_ctx: int, arithmetic: Arithmetic, *, max_seqs: int,
                 max_step: int, top_k: int, kv_type: str = "f32", upload_now: bool = True):
        if arithmetic not in (Arithmetic.INT8, Arithmetic.F32):
            raise UnsupportedError(f"the CPU engine runs the int8 route or f32, not {arithmetic.value}",
                                   hint="use arithmetic 'int8' (the default) or 'f32'")
        try:
            words = (module.call("op_words"), module.call("abi"))
            self.word_dtype = np.int64 if module.call("word_bytes") == 8 else np.int32
        except Exception:       # (a module older than the exports: wasmtime's KeyError, the page's TypeError)
            words = None
        if words != (OP_WORDS, ABI):
            raise UnsupportedError("the CPU engine's module was built from an older shaders/wasm/engine.c",
                                   hint="rebuild it: pyshim setup")
        widest = max(max(spec.head_dims(il)) for il in range(spec.n_layers))
        for il in range(spec.n_layers):
            kv_type_named(kv_type).check_heads(*spec.head_dims(il))
        if widest > MAX_HEAD_DIM:
            raise UnsupportedError(f"the CPU engine's attention takes heads of up to {MAX_HEAD_DIM} values, not "
                                   f"{widest}", hint="use the gpu backend for this model")
        self.module, self.store, self.spec, self.n_ctx, self.kv_type = module, store, spec, n_ctx, kv_type
        self.arithmetic, self.max_seqs, self.max_step = arithmetic, max_seqs, max_step
        self._bound: dict[str, Weight] = {}
        self._ropes: dict[tuple, tuple[int, float]] = {}
        self._constants: dict[int, tuple[int, np.ndarray]] = {}
        self._ones_by_width: dict[int, np.ndarray] = {}
        self._caches: dict[int, list[tuple[int, int]]] = {}        # seq -> per layer (k ptr, v ptr)
        self.tokens_ptr = module.alloc(4 * max_step)
        self.positions_ptr = module.alloc(4 * max_step)
        self.argmax_ptr = module.alloc(4 * max_seqs)    # a greedy step's id, one a sequence when batched
        self.top_k = top_k                          # a sampled step's candidates: ids, then their logits
        self.topk_ptr = module.alloc(8 * top_k)
        self.arena_ptr, self.arena_bytes = 0, 0
        self.weight_bytes = 0
        # upload_now=False (the page): matrices get their place in memory but not their bytes, which the
        # caller copies from the store along `uploads` (file offset, bytes, pointer)
        self.upload_now = upload_now
        self.uploads: list[tuple[int, int, int]] = []
        self._program: WasmProgram | None = None
        self._seq = 0
        self._seqs: tuple[int, ...] | None = None

    # --- weights ---
    def has_weight(self, name: str) -> bool:
        return name in self.store

    def scalar(self, name: str) -> float:
        return float(self.float_values(self.weight(name, (1,)))[0])

    def weights(self, named: Sequence[tuple[str, Sequence[int]]]) -> list[Weight]:
        return [self.weight(name, shape) for name, shape in named]

    def weight(self, name: str, shape: Sequence[int]) -> Weight:
        if name in self._bound:
            return self._bound[name]
        ref = self.store.checked(name, shape)
        check_runnable(name, ref.qtype, "wasm")
        if len(shape) == 1:         # norms and biases in f32
            values = dequantize_rows(self.store.raw(name), ref.qtype).astype(np.float32).reshape(-1)
            w = Weight(self._upload(values), QT.F32, tuple(shape))
        elif self.upload_now:
            w = Weight(self._upload(self.store.raw(name)), ref.qtype, tuple(shape))
        else:
            w = Weight(self.module.alloc(ref.nbytes), ref.qtype, tuple(shape))
            self.uploads.append((ref.offset, ref.nbytes, w.ptr))
            self.weight_bytes += ref.nbytes
        self._bound[name] = w
        return w

    def _upload(self, data: np.ndarray) -> int:
        data = np.ascontiguousarray(data)
        ptr = self.module.alloc(data.nbytes)
        for at in range(0, data.nbytes, 1 << 26):        # 64 MiB at a time: the source may be a memory map
            self.module.write(ptr + at, data.reshape(-1).view(np.uint8)[at:at + (1 << 26)])
        self.weight_bytes += data.nbytes
        return ptr

    def float_values(self, w: Weight) -> np.ndarray:
        return np.frombuffer(self.module.read(w.ptr, 4 * math.prod(w.shape)), dtype=np.float32)

    # --- caches ---
    def _cache_bytes(self, layer: int) -> tuple[int, int]:
        """Layer `layer`'s keys and values of one sequence: n_ctx positions × kv heads × a row of the type."""
        per_value = kv_type_named(self.kv_type).bytes_per_value
        heads = self.spec.kv_heads(layer)
        return tuple(int(per_value * hd) * self.n_ctx * heads for hd in self.spec.head_dims(layer))

    def cache(self, seq: int) -> list[tuple[int, int]]:
        """Sequence `seq`'s KV cache: per layer (keys, values), made on first use."""
        if seq not in self._caches:
            self._caches[seq] = [tuple(self.module.alloc(nbytes) for nbytes in self._cache_bytes(il))
                                 for il in range(self.spec.n_layers)]
        return self._caches[seq]

    def kv_bytes(self) -> int:
        return sum(sum(self._cache_bytes(il)) for il in range(self.spec.n_layers)) * len(self._caches)

    # --- recording ---
    def begin(self, n: int, seq: int = 0, seqs: tuple[int, ...] | None = None) -> WasmProgram:
        """Record a step of n tokens of sequence `seq`, or with `seqs` one token of each of those sequences
        (every op but attention is row by row, so each token is computed as it is alone)."""
        if seqs is not None and (len(seqs) != n or len(set(seqs)) != n):
            raise ValueError(f"a batched step takes one token of each of {n} distinct sequences, got {seqs}")
        self._program, self._seq, self._seqs = WasmProgram(), seq, seqs
        for s in seqs or (seq,):
            self.cache(s)
        return self._program

    def tokens(self, n: int) -> Fixed:
        return Fixed(self.tokens_ptr, (n,))

    def positions(self, n: int) -> Fixed:
        return Fixed(self.positions_ptr, (n,))

    def _new(self, shape: Sequence[int]) -> Tensor:
        shape = tuple(int(s) for s in shape)
        return Tensor(Buf(4 * math.prod(shape)), shape)

    def _op(self, name: str, *args) -> None:
        assert len(args) < OP_WORDS
        self._program.ops.append([OP[name], *args])

    def record_argmax(self, x: Tensor) -> None:
        """The last row's greedy id into `argmax_ptr`."""
        self._op("argmax", _row(x, x.shape[0] - 1), 1, x.shape[1], Fixed(self.argmax_ptr))

    def record_argmax_rows(self, x: Tensor) -> None:
        """Each row's greedy id into `argmax_ptr` (a batched step's: a word a sequence)."""
        self._op("argmax", x, x.shape[0], x.shape[1], Fixed(self.argmax_ptr))

    def record_topk(self, x: Tensor) -> None:
        """The last row's `top_k` largest logits and their ids into `topk_ptr` (ids first)."""
        self._op("topk", _row(x, x.shape[0] - 1), 1, x.shape[1],
                 self.top_k, Fixed(self.topk_ptr), Fixed(self.topk_ptr + 4 * self.top_k))

    def end(self) -> WasmProgram:
        """Lay the program's tensors out in the arena (first fit, each freed after its last use) and encode it."""
        program, self._program = self._program, None
        last_use: dict[int, int] = {}
        for i, op in enumerate(program.ops):
            for buf in program.bufs(op):
                last_use[id(buf)] = i
        if program.output is not None:
            last_use[id(program.output.buf)] = len(program.ops)          # read after the run
        free: list[tuple[int, int]] = []       # (offset, nbytes), sorted by offset
        top = 0
        for i, op in enumerate(program.ops):
            for buf in program.bufs(op):
                if buf.offset is None:
                    buf.offset, top = _place(free, buf.nbytes, top)
            for buf in {id(b): b for b in program.bufs(op)}.values():
                if last_use[id(buf)] == i:
                    _release(free, buf.offset, buf.nbytes)
        program.arena_bytes = top
        if top > self.arena_bytes:
            # a larger arena for this shape; programs encoded before keep the old one (never freed: at least
            # doubling bounds what is left behind to the size of the last)
            size = max(top, 2 * self.arena_bytes)
            self.arena_ptr, self.arena_bytes = self.module.alloc(size), size
        program.arena_ptr = self.arena_ptr
        words = np.zeros((len(program.ops), OP_WORDS), dtype=self.word_dtype)
        for i, op in enumerate(program.ops):
            words[i, :len(op)] = [self._word(a) for a in op]
        program.ptr, program.count = self.module.alloc(words.nbytes), len(program.ops)
        self.module.write(program.ptr, words)
        return program

    def _word(self, a) -> int:
        if isinstance(a, Tensor):
            return self._ptr_word(self.arena_ptr + a.buf.offset + a.off)
        if isinstance(a, (Fixed, Weight)):
            return self._ptr_word(a.ptr)
        if isinstance(a, F):
            return struct.unpack("<i", struct.pack("<f", a.value))[0]
        if a is None:
            return 0
        return int(a)

    def _ptr_word(self, ptr: int) -> int:
        """A pointer as the word that holds it (in an int32 word, addresses above 2 GiB wrap to negative)."""
        return ptr - (1 << 32) if self.word_dtype == np.int32 and ptr >= (1 << 31) else ptr

    # --- ops ---
    def embed(self, table: Weight, tokens: Fixed) -> Tensor:
        n, d = tokens.shape[0], table.shape[1]
        out = self._new((n, d))
        self._op("embed", table, int(table.qtype), d, tokens, n, out)
        return out

    def _type_word(self, w: Weight) -> int:
        """A matmul's type word: the weight's type, the route (F32_ROUTE) and a batched step's PER_TOKEN."""
        return (int(w.qtype) | (F32_ROUTE if self.arithmetic is Arithmetic.F32 else 0)
                | (PER_TOKEN if self._seqs is not None else 0))

    def matmul(self, x: Tensor, w: Weight, bias: Weight | None = None, residual: Tensor | None = None) -> Tensor:
        n, k = x.shape
        m = w.shape[0]
        out = self._new((n, m))
        qtype = self._type_word(w)
        scratch = self.module.call("matmul_scratch", qtype, n, k)
        self._op("matmul", x, n, k, w, qtype, m, out, bias, residual, Tensor(Buf(max(scratch, 4)), (scratch,)))
        return out

    def matmuls(self, x: Tensor, ws: Sequence[Weight], biases: Sequence[Weight | None]) -> list[Tensor]:
        return [self.matmul(x, w, b) for w, b in zip(ws, biases)]

    def glu_matmul(self, x: Tensor, gate: Weight, up: Weight, act: str) -> Tensor:
        return self.glu(self.matmul(x, gate), self.matmul(x, up), act)

    def rmsnorm(self, x: Tensor, w: Weight | None, eps: float, residual: Tensor | None = None) -> Tensor:
        d = x.shape[-1]
        out = self._new(x.shape)
        weight = w if w is not None else Fixed(self._constant(self._ones(d)))    # (gemma4's values: no weight)
        self._op("rmsnorm", x, x.size // d, d, weight, F(eps), out, residual)
        return out

    def _ones(self, d: int) -> np.ndarray:
        """f32 ones of width d, one array a width (the weight of a norm that has none)."""
        return self._ones_by_width.setdefault(d, np.ones(d, np.float32))

    def view(self, x: Tensor, shape: Sequence[int]) -> Tensor:
        shape = tuple(int(s) for s in shape)
        assert math.prod(shape) == x.size, (x.shape, shape)
        return Tensor(x.buf, shape, x.off)

    def split(self, x: Tensor, sizes: Sequence[int]) -> list[Tensor]:
        n, total = x.shape
        outs, at = [], 0
        for size in sizes:
            if n == 1:
                outs.append(Tensor(x.buf, (1, size), x.off + 4 * at))
            else:
                out = self._new((n, size))
                self._op("copy_cols", Tensor(x.buf, x.shape, x.off + 4 * at), n, total, size, out)
                outs.append(out)
            at += size
        return outs

    def rope(self, x: Tensor, positions: Fixed, spec: RopeSpec, freq_factors: Weight | None = None,
             scale: np.ndarray | None = None, rotation: int = 0) -> Tensor:
        n, heads, hd = x.shape
        per_pair, mscale = self._rope_table(spec, freq_factors)
        out = self._new(x.shape)
        self._op("rope", x, out, n, heads, hd, positions, Fixed(per_pair), spec.dims, int(spec.neox), F(mscale),
                 None if scale is None else Fixed(self._constant(scale)))
        if rotation:                    # in place, after the scales
            self._op("hadamard", out, out, out.size, rotation, F(float(hadamard_norm(rotation))))
        return out

    def _constant(self, values: np.ndarray) -> int:
        """A load-time table (f32) in module memory, written once: its address."""
        if id(values) not in self._constants:
            data = np.ascontiguousarray(values, dtype=np.float32)
            ptr = self.module.alloc(data.nbytes)
            self.module.write(ptr, data)
            self._constants[id(values)] = (ptr, values)      # (the array kept: its id is the key)
        return self._constants[id(values)][0]

    def _rope_table(self, spec: RopeSpec, freq_factors: Weight | None) -> tuple[int, float]:
        key = (spec, None if freq_factors is None else freq_factors.ptr)
        if key not in self._ropes:
            ff = None if freq_factors is None else self.float_values(freq_factors)
            inv_freq, mix, mscale = pair_tables(spec, ff)
            per_pair = (inv_freq * (spec.freq_scale * (1.0 - mix) + mix)).astype(np.float64)
            ptr = self.module.alloc(per_pair.nbytes)
            self.module.write(ptr, per_pair)
            self._ropes[key] = (ptr, float(mscale))
        return self._ropes[key]

    def attention(self, q: Tensor, k: Tensor, v: Tensor, positions: Fixed, spec: AttnSpec) -> Tensor:
        n = q.shape[0]
        out = self._new((n, spec.n_heads * spec.head_dim_v))
        scores = Tensor(Buf(4 * self.n_ctx * MAX_THREADS), (MAX_THREADS, self.n_ctx))     # a row per thread
        # a batched step: each token's keys into, and its attention over, its own sequence's cache
        parts = ([(q, k, v, positions, out, self._seq, n)] if self._seqs is None else
                 [(_row(q, t), _row(k, t), _row(v, t), Fixed(positions.ptr + 4 * t, (1,)), _row(out, t), seq, 1)
                  for t, seq in enumerate(self._seqs)])
        for q_, k_, v_, pos, out_, seq, count in parts:
            kc, vc = self.cache(seq)[spec.layer]
            self._op("attention", q_, k_, v_, pos, count, spec.n_heads, spec.n_kv_heads, spec.head_dim, spec.head_dim_v,
                     Fixed(kc), Fixed(vc), F(spec.scale), spec.window, F(spec.softcap), out_, scores, self.n_ctx,
                     KV_CODE[self.kv_type])
        return out

    def glu(self, gate: Tensor, up: Tensor, act: str) -> Tensor:
        if act not in ACTIVATIONS:
            raise UnsupportedError(f"activation {act!r} is not one of {ACTIVATIONS}")
        code = GELU_LLAMA_CPP if act == "gelu_tanh" and self.arithmetic is Arithmetic.INT8 else GLU_ACT[act]
        out = self._new(gate.shape)
        self._op("glu", gate, up, gate.size, code, out)
        return out

    def guess_route(self, x, gate_inp, spec: RouterSpec) -> None:
        """Every expert is resident here: nothing to fetch early."""

    def route(self, logits: Tensor, spec: RouterSpec, scales: Weight | None = None) -> tuple[Tensor, Tensor]:
        if spec.gating not in GATING:
            raise UnsupportedError(f"router gating {spec.gating!r} is not one of {tuple(GATING)}")
        if spec.n_experts > MAX_EXPERTS:
            raise UnsupportedError(f"the CPU engine routes among at most {MAX_EXPERTS} experts, not {spec.n_experts}",
                                   hint="use the gpu backend for this model")
        n = logits.shape[0]
        weights, ids = self._new((n, spec.n_used)), self._new((n, spec.n_used))     # ids: int32 words
        self._op("route", logits, n, spec.n_experts, spec.n_used, GATING[spec.gating], int(spec.norm), F(spec.scale),
                 weights, ids, scales)
        return weights, ids

    def expert_matmul(self, x: Tensor, w: Weight, ids: Tensor) -> Tensor:
        n, used = ids.shape
        _, m, k = w.shape
        per = used if x.shape[0] == n else 1        # a row per token for all its experts, or a row per pair
        out = self._new((n * used, m))
        qtype = self._type_word(w)
        scratch = self.module.call("matmul_scratch", qtype, 1, k)
        self._op("expert_matmul", x, n * used, per, k, w, qtype, m, ids, out, Tensor(Buf(max(scratch, 4)), (scratch,)))
        return out

    def expert_sum(self, y: Tensor, weights: Tensor) -> Tensor:
        n, used = weights.shape
        out = self._new((n, y.shape[1]))
        self._op("expert_sum", y, weights, n, used, y.shape[1], out)
        return out

    def sigmoid_gate(self, x: Tensor, g: Tensor) -> Tensor:
        n, d = x.shape
        out = self._new((n, d))
        self._op("sigmoid_gate", x, g, n, d, out)
        return out

    def add(self, a: Tensor, b: Tensor) -> Tensor:
        out = self._new(a.shape)
        self._op("add", a, b, a.size, out)
        return out

    def scale(self, x: Tensor, s: float) -> Tensor:
        out = self._new(x.shape)
        self._op("scale", x, x.size, F(s), out)
        return out

    def softcap(self, x: Tensor, cap: float) -> Tensor:
        out = self._new(x.shape)
        self._op("softcap", x, x.size, F(cap), out)
        return out

    def last(self, x: Tensor) -> Tensor:
        return _row(x, x.shape[0] - 1)


def _row(x: Tensor, t: int) -> Tensor:
    """Row t (the first axis) of a contiguous tensor."""
    per = math.prod(x.shape[1:])
    return Tensor(x.buf, (1,) + tuple(x.shape[1:]), x.off + 4 * t * per)




def _place(free: list[tuple[int, int]], nbytes: int, top: int) -> tuple[int, int]:
    """(offset, new top): the first free hole that fits, else the arena's top."""
    for i, (at, size) in enumerate(free):
        if size >= nbytes:
            if size == nbytes:
                free.pop(i)
            else:
                free[i] = (at + nbytes, size - nbytes)
            return at, top
    if free and free[-1][0] + free[-1][1] == top:       # the last hole grows into the top
        at, _ = free.pop()
        return at, at + nbytes
    return top, top + nbytes


def _release(free: list[tuple[int, int]], at: int, nbytes: int) -> None:
    """Return [at, at + nbytes) to the free list, merged with its neighbours."""
    import bisect

    i = bisect.bisect(free, (at, 0))
    free.insert(i, (at, nbytes))
    if i + 1 < len(free) and free[i][0] + free[i][1] == free[i + 1][0]:
        free[i] = (at, nbytes + free.pop(i + 1)[1])
    if i > 0 and free[i - 1][0] + free[i - 1][1] == free[i][0]:
        free[i - 1] = (free[i - 1][0], free[i - 1][1] + free.pop(i)[1])
