"""The one contract every executor implements: a `Runner` runs a `Step` and answers what it asks for.

A step is a batch of slices, each some tokens of one sequence at explicit positions (a prompt chunk, or
the one token being decoded); it asks for the same thing of every slice: the greedy id of its last token,
the k largest logits of its last token, the last token's logits, every token's logits (teacher-forced
scoring), or nothing (a prompt chunk whose keys are all that matters). Asking for less is what keeps a GPU step cheap to read back: 4 bytes for an argmax, 8k for
top-k, the vocabulary's logits only when sampling needs them all.

A runner keeps the KV cache of each sequence it holds (`max_seqs` of them; a step's slices may name any
of them) and forgets one on `reset(seq)`. Its `held` (HeldTokens) records which token ids each sequence's
cache holds keys for, so that a new prompt sharing a prefix with what was run before (the next turn of a
chat, a tool call's result, a regenerated reply) runs only what is new. Its `stats` count what the caller may not see otherwise: time
spent waiting for the device and bytes read back from it.

Three executors implement it: the NumPy reference (pyshim.exec.reference, with the llama.cpp emulations
of pyshim.exec.llama_cpp), the GPU executor natively and in the browser (pyshim.exec.gpu_runner), and the
WebAssembly SIMD CPU engine (pyshim.exec.wasm_runner). pyshim.serve.generation is the one loop on top of it.
"""

from __future__ import annotations

import asyncio
import enum
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Awaitable, Callable, Protocol, Sequence

import numpy as np

from pyshim.errors import BadRequestError, ContextOverflowError, UnsupportedError
from pyshim.gguf.header import GGUFHeader
from pyshim.gguf.spec import ModelSpec
from pyshim.plan.settings import Arithmetic, RunSettings


class Want(enum.Enum):
    NONE = "none"                # nothing: the step only writes its keys (a prompt chunk before the last)
    ARGMAX = "argmax"            # the last token's greedy id
    TOP_K = "top_k"              # the last token's k largest logits and their ids, largest first (ties: lower id)
    LOGITS = "logits"            # the last token's logits [vocab]
    ALL_LOGITS = "all_logits"    # every token's logits [n, vocab]


@dataclass(frozen=True)
class Slice:
    """Tokens of sequence `seq` placed at positions start, start + 1, ..."""

    tokens: tuple[int, ...]
    start: int = 0
    seq: int = 0

    def __post_init__(self):
        object.__setattr__(self, "tokens", tuple(int(t) for t in self.tokens))

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


@dataclass(frozen=True)
class Step:
    slices: tuple[Slice, ...]
    want: Want = Want.LOGITS
    k: int = 0                   # Want.TOP_K only

    @classmethod
    def of(cls, tokens: Sequence[int], start: int = 0, *, seq: int = 0, want: Want = Want.LOGITS, k: int = 0) -> "Step":
        """A step of one slice."""
        return cls((Slice(tuple(tokens), start, seq),), want, k)

    @property
    def one_token_each(self) -> bool:
        """One token of each of several distinct sequences, asking for their greedy ids, logits or nothing:
        what an executor runs as one batched decode program (pyshim.serve.batching makes such steps)."""
        s = self.slices
        return (len(s) > 1 and self.want in (Want.ARGMAX, Want.LOGITS, Want.NONE) and all(len(x.tokens) == 1 for x in s)
                and len({x.seq for x in s}) == len(s))


@dataclass
class Output:
    """What a step answered for one slice (the field its Want names is set)."""

    token: int | None = None                 # ARGMAX
    values: np.ndarray | None = None         # TOP_K: [k] f32, largest first
    ids: np.ndarray | None = None            # TOP_K: [k] token ids
    logits: np.ndarray | None = None         # LOGITS: [vocab]; ALL_LOGITS: [n, vocab]


@dataclass
class RunnerStats:
    steps: int = 0
    wait_s: float = 0.0          # time spent awaiting the device (GPU readbacks); 0 for the CPU executors
    bytes_read: int = 0          # bytes read back from the device


@dataclass
class Capacity:
    """What one runner holds: positions per sequence, sequences, tokens per step, top-k on the executor."""

    n_ctx: int
    max_seqs: int = 1
    max_step_tokens: int = 256
    top_k: int = 0               # largest k the executor picks itself (0: Want.TOP_K is not offered)


Progress = Callable[[int, int], "Awaitable[None] | None"]   # (done, total); a JS callback may return a promise


async def report(progress: Progress | None, done: int, total: int) -> None:
    """`progress(done, total)` when there is a listener, awaiting what it returns."""
    if progress is not None:
        maybe = progress(done, total)
        if maybe is not None:
            await maybe


class HeldTokens:
    """Per sequence, the token ids whose keys its cache holds at positions 0, 1, ... (what its steps
    wrote, in order), and how far any step wrote: the prefix a new prompt may keep (`reusable`).

    Full-attention caches are indexed by position, so any prefix stays valid whatever was written after
    it. A sliding-window layer's ring reuses slots (slot = position % its size): once a step has written
    past the window, a write below the highest position written may have taken the slots of keys the
    prefix still needs, so with wrapped rings only a prompt that extends everything held keeps it, and a
    step that does not extend (or rewrite the end of) what is held forgets it."""

    def __init__(self, window: int = 0):
        self.window = window         # the sliding window when the model has one shorter than its context, else 0
        self._tokens: dict[int, list[int]] = {}
        self._top: dict[int, int] = {}    # the end of the highest position written since the last reset
        # prompts being run right now (sequence -> (prompt, set once its keys are in)): a request arriving
        # meanwhile under the same opening waits for them and copies, rather than runs it too
        self._running: dict[int, tuple[tuple[int, ...], asyncio.Event]] = {}
        # sequence -> (first, end) of the positions a step is writing now: what it held from `first` on is
        # being replaced, so no other sequence may take those keys (best_source) until the step is done
        self._writing: dict[int, tuple[int, int]] = {}
        self._busy: dict[int, int] = {}   # sequence -> requests running in it (their caches are not taken back)
        self._ended = asyncio.Event()     # set (and replaced) each time a request leaves its sequence

    @classmethod
    def for_spec(cls, spec: ModelSpec, n_ctx: int) -> "HeldTokens":
        window = spec.sliding_window if spec.sliding_window and any(spec.swa_layers) else 0
        return cls(window if window < n_ctx else 0)

    def tokens(self, seq: int = 0) -> list[int]:
        return list(self._tokens.get(seq, ()))

    def _wrapped(self, seq: int) -> bool:
        return bool(self.window) and self._top.get(seq, 0) > self.window

    @contextmanager
    def writing(self, s: Slice):
        """Around running slice `s`: recorded when it finishes; a slice cut short (an error, a lost device,
        a cancelled await) may have written some of its keys, so its sequence is forgotten."""
        start, end = self._writing.get(s.seq, (s.start, s.end))
        self._writing[s.seq] = (min(start, s.start), max(end, s.end))
        try:
            yield
        except BaseException:
            self.forget(s.seq)
            raise
        finally:
            self._writing.pop(s.seq, None)
        self.wrote(s)

    def wrote(self, s: Slice) -> None:
        """Slice `s` was run: its keys are in the cache."""
        held, wrapped = self._tokens.get(s.seq, []), self._wrapped(s.seq)     # (before this slice's writes)
        self._top[s.seq] = max(self._top.get(s.seq, 0), s.end)
        if s.start > len(held):                  # a gap: the keys before it stay, the new ones are not a prefix
            if wrapped:
                held = []
        elif (wrapped and s.start not in (0, len(held))
              and not (s.end == len(held) and tuple(held[s.start:]) == s.tokens)):
            held = []                            # a ring below its top: earlier slots may be gone
        else:
            held = held[:s.start] + list(s.tokens)
        self._tokens[s.seq] = held

    def top(self, seq: int) -> int:
        """The end of the highest position written in `seq` since its reset, a step running now included."""
        return max(self._top.get(seq, 0), self._writing.get(seq, (0, 0))[1])

    def reusable(self, prompt: Sequence[int], seq: int = 0) -> int:
        """How many leading tokens of `prompt` need not run again: the prefix it shares with what is
        held (at most all but its last token, whose logits a step must compute)."""
        held = self._tokens.get(seq, [])
        n = 0
        for a, b in zip(held, prompt[:len(prompt) - 1]):
            if a != b:
                break
            n += 1
        if n < len(held) and self._wrapped(seq):
            return 0
        return n

    @contextmanager
    def busy(self, seq: int):
        """Around a request running in sequence `seq`: a runner short of cache memory does not take its
        keys back for another sequence (pyshim.gpu.kv)."""
        self._busy[seq] = self._busy.get(seq, 0) + 1
        try:
            yield
        finally:
            self._busy[seq] -= 1
            if not self._busy[seq]:
                del self._busy[seq]
            self._ended.set()
            self._ended = asyncio.Event()

    def in_use(self, seq: int) -> bool:
        return seq in self._busy

    @property
    def busy_seqs(self) -> set[int]:
        return set(self._busy)

    async def request_ended(self) -> None:
        """Returns when a request next leaves its sequence (its cache may then be taken back)."""
        await self._ended.wait()

    def forget(self, seq: int = 0) -> None:
        self._tokens.pop(seq, None)
        self._top.pop(seq, None)

    def best_source(self, prompt: Sequence[int], seq: int) -> tuple[int, int]:
        """(another sequence, how many leading tokens of `prompt` its cache holds): the one holding the
        most, for `seq` to copy instead of running them again ((seq, 0) when none holds any)."""
        best = (seq, 0)
        for other in self._tokens:
            n = min(self.reusable(prompt, other), self._writing.get(other, (len(prompt),))[0])
            if other != seq and n > best[1]:
                best = (other, n)
        return best

    @contextmanager
    def prefilling(self, seq: int, prompt: Sequence[int]):
        """Around running `prompt` in sequence `seq`: others may wait for its keys (`pending_source`)."""
        done = asyncio.Event()
        self._running[seq] = (tuple(prompt), done)
        try:
            yield
        finally:
            self._running.pop(seq, None)
            done.set()

    def pending_source(self, prompt: Sequence[int], seq: int) -> tuple[asyncio.Event | None, int]:
        """(set once its keys are in, how many leading tokens of `prompt` it shares): the prompt another
        sequence is running now that shares the most with `prompt` ((None, 0) when none does)."""
        best: tuple[asyncio.Event | None, int] = (None, 0)
        for other, (running, done) in self._running.items():
            n = 0
            for a, b in zip(running, prompt[:len(prompt) - 1]):
                if a != b:
                    break
                n += 1
            if other != seq and n > best[1]:
                best = (done, n)
        return best

    def copied(self, src: int, dst: int, n: int) -> None:
        """Sequence `dst`'s cache was given `src`'s keys for positions [0, n)."""
        self._tokens[dst] = self._tokens.get(src, [])[:n]
        self._top[dst] = n


class Runner(Protocol):
    spec: ModelSpec
    header: GGUFHeader
    settings: RunSettings
    arithmetic: Arithmetic       # what it really runs (the settings may leave it to the executor)
    capacity: Capacity
    stats: RunnerStats
    held: HeldTokens             # what each sequence's cache holds keys for (every step records its slices)
    auto: dict | None            # what kv_type "auto" chose {context, kv_type, total_bytes, reason}; None: nothing was

    @property
    def n_ctx(self) -> int: ...

    async def prepare(self, progress: Progress | None = None) -> None:
        """One-time work before anything is timed (dequantizing, compiling, rearranging weights);
        `progress(done, total)` counts the pipelines compiled, where an executor compiles any."""

    async def step(self, step: Step) -> list[Output]:
        """Run every slice (writing its keys into its sequence's cache) and answer `step.want` for each."""

    def reset(self, seq: int = 0) -> None:
        """Forget sequence `seq`'s keys (and `held`'s record of them): a new conversation starts there."""

    def close(self) -> None:
        """Free what the runner holds (the GPU device and its buffers)."""


def check_step(step: Step, capacity: Capacity, vocab: int) -> None:
    """The checks every executor makes before running a step (same errors everywhere)."""
    if not step.slices:
        raise BadRequestError("a step needs at least one slice of tokens")
    if step.want is Want.TOP_K and not 0 < step.k <= capacity.top_k:
        raise BadRequestError(f"top-k on this executor takes k in [1, {capacity.top_k}], got {step.k}")
    for s in step.slices:
        if not s.tokens:
            raise BadRequestError("no tokens to run")
        if not 0 <= s.seq < capacity.max_seqs:
            raise UnsupportedError(f"sequence {s.seq} is beyond the {capacity.max_seqs} this runner holds",
                                   hint="several sequences at once arrive with continuous batching")
        if len(s.tokens) > capacity.max_step_tokens:
            raise BadRequestError(f"a step runs at most {capacity.max_step_tokens} tokens, got {len(s.tokens)}",
                                  hint="run the prompt in chunks (pyshim.serve.generation does)")
        if s.start < 0 or s.end > capacity.n_ctx:
            raise ContextOverflowError(f"positions up to {s.end} exceed the context of {capacity.n_ctx} tokens",
                                       hint="use a shorter prompt or a larger context")
        bad = [t for t in s.tokens if not 0 <= t < vocab]
        if bad:
            raise BadRequestError(f"token ids outside the vocabulary of {vocab}: {bad[:5]}")


def top_k_rows(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the k largest logits, best first (ties: lower id first): (ids [n, k], logits [n, k])."""
    k = min(k, logits.shape[1])
    part = np.argpartition(-logits, k - 1, axis=1)[:, :k]             # O(vocab) per row, unordered
    kth = np.take_along_axis(logits, part, axis=1).min(axis=1)         # the k-th largest value of each row
    # every value at least the k-th, in id order, then stably by value: values equal to the k-th are
    # kept lowest id first (argpartition alone picks any of them)
    top = np.empty((logits.shape[0], k), dtype=np.int64)
    for r, row in enumerate(logits):
        ids = np.flatnonzero(row >= kth[r])
        top[r] = ids[np.argsort(-row[ids], kind="stable")[:k]]
    return top, np.take_along_axis(logits, top, axis=1)


def answer(logits: np.ndarray, step: Step) -> Output:
    """A slice's Output from its logits ([n, vocab] for ALL_LOGITS, else the last row [vocab]), for
    executors that compute logits anyway (the CPU ones)."""
    if step.want is Want.NONE:
        return Output()
    if step.want is Want.ALL_LOGITS:
        return Output(logits=logits)
    last = logits[-1] if logits.ndim == 2 else logits
    if step.want is Want.ARGMAX:
        return Output(token=int(np.argmax(last)))
    if step.want is Want.TOP_K:
        ids, values = top_k_rows(last[None, :], step.k)
        return Output(values=values[0].astype(np.float32), ids=ids[0].astype(np.int64))
    return Output(logits=last)
