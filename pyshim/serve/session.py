"""A chat engine: a model on the GPU executor plus its tokenizer and chat template; messages in,
streamed text out. The site's Worker drives it (weights streamed from IndexedDB by JS along the upload
plan); natively it loads straight from a file.

Everything that waits is async: the browser has no way to block on the GPU.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Sequence

import numpy as np

from pyshim.text.chat import ChatTemplate
from pyshim.text.compaction import compact
from pyshim.errors import BadRequestError, GGUFFormatError
from pyshim.serve.generation import PREFILL_CHUNK, StopStrings
from pyshim.gguf.header import GGUFHeader, read_header
from pyshim.gpu.kernels import TOPK
from pyshim.serve.sampling import SamplingParams, can_sample_top_k, make_rng, sample, sample_top_k
from pyshim.text.tokenizer import Tokenizer


REPLY_SHARE = 4     # a compacted conversation leaves up to 1/REPLY_SHARE of the context for the reply


class RangesSource:
    """The few file ranges the loader reads itself (1-D tensors: norms, biases), handed over by JS;
    everything else goes file → GPU along the upload plan without touching Python."""

    def __init__(self, ranges: dict[int, bytes]):
        self._ranges = {int(offset): np.frombuffer(bytes(data), dtype=np.uint8) for offset, data in ranges.items()}

    def read(self, offset: int, nbytes: int) -> np.ndarray:
        data = self._ranges.get(int(offset))
        if data is None or data.shape[0] < nbytes:
            raise GGUFFormatError(f"bytes [{offset}, {offset + nbytes}) were not provided to the loader",
                                  hint="this is a bug in the upload plan: report it")
        return data[:nbytes]


def small_tensor_ranges(header: GGUFHeader) -> list[tuple[int, int]]:
    """(file offset, bytes) of the 1-D tensors the executor keeps as f32 and so reads on the CPU."""
    return [(t.offset, t.nbytes) for t in header.tensors if len(t.shape) == 1]


@dataclass
class Reply:
    text: str
    finish_reason: str          # "stop" | "length" | "abort"
    prompt_tokens: int
    completion_tokens: int
    prefill_ms: float
    ttft_ms: float
    decode_tok_per_s: float
    compacted: bool = False     # older turns were compacted to fit the context

    def as_dict(self) -> dict:
        return {
            "text": self.text, "finish_reason": self.finish_reason,
            "usage": {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                      "total_tokens": self.prompt_tokens + self.completion_tokens},
            "timings": {"prefill_ms": self.prefill_ms, "ttft_ms": self.ttft_ms, "decode_tok_per_s": self.decode_tok_per_s},
            "compacted": self.compacted,
        }


class ChatEngine:
    def __init__(self, runner, tokenizer: Tokenizer, template: ChatTemplate):
        self.runner, self.tokenizer, self.template = runner, tokenizer, template

    @classmethod
    async def open(cls, header: GGUFHeader, source, *, n_ctx: int | None = None, device=None,
                   upload_now: bool = True, kv_type: str = "f32", int8: bool | None = None) -> "ChatEngine":
        """Bind the model on the GPU. With `upload_now=False` the caller copies the weights along
        `engine.uploads` before the first `chat()`. `kv_type`: f32, f16 or q8 (pyshim.plan.memory.KV_TYPES);
        `int8`: the executor's int8 route on or off (None: the adapter's default)."""
        from pyshim.exec.gpu_runner import load_gpu_async

        tokenizer = Tokenizer.from_metadata(header.metadata)
        template = ChatTemplate.from_metadata(header.metadata, tokenizer)
        runner = await load_gpu_async(header=header, source=source, n_ctx=n_ctx, device=device, upload_now=upload_now,
                                      kv_type=kv_type, int8=int8)
        return cls(runner, tokenizer, template)

    @classmethod
    async def open_prefix(cls, prefix, file_size: int, ranges: dict[int, bytes], **kwargs) -> "ChatEngine":
        """From the header bytes and the small tensors' bytes (the browser path)."""
        return await cls.open(read_header(prefix, file_size=file_size), RangesSource(ranges), upload_now=False, **kwargs)

    @property
    def uploads(self):
        return self.runner.ops.uploads

    async def prepare(self) -> None:
        await self.runner.prepare_async()

    def fit_messages(self, messages: list[dict], max_tokens: int) -> tuple[list[dict], bool]:
        """The conversation, compacted if needed so the prompt leaves room for a reply."""
        room = min(max_tokens, self.runner.n_ctx // REPLY_SHARE)
        return compact(messages, lambda msgs: len(self.template.encode(self.tokenizer, msgs)), self.runner.n_ctx - room)

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        ids = self.template.encode(self.tokenizer, messages)
        if len(ids) >= self.runner.n_ctx:
            raise BadRequestError(f"the conversation is {len(ids)} tokens, the context holds {self.runner.n_ctx}",
                                  hint="start a new chat, shorten the messages, or raise the context setting")
        return ids

    async def chat(self, messages: list[dict], params: SamplingParams, max_tokens: int, *,
                   on_text: Callable[[str, int], Awaitable[None] | None] | None = None,
                   should_stop: Callable[[], bool] = lambda: False, stop_strings: Sequence[str] = ()) -> Reply:
        """Generate a reply to `messages`. `on_text(piece, token)` sees the text as it streams (UTF-8-safe,
        stop strings held back); `should_stop()` is polled between tokens (the stop button)."""
        if max_tokens < 1:
            raise BadRequestError("max_tokens must be at least 1")
        messages, compacted = self.fit_messages(messages, max_tokens)
        prompt = self.prompt_ids(messages)
        runner, stop = self.runner, self.template.stop_ids
        rng = make_rng(params.seed)
        stream, watcher = self.tokenizer.stream(), StopStrings(stop_strings)
        on_gpu_argmax = params.greedy and params.repetition_penalty == 1.0 and not params.presence_penalty and not params.frequency_penalty
        # top-k sampling picks its candidates on the GPU: k pairs come back instead of the vocabulary's logits
        on_gpu_top_k = hasattr(runner, "top_k_async") and can_sample_top_k(params, TOPK)
        history, text, finish = list(prompt), [], "length"
        generated, pos, t0 = 0, 0, time.perf_counter()
        decode_s, ttft_ms = 0.0, 0.0

        async def step(ids: list[int], start: int) -> int:
            if on_gpu_argmax:
                return await runner.greedy_async(ids, start)
            if on_gpu_top_k:
                return sample_top_k(*await runner.top_k_async(ids, start, params.top_k), params, rng)
            logits = await runner.forward_async(ids, start)
            return sample(logits[-1], params, rng, history)

        async def emit(piece: str, token: int) -> None:
            if piece:
                text.append(piece)
                if on_text is not None:
                    maybe = on_text(piece, token)
                    if maybe is not None:
                        await maybe

        runner.reset()   # a new conversation: no key from the previous one may be attended to
        # Prefill in chunks (the last chunk yields the first new token), then one token per step.
        for at in range(0, len(prompt) - PREFILL_CHUNK, PREFILL_CHUNK):
            await runner.forward_async(prompt[at:at + PREFILL_CHUNK], at)
        at = (len(prompt) - 1) // PREFILL_CHUNK * PREFILL_CHUNK
        token = await step(prompt[at:], at)
        prefill_ms = ttft_ms = (time.perf_counter() - t0) * 1e3
        pos = len(prompt)
        while True:
            if token in stop:
                finish = "stop"
                break
            generated += 1
            history.append(token)
            await emit(watcher.feed(stream.add(token)), token)
            if watcher.stopped:
                finish = "stop"
                break
            if generated >= max_tokens or pos >= runner.n_ctx:
                break
            if should_stop():
                finish = "abort"
                break
            t1 = time.perf_counter()
            token = await step([token], pos)
            decode_s += time.perf_counter() - t1
            pos += 1
        if not watcher.stopped:
            await emit(watcher.feed(stream.finish()) + watcher.flush(), -1)
        steps = max(0, generated - 1)
        return Reply(text="".join(text), finish_reason=finish, prompt_tokens=len(prompt), completion_tokens=generated,
                     prefill_ms=prefill_ms, ttft_ms=ttft_ms, decode_tok_per_s=steps / decode_s if decode_s else 0.0,
                     compacted=compacted)
