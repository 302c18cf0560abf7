"""The request queue in front of a session: requests start in the order they arrive, each in a sequence
(a KV cache) of its own, so two callers never interleave inside one cache. With one sequence (the
default) they run one at a time. With several (`slots`: a runner holding that many caches, wrapped in
pyshim.serve.batching's BatchingRunner) up to that many run at once — continuous batching: a request
joins the running ones between their steps and leaves when it ends, and their decode steps run together.
A job that must have the session alone (loading or unloading a model, a benchmark) waits for every
running one and holds all the sequences.

A job is `job(should_stop)`: it polls `should_stop()` between tokens, and learns its sequence from
`current_seq()`. A freed sequence goes to the next request first (last freed, first given), so one
caller's conversation keeps finding the cache that holds its earlier turns. Aborting a queued request
takes it out before it starts (its `run` raises AbortedError); aborting a running one makes its
`should_stop()` true. An abort may arrive before its request does (the page posts both; the request may
still be loading its model), so the last ABORTS_KEPT aborted ids are remembered.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
from collections import OrderedDict, deque
from typing import Awaitable, Callable, TypeVar

from pyshim.errors import PyshimError

T = TypeVar("T")
ABORTS_KEPT = 256

_SEQ: contextvars.ContextVar[int] = contextvars.ContextVar("pyshim_seq", default=0)


def current_seq() -> int:
    """The sequence the scheduler gave the running request (0 outside one)."""
    return _SEQ.get()


class AbortedError(PyshimError):
    """A request aborted while it waited in the queue."""


class Scheduler:
    def __init__(self, slots: int = 1):
        if slots < 1:
            raise ValueError(f"a scheduler needs at least one sequence, got {slots}")
        self.slots = slots
        self._free = list(range(slots - 1, -1, -1))     # a stack: pop() gives sequence 0 first
        self._order: deque[int] = deque()                # waiting requests, first come first
        self._changed = asyncio.Condition()
        self._aborted: OrderedDict[int, None] = OrderedDict()
        self._ids = itertools.count(-1, -1)      # ids for callers that bring none (negative: never the page's)
        self._held: dict[int, list[int]] = {}    # running request id -> the sequences it holds (exclusive: all)
        self.done = 0

    @property
    def running(self) -> dict[int, int]:
        """Running request id -> its sequence."""
        return {rid: held[0] for rid, held in self._held.items()}

    @property
    def queued(self) -> int:
        return len(self._order)

    async def run(self, job: Callable[[Callable[[], bool]], Awaitable[T]], request_id: int | None = None,
                  on_start: Callable[[], None] | None = None, *, exclusive: bool = False) -> T:
        """Run `job` when the requests before it have started and a sequence is free (`exclusive`: when
        every one is: the job has the session alone); `on_start()` is called as it starts (the page learns
        that its request left the queue)."""
        rid = next(self._ids) if request_id is None else request_id
        need = self.slots if exclusive else 1
        async with self._changed:
            self._order.append(rid)
            try:
                await self._changed.wait_for(lambda: rid in self._aborted or (self._order[0] == rid and len(self._free) >= need))
            finally:
                self._order.remove(rid)
                self._changed.notify_all()      # the next in line may start now
            if rid in self._aborted:
                self._aborted.pop(rid, None)
                raise AbortedError("the request was aborted before it started")
            self._held[rid] = [self._free.pop() for _ in range(need)]
        token = _SEQ.set(self._held[rid][0])
        try:
            if on_start is not None:
                on_start()
            return await job(lambda: rid in self._aborted)
        finally:
            _SEQ.reset(token)
            async with self._changed:
                self._aborted.pop(rid, None)
                self.done += 1
                self._free.extend(reversed(self._held.pop(rid)))
                self._changed.notify_all()

    def resize(self, slots: int) -> None:
        """From the one running request, which just loaded a model holding `slots` sequences: it keeps
        sequence 0 (all of them if it runs exclusive), the rest are free for the next requests."""
        if len(self._held) != 1:
            raise RuntimeError("the sequences change only while one request runs: the one that loads the model")
        (rid,) = self._held
        exclusive = len(self._held[rid]) == self.slots
        self.slots = slots
        self._held[rid] = list(range(slots)) if exclusive else [0]
        self._free = [] if exclusive else list(range(slots - 1, 0, -1))
        _SEQ.set(0)
        asyncio.ensure_future(self._wake())

    def abort(self, request_id: int) -> bool:
        """Stop request `request_id`, running or queued (or not arrived yet); True when it is running or queued."""
        self._aborted[request_id] = None
        while len(self._aborted) > ABORTS_KEPT:
            self._aborted.popitem(last=False)
        if request_id in self._order:
            asyncio.ensure_future(self._wake())
        return request_id in self._held or request_id in self._order

    async def _wake(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def stats(self) -> dict:
        return {"running": len(self._held), "queued": self.queued, "done": self.done, "sequences": self.slots}
