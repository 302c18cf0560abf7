"""A model's prompt pipelines compiled while nothing else needs the machine.

Two such times (pyshim.serve.worker_api): while a load streams the weights in from the store (the upload
is the store's and the GPU process's work; compiling is the compiler's), and after a model loaded ahead of
its first request (the JS API's engine.load), while the visitor types. Compiling the pipelines of the
prompt steps then (pyshim.exec.gpu_runner.GpuRunner.prewarm) means the first reply no longer waits for
them. A request on the model stops it, so it never competes with a reply's own steps: what a request still
needs they compile, and a compilation already under way is shared, not repeated (KernelCache).
"""

from __future__ import annotations

import asyncio

from pyshim.errors import PyshimError


class Prewarm:
    """The background compilation of the loaded model (at most one)."""

    def __init__(self):
        self._task: asyncio.Task | None = None

    def start(self, runner) -> None:
        """Start `runner`'s prewarm, where it has one (the GPU executor) and none is running or done."""
        prewarm = getattr(runner, "prewarm", None)
        if prewarm is not None and self._task is None:
            self._task = asyncio.ensure_future(_quietly(prewarm))   # (called when it starts: it may be stopped first)

    def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()

    def stats(self) -> dict | None:
        """{"done", "compiled"} (pipelines; None until done, or where it failed), or None: none since the model
        loaded, or a request stopped it."""
        task = self._task
        if task is None:
            return None
        done = task.done() and not task.cancelled()
        return {"done": task.done(), "compiled": task.result() if done and task.exception() is None else None}


async def _quietly(work):
    try:
        return await work()
    except PyshimError:
        return None     # (a device lost, a pipeline refused: the step that needs it meets the same error and says so)
