"""The one generation loop, over any Runner (pyshim.exec.runner): the CLI, the Python API, the site's
Worker and the benchmarks all generate through `generate`, and score through `score`.

A prompt runs in chunks of the runner's largest step; the chunks before the last only write their keys
(nothing is read back). What the sequence's cache already holds of it is not run again: a prompt that
starts with the tokens of an earlier request in the same sequence (the conversation so far, with the reply
as the model wrote it) keeps their keys (the runner's `held`, pyshim.exec.runner.HeldTokens) and runs
from the first token that differs; where another sequence holds more of it (a system prompt that
concurrent requests share) and the runner can `share`, those keys are copied from there instead — after
waiting for them when that sequence is running its prompt right now (SHARE_WAIT_MIN tokens in common); `usage()` counts the kept ones as OpenAI's cached_tokens. Then each step decodes one token and asks the runner for as little as sampling
needs: the argmax when decoding greedily without penalties (4 bytes from a GPU), the k largest logits
for top-k sampling without penalties, the vocabulary's logits otherwise. Text streams out UTF-8-safe,
with stop strings held back until they are ruled out; stop ids end the reply and are not part of it;
`should_stop()` is polled between tokens (the Stop button, an abort).

A constrained reply (`constraint`: a pyshim.text.grammar Matcher for a JSON Schema or a grammar) asks
the grammar engine for the tokens allowed next and the runner for its top-k candidates (k = the most the
executor picks itself): greedy takes the first allowed one, top-k sampling draws among the allowed ones
when at least top_k are; only when the candidates do not suffice is the same step run again for the
whole vocabulary's logits (it writes the same keys), which the mask then filters before sampling. When
the grammar allows one token only (text it forces: a tool call's tags, a schema's keys), that token
follows without a step: the keys of a run of forced tokens are written by the next step that has to read
something, all of them in that one step (jump-forward: a step of n tokens costs far less than n steps).

Timings (what the benchmarks and the APIs report): prefill_ms = the prompt up to the first new token
(time to first token); decode_ms = from the first new token to the last (every later step, the streaming
of its text included); cpu_ms = the part of decode_ms not spent awaiting the device — Python, FFI and the
calls that encode each step, the CPU side of a step; decode_bytes_read = what came back from the device
during decode.
"""

from __future__ import annotations

import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Sequence

import numpy as np

from pyshim.errors import BadRequestError, ContextOverflowError
from pyshim.exec.runner import Progress, Runner, Step, Want, report, top_k_rows
from pyshim.serve.sampling import SamplingParams, can_sample_top_k, make_rng, sample, sample_top_k
from pyshim.text.grammar import Matcher, allowed, mask_logits
from pyshim.text.stops import StopStrings

MAX_SCORE_TOP_K = 100         # a score row holds k ids and k floats per position
# A prompt sharing at least this many leading tokens with one another sequence is running waits for its
# keys and copies them (fewer: a chat template's opening, which every prompt shares, is not worth a wait).
SHARE_WAIT_MIN = 32

OnText = Callable[[str, int], "Awaitable[None] | None"]


@dataclass
class Completion:
    prompt_tokens: int
    cached_tokens: int = 0              # of prompt_tokens: kept from the cache, not run again
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str = "length"       # "stop" (an end-of-generation id or a stop string) | "length" | "abort"
    constrained: bool = False           # a grammar kept the reply in shape (response_format)
    grammar_ms: float = 0.0             # of decode_ms: the grammar engine's masks and advances
    fallbacks: int = 0                  # constrained steps whose top-k held too few allowed tokens (re-run for all logits)
    forced: int = 0                     # constrained steps with one token allowed (taken without reading the logits)
    prefill_ms: float = 0.0
    decode_ms: float = 0.0
    cpu_ms: float = 0.0
    decode_steps: int = 0
    decode_step_ms: list[float] = field(default_factory=list)   # each decode step's own time (next_token)
    decode_bytes_read: int = 0
    compacted: bool = False             # older turns of a conversation were compacted to fit the context
    tool_calls: list[dict] | None = None    # the calls the reply made (OpenAI's shape); finish_reason "tool_calls"

    @property
    def decode_tok_per_s(self) -> float:
        return 1e3 * self.decode_steps / self.decode_ms if self.decode_steps and self.decode_ms > 0 else 0.0

    @property
    def decode_median_step_ms(self) -> float | None:
        """The median decode step: what a step takes when nothing outside the engine intervenes (on a shared
        machine a mean carries every neighbour's burst; benchmarks set it beside their best-of rooflines)."""
        return statistics.median(self.decode_step_ms) if self.decode_step_ms else None

    @property
    def prefill_tok_per_s(self) -> float:
        run = self.prompt_tokens - self.cached_tokens
        return 1e3 * run / self.prefill_ms if self.prefill_ms > 0 else 0.0

    @property
    def bytes_per_decode_step(self) -> float | None:
        return self.decode_bytes_read / self.decode_steps if self.decode_steps else None

    def usage(self) -> dict:
        n = len(self.token_ids)
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": n, "total_tokens": self.prompt_tokens + n,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}

    def timings(self) -> dict:
        out = {"prefill_ms": self.prefill_ms, "ttft_ms": self.prefill_ms, "decode_ms": self.decode_ms,
               "decode_tok_per_s": self.decode_tok_per_s, "decode_steps": self.decode_steps,
               "decode_median_step_ms": self.decode_median_step_ms, "cpu_ms": self.cpu_ms,
               "bytes_per_decode_step": self.bytes_per_decode_step}
        if self.constrained:
            out.update(grammar_ms=self.grammar_ms, grammar_fallbacks=self.fallbacks, grammar_forced=self.forced)
        return out

    def as_dict(self) -> dict:
        out = {"text": self.text, "token_ids": self.token_ids, "finish_reason": self.finish_reason,
               "usage": self.usage(), "timings": self.timings(), "compacted": self.compacted}
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        return out


def decode_want(runner: Runner, params: SamplingParams) -> Want:
    """What a decode step asks the runner for, given how the token is sampled."""
    if params.greedy and params.repetition_penalty == 1.0 and not params.presence_penalty and not params.frequency_penalty:
        return Want.ARGMAX
    if can_sample_top_k(params, runner.capacity.top_k):
        return Want.TOP_K
    return Want.LOGITS


async def generate(runner: Runner, prompt: Sequence[int], params: SamplingParams, max_tokens: int, *,
                   stop_ids: Sequence[int] = (), stop_strings: Sequence[str] = (), decoder=None,
                   on_text: OnText | None = None, should_stop: Callable[[], bool] = lambda: False,
                   seq: int = 0, constraint: Matcher | None = None, on_prefill: Progress | None = None,
                   reuse: bool = True) -> Completion:
    """Continue `prompt` (token ids) in sequence `seq`, keeping what its cache holds of the prompt's
    start (`reuse`; without it, or when nothing matches, the cache is reset first). `decoder` turns ids
    into text incrementally (`add(id) -> str`, `finish() -> str`: the tokenizer's StreamingDecoder, which
    holds back incomplete UTF-8); without one only ids come out. `on_text(piece, token)` sees the text as
    it streams (stop strings held back; the last piece has token -1). `constraint` keeps the reply inside
    a grammar (see the module docstring). `on_prefill(done, total)` follows the prompt, in tokens: (kept,
    total) before its first chunk, then after each (the last with the first new token computed); like `on_text`,
    it may return an awaitable."""
    prompt = [int(t) for t in prompt]
    if not prompt:
        raise BadRequestError("the prompt is empty")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise BadRequestError(f"max_tokens must be at least 1, got {max_tokens!r}")
    n_ctx = runner.capacity.n_ctx
    if len(prompt) >= n_ctx:
        raise ContextOverflowError(f"the prompt has {len(prompt)} tokens; the context holds {n_ctx} with the reply",
                                   hint="shorten the prompt or load the model with a larger context")
    out = Completion(prompt_tokens=len(prompt), constrained=constraint is not None)
    chunk = runner.capacity.max_step_tokens
    unwritten: list[int] = []   # reply tokens, just before the next step's, whose keys wait for it (forced ones)
    grammar_s = [0.0]       # the grammar engine's time; the prompt's first mask is not decode, kept apart below
    want = decode_want(runner, params)
    rng, history, stop = make_rng(params.seed), list(prompt), set(int(t) for t in stop_ids)
    watcher, stats = StopStrings(stop_strings), runner.stats
    pieces: list[str] = []

    async def keys_but_the_last_step(tokens: list[int], start: int,
                                     on_step: Progress | None = None) -> tuple[list[int], int]:
        """Writes the keys of `tokens` (the first at `start`) in steps of `chunk`, nothing read back, all but
        the last step's tokens (1..chunk), which it returns with their position for the step that reads."""
        while len(tokens) > chunk:
            await runner.step(Step.of(tokens[:chunk], start, seq=seq, want=Want.NONE))
            tokens, start = tokens[chunk:], start + chunk
            await report(on_step, start, len(prompt))
        return tokens, start

    async def next_token(tokens: list[int], start: int) -> int:
        if constraint is not None:
            return await constrained_token(tokens, start)
        (o,) = await runner.step(Step.of(tokens, start, seq=seq, want=want, k=params.top_k if want is Want.TOP_K else 0))
        if want is Want.ARGMAX:
            return o.token
        if want is Want.TOP_K:
            return sample_top_k(o.values, o.ids, params, rng)
        return sample(o.logits, params, rng, history)

    async def constrained_token(tokens: list[int], start: int) -> int:
        t = time.perf_counter()
        mask = await constraint.mask()
        grammar_s[0] += time.perf_counter() - t
        words = np.flatnonzero(mask)
        if len(words) == 1 and not int(mask[words[0]]) & (int(mask[words[0]]) - 1):    # one token allowed: forced
            out.forced += 1
            if start < len(prompt):                  # the prompt's last chunk: its keys now (prefill's time)
                await runner.step(Step.of(tokens, start, seq=seq, want=Want.NONE))
            else:                                    # a reply token's keys: with the next step that reads
                unwritten.extend(tokens)
            return 32 * int(words[0]) + int(mask[words[0]]).bit_length() - 1
        if unwritten:                                # (a forced run longer than a step: its first keys alone)
            tokens, start = await keys_but_the_last_step(unwritten + list(tokens), start - len(unwritten))
            unwritten.clear()
        k = runner.capacity.top_k
        if want is not Want.LOGITS and k:
            (o,) = await runner.step(Step.of(tokens, start, seq=seq, want=Want.TOP_K, k=k))
            ok = allowed(mask, o.ids)                    # o.ids: largest logit first
            if params.greedy and ok.any():
                return int(o.ids[int(np.argmax(ok))])
            keep = np.flatnonzero(ok)[:params.top_k]
            if not params.greedy and len(keep) == params.top_k:
                return sample_top_k(o.values[keep], o.ids[keep], params, rng)
            out.fallbacks += 1
        (o,) = await runner.step(Step.of(tokens, start, seq=seq, want=Want.LOGITS))
        logits = mask_logits(o.logits, mask)
        if not np.isfinite(logits).any():
            raise BadRequestError("the grammar allows no token here (it cannot be completed with this vocabulary)",
                                  param="response_format")
        return sample(logits, params, rng, history)

    async def emit(piece: str, token: int) -> None:
        if piece:
            pieces.append(piece)
            if on_text is not None:
                maybe = on_text(piece, token)
                if maybe is not None:
                    await maybe

    with runner.held.busy(seq):     # its KV pages are not taken back for others while it runs
        kept = runner.held.reusable(prompt, seq) if reuse else 0
        sharing = reuse and hasattr(runner, "share")
        if sharing:
            # another sequence holding more of the prompt (a system prompt a concurrent request runs under):
            # its keys are shared, not computed again — once it has them, if it is running them now
            running, n = runner.held.pending_source(prompt, seq)
            if running is not None and n > kept and n >= SHARE_WAIT_MIN:
                await running.wait()
            src, n = runner.held.best_source(prompt, seq)
            if n > kept and runner.share(src, seq, n):
                kept = n
        if not kept:
            runner.reset(seq)     # a new conversation: no key of the previous one may be attended to
        out.cached_tokens = kept
        await report(on_prefill, kept, len(prompt))
        t0 = time.perf_counter()
        with runner.held.prefilling(seq, prompt) if sharing else nullcontext():
            token = await next_token(*await keys_but_the_last_step(prompt[kept:], kept, on_prefill))
        await report(on_prefill, len(prompt), len(prompt))    # before t_first: counted in prefill_ms, not decode_ms
        t_first = time.perf_counter()
        out.prefill_ms = 1e3 * (t_first - t0)
        grammar_s[0] = 0.0
        waited, read = stats.wait_s, stats.bytes_read
        pos = len(prompt)
        while True:
            if token in stop:
                out.finish_reason = "stop"
                break
            out.token_ids.append(token)
            history.append(token)
            if constraint is not None:
                t = time.perf_counter()
                constraint.accept(token)
                grammar_s[0] += time.perf_counter() - t
            if decoder is not None:
                await emit(watcher.feed(decoder.add(token)), token)
                if watcher.stopped:
                    out.finish_reason = "stop"
                    break
            if len(out.token_ids) >= max_tokens or pos >= n_ctx:
                break
            if should_stop():
                out.finish_reason = "abort"
                break
            t = time.perf_counter()
            token = await next_token([token], pos)
            out.decode_step_ms.append(1e3 * (time.perf_counter() - t))
            out.decode_steps += 1
            pos += 1
        # Only steps after the first token count as decode; the final text flush is not a step.
        out.decode_ms = 1e3 * (time.perf_counter() - t_first)
        out.cpu_ms = max(0.0, out.decode_ms - 1e3 * (stats.wait_s - waited))
        out.decode_bytes_read = stats.bytes_read - read
        out.grammar_ms = 1e3 * grammar_s[0]
        if decoder is not None and not watcher.stopped:
            await emit(watcher.feed(decoder.finish()) + watcher.flush(), -1)
        out.text = "".join(pieces)
        return out


@dataclass
class Scores:
    """Teacher-forced predictions: row i = the top-k after ids[:i+1] (ids [n, k], logits and log-probs)."""

    ids: list[int]
    top_ids: np.ndarray
    top_logits: np.ndarray
    top_logprobs: np.ndarray

    def as_dict(self, digits: int = 5) -> dict:
        return {"ids": self.ids, "top_ids": self.top_ids.tolist(),
                "top_logits": [[round(float(v), digits) for v in row] for row in self.top_logits],
                "top_logprobs": [[round(float(v), digits) for v in row] for row in self.top_logprobs]}


async def score(runner: Runner, ids: Sequence[int], top_k: int = 10, *, seq: int = 0) -> Scores:
    """The top-k predictions after every prefix of `ids`, in steps of the runner's largest."""
    ids = [int(t) for t in ids]
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= MAX_SCORE_TOP_K:
        raise BadRequestError(f"top_k must be in 1..{MAX_SCORE_TOP_K}, got {top_k!r}")
    if not ids:
        raise BadRequestError("the text is empty")
    if len(ids) > runner.capacity.n_ctx:
        raise ContextOverflowError(f"the text has {len(ids)} tokens, more than the context of {runner.capacity.n_ctx}",
                                   hint="shorten it or load the model with a larger context")
    runner.reset(seq)
    chunk = runner.capacity.max_step_tokens
    rows = []
    for at in range(0, len(ids), chunk):
        (o,) = await runner.step(Step.of(ids[at:at + chunk], at, seq=seq, want=Want.ALL_LOGITS))
        rows.append(o.logits)
    logits = np.concatenate(rows)                                          # [n, vocab]
    top_ids, top_logits = top_k_rows(logits, top_k)
    peak = logits.max(axis=1, keepdims=True)
    log_norm = peak + np.log(np.exp(logits - peak, dtype=np.float64).sum(axis=1, keepdims=True))   # [n, 1]
    return Scores(ids, top_ids, top_logits, top_logits - log_norm)
