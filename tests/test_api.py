"""The OpenAI-shaped Python API on the CPU reference: shapes, streaming equals non-streaming, validation."""

from __future__ import annotations

import asyncio

import pytest

from pyshim.api import load
from pyshim.errors import BadRequestError

pytestmark = [pytest.mark.models]
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def engine():
    return asyncio.run(load("smollm2", backend="cpu", n_ctx=256))


def run(coro):
    return asyncio.run(coro)


def test_non_streaming_reply_has_the_openai_shape(engine):
    reply = run(engine.chat.completions.create(messages=MESSAGES, temperature=0, max_tokens=8))
    assert reply["object"] == "chat.completion" and reply["id"].startswith("chatcmpl-") and reply["model"] == "smollm2"
    choice = reply["choices"][0]
    assert choice["message"]["role"] == "assistant" and "Paris" in choice["message"]["content"]
    assert choice["finish_reason"] in ("stop", "length")
    usage = reply["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] and usage["completion_tokens"] >= 1


def test_streamed_text_equals_the_non_streamed_text(engine):
    async def both():
        whole = await engine.chat.completions.create(messages=MESSAGES, temperature=0, max_tokens=8)
        chunks = [c async for c in await engine.chat.completions.create(messages=MESSAGES, temperature=0, max_tokens=8, stream=True)]
        return whole, chunks

    whole, chunks = run(both())
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == whole["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"] and "usage" in chunks[-1]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


def test_stop_strings_cut_the_reply(engine):
    reply = run(engine.chat.completions.create(messages=MESSAGES, temperature=0, max_tokens=8, stop=["Paris"]))
    assert "Paris" not in reply["choices"][0]["message"]["content"] and reply["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("fields,match", [
    ({"model": "gpt-4"}, "unknown model"),
    ({"max_tokens": -1}, "max_tokens"),
    ({"max_tokens": "8"}, "max_tokens"),
    ({"temperature": 3}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, r"messages\[0\]"),
    ({"messages": [{"role": "user", "content": 5}]}, r"messages\[0\]"),
    ({"stop": [""]}, "stop"),
    ({"seed": 1.5}, "seed"),
])
def test_bad_requests_are_refused_with_the_field_named(engine, fields, match):
    request = {"messages": MESSAGES, **fields}
    with pytest.raises(BadRequestError, match=match):
        run(engine.chat.completions.create(**request))


def test_concurrent_requests_are_queued_not_mixed(engine):
    async def two():
        a = engine.chat.completions.create(messages=MESSAGES, temperature=0, max_tokens=6)
        b = engine.chat.completions.create(messages=[{"role": "user", "content": "Name a colour."}], temperature=0, max_tokens=6)
        return await asyncio.gather(a, b)

    async def one(messages):
        return await engine.chat.completions.create(messages=messages, temperature=0, max_tokens=6)

    a, b = run(two())
    assert a["choices"][0]["message"]["content"] == run(one(MESSAGES))["choices"][0]["message"]["content"]
    assert b["choices"][0]["message"]["content"] == run(one([{"role": "user", "content": "Name a colour."}]))["choices"][0]["message"]["content"]


def test_kv_type_reaches_the_engine():
    async def reply(kv_type):
        engine = await load("smollm2", backend="gpu", n_ctx=256, kv_type=kv_type)
        try:
            assert engine.session.runner.ops.kv_type == kv_type
            out = await engine.chat.completions.create(messages=MESSAGES, temperature=0, max_tokens=4)
            return out["choices"][0]["message"]["content"]
        finally:
            engine.close()

    assert run(reply("q8"))
    with pytest.raises(BadRequestError, match="kv_type"):
        run(load("smollm2", backend="cpu", kv_type="q3"))


@pytest.mark.parametrize("backend", ["gpu", "wasm"])
def test_parallel_requests_are_decoded_together_each_as_alone(backend):
    """`parallel=3`: three gathered requests run at once, each in a sequence of its own, their decode steps
    batched (on the GPU and on the CPU engine); each reply is the one it gets alone, and the batched steps
    really ran."""
    questions = [MESSAGES, [{"role": "user", "content": "Name a colour."}],
                 [{"role": "user", "content": "Write one word that rhymes with cat."}]]
    tokens = [8, 5, 10]

    async def scene():
        engine = await load("smollm2", backend=backend, n_ctx=256, parallel=3)
        try:
            def ask(messages, n):
                return engine.chat.completions.create(messages=messages, temperature=0, max_tokens=n)

            together = await asyncio.gather(*(ask(m, n) for m, n in zip(questions, tokens)))
            batched = engine.session.runner.batch_stats.steps
            alone = [await ask(m, n) for m, n in zip(questions, tokens)]
            return together, alone, batched, engine.scheduler.stats()
        finally:
            engine.close()

    together, alone, batched, stats = run(scene())
    for a, b in zip(together, alone):
        assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
        # (alone, each finds the chat template's opening in its cache: cached_tokens differ, nothing else)
        assert {k: a["usage"][k] for k in ("prompt_tokens", "completion_tokens")} == \
            {k: b["usage"][k] for k in ("prompt_tokens", "completion_tokens")}
    assert batched >= min(tokens) - 2 and stats == {"running": 0, "queued": 0, "done": 6, "sequences": 3}
    if backend == "wasm":
        with pytest.raises(BadRequestError, match="holds at most 8 sequences, not 9"):
            run(load("smollm2", backend="wasm", parallel=9))


def test_a_system_prompt_a_running_request_holds_is_prefilled_once():
    """`parallel=2`: a request arriving while another runs under the same ~200-token system prompt copies
    that prompt's keys from the other's cache (usage says so) and answers as it does alone; two arriving
    together run it once."""
    system = {"role": "system", "content": " ".join(["You answer questions about geography briefly and exactly, "
                                                     "in one short sentence, without any preamble."] * 10)}
    first = [system, {"role": "user", "content": "What is the capital of France?"}]
    second = [system, {"role": "user", "content": "What is the capital of Italy?"}]

    async def scene():
        engine = await load("smollm2", backend="gpu", n_ctx=512, parallel=2)
        try:
            stream = await engine.chat.completions.create(messages=first, temperature=0, max_tokens=8, stream=True)
            texts, late = [], None
            async for chunk in stream:
                texts.append(chunk["choices"][0]["delta"].get("content") or "")
                if late is None and "".join(texts):     # the first has its first words: the second arrives
                    late = asyncio.ensure_future(engine.chat.completions.create(messages=second, temperature=0, max_tokens=8))
            reply = await late
            engine.session.runner.reset(0)
            engine.session.runner.reset(1)
            alone = await engine.chat.completions.create(messages=second, temperature=0, max_tokens=8)
            return reply, alone
        finally:
            engine.close()

    reply, alone = run(scene())
    assert reply["choices"][0]["message"]["content"] == alone["choices"][0]["message"]["content"]
    cached = reply["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 200 and reply["usage"]["prompt_tokens"] - cached < 20, reply["usage"]
    assert alone["usage"]["prompt_tokens_details"]["cached_tokens"] == 0

    async def at_once():        # arriving together: one runs the system prompt, the other waits and copies it
        engine = await load("smollm2", backend="gpu", n_ctx=512, parallel=2)
        try:
            return await asyncio.gather(*(engine.chat.completions.create(messages=m, temperature=0, max_tokens=8)
                                          for m in (first, second)))
        finally:
            engine.close()

    a, b = run(at_once())
    assert b["choices"][0]["message"]["content"] == alone["choices"][0]["message"]["content"]
    kept = [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in (a, b)]
    assert kept[0] == 0 and kept[1] >= 200, kept
