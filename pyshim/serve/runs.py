"""Raw-prompt runs on the GPU executor: `complete` (a continuation of a prompt, no chat template — the JS
API's completions.create), `score` (teacher-forced top-k after every prefix, as `pyshim score --json`
prints) and `bench` (a fixed-length greedy decode and its timings). web/engine/runs.js drives them in the
site's Worker over the model pyshim.serve.worker_api holds; requests arrive and results leave as JSON text.

Timings: prefill_ms = the prompt up to the first new token (so ttft_ms = prefill_ms); decode_ms = from
the first new token to the last (every later step, the streaming of its text included); cpu_ms = the part
of decode_ms not spent awaiting the GPU readback (`GPUDevice.read_wait_s`): Python, Pyodide's FFI and the
JS calls that encode each step — the CPU side of a step the benchmark reports.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Sequence

import numpy as np

from pyshim.errors import BadRequestError, ContextOverflowError
from pyshim.serve.generation import StopStrings, top_k_rows
from pyshim.serve.sampling import SamplingParams, make_rng, sample

DEFAULT_MAX_TOKENS = 256      # as the chat's sampling default (pyshim.serve.worker_api)
KERNEL_REPS = 2         # per-kernel profile in bench: submissions per group (a decode step costs 0.3-2 s on SwiftShader)
DEFAULT_SCORE_TOP_K = 10      # as `pyshim score`
MAX_SCORE_TOP_K = 100         # a score row holds k ids and k floats per position


@dataclass
class Completion:
    prompt_tokens: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str = "length"       # "stop" (an end-of-generation id or a stop string) | "length" | "abort"
    prefill_ms: float = 0.0
    decode_ms: float = 0.0
    cpu_ms: float = 0.0

    @property
    def decode_tok_per_s(self) -> float:
        steps = len(self.token_ids) - 1      # the first token comes from the prefill
        return 1e3 * steps / self.decode_ms if steps > 0 and self.decode_ms > 0 else 0.0

    def as_dict(self, load_ms: float = 0.0) -> dict:
        n = len(self.token_ids)
        return {
            "text": self.text, "token_ids": self.token_ids, "finish_reason": self.finish_reason,
            "usage": {"prompt_tokens": self.prompt_tokens, "completion_tokens": n, "total_tokens": self.prompt_tokens + n},
            "timings": {"load_ms": load_ms, "prefill_ms": self.prefill_ms, "ttft_ms": self.prefill_ms,
                        "decode_ms": self.decode_ms, "decode_tok_per_s": self.decode_tok_per_s, "cpu_ms": self.cpu_ms},
        }


def sampling_params(sampling: dict) -> tuple[SamplingParams, int, list[str], bool]:
    """A request's `sampling` -> (params, max_tokens, stop strings, ignore_eos). `stop` may be one string;
    a field given as null takes its default."""
    def get(key, default):
        value = sampling.get(key)
        return default if value is None else value

    seed = sampling.get("seed")
    params = SamplingParams(
        temperature=float(get("temperature", 0.0)), top_p=float(get("top_p", 1.0)), top_k=int(get("top_k", 0)),
        min_p=float(get("min_p", 0.0)), repetition_penalty=float(get("repetition_penalty", 1.0)),
        presence_penalty=float(get("presence_penalty", 0.0)), frequency_penalty=float(get("frequency_penalty", 0.0)),
        seed=None if seed is None else int(seed))
    max_tokens = int(get("max_tokens", DEFAULT_MAX_TOKENS))
    if max_tokens < 1:
        raise BadRequestError("max_tokens must be at least 1")
    stop = sampling.get("stop") or []
    stops = [stop] if isinstance(stop, str) else [str(s) for s in stop]
    return params, max_tokens, stops, bool(sampling.get("ignore_eos", False))


def request_ids(tokenizer, request: dict, n_vocab: int, text_key: str = "prompt", ids_key: str = "prompt_ids") -> list[int]:
    """The token ids of a request: `ids_key` as given (checked against the vocabulary), or `text_key`
    tokenized with the model's specials (BOS where the model wants one)."""
    ids = request.get(ids_key)
    if ids is not None:
        if not isinstance(ids, (list, tuple)) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise BadRequestError(f"{ids_key} must be a list of integer token ids")
        bad = [t for t in ids if not 0 <= t < n_vocab]
        if bad:
            raise BadRequestError(f"{ids_key} holds ids outside the vocabulary of {n_vocab}: {bad[:5]}")
        ids = list(ids)
    elif isinstance(request.get(text_key), str):
        ids = tokenizer.encode(request[text_key], add_special=True)
    else:
        raise BadRequestError(f"give {text_key} (a string) or {ids_key} (a list of token ids)")
    if not ids:
        raise BadRequestError(f"the {text_key} is empty")
    return ids


async def complete_ids(runner, tokenizer, prompt: Sequence[int], params: SamplingParams, max_tokens: int, *,
                       stop_ids: Sequence[int] = (), stop_strings: Sequence[str] = (),
                       on_text: Callable[[str, int], Awaitable[None] | None] | None = None,
                       should_stop: Callable[[], bool] = lambda: False) -> Completion:
    """Continue `prompt` on a GpuRunner. Stop ids end generation and are not part of the text; stop strings
    cut the text before them (its token ids are kept). `on_text(piece, token)` sees the text as it streams
    (UTF-8-safe, stop strings held back; the last piece has token -1); `should_stop()` is polled between tokens."""
    if len(prompt) + 1 > runner.n_ctx:
        raise ContextOverflowError(f"the prompt has {len(prompt)} tokens; the context holds {runner.n_ctx} with the reply",
                                   hint="shorten the prompt or load the model with a larger context")
    out = Completion(prompt_tokens=len(prompt))
    on_gpu_argmax = (params.greedy and params.repetition_penalty == 1.0 and not params.presence_penalty
                     and not params.frequency_penalty)
    rng, history, stop = make_rng(params.seed), list(prompt), set(int(t) for t in stop_ids)
    stream, watcher, device = tokenizer.stream(), StopStrings(stop_strings), runner.device
    pieces: list[str] = []

    async def step(ids: list[int], start: int) -> int:
        if on_gpu_argmax:
            return await runner.greedy_async(ids, start)     # the argmax on the GPU: 4 bytes come back
        logits = await runner.forward_async(ids, start)
        return sample(logits[-1], params, rng, history)

    async def emit(piece: str, token: int) -> None:
        if piece:
            pieces.append(piece)
            if on_text is not None:
                maybe = on_text(piece, token)
                if maybe is not None:
                    await maybe

    runner.reset()
    t0 = time.perf_counter()
    token = await step(list(prompt), 0)
    t_first = time.perf_counter()
    waited_first = device.read_wait_s
    out.prefill_ms = 1e3 * (t_first - t0)
    pos = len(prompt)
    while True:
        if token in stop:
            out.finish_reason = "stop"
            break
        out.token_ids.append(token)
        history.append(token)
        await emit(watcher.feed(stream.add(token)), token)
        if watcher.stopped:
            out.finish_reason = "stop"
            break
        if len(out.token_ids) >= max_tokens or pos >= runner.n_ctx:
            break
        if should_stop():
            out.finish_reason = "abort"
            break
        token = await step([token], pos)
        pos += 1
    # Only steps after the first token count as decode; the final text flush is not a step.
    out.decode_ms = 1e3 * (time.perf_counter() - t_first)
    out.cpu_ms = max(0.0, out.decode_ms - 1e3 * (device.read_wait_s - waited_first))
    if not watcher.stopped:
        await emit(watcher.feed(stream.finish()) + watcher.flush(), -1)
    out.text = "".join(pieces)
    return out


async def score_ids(runner, ids: Sequence[int], top_k: int) -> dict:
    """Teacher-forced: row i = the top-k ids, logits and log-probabilities predicted after ids[:i+1]."""
    if not 1 <= top_k <= MAX_SCORE_TOP_K:
        raise BadRequestError(f"top_k must be in 1..{MAX_SCORE_TOP_K}")
    if len(ids) > runner.n_ctx:
        raise ContextOverflowError(f"the text has {len(ids)} tokens, more than the context of {runner.n_ctx}",
                                   hint="shorten it or load the model with a larger context")
    runner.reset()
    logits = await runner.forward_async(list(ids), 0, all_logits=True)          # [n, vocab]
    top_ids, top_logits = top_k_rows(logits, top_k)
    peak = logits.max(axis=1, keepdims=True)
    log_norm = peak + np.log(np.exp(logits - peak, dtype=np.float64).sum(axis=1, keepdims=True))   # [n, 1]
    return {"ids": list(ids), "top_ids": top_ids.tolist(),
            "top_logits": [[round(float(v), 5) for v in row] for row in top_logits],
            "top_logprobs": [[round(float(v), 5) for v in row] for row in top_logits - log_norm]}


def arithmetic(runner) -> str:
    """"int8": the GPU executor rounds matmul activations as llama.cpp's CPU backend does (its int8 route,
    taken on CPU adapters), or the reference emulates exactly that rounding; "f32": neither."""
    ops = runner.ops
    return "int8" if getattr(ops, "int8", False) or getattr(ops, "emulate_llama_cpp", False) else "f32"


# --- the Worker's entry points (web/engine/runs.js): JSON in, JSON out ---------------------------------

def _engine():
    from pyshim.serve.worker_api import loaded_engine

    return loaded_engine()


async def complete(request_json: str, on_text, should_stop) -> str:
    """Request {prompt | prompt_ids, sampling: {temperature, top_p, top_k, min_p, max_tokens, seed, stop,
    ignore_eos, ...penalties}, stop_token_ids?} -> Completion.as_dict() as JSON (load_ms filled in by JS)."""
    engine = _engine()
    request = json.loads(request_json)
    params, max_tokens, stops, ignore_eos = sampling_params(request.get("sampling") or {})
    prompt = request_ids(engine.tokenizer, request, engine.runner.spec.n_vocab)
    stop_ids = () if ignore_eos else sorted(set(engine.tokenizer.eog_ids) | set(request.get("stop_token_ids") or ()))
    done = await complete_ids(engine.runner, engine.tokenizer, prompt, params, max_tokens, stop_ids=stop_ids,
                              stop_strings=stops, on_text=lambda piece, token: on_text(piece, token),
                              should_stop=lambda: bool(should_stop()))
    return json.dumps({**done.as_dict(), "arithmetic": arithmetic(engine.runner)})


async def score(request_json: str) -> str:
    """Request {text | ids, top_k} -> {ids, top_ids, top_logits, top_logprobs} as JSON."""
    engine = _engine()
    request = json.loads(request_json)
    ids = request_ids(engine.tokenizer, request, engine.runner.spec.n_vocab, text_key="text", ids_key="ids")
    scored = await score_ids(engine.runner, ids, int(request.get("top_k", DEFAULT_SCORE_TOP_K)))
    return json.dumps({**scored, "arithmetic": arithmetic(engine.runner)})


def gpu_bytes(runner) -> dict:
    """Device memory: what the executor allocated so far (buffers are made at load and as step shapes are
    first built, so after a run this is its peak) and what the plan (pyshim.plan.memory) predicts for its
    largest step."""
    from pyshim.plan.memory import estimate

    ops = runner.ops
    plan = estimate(runner.spec, runner.header.tensors, context=runner.n_ctx, kv_type=ops.kv_type, chunk=ops.max_chunk)
    return {"peak_gpu_bytes": ops.memory()["total"], "planned_gpu_bytes": plan.total_bytes}



async def bench(request_json: str) -> str:
    """Request {prompt, max_tokens, ignore_eos (default true), kernels (default false)}: a greedy run ->
    {prompt_tokens, prefill_ms, ttft_ms, decode_tokens, decode_ms, cpu_ms, cpu_share, text, peak_gpu_bytes,
    planned_gpu_bytes} as JSON (load_ms filled in by JS). cpu_share = cpu_ms / decode_ms, the CPU side of a
    decode step (0..1). With `kernels`: also kernel_ms {shader group: ms per decode step} and
    kernel_step_ms (pyshim.gpu.profile; a few decode steps' worth of extra time)."""
    engine = _engine()
    request = json.loads(request_json)
    prompt = request_ids(engine.tokenizer, request, engine.runner.spec.n_vocab)
    max_tokens = int(request.get("max_tokens", DEFAULT_MAX_TOKENS))
    if max_tokens < 1:
        raise BadRequestError("max_tokens must be at least 1")
    stop_ids = () if request.get("ignore_eos", True) else sorted(engine.tokenizer.eog_ids)
    done = await complete_ids(engine.runner, engine.tokenizer, prompt, SamplingParams(), max_tokens, stop_ids=stop_ids)
    profile = {}
    if request.get("kernels"):
        from pyshim.gpu.profile import kernel_times

        times = await kernel_times(engine.runner, reps=KERNEL_REPS, rounds=1)
        profile = {"kernel_ms": {name: g["ms"] for name, g in times["groups"].items()}, "kernel_step_ms": times["step_ms"]}
    return json.dumps({**profile, "prompt_tokens": done.prompt_tokens, "prefill_ms": done.prefill_ms, "ttft_ms": done.prefill_ms,
                       "decode_tokens": len(done.token_ids), "decode_ms": done.decode_ms, "cpu_ms": done.cpu_ms,
                       "cpu_share": done.cpu_ms / done.decode_ms if done.decode_ms > 0 else None,
                       "decode_tok_per_s": done.decode_tok_per_s, "text": done.text, "arithmetic": arithmetic(engine.runner),
                       **gpu_bytes(engine.runner)})
