"""The CPU engine behind the Runner contract: WebAssembly SIMD kernels (shaders/wasm/engine.c) driven by a
program recorded once per step shape (pyshim.exec.wasm_ops) — natively under wasmtime, for visitors
without a usable GPU in the page.

A step's slices run one after another, each its sequence's program for (tokens in the slice, what comes
back): greedy ids are picked inside the module (4 bytes read back), logits are read when asked for. A step
of one token of each of several sequences (continuous batching, pyshim.serve.batching) runs as one
program instead: its matmuls take all the tokens at once — each weight row read once for all of them,
each token's dot products the same as alone — and attention runs per token in its own sequence's cache.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import numpy as np

from pyshim.errors import PyshimError, UnsupportedError
from pyshim.exec.runner import Capacity, HeldTokens, Output, Progress, RunnerStats, Step, Want, answer, check_step
from pyshim.exec.wasm_module import Module, NativeModule
from pyshim.exec.wasm_ops import WasmOps, WasmProgram
from pyshim.plan.memory import cpu_engine_bytes, cpu_engine_plan, cpu_engine_wide, per_token
from pyshim.plan.settings import AUTO, Arithmetic, RunSettings
from pyshim.plan.settings import kv_type as kv_type_named

MAX_SEQS = 8            # sequences held at once (each KV cache is made on first use)
KEEP_PROGRAMS = 8       # step shapes (other than one token) kept recorded
TOP_K = 64              # the largest k a top-k step answers (picked in the module: only they are read back)


class WasmRunner:
    auto: dict | None = None
    runs_on = "cpu"               # what the page's `device` setting calls it

    def __init__(self, spec, header, ops: WasmOps, model, settings: RunSettings, n_ctx: int):
        self.spec, self.header, self.ops, self.model, self.settings = spec, header, ops, model, settings
        self.arithmetic = ops.arithmetic
        self.capacity = Capacity(n_ctx=n_ctx, max_seqs=ops.max_seqs, max_step_tokens=ops.max_step, top_k=TOP_K)
        self.stats = RunnerStats()
        self.held = HeldTokens()      # caches are indexed by position, windows included: no ring to wrap
        # by (tokens, want, the sequence — or a batched step's sequences)
        self._programs: OrderedDict[tuple[int, Want, int | tuple[int, ...]], WasmProgram] = OrderedDict()

    @property
    def n_ctx(self) -> int:
        return self.capacity.n_ctx

    @property
    def module(self) -> Module:
        return self.ops.module

    @property
    def threads(self) -> int:
        return self.module.threads

    @property
    def relaxed_simd(self) -> bool:
        """Whether the module is the relaxed-SIMD build (web/engine/cpu.js and NativeModule pick it where they can)."""
        return self.module.relaxed

    @property
    def wasm64(self) -> bool:
        """Whether the module is the 64-bit build (a model past 4 GiB: pyshim.exec.wasm_runner.needs_wide)."""
        return self.module.wide

    @property
    def weight_bytes(self) -> int:
        return per_token(self.spec, self.header.tensors).read_bytes

    async def prepare(self, progress: Progress | None = None) -> None:
        """Record the one-token programs (nothing to compile: the module was built at setup)."""
        for want in (Want.ARGMAX, Want.TOP_K, Want.LOGITS):      # greedy, sampled, penalized or constrained
            self.program(1, want, 0)

    def program(self, n: int, want: Want, seq: int | tuple[int, ...]) -> WasmProgram:
        """The program of an n-token step of sequence `seq` answering `want` (ARGMAX and TOP_K picked in the
        module; the others' logits read back); `seq` a tuple: a batched decode step's sequences (ARGMAX or
        LOGITS, answered for every one)."""
        want = want if want in (Want.ARGMAX, Want.TOP_K, Want.ALL_LOGITS) else Want.LOGITS
        key = (n, want, seq)
        batched = isinstance(seq, tuple)
        if key not in self._programs:
            ops = self.ops
            program = ops.begin(n, seqs=seq) if batched else ops.begin(n, seq)
            logits = self.model.forward(ops, ops.tokens(n), ops.positions(n), want is Want.ALL_LOGITS or batched)
            program.output = logits
            if want is Want.ARGMAX and batched:
                ops.record_argmax_rows(logits)
            elif want is Want.ARGMAX:
                ops.record_argmax(logits)
            elif want is Want.TOP_K:
                ops.record_topk(logits)
            self._programs[key] = ops.end()
            others = [k for k in self._programs if k[0] != 1]
            for old in others[:max(0, len(others) - KEEP_PROGRAMS)]:
                del self._programs[old]
        self._programs.move_to_end(key)
        return self._programs[key]

    async def step(self, step: Step) -> list[Output]:
        # The module's run holds the thread; in the page's Worker a yield between steps is what lets an
        # abort (or another request) in, as the GPU's awaited reads do
        await asyncio.sleep(0)
        return self.run(step)

    def run(self, step: Step) -> list[Output]:
        check_step(step, self.capacity, self.spec.n_vocab)
        slices = step.slices
        if step.one_token_each:
            with ExitStack() as held:
                for s in slices:
                    held.enter_context(self.held.writing(s))
                outputs = self._batch(step)
        else:
            outputs = []
            for s in slices:
                with self.held.writing(s):
                    outputs.append(self._slice(s.tokens, s.start, s.seq, step))
        self.stats.steps += 1
        return outputs

    def _batch(self, step: Step) -> list[Output]:
        """One token of each sequence in one program."""
        n = len(step.slices)
        program = self.program(n, step.want, tuple(s.seq for s in step.slices))
        self._run(program, [s.tokens[0] for s in step.slices], [s.start for s in step.slices])
        if step.want is Want.NONE:
            return [Output() for _ in range(n)]
        if step.want is Want.ARGMAX:
            self.stats.bytes_read += 4 * n
            return [Output(token=int(t)) for t in np.frombuffer(self.module.read(self.ops.argmax_ptr, 4 * n), dtype=np.int32)]
        rows = self._logits(program)
        return [Output(logits=row.copy()) for row in rows]

    def _run(self, program: WasmProgram, tokens, positions) -> None:
        module, ops = self.module, self.ops
        module.write(ops.tokens_ptr, np.asarray(tokens, dtype=np.int32))
        module.write(ops.positions_ptr, np.asarray(positions, dtype=np.int32))
        bad = module.call("run", program.ptr, program.count)
        if bad:
            raise UnsupportedError(f"the CPU engine does not know op {bad - 1} of its program",
                                   hint="rebuild it: pyshim setup")

    def _logits(self, program: WasmProgram) -> np.ndarray:
        out = program.output
        ptr = program.arena_ptr + out.buf.offset + out.off      # (its own arena: a later program may have a larger one)
        self.stats.bytes_read += 4 * out.size
        return np.frombuffer(self.module.read(ptr, 4 * out.size), dtype=np.float32).reshape(out.shape)

    def _slice(self, tokens, start: int, seq: int, step: Step) -> Output:
        program = self.program(len(tokens), step.want, seq)
        module, ops = self.module, self.ops
        self._run(program, tokens, np.arange(start, start + len(tokens)))
        if step.want is Want.ARGMAX:
            self.stats.bytes_read += 4
            return Output(token=int(np.frombuffer(module.read(ops.argmax_ptr, 4), dtype=np.int32)[0]))
        if step.want is Want.TOP_K:
            self.stats.bytes_read += 8 * step.k
            ids = np.frombuffer(module.read(ops.topk_ptr, 4 * step.k), dtype=np.int32)
            values = np.frombuffer(module.read(ops.topk_ptr + 4 * ops.top_k, 4 * step.k), dtype=np.float32)
            return Output(values=values.copy(), ids=ids.astype(np.int64))
        if step.want is Want.NONE:
            return Output()
        logits = self._logits(program)
        return answer(logits if step.want is Want.ALL_LOGITS else logits[-1], step)

    def share(self, src: int, dst: int, n: int) -> bool:
        """Sequence `dst` takes `src`'s keys and values for positions [0, n) — copied in the module's memory
        (a cache holds each position in its own rows, sliding windows included) instead of run again: a
        system prompt that concurrent requests share."""
        if src == dst or n < 1:
            return False
        ops, spec = self.ops, self.spec
        per_value = kv_type_named(ops.kv_type).bytes_per_value
        for il, ((ks, vs), (kd, vd)) in enumerate(zip(ops.cache(src), ops.cache(dst))):
            for a, b, head_dim in zip((ks, vs), (kd, vd), spec.head_dims(il)):
                nbytes = int(per_value * head_dim) * spec.kv_heads(il) * n
                self.module.write(b, self.module.read(a, nbytes))
        self.held.copied(src, dst, n)
        return True

    def reset(self, seq: int = 0) -> None:
        """Only `held` forgets: a step's attention reads only positions up to its own, all written before."""
        self.held.forget(seq)

    def close(self) -> None:
        self._programs.clear()
        self.module.close()

    def expert_cache_stats(self) -> None:
        """None: the CPU engine streams no experts (the GPU executor's report has the same fields)."""

    def layer_stream_stats(self) -> None:
        """None: the CPU engine streams no layers."""

    def memory(self) -> dict:
        return {"module_bytes": self.module.memory_bytes, "threads": self.module.threads, "relaxed_simd": self.relaxed_simd,
                "wasm64": self.wasm64,
                "weight_bytes": self.ops.weight_bytes,
                "kv_bytes": self.ops.kv_bytes(), "arena_bytes": self.ops.arena_bytes}


def load_wasm(path: str | Path | None = None, *, header=None, source=None, settings: RunSettings = RunSettings(),
              module: Module | None = None, upload_now: bool = True) -> WasmRunner:
    """A WasmRunner for a GGUF file (or a parsed header plus a byte source), its weights copied into the
    module's memory. `module`: an instantiated engine (default: the built one under wasmtime);
    `upload_now=False` leaves the matrices' bytes to the caller (`runner.ops.uploads`: the page).
    Natively `settings.threads` (default 1) runs programs on that many threads."""
    from pyshim.gguf.model import open_model
    from pyshim.gguf.tensors import WeightStore, tensor_refs_from_header
    from pyshim.models import build_model

    header, source, spec = open_model(path, header=header, source=source)
    spec = settings.spec_for(spec)
    if settings.kv_type == AUTO:
        settings = replace(settings, kv_type="f32")   # (the memory plan's choice of cache types is the GPU's)
    n_ctx = settings.context_for(spec.context_length)
    own = module is None
    module = module or NativeModule(threads=settings.threads or 1, wide=needs_wide(spec, header, settings))
    try:
        store = WeightStore(tensor_refs_from_header(header), source)
        ops = WasmOps(module, store, spec, n_ctx,
                      settings.arithmetic or Arithmetic.INT8, max_seqs=MAX_SEQS, max_step=settings.prefill_chunk, top_k=TOP_K,
                      kv_type=settings.kv_type, upload_now=upload_now)
        return WasmRunner(spec, header, ops, build_model(spec, ops, store if settings.scaled_keys else None, settings.rotated_keys), settings, n_ctx)
    except BaseException:
        if own:             # (its helper threads end with it; a caller's module is the caller's to close)
            module.close()
        raise


def needs_wide(spec, header, settings: RunSettings) -> bool:
    """Whether the model (its spec as the settings change it) with these settings needs the engine's 64-bit
    build: weights, a cache for each parallel sequence and activations past wasm32's 4 GiB
    (pyshim.plan.memory.cpu_engine_wide). A model whose estimate fails is left to the 32-bit build, whose
    loading then says what is wrong."""
    try:
        est, n_ctx, kv_type = cpu_engine_plan(spec, header.tensors, settings)
    except PyshimError:
        return False
    return cpu_engine_wide(cpu_engine_bytes(spec, est, n_ctx, kv_type, settings.parallel))
