"""Prefill, decode one token, generate, score: plain functions over a `Runner` (gpt-fast style).

A Runner maps (ids, start position) to logits and keeps the KV cache; nothing here knows the
architecture or the executor.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np

from pyshim.errors import BadRequestError, ContextOverflowError
from pyshim.serve.sampling import SamplingParams, make_rng, sample

PREFILL_CHUNK = 256     # tokens per forward while prefilling: bounds the [n, S] attention scores


def _check_fits(runner, n: int, what: str) -> None:
    if n == 0:
        raise BadRequestError(f"the {what} is empty")
    if n > runner.n_ctx:
        raise ContextOverflowError(f"the {what} has {n} tokens, more than the context of {runner.n_ctx}",
                                   hint="shorten it or raise --ctx (up to the model's training context)")


def prefill(runner, ids: Sequence[int], start: int = 0, chunk: int = PREFILL_CHUNK,
            all_logits: bool = False) -> np.ndarray:
    """Run `ids` at positions start.. in chunks; logits of the last id [vocab] (or of all ids [n, vocab])."""
    rows = []
    for at in range(0, len(ids), chunk):
        piece = list(ids[at:at + chunk])
        last_chunk = at + chunk >= len(ids)
        logits = runner.forward(piece, start + at, all_logits=all_logits)
        if all_logits:
            rows.append(logits)
        elif last_chunk:
            return logits[-1]
    return np.concatenate(rows)


def decode_one_token(runner, token: int, pos: int) -> np.ndarray:
    """Logits [vocab] after `token` placed at position `pos`."""
    return runner.forward([token], pos)[-1]


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    generated: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0        # time in decode steps (the first generated token comes from the prefill)
    decode_steps: int = 0
    decode_wait_s: float | None = None   # GPU runners: the part of decode_s spent awaiting readbacks
    finish_reason: str = ""      # "stop" (stop token or string) | "length"

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tok_s(self) -> float:
        return self.decode_steps / self.decode_s if self.decode_s else 0.0

    @property
    def cpu_share_pct(self) -> float | None:
        """The CPU side of a decode step (Python, FFI, encoding: outside GPU waits), GPU runners only."""
        if self.decode_wait_s is None or not self.decode_s:
            return None
        return 100 * max(0.0, self.decode_s - self.decode_wait_s) / self.decode_s


def generate_ids(runner, prompt_ids: Sequence[int], max_tokens: int, params: SamplingParams,
                 stop_ids: Sequence[int] = (), stats: GenerationStats | None = None) -> Iterator[int]:
    """Yield up to `max_tokens` new ids (a stop id is yielded, then generation ends).
    Stops early at the end of the context. The KV cache is reset first."""
    stats = stats if stats is not None else GenerationStats()
    _check_fits(runner, len(prompt_ids), "prompt")
    if max_tokens < 0:
        raise BadRequestError("max_tokens must be >= 0")
    rng = make_rng(params.seed)
    history = list(prompt_ids)
    stop = set(int(t) for t in stop_ids)
    stats.prompt_tokens = len(prompt_ids)
    stats.finish_reason = "length"
    if max_tokens == 0:
        return
    runner.reset()
    device = getattr(runner, "device", None)      # a GPU runner counts its readback waits (read_wait_s)
    if device is not None:
        stats.decode_wait_s = 0.0
    t0 = time.perf_counter()
    logits = prefill(runner, prompt_ids)
    stats.prefill_s = time.perf_counter() - t0
    pos = len(prompt_ids)
    while True:
        token = sample(logits, params, rng, history)
        history.append(token)
        stats.generated += 1
        yield token
        if token in stop:
            stats.finish_reason = "stop"
            return
        if stats.generated >= max_tokens or pos >= runner.n_ctx:
            return
        t0 = time.perf_counter()
        waited = device.read_wait_s if device is not None else 0.0
        logits = decode_one_token(runner, token, pos)
        stats.decode_s += time.perf_counter() - t0
        if device is not None:
            stats.decode_wait_s += device.read_wait_s - waited
        stats.decode_steps += 1
        pos += 1


class StopStrings:
    """Streams text while watching for stop strings: text that might be the start of one is held back."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """New text in; the part that is safe to show out (everything before a stop string, once found)."""
        if self.stopped:
            return ""
        self.held += text
        cut = min((i for i in (self.held.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            out, self.held, self.stopped = self.held[:cut], "", True
            return out
        keep = 0        # longest tail of held that is a proper prefix of some stop string
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.held)), 0, -1):
                if self.held.endswith(s[:n]):
                    keep = max(keep, n)
                    break
        out, self.held = self.held[:len(self.held) - keep], self.held[len(self.held) - keep:]
        return out

    def flush(self) -> str:
        out, self.held = ("" if self.stopped else self.held), ""
        return out


@dataclass
class Generation:
    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    text: str = ""
    stats: GenerationStats = field(default_factory=GenerationStats)


def generate_text(runner, prompt_ids: Sequence[int], stream, *, max_tokens: int, params: SamplingParams,
                  stop_ids: Sequence[int] = (), stop_strings: Sequence[str] = (),
                  on_text: Callable[[str], None] | None = None) -> Generation:
    """Generate and detokenize as it goes. `stream` turns ids into text incrementally: `add(id) -> str`,
    `finish() -> str` (the tokenizer's StreamingDecoder, which holds back incomplete UTF-8).
    Stop ids end generation and are not part of the text; stop strings cut the text before them."""
    result = Generation(prompt_ids=list(prompt_ids))
    watcher = StopStrings(stop_strings)
    stop = set(int(t) for t in stop_ids)

    def emit(piece: str) -> None:
        if piece:
            result.text += piece
            if on_text is not None:
                on_text(piece)

    for token in generate_ids(runner, prompt_ids, max_tokens, params, stop_ids, result.stats):
        if token in stop:
            result.stats.finish_reason = "stop"
            break
        result.ids.append(token)
        emit(watcher.feed(stream.add(token)))
        if watcher.stopped:
            result.stats.finish_reason = "stop"
            break
    if not watcher.stopped:
        emit(watcher.feed(stream.finish()) + watcher.flush())
    return result


def score(runner, ids: Sequence[int], top_k: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Teacher-forced: row i = the top-k (ids, logits) predicted after ids[:i+1]; both [n, k]."""
    _check_fits(runner, len(ids), "text")
    runner.reset()
    logits = prefill(runner, ids, all_logits=True)                       # [n, vocab]
    return top_k_rows(logits, top_k)


def top_k_rows(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the k largest logits, best first (ties: lower id first): (ids [n, k], logits [n, k])."""
    k = min(k, logits.shape[1])
    part = np.argpartition(-logits, k - 1, axis=1)[:, :k]             # O(vocab) per row, unordered
    vals = np.take_along_axis(logits, part, axis=1)
    order = np.lexsort((part, -vals), axis=1)
    top = np.take_along_axis(part, order, axis=1)
    return top, np.take_along_axis(logits, top, axis=1)
