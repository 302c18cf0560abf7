"""A model's prompt pipelines compiled while nothing runs.

A model loaded ahead of its first request (the JS API's engine.load) waits for the visitor to type; compiling
the pipelines of its prompt steps then (pyshim.exec.gpu_runner.GpuRunner.prewarm) means the first reply no
longer waits for them (pyshim.serve.worker_api starts it after such a load). A request on the model stops it,
so it never competes with a reply's own steps: what a request still needs they compile, and a compilation
already under way is shared, not repeated (KernelCache). Not during a load's upload: on 2 cores the upload
(the store's reads and the copies into GPU buffers) keeps both busy, and starting it there measured level
(Qwen2.5-1.5B's shape in Chromium, two pairs: load 24.1/24.6 s without, 29.7/24.0 with; first token
60.7/61.2 s without, 58.4/60.0 with).
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
