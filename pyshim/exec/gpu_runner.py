"""A model on the GPU executor: token ids in, logits (or the greedy id) out — the GPU twin of
`pyshim.exec.loading.Runner`.

Programs are recorded and built once per step shape: (tokens in the step, all logits or the last
row, greedy or not). Everything that waits is `async` (`forward_async`, `greedy_async`); the sync
`forward`/`greedy` wrap them on the runner's own event loop and exist for the native CLI only (a
browser caller awaits the async ones).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from pathlib import Path

import numpy as np

from pyshim.errors import BadRequestError, ContextOverflowError
from pyshim.gpu.device import GPUDevice
from pyshim.gpu.ops import GpuOps, Program
from pyshim.gpu.kernels import TOPK

KEEP_PROGRAMS = 8       # step shapes (other than one token) kept built; more are rebuilt on use
from pyshim.gpu.pool import physical


class GpuRunner:
    def __init__(self, spec, header, ops: GpuOps, model, n_ctx: int, loop: asyncio.AbstractEventLoop | None = None):
        self.spec, self.header, self.ops, self.model, self.n_ctx = spec, header, ops, model, n_ctx
        self._programs: OrderedDict[tuple[int, bool, bool, bool], Program] = OrderedDict()   # least recently used first
        self._loop = loop

    @property
    def metadata(self) -> dict:
        return self.header.metadata

    @property
    def weight_bytes(self) -> int:
        return self.ops.bound_bytes

    @property
    def device(self) -> GPUDevice:
        return self.ops.device

    def reset(self) -> None:
        """Nothing to clear: a step's attention reads only positions up to its own, all written before."""

    async def prepare_async(self) -> None:
        """One-time work before anything is timed: rearrange the grouped weights (their bytes must be
        uploaded by now), record and build the one-token (decode) programs."""
        await self.ops.repack()
        for greedy in (False, True):
            await self._program(1, False, greedy)

    def _rows_per_step(self, all_logits: bool) -> int:
        if not all_logits:
            return self.ops.max_chunk
        # an all-logits step holds [n, vocab] f32 in one binding
        return max(1, min(self.ops.max_chunk, self.ops.max_binding // (4 * self.spec.n_vocab)))

    async def _program(self, n: int, all_logits: bool, greedy: bool, topk: bool = False) -> Program:
        key = (n, all_logits, greedy, topk)
        if key not in self._programs:
            ops = self.ops
            program = ops.begin(n)
            logits = self.model.forward(ops, ops.tokens(n), ops.positions(n), all_logits)
            program.output = logits
            if greedy:
                program.argmax = ops.record_argmax(logits)
            if topk:
                program.topk = ops.record_topk(logits)
            ops.end()
            await program.build(ops.device, ops.kernels, ops.pool)
            self._programs[key] = program
            self._evict()
        self._programs.move_to_end(key)
        return self._programs[key]

    def _evict(self) -> None:
        """Keep the one-token programs and the KEEP_PROGRAMS most recently used others: every prompt length
        makes a program (params arena and some 600 bind groups), and a long chat sees many lengths. The
        one dropped is the least recently used, never one of the step being run."""
        others = [key for key in self._programs if key[0] != 1]
        for key in others[:max(0, len(others) - KEEP_PROGRAMS)]:
            self.ops.drop(self._programs.pop(key))

    def _check(self, ids, start: int) -> None:
        if len(ids) == 0:
            raise BadRequestError("no tokens to run")
        if start + len(ids) > self.n_ctx:
            raise ContextOverflowError(f"positions up to {start + len(ids)} exceed the context of {self.n_ctx} tokens",
                                       hint="use a shorter prompt or a larger --ctx")

    async def _run(self, ids, start: int, all_logits: bool, greedy: bool, topk: bool = False) -> Program:
        await self.ops.repack()        # no-op after the first step
        program = await self._program(len(ids), all_logits, greedy, topk)
        dev = self.device
        dev.write(self.ops.tokens_buf, np.asarray(ids, dtype=np.uint32))
        dev.write(self.ops.positions_buf, np.arange(start, start + len(ids), dtype=np.uint32))
        dev.submit(program.ready, label=f"step_n{len(ids)}")
        return program

    async def forward_async(self, ids, start: int, all_logits: bool = False) -> np.ndarray:
        """Logits [len(ids), vocab] (or [1, vocab], the last id's) for ids at positions start..."""
        self._check(ids, start)
        step = self._rows_per_step(all_logits)
        rows = []
        for at in range(0, len(ids), step):
            piece = list(ids[at:at + step])
            last = at + step >= len(ids)
            program = await self._run(piece, start + at, all_logits, False)
            if all_logits or last:
                out = program.output
                data = await self.device.read(physical(out.buf), out.size * 4, out.off * 4)
                rows.append(np.frombuffer(data, dtype=np.float32).reshape(out.shape))
        return np.concatenate(rows) if all_logits else rows[-1]

    async def _last_step(self, ids, start: int, *, greedy: bool = False, topk: bool = False) -> Program:
        """Runs ids in steps of at most max_chunk; the earlier ones only fill the KV cache, the last one
        (returned) also picks on the GPU (argmax or top-k of its last row)."""
        self._check(ids, start)
        chunk = self.ops.max_chunk
        for at in range(0, len(ids) - chunk, chunk):
            await self._run(list(ids[at:at + chunk]), start + at, False, False)
        at = (len(ids) - 1) // chunk * chunk
        return await self._run(list(ids[at:]), start + at, False, greedy, topk)

    async def greedy_async(self, ids, start: int) -> int:
        """The argmax of the last id's logits, computed on the GPU (4 bytes come back)."""
        program = await self._last_step(ids, start, greedy=True)
        return int(np.frombuffer(await self.device.read(program.argmax, 4), dtype=np.uint32)[0])

    async def top_k_async(self, ids, start: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k (<= TOPK) largest logits of the last id and their token ids, largest first (ties: lower id
        first), picked on the GPU: k pairs come back instead of the vocabulary."""
        if not 0 < k <= TOPK:
            raise BadRequestError(f"top-k on the GPU takes k in [1, {TOPK}], got {k}")
        program = await self._last_step(ids, start, topk=True)
        pairs = np.frombuffer(await self.device.read(program.topk, k * 8), dtype=np.uint32).reshape(k, 2)
        return pairs[:, 0].view(np.float32).copy(), pairs[:, 1].astype(np.int64)

    # --- sync wrappers: native CPython only ---
    def _sync(self, coro):
        if self._loop is None:
            raise RuntimeError("this GpuRunner was made for async use: await forward_async/greedy_async")
        return self._loop.run_until_complete(coro)

    def forward(self, ids, start: int, all_logits: bool = False) -> np.ndarray:
        return self._sync(self.forward_async(ids, start, all_logits))

    def greedy(self, ids, start: int) -> int:
        return self._sync(self.greedy_async(ids, start))

    def prepare(self) -> None:
        self._sync(self.prepare_async())


async def load_gpu_async(path: str | Path | None = None, *, header=None, source=None, n_ctx: int | None = None,
                         device: GPUDevice | None = None, loop=None, **ops_options) -> GpuRunner:
    """A GpuRunner for a GGUF file (`path`), or for a parsed header plus a byte source (Pyodide).
    `ops_options` go to GpuOps (max_chunk, max_binding)."""
    from pyshim.gpu import open_device
    from pyshim.exec.loading import open_model
    from pyshim.models import build_model
    from pyshim.gguf.tensors import WeightStore, tensor_refs_from_header

    header, source, spec, n_ctx = open_model(path, header=header, source=source, n_ctx=n_ctx)
    device = device or await open_device()
    ops = GpuOps(device, WeightStore(tensor_refs_from_header(header), source), spec, n_ctx, **ops_options)
    model = build_model(spec, ops)
    return GpuRunner(spec, header, ops, model, n_ctx, loop)


def load_gpu(path: str | Path | None = None, *, header=None, source=None, n_ctx: int | None = None, **ops_options) -> GpuRunner:
    """Native CPython: open the device and load on a private event loop kept for the sync wrappers."""
    loop = asyncio.new_event_loop()
    return loop.run_until_complete(load_gpu_async(path, header=header, source=source, n_ctx=n_ctx, loop=loop, **ops_options))
