"""Tool calls: `tools` / `tool_choice` rendered by the model's own template (Qwen2.5's) or pyshim's system
message (a template without tools: SmolLM2's), the call's JSON constrained to the function's schema, and
the round trip call -> tool result -> answer on Qwen2.5 through the Python API natively, and on SmolLM2
(Qwen2.5 with --full) through the JS API and the /v1 endpoint (the page's `openai` client) in Chromium.
"""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest

import harness
from pyshim.errors import BadRequestError
from pyshim.gguf.header import read_header_from_file
from pyshim.serve.protocol import Sampling
from pyshim.setup.catalog import model_path
from pyshim.text.chat import ChatTemplate
from pyshim.text.grammar import LLGuidance, accepted_prefix
from pyshim.text.tokenizer import Tokenizer
from pyshim.text.tools import BARE_JSON, TAGGED, CallMatcher, call_format, tool_spec, with_tools

pytestmark = [pytest.mark.models]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city",
                                             "parameters": {"type": "object", "properties": {
                                                 "city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                                                 "required": ["city"]}}}
ADD = {"type": "function", "function": {"name": "add", "description": "Add two numbers",
                                         "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                                                        "required": ["a", "b"]}}}
TOOLS = [WEATHER, ADD]
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
RESULT = json.dumps({"temperature": 18, "sky": "cloudy"})
MAX_TOKENS = 60
REPLY_TIMEOUT_MS = 900_000


def vocabulary(name: str):
    path = model_path(name)
    if not path.is_file():
        pytest.skip(f"{path.name} is not placed (pyshim setup --test-models)")
    header = read_header_from_file(path)
    tokenizer = Tokenizer.from_metadata(header.metadata)
    template = ChatTemplate.from_metadata(header.metadata, tokenizer)
    return header, tokenizer, template, sorted(set(tokenizer.eog_ids) | set(template.stop_ids))


def test_tool_choice_rules():
    assert tool_spec(None, None) is None and tool_spec(TOOLS, "none") is None
    auto = tool_spec(TOOLS, None)
    assert not auto.required and auto.names == ("get_weather", "add")
    named = tool_spec(TOOLS, {"type": "function", "function": {"name": "add"}})
    assert named.required and named.names == ("add",) and named.schema()["properties"]["name"] == {"const": "add"}
    for choice in (None, "required", {"type": "function", "function": {"name": "add"}}):   # the JS engine gets it back
        spec = tool_spec(TOOLS, choice, False)
        request = spec.as_request()
        assert tool_spec(request["tools"], request["tool_choice"], request["parallel_tool_calls"]) == spec
    with pytest.raises(BadRequestError, match="not among the tools") as err:
        tool_spec(TOOLS, {"type": "function", "function": {"name": "nope"}})
    assert err.value.param == "tool_choice"
    with pytest.raises(BadRequestError, match="twice"):
        tool_spec([ADD, ADD], "auto")
    with pytest.raises(BadRequestError, match="no tools"):
        tool_spec(None, "required")
    with pytest.raises(BadRequestError, match="cannot be combined"):
        Sampling.parse({"tools": TOOLS, "response_format": {"type": "json_object"}})
    with pytest.raises(BadRequestError, match="tools"):
        Sampling.parse({"tools": [{"type": "function"}]})


def test_templates_render_the_tools_and_the_results():
    _, qt, qwen, _ = vocabulary("qwen2.5")
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    turns = QUESTION + [{"role": "assistant", "content": None, "tool_calls": [call]},
                        {"role": "tool", "tool_call_id": "call_1", "content": RESULT}]
    messages, extra = with_tools(turns, tool_spec(TOOLS, "auto"), qwen.source)
    text = qwen.render(messages, **extra)
    assert "<tools>" in text and '"name": "get_weather"' in text            # the template's own tools section
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert f"<tool_response>\n{RESULT}\n</tool_response>" in text
    _, st, smol, _ = vocabulary("smollm2")
    messages, extra = with_tools(turns, tool_spec(TOOLS, "auto"), smol.source)
    text = smol.render(messages, **extra)
    assert extra == {} and "To call one, reply with only <tool_call>" in text and "<tool_response>" in text


def _walk(name: str, choice, *parts: str):
    """The parts tokenized apart (as the matcher writes a call: the tags' tokens, then the JSON's) walked
    through a CallMatcher: (matcher, tokens accepted, tokens)."""
    _, tokenizer, _, end_ids = vocabulary(name)
    matcher = CallMatcher(tool_spec(TOOLS, choice), LLGuidance(tokenizer, end_ids), tokenizer, tokenizer.vocab_size, end_ids)
    ids = [t for part in parts for t in tokenizer.encode(part, add_special=False, parse_special=True)]
    return matcher, asyncio.run(accepted_prefix(matcher, ids)), len(ids)


def test_a_call_is_constrained_to_its_function():
    call = ("<tool_call>\n", '{"name": "add", "arguments": {"a": 2, "b": 3}}', "\n</tool_call>")
    matcher, n, total = _walk("qwen2.5", "required", *call)
    assert n == total and matcher.calling
    assert matcher.calls[0]["function"] == {"name": "add", "arguments": '{"a": 2, "b": 3}'}
    _, n, total = _walk("qwen2.5", {"type": "function", "function": {"name": "get_weather"}}, *call)   # not the named one
    assert n < total
    _, n, total = _walk("qwen2.5", "required", "<tool_call>\n", '{"name": "add", "arguments": {"a": "two"}}')   # a string for a number
    assert n < total
    matcher, n, total = _walk("qwen2.5", "auto", "It is sunny.")                                              # auto: text is fine
    assert n == total and not matcher.calling and matcher.calls == []


# --- a template in the Llama 3.x style: tools rendered by it, a call as a bare {"name", "parameters"} object ---

# Written for these tests (Qwen's turn markers, so Qwen2.5's vocabulary renders it), teaching the call
# format Llama 3.1-3.3's templates teach: a bare JSON object with "parameters", a result in an ipython turn.
BARE_TEMPLATE = """{%- for m in messages -%}
{%- if loop.first and tools -%}
<|im_start|>user
Given these functions, answer the next message with a function call.
Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.
{% for t in tools %}{{ t | tojson }}
{% endfor %}<|im_end|>
{% endif -%}
{%- if m.role == 'tool' -%}
<|im_start|>ipython
{{ m.content }}<|im_end|>
{% elif m.tool_calls -%}
<|im_start|>assistant
{%- for c in m.tool_calls %}
{"name": "{{ c.function.name }}", "parameters": {{ c.function.arguments | tojson }}}{% endfor %}<|im_end|>
{% else -%}
<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif -%}"""


def bare_template(model: str = "qwen2.5"):
    header, tokenizer, _, end_ids = vocabulary(model)
    return header, tokenizer, ChatTemplate.from_metadata(header.metadata, tokenizer, override=BARE_TEMPLATE), end_ids


def test_a_bare_json_template_renders_the_tools_and_a_call():
    _, _, template, _ = bare_template()
    assert call_format(template.source) is BARE_JSON and call_format(vocabulary("qwen2.5")[2].source) is TAGGED
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    turns = QUESTION + [{"role": "assistant", "content": None, "tool_calls": [call]},
                        {"role": "tool", "tool_call_id": "call_1", "content": RESULT}]
    messages, extra = with_tools(turns, tool_spec(TOOLS, "auto"), template.source)
    text = template.render(messages, **extra)
    assert extra["tools"] == TOOLS and '"parameters"' in text and '"name": "get_weather"' in text
    assert '{"name": "get_weather", "parameters": {"city": "Paris"}}' in text and f"ipython\n{RESULT}" in text


def _walk_bare(choice, text: str):
    _, tokenizer, _, end_ids = bare_template()
    matcher = CallMatcher(tool_spec(TOOLS, choice), LLGuidance(tokenizer, end_ids), tokenizer, tokenizer.vocab_size, end_ids, BARE_JSON)
    ids = tokenizer.encode(text, add_special=False)
    return matcher, asyncio.run(accepted_prefix(matcher, ids)), len(ids)


def test_a_bare_json_call_is_constrained_to_its_function():
    call = '{"name": "add", "parameters": {"a": 2, "b": 3}}'
    for choice in ("required", "auto"):          # auto: the object's first token makes it a call
        matcher, n, total = _walk_bare(choice, call)
        assert n == total and matcher.calling, choice
        assert matcher.calls[0]["function"] == {"name": "add", "arguments": '{"a": 2, "b": 3}'}
    _, n, total = _walk_bare("required", '{"name": "add", "arguments": {"a": 2, "b": 3}}')     # the tagged format's key
    assert n < total
    _, n, total = _walk_bare("required", '{"name": "add", "parameters": {"a": 2, "b": 3}}{"name"')   # one call a reply
    assert n < total
    matcher, n, total = _walk_bare("auto", "It is sunny.")
    assert n == total and not matcher.calling and matcher.calls == []


# SmolLM2 by default: the same ChatML tokens as Qwen2.5, and a tools prompt of ~250 tokens that
# Qwen2.5 prefills natively on lavapipe in ~2.5 minutes a request (its K-quant matmuls), SmolLM2 in seconds.
MODELS = ["smollm2", pytest.param("qwen2.5", marks=pytest.mark.full)]


@pytest.mark.parametrize("model", MODELS)
def test_round_trip_with_a_bare_json_template(model):
    """A model natively, its template replaced by BARE_TEMPLATE: the required call comes out as a bare
    object whose arguments fit the function, and the tool's result goes back through the template."""
    from pyshim.serve.session import Session
    from runners import gpu

    header, tokenizer, template, _ = bare_template(model)

    async def run():
        session = Session(await gpu(model_path(model), context=1024))
        session.template = template
        try:
            first = await session.chat(QUESTION, Sampling.parse({"tools": TOOLS, "tool_choice": "required", "temperature": 0,
                                                                 "max_tokens": MAX_TOKENS}))
            assert first.tool_calls, (first.finish_reason, tokenizer.decode(first.token_ids))
            call = first.tool_calls[0]
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            final = await session.chat(QUESTION + [message, {"role": "tool", "tool_call_id": call["id"], "content": RESULT}],
                                       Sampling.parse({"tools": TOOLS, "tool_choice": "none", "temperature": 0, "max_tokens": 12}))
            return first, final
        finally:
            session.close()

    first, final = asyncio.run(run())
    assert first.finish_reason == "tool_calls" and len(first.tool_calls) == 1 and first.text == ""
    fn = first.tool_calls[0]["function"]
    params = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[fn["name"]]
    jsonschema.validate(json.loads(fn["arguments"]), params)
    assert final.text.strip() and not final.tool_calls


# --- the round trip through the APIs (Qwen2.5: its own template's tools; SmolLM2: pyshim's tools message) --

@pytest.mark.parametrize("model", MODELS)
def test_round_trip_through_the_python_api(model):
    from pyshim.api import load

    vocabulary(model)

    async def run():
        engine = await load(model, backend="gpu", n_ctx=2048)
        try:
            first = await engine.chat.completions.create(messages=QUESTION, tools=TOOLS, tool_choice="required",
                                                         temperature=0, max_tokens=MAX_TOKENS)
            message = first["choices"][0]["message"]
            result = {"role": "tool", "tool_call_id": (message.get("tool_calls") or [{}])[0].get("id", ""), "content": RESULT}
            final = await engine.chat.completions.create(messages=QUESTION + [message, result], tools=TOOLS, tool_choice="none",
                                                         temperature=0, max_tokens=MAX_TOKENS)
            chunks = [c async for c in await engine.chat.completions.create(messages=QUESTION, tools=TOOLS, tool_choice="required",
                                                                             temperature=0, max_tokens=MAX_TOKENS, stream=True)]
            return first, final, chunks
        finally:
            engine.close()

    first, final, chunks = asyncio.run(run())
    choice = first["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None, choice
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_") and call["function"]["name"] in ("get_weather", "add")
    params = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[call["function"]["name"]]
    jsonschema.validate(json.loads(call["function"]["arguments"]), params)
    answer = final["choices"][0]
    assert answer["message"]["content"].strip() and "tool_calls" not in answer["message"], answer
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert not any(d.get("content") for d in deltas[1:])                      # a call's text is not content
    (streamed,) = [d["tool_calls"] for d in deltas if "tool_calls" in d]
    assert streamed[0]["index"] == 0 and streamed[0]["function"] == call["function"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


ROUND_TRIP_JS = """async ([model, tools, question, result, maxTokens, answerTokens]) => {
  const { engine, client } = window.pyshimExample;
  const out = {};
  for (const [name, create] of [["js", (b) => engine.chat.completions.create(b)], ["endpoint", (b) => client.chat.completions.create(b)]]) {
    const first = await create({model, messages: question, tools, tool_choice: 'required', temperature: 0, max_tokens: maxTokens});
    const message = first.choices[0].message;
    if (name === 'endpoint') {       // the call over the wire; the answer after it is plain text, as in the JS API
      out[name] = {first: first.choices[0]};
      continue;
    }
    const id = message.tool_calls?.[0]?.id ?? '';
    const final = await create({model, temperature: 0, max_tokens: answerTokens, tools, tool_choice: 'none',
                                messages: [...question, message, {role: 'tool', tool_call_id: id, content: result}]});
    out[name] = {first: first.choices[0], final: final.choices[0]};
  }
  return out;
}"""


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.parametrize("model", ["smollm2", pytest.param("qwen2.5", marks=pytest.mark.full)])
def test_round_trip_through_the_js_api_and_the_endpoint(chromium, dev_server, model):
    # SmolLM2 by default (pyshim's tools message): its prompt and steps are a quarter of Qwen2.5's on
    # SwiftShader (Qwen2.5, its own template's tools, ~8 minutes on CI's machine, with --full).
    vocabulary(model)
    context = chromium.new_context()
    try:
        page, watch = harness.open_page(context, dev_server.url + f"examples/openai.html?model={model}")
        page.wait_for_function("() => ['ready', 'error'].includes(document.body.dataset.state)", timeout=REPLY_TIMEOUT_MS)
        assert page.evaluate("() => document.body.dataset.state") == "ready", page.inner_text("#status")
        page.set_default_timeout(REPLY_TIMEOUT_MS)
        out = page.evaluate(ROUND_TRIP_JS, [model, TOOLS, QUESTION, RESULT, MAX_TOKENS, 8])
        params = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
        for face, r in out.items():
            assert r["first"]["finish_reason"] == "tool_calls" and r["first"]["message"]["content"] is None, (face, r)
            (call,) = r["first"]["message"]["tool_calls"]
            jsonschema.validate(json.loads(call["function"]["arguments"]), params[call["function"]["name"]])
        final = out["js"]["final"]
        assert final["message"]["content"].strip() and final["finish_reason"] in ("stop", "length"), out
        watch.check()
    finally:
        context.close()
