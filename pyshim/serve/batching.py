"""Several generations decoded together: a Runner over another that runs the one-token decode steps of
concurrent `generate` calls (pyshim.serve.generation, the one loop) as one batched step.

Each request keeps its own loop — its sampling, stop strings, grammar, max_tokens and abort — in its own
sequence; only the steps meet here. A one-token step asking for the argmax or the logits waits a moment
(a few turns of the event loop: the other sequences' next steps arrive in that time, since each caller
only samples and streams between its steps) and then runs with every such step pending, as one step of
the wrapped runner with a slice per sequence (pyshim.exec.gpu_runner: one program, the weights read once
for all of them). Every other step — a prompt chunk, top-k, all logits — runs on its own, in turn with
the batches: a request joining the running ones has its prompt prefilled between their decode steps, so
their streams keep flowing; one that leaves (finished, aborted) simply stops sending steps.

A step the KV cache has no pages for (pyshim.gpu.kv: every free page taken, no idle sequence's to take
back) waits for another request to end, and fails with KVCacheFullError only when every other running
request waits as well (so two requests can never wait for each other).

The wrapped runner's sequences are the callers' to allocate: two concurrent requests must not share one.
Its `stats` (device waits, bytes read back) are kept per caller here: each request runs in a task of
its own, and sees its own steps' and its share of the batched ones' (split evenly among their sequences),
so a request's decode timings stay its own while others run beside it.
"""

from __future__ import annotations

import asyncio
import contextvars
from dataclasses import dataclass

from pyshim.errors import KVCacheFullError
from pyshim.exec.runner import Output, RunnerStats, Step, Want

BATCHED_WANTS = (Want.ARGMAX, Want.LOGITS)
GATHER_YIELDS = 4       # event-loop turns a pending decode step waits for the others' (each samples, then steps)

_STATS: contextvars.ContextVar[RunnerStats | None] = contextvars.ContextVar("pyshim_request_stats", default=None)


@dataclass
class BatchStats:
    steps: int = 0          # steps of the wrapped runner that ran several sequences' tokens
    tokens: int = 0         # the tokens those steps decoded
    alone: int = 0          # decode steps that found no other sequence's to join
    waits: int = 0          # times a request waited for KV pages another held

    def as_dict(self) -> dict:
        return {"batched_steps": self.steps, "batched_tokens": self.tokens, "alone": self.alone, "page_waits": self.waits}


class BatchingRunner:
    """The Runner contract over `runner`, with concurrent decode steps of different sequences batched."""

    def __init__(self, runner, *, gather_yields: int = GATHER_YIELDS):
        self.inner = runner
        self.gather_yields = gather_yields
        self.batch_stats = BatchStats()
        self._lock = asyncio.Lock()          # one step of the wrapped runner at a time (its buffers are shared)
        self._pending: list[tuple[Step, asyncio.Future, RunnerStats]] = []
        self._flusher: asyncio.Task | None = None
        self._waiting: set[int] = set()      # sequences whose request waits for KV pages

    def __getattr__(self, name):            # capacity, held, reset, spec, ...: the wrapped runner's
        return getattr(self.inner, name)

    @property
    def stats(self) -> RunnerStats:
        """The calling request's: its steps' device waits and bytes read back (the wrapped runner's stats
        count everyone's)."""
        mine = _STATS.get()
        if mine is None:
            mine = RunnerStats()
            _STATS.set(mine)
        return mine

    async def step(self, step: Step) -> list[Output]:
        """Run `step` (batched with others' when it is a decode step); when the KV cache has no page for it
        while other requests run on, wait for one of them to end and try again (its pages may then be
        taken back): a request fails for want of pages only when every other running one waits too."""
        seq = step.slices[0].seq
        while True:
            try:
                return await self._step(step)
            except KVCacheFullError:
                others = self.inner.held.busy_seqs - self._waiting - {seq}
                if not others:
                    raise
                self._waiting.add(seq)
                try:
                    await self.inner.held.request_ended()
                finally:
                    self._waiting.discard(seq)
                self.batch_stats.waits += 1

    async def _step(self, step: Step) -> list[Output]:
        if not (len(step.slices) == 1 and len(step.slices[0].tokens) == 1 and step.want in BATCHED_WANTS):
            async with self._lock:
                return await self._counted([self.stats], self.inner.step(step))
        done = asyncio.get_running_loop().create_future()
        self._pending.append((step, done, self.stats))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.ensure_future(self._flush())
        return await done

    async def _flush(self) -> None:
        while self._pending:
            for _ in range(self.gather_yields):
                await asyncio.sleep(0)
            async with self._lock:
                batch, self._pending = self._pending, []
                for want in BATCHED_WANTS:
                    group = [(s, f, st) for s, f, st in batch if s.want is want and not f.done()]   # (an aborted caller's: skipped)
                    if group:
                        await self._run(want, group)

    async def _counted(self, callers: list[RunnerStats], work):
        """Await a step of the wrapped runner, its waits and readbacks shared evenly by `callers`."""
        inner = self.inner.stats
        waited, read = inner.wait_s, inner.bytes_read
        try:
            return await work
        finally:
            for mine in callers:
                mine.steps += 1
                mine.wait_s += (inner.wait_s - waited) / len(callers)
                mine.bytes_read += (inner.bytes_read - read) // len(callers)

    async def _run(self, want: Want, group: list[tuple[Step, asyncio.Future, RunnerStats]]) -> None:
        if len(group) == 1:
            self.batch_stats.alone += 1
        else:
            self.batch_stats.steps += 1
            self.batch_stats.tokens += len(group)
        try:
            outputs = await self._counted([st for _, _, st in group],
                                          self.inner.step(Step(tuple(s.slices[0] for s, _, _ in group), want)))
        except KVCacheFullError as exc:
            if len(group) == 1:
                raise_to(group, exc)
                return
            # refused before anything ran: each on its own, so only the ones that find no page fail
            for member in group:
                await self._run(want, [member])
            return
        except Exception as exc:        # noqa: BLE001 — every caller of the step sees its error
            raise_to(group, exc)
            return
        for (_, f, _), out in zip(group, outputs):
            if not f.done():
                f.set_result([out])


def raise_to(group: list[tuple[Step, asyncio.Future, RunnerStats]], exc: BaseException) -> None:
    """Every caller of a step that failed sees its error."""
    for _, f, _ in group:
        if not f.done():
            f.set_exception(exc)
