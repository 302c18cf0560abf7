"""Runners driven synchronously, for tests: the reference and the GPU runner behind the same few calls.

`Drive(runner, loop)` runs steps on `loop` (a native GPU runner's device lives on the loop it was opened
on; the reference needs none) in chunks of the runner's largest step, as the generation loop does."""

from __future__ import annotations

import asyncio
import concurrent.futures

import numpy as np

from pyshim.exec.loading import load_reference
from pyshim.exec.runner import Step, Want
from pyshim.plan.settings import Arithmetic, RunSettings


def reference(path, *, context: int | None = None, arithmetic: Arithmetic | str | None = None, kv_type: str = "f32",
              chunk: int | None = None, **rope):
    """The NumPy reference for `path` (f32 unless `arithmetic` says int8 or llama.cpp-exact); `rope`:
    rope_scaling / rope_scale / yarn_orig_ctx overrides (RunSettings)."""
    settings = RunSettings(context=context, kv_type=kv_type, arithmetic=arithmetic,
                           **({} if chunk is None else {"prefill_chunk": chunk}), **rope)
    return load_reference(path, settings=settings)


async def gpu(path, *, context: int | None = None, arithmetic=None, kv_type: str = "f32", chunk: int | None = None,
              device=None, rope: dict | None = None, expert_slots: int | None = None, streamed_layers: int | None = None,
              kv_pages: int | None = None, **options):
    """A GpuRunner (options: upload_now, max_binding, policy={...}; `rope`: RunSettings' rope overrides;
    `expert_slots`: routed experts streamed into a cache of that many per layer; `streamed_layers`: the last
    that many layers streamed through rotating buffers; `kv_pages`: the KV cache's pages)."""
    from pyshim.exec.gpu_runner import load_gpu

    settings = RunSettings(context=context, kv_type=kv_type, arithmetic=arithmetic,
                           **({} if chunk is None else {"prefill_chunk": chunk}), **(rope or {}), expert_slots=expert_slots,
                           streamed_layers=streamed_layers, kv_pages=kv_pages)
    # The f32 route's kernels, which these tests' tolerances are for, unless a test asks for halves: on a
    # GPU with shader-f16 the default policy runs them in f16 (tests/test_kernels_f16.py checks those).
    # int8 asked: its kernels, which are barrier-free ones (a real GPU's default reductions would take the
    # f32 route instead), unless the test names `reduce` itself.
    policy = {"f16": False, **(options.get("policy") or {})}
    if settings.arithmetic is Arithmetic.INT8:
        policy.setdefault("reduce", False)
    options["policy"] = policy
    return await load_gpu(path, settings=settings, device=device, **options)


class Drive:
    def __init__(self, runner, loop: asyncio.AbstractEventLoop | None = None):
        self.runner = runner
        self.loop = loop

    def _run(self, coro):
        if self.loop is not None:
            return self.loop.run_until_complete(coro)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(coro)
        # inside a running loop (Playwright's sync API keeps one): run the reference's steps on a thread
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, coro).result()

    def step(self, tokens, start: int = 0, want: Want = Want.LOGITS, k: int = 0):
        return self._run(self.runner.step(Step.of(list(tokens), start, want=want, k=k)))[0]

    def logits(self, ids, start: int = 0, *, all_logits: bool = False) -> np.ndarray:
        """The last token's logits [vocab], or every token's [n, vocab], ids run in the runner's largest steps."""
        chunk = self.runner.capacity.max_step_tokens
        rows = []
        for at in range(0, len(ids), chunk):
            last = at + chunk >= len(ids)
            want = Want.ALL_LOGITS if all_logits else Want.LOGITS if last else Want.NONE
            out = self.step(ids[at:at + chunk], start + at, want)
            if all_logits or last:
                rows.append(out.logits)
        return np.concatenate(rows) if all_logits else rows[-1]

    def greedy(self, ids, start: int = 0) -> int:
        """The argmax of the last id's logits, as the runner answers Want.ARGMAX (on the GPU for a GpuRunner)."""
        chunk = self.runner.capacity.max_step_tokens
        last = (len(ids) - 1) // chunk * chunk
        for at in range(0, last, chunk):
            self.step(ids[at:at + chunk], start + at, Want.NONE)
        return self.step(ids[last:], start + last, Want.ARGMAX).token

    def top_k(self, ids, start: int, k: int):
        out = self.step(ids, start, Want.TOP_K, k)
        return out.values, out.ids

    def scores(self, ids, k: int = 10):
        """(top ids [n, k], top logits [n, k]) after every prefix (pyshim.serve.generation.score)."""
        from pyshim.serve.generation import score

        s = self._run(score(self.runner, ids, k))
        return s.top_ids, s.top_logits

    def greedy_ids(self, prompt, n: int) -> list[int]:
        """n greedy tokens after `prompt` through the generation loop (no stop ids)."""
        from pyshim.serve.generation import generate
        from pyshim.serve.sampling import SamplingParams

        return self._run(generate(self.runner, prompt, SamplingParams(), n)).token_ids


def assert_greedy_like_reference(ref, runner, prompt: list[int], n: int = 32, loop=None) -> None:
    """Assert the GPU runner's greedy tokens equal the reference's argmax, n steps after `prompt`."""
    cpu, dev = Drive(ref), Drive(runner, loop)
    ref_seq, gpu_seq = list(prompt), list(prompt)
    logits = cpu.logits(ref_seq)
    token = dev.greedy(gpu_seq)
    for _ in range(n):
        want = int(np.argmax(logits))
        assert token == want, (ref_seq[len(prompt):], want, token)
        ref_seq.append(want)
        gpu_seq.append(token)
        logits = cpu.logits([want], len(ref_seq) - 1)
        token = dev.greedy([token], len(gpu_seq) - 1)
