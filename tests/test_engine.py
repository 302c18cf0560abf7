"""The chat engine natively (wgpu): the browser's loading path (header + small ranges + upload plan)
gives the same greedy reply as the CPU reference."""

from __future__ import annotations

import asyncio

import pytest

from pyshim.setup.catalog import resolve_model
from pyshim.serve.session import ChatEngine, RangesSource, small_tensor_ranges
from pyshim.errors import BadRequestError
from pyshim.gguf.header import read_header_from_file
from pyshim.serve.sampling import SamplingParams
from pyshim.gguf.tensors import FileSource

pytestmark = [pytest.mark.models, pytest.mark.slow]
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
MAX_TOKENS = 8


async def open_like_the_browser(path):
    """What the Worker does: header bytes, the 1-D tensors' bytes, then every upload copied by the caller."""
    header = read_header_from_file(path)
    file = FileSource(path)
    ranges = {off: file.read(off, n).tobytes() for off, n in small_tensor_ranges(header)}
    engine = await ChatEngine.open(header, RangesSource(ranges), n_ctx=256, upload_now=False, int8=False)   # exact arithmetic: the plain reference is the oracle
    device = engine.runner.device
    for up in engine.uploads:
        device.write(up.buffer, file.read(up.file_offset, up.nbytes), up.buffer_offset)
    return engine


def test_browser_style_load_answers_like_the_cpu_reference():
    path = resolve_model("smollm2")

    async def run():
        engine = await open_like_the_browser(path)
        pieces = []
        reply = await engine.chat(MESSAGES, SamplingParams(), MAX_TOKENS, on_text=lambda piece, token: pieces.append(piece))
        return engine, reply, pieces

    engine, reply, pieces = asyncio.run(run())
    from pyshim.serve.generation import generate_text
    from pyshim.exec.loading import load

    cpu = load(path, n_ctx=256)
    tok = engine.tokenizer
    expected = generate_text(cpu, engine.template.encode(tok, MESSAGES), tok.stream(), max_tokens=MAX_TOKENS,
                             params=SamplingParams(), stop_ids=engine.template.stop_ids)
    assert reply.text == expected.text and "".join(pieces) == reply.text
    assert reply.completion_tokens == len(expected.ids) and reply.finish_reason == expected.stats.finish_reason
    assert "Paris" in reply.text


def test_conversation_longer_than_the_context_is_refused_before_running():
    async def run():
        engine = await open_like_the_browser(resolve_model("smollm2"))
        with pytest.raises(BadRequestError, match="context"):
            await engine.chat([{"role": "user", "content": "word " * 400}], SamplingParams(), 4)

    asyncio.run(run())


def test_a_conversation_past_the_context_is_compacted_not_refused():
    async def run():
        engine = await open_like_the_browser(resolve_model("smollm2"))
        messages = [{"role": "user", "content": "My name is Ada and my server is at /srv/app on port 8080."},
                    {"role": "assistant", "content": "Got it."}]
        for i in range(12):
            messages += [{"role": "user", "content": f"Tell me fact {i}. " + "please " * 20},
                         {"role": "assistant", "content": "A fact. " * 20}]
        messages.append({"role": "user", "content": "What is my name?"})
        assert len(engine.template.encode(engine.tokenizer, messages)) > engine.runner.n_ctx
        return await engine.chat(messages, SamplingParams(), 2)

    reply = asyncio.run(run())
    assert reply.compacted and reply.prompt_tokens < 256 and reply.completion_tokens >= 1
