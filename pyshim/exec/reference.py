"""The reference executor: the ops interface computed immediately with NumPy, in float32.

Weights stay as GGUF blocks in their `ByteSource` and are dequantized with `gguf.quants`:
- `cache_weights=True` (default in CPython): each matmul weight is dequantized once, on first use, and
  kept as f32 (Qwen2.5-0.5B: ~2.4 GB) — fast decode;
- `cache_weights=False` (Pyodide's 2–4 GB wasm heap): dequantized per matmul, `DEQUANT_CHUNK_ROWS` rows
  at a time, so the peak is one chunk — slow but small.
Embedding lookups dequantize only the rows asked for. This executor is the oracle every GPU kernel is
checked against, so it favours plain, obviously right NumPy over speed. Its arithmetic is f32;
pyshim.exec.llama_cpp subclasses it for llama.cpp's rounding (the GPU int8 route's oracle) and for
llama.cpp's x86 arithmetic bit for bit. `ReferenceRunner` runs any of them behind the Runner contract.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from gguf import GGMLQuantizationType as QT

from pyshim.errors import UnsupportedError
from pyshim.exec.kvcache import KVCache
from pyshim.exec.runner import Capacity, HeldTokens, Output, Progress, RunnerStats, Step, Want, answer, check_step
from pyshim.gguf.tensors import TensorRef, WeightStore, dequantize_rows
from pyshim.gguf.types import check_runnable
from pyshim.models.key_scales import hadamard
from pyshim.models.ops import ACTIVATIONS, GATINGS, AttnSpec, RouterSpec
from pyshim.models.rope import RopeSpec, cos_sin
from pyshim.plan.memory import per_token
from pyshim.plan.settings import Arithmetic, RunSettings

# Rows dequantized at once when weights are not cached: 4096 rows x 4096 f32 = 64 MiB at most.
DEQUANT_CHUNK_ROWS = 4096
GELU_COEF_A = 0.044715
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
# A router's chosen weights are divided by their sum, but at least this (llama.cpp's clamp)
ROUTER_NORM_MIN = 6.103515625e-5
# Sequences a reference runner holds at once (each KV cache is made on first use).
MAX_SEQS = 8


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)))


class Weight:
    """A bound GGUF tensor: its place in the file, and its f32 values once asked for (cached or not)."""

    def __init__(self, store: WeightStore, ref: TensorRef, cache: bool, shape: tuple[int, ...] | None = None):
        self.store, self.ref, self.cache = store, ref, cache
        self.shape = shape or ref.shape
        self._dense: np.ndarray | None = None
        self._experts: dict[int, Weight] = {}

    def raw(self) -> np.ndarray:
        """The GGUF blocks, uint8 (rows, row_bytes)."""
        return self.store.raw(self.ref.name)

    def dense(self) -> np.ndarray:
        """All values as f32 in `shape` (cached after the first call when caching)."""
        if self._dense is not None:
            return self._dense
        values = dequantize_rows(self.raw(), self.ref.qtype).reshape(self.shape)
        if self.cache:
            self._dense = values
        return values

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` of a 2-D weight as f32 [len(ids), n_in]."""
        if self._dense is not None:
            return self._dense[ids]
        return dequantize_rows(self.store.raw_rows(self.ref.name, ids), self.ref.qtype)

    def expert(self, e: int) -> "Weight":
        """Expert `e`'s matrix [m, k] of a 3-D weight [n_experts, m, k]: a view of its rows, as a Weight."""
        if e not in self._experts:
            self._experts[e] = ExpertWeight(self, e)
        return self._experts[e]

    def matmul_t(self, x: np.ndarray) -> np.ndarray:
        """x [n, k] @ self.T -> [n, m], the weight dequantized to f32."""
        if self.cache or self.ref.qtype == QT.F32:
            return x @ self.dense().T
        raw = self.raw()
        out = np.empty((x.shape[0], self.shape[0]), dtype=np.float32)
        for start in range(0, self.shape[0], DEQUANT_CHUNK_ROWS):
            chunk = dequantize_rows(raw[start:start + DEQUANT_CHUNK_ROWS], self.ref.qtype)
            out[:, start:start + chunk.shape[0]] = x @ chunk.T
        return out


class ExpertWeight(Weight):
    """One expert's [m, k] matrix inside a 3-D weight: its rows of the parent's blocks (and of the
    parent's f32 values once those are cached), so every matmul route treats it as a 2-D weight."""

    def __init__(self, parent: Weight, e: int):
        self.parent, self.e = parent, e
        self.store, self.ref, self.cache = parent.store, parent.ref, parent.cache
        self.shape = tuple(parent.shape[1:])
        self._dense = None

    def raw(self) -> np.ndarray:
        m = self.shape[0]
        return self.parent.raw()[self.e * m:(self.e + 1) * m]

    def dense(self) -> np.ndarray:
        if self._dense is None and self.parent._dense is not None:     # the parent's cached values, viewed
            self._dense = self.parent._dense[self.e]
        return super().dense()


class ReferenceOps:
    """`pyshim.models.ops.Ops` in NumPy, f32 arithmetic. Tensors are float32 ndarrays; tokens and
    positions int64 arrays. `kv` is the cache of the sequence being run (the runner sets it)."""

    arithmetic = Arithmetic.F32

    def __init__(self, store: WeightStore, spec, n_ctx: int, *, cache_weights: bool = True, kv_type: str = "f32"):
        self.store = store
        self.spec, self.n_ctx, self.kv_type = spec, n_ctx, kv_type
        self.cache_weights = cache_weights
        self.kv = KVCache(spec, n_ctx, kv_type)
        self._bound: dict[str, Weight] = {}

    def prepare(self) -> None:
        """Dequantize every cached weight now (else the first forward pays for it); no-op when not caching."""
        if self.cache_weights:
            for w in self._bound.values():
                if len(w.shape) >= 2:
                    w.dense()

    # --- weights ---
    def has_weight(self, name: str) -> bool:
        return name in self.store

    def scalar(self, name: str) -> float:
        return float(self.weight(name, (1,)).dense().reshape(-1)[0])

    def weights(self, named: Sequence[tuple[str, Sequence[int]]]) -> list[Weight]:
        return [self.weight(name, shape) for name, shape in named]

    def weight(self, name: str, shape: Sequence[int]) -> Weight:
        ref = self.store.checked(name, shape)
        check_runnable(name, ref.qtype, "cpu")
        if name not in self._bound:
            self._bound[name] = Weight(self.store, ref, self.cache_weights, tuple(shape))
        return self._bound[name]

    # --- ops ---
    def embed(self, table: Weight, tokens: np.ndarray) -> np.ndarray:
        return table.rows(tokens)

    def matmul(self, x: np.ndarray, w: Weight, bias: Weight | None = None, residual: np.ndarray | None = None) -> np.ndarray:
        out = self._matmul(x, w)
        if bias is not None:
            out += bias.dense()
        return out if residual is None else self.add(residual, out)

    def _matmul(self, x: np.ndarray, w: Weight) -> np.ndarray:
        return w.matmul_t(x)

    def matmuls(self, x: np.ndarray, ws: Sequence[Weight], biases: Sequence[Weight | None]) -> list[np.ndarray]:
        return [self.matmul(x, w, b) for w, b in zip(ws, biases)]

    def glu_matmul(self, x: np.ndarray, gate: Weight, up: Weight, act: str) -> np.ndarray:
        return self.glu(self.matmul(x, gate), self.matmul(x, up), act)

    def rmsnorm(self, x: np.ndarray, w: Weight | None, eps: float, residual: np.ndarray | None = None) -> np.ndarray:
        out = self._rmsnorm(x, w, eps)
        return out if residual is None else self.add(residual, out)

    def _rmsnorm(self, x: np.ndarray, w: Weight | None, eps: float) -> np.ndarray:
        ms = np.mean(np.square(x, dtype=np.float64), axis=-1, keepdims=True)
        out = (x / np.sqrt(ms + eps)).astype(np.float32)
        return out if w is None else out * w.dense()

    def view(self, x: np.ndarray, shape: Sequence[int]) -> np.ndarray:
        return x.reshape(tuple(shape))

    def split(self, x: np.ndarray, sizes: Sequence[int]) -> list[np.ndarray]:
        return np.split(x, np.cumsum(sizes)[:-1], axis=-1)

    def rope(self, x: np.ndarray, positions: np.ndarray, spec: RopeSpec, freq_factors: Weight | None = None,
             scale: np.ndarray | None = None, rotation: int = 0) -> np.ndarray:
        y = self._rotate(x, positions, spec, freq_factors)
        y = y if scale is None else y * scale
        return hadamard(y, rotation) if rotation else y

    def _rotate(self, x: np.ndarray, positions: np.ndarray, spec: RopeSpec, freq_factors: Weight | None) -> np.ndarray:
        ff = freq_factors.dense() if freq_factors is not None else None
        cos, sin = cos_sin(spec, positions, ff)                 # [n, dims/2]
        return rotate(x, cos, sin, spec)

    def attention(self, q, k, v, positions, spec: AttnSpec) -> np.ndarray:
        n, hq, hd = q.shape
        hkv, group = spec.n_kv_heads, spec.n_heads // spec.n_kv_heads
        layer = self.kv[spec.layer]
        # keys = what the cache held before this step, then this step's own (a ring smaller than the
        # chunk would otherwise lose keys the chunk's first queries still need)
        ck, cv, cpos = layer.contents()
        cpos = np.where(cpos < positions[0], cpos, -1)     # held at this step's positions or later: an older run's
        k, v = layer.as_stored(k), layer.as_stored(v)      # this step's keys too: the GPU reads them from the cache
        keys = np.concatenate([ck, k]) if len(ck) else k                      # [S, Hkv, hd]
        vals = np.concatenate([cv, v]) if len(cv) else v                      # [S, Hkv, hd_v]
        kpos = np.concatenate([cpos, positions]) if len(cpos) else positions  # [S]
        layer.update(positions, k, v)

        qh = q.reshape(n, hkv, group, hd).transpose(1, 2, 0, 3)               # [Hkv, G, n, hd]
        visible = (kpos[None, :] <= positions[:, None]) & (kpos[None, :] >= 0)   # [n, S]
        if spec.window:
            visible &= positions[:, None] - kpos[None, :] < spec.window
        return self._attend(qh, keys, vals, visible, spec)

    def _attend(self, qh: np.ndarray, keys: np.ndarray, vals: np.ndarray, visible: np.ndarray, spec: AttnSpec) -> np.ndarray:
        """qh [Hkv, G, n, hd], keys [S, Hkv, hd], vals [S, Hkv, hd_v], visible [n, S] -> [n, Hq * hd_v]."""
        n = qh.shape[2]
        scores = qh @ keys.transpose(1, 2, 0)[:, None]                        # [Hkv, G, n, S]
        scores *= spec.scale
        if spec.softcap > 0:
            scores = spec.softcap * np.tanh(scores / spec.softcap)
        scores = np.where(visible, scores, -np.inf)
        scores -= scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        out = probs @ vals.transpose(1, 0, 2)[:, None]                        # [Hkv, G, n, hd_v]
        return out.transpose(2, 0, 1, 3).reshape(n, spec.n_heads * spec.head_dim_v).astype(np.float32)

    def glu(self, gate: np.ndarray, up: np.ndarray, act: str) -> np.ndarray:
        if act == "silu":
            return self._silu_glu(gate, up)
        if act == "gelu_tanh":
            return self._gelu_glu(gate, up)
        raise UnsupportedError(f"activation {act!r} is not one of {ACTIVATIONS}")

    def _silu_glu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        return gate / (1.0 + np.exp(-gate)) * up

    def _gelu_glu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        return gelu_tanh(gate) * up

    # --- mixture of experts ---
    def guess_route(self, x, gate_inp, spec: RouterSpec) -> None:
        """Every expert is resident here: nothing to fetch early."""

    def route(self, logits: np.ndarray, spec: RouterSpec, scales: Weight | None = None) -> tuple[np.ndarray, np.ndarray]:
        if spec.gating == "softmax":
            z = np.exp(logits - logits.max(axis=-1, keepdims=True))
            probs = z / z.sum(axis=-1, keepdims=True)
        elif spec.gating == "sigmoid":
            probs = 1.0 / (1.0 + np.exp(-logits))
        else:
            raise UnsupportedError(f"router gating {spec.gating!r} is not one of {GATINGS}")
        probs = probs.astype(np.float32)
        ids = np.argsort(-probs, axis=-1, kind="stable")[:, :spec.n_used]               # [n, u]
        weights = np.take_along_axis(probs, ids, axis=-1)
        if spec.norm:       # (the sum clamped at f16's smallest normal, as llama.cpp does)
            weights = weights / np.maximum(weights.sum(axis=-1, keepdims=True), np.float32(ROUTER_NORM_MIN))
        if spec.scale != 1.0:
            weights = weights * np.float32(spec.scale)
        if scales is not None:
            weights = weights * scales.dense()[ids]
        return weights.astype(np.float32), ids

    def expert_matmul(self, x: np.ndarray, w: Weight, ids: np.ndarray) -> np.ndarray:
        n, used = ids.shape
        pairs = ids.reshape(-1)
        rows = np.repeat(x, used, axis=0) if x.shape[0] == n and used > 1 else x           # [n * u, k]
        out = np.empty((n * used, w.shape[1]), dtype=np.float32)
        for e in np.unique(pairs):                   # the pairs that chose expert e, as one matmul
            at = np.flatnonzero(pairs == e)
            out[at] = self._matmul(rows[at], w.expert(int(e)))
        return out

    def expert_sum(self, y: np.ndarray, weights: np.ndarray) -> np.ndarray:
        n, used = weights.shape
        y = y.reshape(n, used, -1)
        out = y[:, 0] * weights[:, :1]
        for j in range(1, used):                     # in slot order, as llama.cpp adds its views
            out = out + y[:, j] * weights[:, j:j + 1]
        return out.astype(np.float32)

    def sigmoid_gate(self, x: np.ndarray, g: np.ndarray) -> np.ndarray:
        return (x * (1.0 / (1.0 + np.exp(-g)))).astype(np.float32)

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return a + b

    def scale(self, x: np.ndarray, s: float) -> np.ndarray:
        return x * np.float32(s)

    def softcap(self, x: np.ndarray, cap: float) -> np.ndarray:
        return (np.tanh(x / np.float32(cap)) * np.float32(cap)).astype(np.float32)

    def last(self, x: np.ndarray) -> np.ndarray:
        return x[-1:]


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, spec: RopeSpec) -> np.ndarray:
    """Rope's rotation of the first spec.dims of each head; x [n, heads, hd], cos/sin [n, dims/2]."""
    cos, sin = cos[:, None, :], sin[:, None, :]                 # broadcast over heads
    out = x.copy()
    d = spec.dims
    if spec.neox:
        x1, x2 = x[..., : d // 2], x[..., d // 2: d]
        out[..., : d // 2] = x1 * cos - x2 * sin
        out[..., d // 2: d] = x2 * cos + x1 * sin
    else:
        x1, x2 = x[..., 0:d:2], x[..., 1:d:2]
        out[..., 0:d:2] = x1 * cos - x2 * sin
        out[..., 1:d:2] = x2 * cos + x1 * sin
    return out


class ReferenceRunner:
    """A model on a NumPy ops class behind the Runner contract (pyshim.exec.runner). Sequences get their
    own KV cache on first use, up to MAX_SEQS; the slices of a step run one after another."""

    auto: dict | None = None     # set by the loader when kv_type was "auto" (pyshim.exec.runner.Runner)

    def __init__(self, spec, header, ops: ReferenceOps, model, settings: RunSettings, n_ctx: int):
        self.spec, self.header, self.ops, self.model, self.settings = spec, header, ops, model, settings
        self.arithmetic = ops.arithmetic
        self.capacity = Capacity(n_ctx=n_ctx, max_seqs=MAX_SEQS, max_step_tokens=settings.prefill_chunk)
        self.stats = RunnerStats()
        self.held = HeldTokens.for_spec(spec, n_ctx)
        self._caches: dict[int, KVCache] = {0: ops.kv}

    @property
    def n_ctx(self) -> int:
        return self.capacity.n_ctx

    @property
    def weight_bytes(self) -> int:
        """Bytes of GGUF weights a decode token reads (pyshim.plan.memory.per_token: one embedding row, and
        of a mixture of experts only the experts a token is routed to)."""
        return per_token(self.spec, self.header.tensors).read_bytes

    async def prepare(self, progress: Progress | None = None) -> None:
        """Dequantize the weights; nothing is compiled, so `progress` is never called."""
        self.ops.prepare()

    async def step(self, step: Step) -> list[Output]:
        return self.run(step)

    def run(self, step: Step) -> list[Output]:
        """`step` computed now (the reference never waits; tests call this directly)."""
        check_step(step, self.capacity, self.spec.n_vocab)
        outputs = []
        for s in step.slices:
            if s.seq not in self._caches:
                self._caches[s.seq] = KVCache(self.spec, self.n_ctx, self.settings.kv_type)
            self.ops.kv = self._caches[s.seq]
            tokens = np.asarray(s.tokens, dtype=np.int64)
            positions = np.arange(s.start, s.end, dtype=np.int64)
            with self.held.writing(s):
                logits = self.model.forward(self.ops, tokens, positions, step.want is Want.ALL_LOGITS)
            outputs.append(answer(logits, step))
        self.stats.steps += 1
        return outputs

    def logits(self, ids: Sequence[int], start: int = 0, *, seq: int = 0, all_logits: bool = False) -> np.ndarray:
        """The last token's logits [vocab] (or every token's, [n, vocab]) for ids at positions start...,
        in steps of at most max_step_tokens (a test's and a script's shorthand for run())."""
        step = self.capacity.max_step_tokens
        rows = []
        for at in range(0, len(ids), step):
            want = Want.ALL_LOGITS if all_logits else Want.LOGITS
            rows.append(self.run(Step.of(ids[at:at + step], start + at, seq=seq, want=want))[0].logits)
        return np.concatenate(rows) if all_logits else rows[-1]

    def reset(self, seq: int = 0) -> None:
        self.held.forget(seq)
        if seq in self._caches:
            self._caches[seq].reset()

    def close(self) -> None:
        self._caches = {}

    def layer_stream_stats(self) -> None:
        """None: the reference streams no layers (the GPU executor's report has the fields)."""
