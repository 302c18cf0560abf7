"""A session: one loaded model ready to serve — its runner, tokenizer and chat template — and the
requests it answers (chat, raw completion, teacher-forced scores, a benchmark run), each through the
one generation loop (pyshim.serve.generation), chats and completions in the sequence the scheduler gave
them (pyshim.serve.scheduler.current_seq). The Python API, the site's Worker and the CLI hold one.
"""

from __future__ import annotations

from typing import Callable, Sequence

from pyshim.errors import BadRequestError, ContextOverflowError
from pyshim.exec.runner import Progress, Runner
from pyshim.serve.generation import Completion, OnText, Scores, generate, score
from pyshim.serve.protocol import Sampling
from pyshim.serve.scheduler import current_seq
from pyshim.serve.sampling import SamplingParams
from pyshim.text.chat import ChatTemplate
from pyshim.text.compaction import compact
from pyshim.text.grammar import Grammars
from pyshim.text.tokenizer import Tokenizer

GrammarsFactory = Callable[[Tokenizer, list[int]], Grammars]

REPLY_SHARE = 4     # a compacted conversation leaves up to 1/REPLY_SHARE of the context for the reply


class Session:
    def __init__(self, runner: Runner, tokenizer: Tokenizer | None = None, template: ChatTemplate | None = None,
                 grammars: GrammarsFactory | None = None):
        self.runner = runner
        metadata = runner.header.metadata
        self.tokenizer = tokenizer or Tokenizer.from_metadata(metadata)
        self.template = template or ChatTemplate.from_metadata(metadata, self.tokenizer)
        self._make_grammars = grammars   # (tokenizer, end ids) -> the grammar engine; default llguidance (native)
        self._grammars: Grammars | None = None

    @property
    def end_ids(self) -> list[int]:
        """Every id that may end a reply: end of generation and the template's end of turn (what a grammar
        engine allows once its grammar may end)."""
        return sorted(set(self.tokenizer.eog_ids) | set(self.template.stop_ids))

    def grammars(self) -> Grammars:
        """The grammar engine, made on the first constrained request (it converts the vocabulary)."""
        if self._grammars is None:
            make = self._make_grammars
            if make is None:
                from pyshim.text.grammar import LLGuidance as make
            self._grammars = make(self.tokenizer, self.end_ids)
        return self._grammars

    @property
    def n_ctx(self) -> int:
        return self.runner.capacity.n_ctx

    async def prepare(self, progress: Progress | None = None) -> None:
        """The runner's one-time work; `progress(done, total)`: its pipelines compiled (Runner.prepare)."""
        await self.runner.prepare(progress)

    def close(self) -> None:
        self.runner.close()

    # --- prompts ---
    def fit_messages(self, messages: list[dict], max_tokens: int) -> tuple[list[dict], bool]:
        """The conversation, compacted if needed so the prompt leaves room for a reply."""
        room = min(max_tokens, self.n_ctx // REPLY_SHARE)
        return compact(messages, lambda msgs: len(self.template.encode(self.tokenizer, msgs)), self.n_ctx - room)

    def chat_ids(self, messages: list[dict], **extra) -> list[int]:
        ids = self.template.encode(self.tokenizer, messages, **extra)
        if len(ids) >= self.n_ctx:
            raise ContextOverflowError(f"the conversation is {len(ids)} tokens, the context holds {self.n_ctx}",
                                       hint="start a new chat, shorten the messages, or raise the context setting")
        return ids

    def prompt_ids(self, text: str | None = None, ids: Sequence[int] | None = None) -> list[int]:
        """Token ids as given (checked against the vocabulary), or `text` tokenized with the model's
        specials (BOS where the model wants one)."""
        n_vocab = self.runner.spec.n_vocab
        if ids is not None:
            bad = [t for t in ids if not 0 <= int(t) < n_vocab]
            if bad:
                raise BadRequestError(f"token ids outside the vocabulary of {n_vocab}: {bad[:5]}", param="prompt_ids")
            return [int(t) for t in ids]
        if text is None:
            raise BadRequestError("give a prompt (a string) or prompt_ids (a list of token ids)", param="prompt")
        return self.tokenizer.encode(text, add_special=True)

    def stop_ids(self, sampling: Sampling, extra: Sequence[int] = (), *, chat: bool = False) -> list[int]:
        """The ids that end a reply: the vocabulary's end-of-generation ids (and the template's end of
        turn in a chat), plus `extra`; none with ignore_eos."""
        if sampling.ignore_eos:
            return []
        ids = set(self.tokenizer.eog_ids) | set(int(t) for t in extra)
        return sorted(ids | set(self.template.stop_ids) if chat else ids)

    # --- requests ---
    async def chat(self, messages: list[dict], sampling: Sampling, *, on_text: OnText | None = None,
                   should_stop: Callable[[], bool] = lambda: False, on_prefill: Progress | None = None) -> Completion:
        """A reply to `messages`, the conversation compacted first when it would not leave room for one;
        with tools, the reply may be calls (pyshim.text.tools), whose text is then not streamed.
        `on_prefill(done, total)`: the prompt's tokens read so far (pyshim.serve.generation.generate)."""
        messages = [{**m, "content": m.get("content") or ""} for m in messages]
        spec, extra = sampling.tools, {}
        if spec is not None:
            from pyshim.text.tools import with_tools

            messages, extra = with_tools(messages, spec, self.template.source)
        messages, compacted = self.fit_messages(messages, sampling.max_tokens)
        if spec is None:
            done = await self.complete(self.chat_ids(messages), sampling, stop_ids=self.stop_ids(sampling, chat=True),
                                       on_text=on_text, should_stop=should_stop, on_prefill=on_prefill)
        else:
            done = await self._call_tools(self.chat_ids(messages, **extra), sampling, on_text, should_stop, on_prefill=on_prefill)
        done.compacted = compacted
        return done

    async def _call_tools(self, prompt: list[int], sampling: Sampling, on_text, should_stop, *,
                          on_prefill: Progress | None = None) -> Completion:
        from pyshim.text.tools import CallMatcher, call_format

        matcher = CallMatcher(sampling.tools, self.grammars(), self.tokenizer, self.runner.spec.n_vocab, self.end_ids,
                              call_format(self.template.source))

        async def text(piece: str, token: int):     # (the first token's verdict comes before its text)
            if matcher.calling or on_text is None:
                return
            maybe = on_text(piece, token)
            if maybe is not None:
                await maybe

        try:
            done = await generate(self.runner, prompt, sampling.params, sampling.max_tokens, stop_ids=self.stop_ids(sampling, chat=True),
                                  stop_strings=sampling.stop, decoder=self.tokenizer.stream(), on_text=text,
                                  should_stop=should_stop, constraint=matcher, on_prefill=on_prefill, seq=current_seq())
        finally:
            matcher.close()
        if matcher.calling:
            done.tool_calls = matcher.calls
            done.text = ""
            if done.tool_calls and done.finish_reason == "stop":
                done.finish_reason = "tool_calls"
        return done

    async def complete(self, prompt: Sequence[int], sampling: Sampling, *, stop_ids: Sequence[int] | None = None,
                       on_text: OnText | None = None, should_stop: Callable[[], bool] = lambda: False,
                       on_prefill: Progress | None = None, reuse: bool = True) -> Completion:
        """A continuation of `prompt` (token ids); stop ids default to the vocabulary's end of generation.
        With a response_format the reply is constrained to it, and any id the grammar engine takes for an
        end also ends the reply. `on_prefill` as in chat; `reuse=False` runs the whole prompt whatever the
        cache holds (benchmarks)."""
        stop_ids = self.stop_ids(sampling) if stop_ids is None else list(stop_ids)
        constraint = None
        if sampling.response_format is not None:
            constraint = await self.grammars().matcher(sampling.response_format)
            stop_ids = sorted(set(stop_ids) | set(self.end_ids))
        try:
            return await generate(self.runner, prompt, sampling.params, sampling.max_tokens, stop_ids=stop_ids,
                                  stop_strings=sampling.stop, decoder=self.tokenizer.stream(), on_text=on_text,
                                  should_stop=should_stop, constraint=constraint, on_prefill=on_prefill, reuse=reuse,
                                  seq=current_seq())
        finally:
            if constraint is not None:
                constraint.close()

    async def score(self, ids: Sequence[int], top_k: int) -> Scores:
        return await score(self.runner, ids, top_k)

    async def bench(self, prompt: Sequence[int], max_tokens: int, *, ignore_eos: bool = True,
                    on_prefill: Progress | None = None) -> Completion:
        """A fixed-length greedy run (what the benchmarks time): the whole prompt runs, whatever the cache
        holds. `on_prefill` as in chat: its (total, total) comes just before the decode's clock starts."""
        stops = () if ignore_eos else self.tokenizer.eog_ids
        return await generate(self.runner, prompt, SamplingParams(), max_tokens, stop_ids=stops, decoder=self.tokenizer.stream(),
                              reuse=False, on_prefill=on_prefill)
