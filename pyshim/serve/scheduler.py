"""The request queue in front of a session: requests run one at a time, in the order they arrive, so two
callers never interleave inside one KV cache. Continuous batching (several sequences decoded together)
replaces this with a scheduler that joins and retires sequences between steps; the interface stays:
`run(job, request_id)` and `abort(request_id)`.

A job is `job(should_stop)`: it polls `should_stop()` between tokens. Aborting a queued request takes it
out before it starts (its `run` raises AbortedError); aborting the running one makes `should_stop()` true.
An abort may arrive before its request does (the page posts both; the request may still be loading its
model), so the last ABORTS_KEPT aborted ids are remembered.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import OrderedDict
from typing import Awaitable, Callable, TypeVar

from pyshim.errors import PyshimError

T = TypeVar("T")
ABORTS_KEPT = 256


class AbortedError(PyshimError):
    """A request aborted while it waited in the queue."""


class Scheduler:
    def __init__(self):
        self._lock = asyncio.Lock()
        self._aborted: OrderedDict[int, None] = OrderedDict()
        self._waiting: set[int] = set()
        self._ids = itertools.count(-1, -1)      # ids for callers that bring none (negative: never the page's)
        self.running: int | None = None
        self.done = 0

    @property
    def queued(self) -> int:
        return len(self._waiting)

    async def run(self, job: Callable[[Callable[[], bool]], Awaitable[T]], request_id: int | None = None,
                  on_start: Callable[[], None] | None = None) -> T:
        """Run `job` when every request before it is done; `on_start()` is called as it starts (the page
        learns that its request left the queue)."""
        rid = next(self._ids) if request_id is None else request_id
        self._waiting.add(rid)
        try:
            await self._lock.acquire()
        finally:
            self._waiting.discard(rid)
        try:
            if rid in self._aborted:
                raise AbortedError("the request was aborted before it started")
            self.running = rid
            if on_start is not None:
                on_start()
            return await job(lambda: rid in self._aborted)
        finally:
            self.running = None
            self._aborted.pop(rid, None)
            self.done += 1
            self._lock.release()

    def abort(self, request_id: int) -> bool:
        """Stop request `request_id`, running or queued (or not arrived yet); True when it is running or queued."""
        self._aborted[request_id] = None
        while len(self._aborted) > ABORTS_KEPT:
            self._aborted.popitem(last=False)
        return request_id == self.running or request_id in self._waiting

    def stats(self) -> dict:
        return {"running": self.running is not None, "queued": self.queued, "done": self.done}
