"""web/engine/openai.js (request validation and OpenAI objects, shared by the JS engine and the service
worker's /v1 endpoint) run in Node, without a browser: every bad request the browser test sends is
refused with the same param, good ones are normalized, and the builders give OpenAI's shapes."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from test_js_api import BAD_REQUESTS

ROOT = Path(__file__).resolve().parent.parent
OPENAI_JS = (ROOT / "web" / "engine" / "openai.js").as_uri()
MODELS = [{"id": "smollm2", "aliases": ["url:http://x/models/SmolLM2-135M-Instruct.Q4_1.gguf"]}]

SCRIPT = """
const api = await import(process.argv[1]);
const { cases, models } = JSON.parse(process.argv[2]);
const refusal = (fn) => { try { return {ok: true, value: fn()}; } catch (e) { return {ok: false, name: e.name, status: e.status, body: e.body}; } };
const base = {id: "chatcmpl-1", created: 1, model: "smollm2"};
console.log(JSON.stringify({
  bad: cases.map((body) => refusal(() => api.validateChatRequest(body, {models}))),
  good: refusal(() => api.validateChatRequest({messages: [{role: "user", content: "hi", name: "x"}], stop: "\\n", seed: 3,
                                               model: models[0].aliases[0], max_completion_tokens: 5}, {models})),
  defaults: api.validateChatRequest({messages: [{role: "user", content: "hi"}]}, {models}),
  noModel: refusal(() => api.validateChatRequest({messages: [{role: "user", content: "hi"}]}, {models: []})),
  prompt: refusal(() => api.validateCompletionRequest({prompt: ["one prompt"], temperature: 0}, {models})),
  sampling: [api.workerSampling(api.validateChatRequest({messages: [{role: "user", content: "hi"}]}, {models})),
             api.workerSampling(api.validateChatRequest({messages: [{role: "user", content: "hi"}], stop: ["a"]}, {models}))],
  completion: api.chatCompletion(base, {text: "Paris", finish_reason: "stop", usage: {prompt_tokens: 3, completion_tokens: 2}}),
  chunk: api.chatChunk(base, {}, {finish_reason: "length", usage: {prompt_tokens: 3, completion_tokens: 2}, extra: {timings: {}}}),
  errors: [["BadRequestError", "too long"], ["EngineUnavailableError", "no"], ["GPUError", "lost"]].map(([name, message]) => {
    const e = api.errorFromEngine({name, message, hint: "h"});
    return [e.status, e.body.error.type, e.body.error.code];
  }),
  id: api.newId("chatcmpl"),
}));
"""


@pytest.fixture(scope="module")
def results():
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (the browser tests check the same module)")
    cases = [body for body, _ in BAD_REQUESTS]
    out = subprocess.run([node, "--input-type=module", "-e", SCRIPT, OPENAI_JS, json.dumps({"cases": cases, "models": MODELS})],
                         capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


def test_bad_requests_name_their_param(results):
    for (body, param), out in zip(BAD_REQUESTS, results["bad"]):
        assert not out["ok"], f"accepted {body}"
        assert out["name"] == "APIError" and out["status"] == 400
        error = out["body"]["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"], (body, error)


def test_good_requests_are_normalized(results):
    good = results["good"]
    assert good["ok"], good
    assert good["value"]["model"] == "smollm2"                 # an alias names the engine's model
    assert good["value"]["messages"] == [{"role": "user", "content": "hi"}]   # unknown message fields dropped
    assert (good["value"]["stop"], good["value"]["seed"], good["value"]["max_tokens"]) == (["\n"], 3, 5)
    d = results["defaults"]
    assert (d["model"], d["temperature"], d["top_p"], d["top_k"], d["max_tokens"], d["stop"], d["seed"], d["stream"]) == \
        ("smollm2", 1.0, 1.0, 0, 256, [], None, False)
    assert results["noModel"]["body"]["error"]["code"] == "model_not_found"
    assert results["prompt"]["ok"] and results["prompt"]["value"]["prompt"] == "one prompt"
    plain, stopped = results["sampling"]
    assert set(plain) == {"temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
                          "max_tokens", "seed"} and stopped["stop"] == ["a"]


def test_builders_give_openai_shapes(results):
    c = results["completion"]
    assert c["object"] == "chat.completion" and c["choices"] == [
        {"index": 0, "message": {"role": "assistant", "content": "Paris"}, "logprobs": None, "finish_reason": "stop"}]
    assert c["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5} and "pyshim" not in c
    k = results["chunk"]
    assert k["object"] == "chat.completion.chunk" and k["choices"][0]["delta"] == {} and k["choices"][0]["finish_reason"] == "length"
    assert k["usage"]["total_tokens"] == 5 and k["pyshim"] == {"timings": {}}
    assert results["errors"] == [[400, "invalid_request_error", "BadRequestError"], [503, "server_error", "EngineUnavailableError"],
                                 [500, "server_error", "GPUError"]]
    assert results["id"].startswith("chatcmpl-") and len(results["id"]) == len("chatcmpl-") + 24


PARITY = [  # (kind, body): requests Python and JS must refuse with the same words, or accept alike
    ("chat.completions", {"messages": []}), ("chat.completions", {}), ("chat.completions", "not an object"),
    ("chat.completions", {"messages": [{"role": "robot", "content": "x"}]}),
    ("chat.completions", {"messages": [{"role": "user", "content": "x"}], "temperature": 2.5}),
    ("chat.completions", {"messages": [{"role": "user", "content": "x"}], "top_p": 0}),
    ("chat.completions", {"messages": [{"role": "user", "content": "x"}], "stop": ["a", "b", "c", "d", "e"]}),
    ("chat.completions", {"messages": [{"role": "user", "content": "x"}], "seed": 1.5, "max_tokens": 0}),
    ("chat.completions", {"messages": [{"role": "user", "content": "x"}], "n": 3}),
    ("chat.completions", {"messages": [{"role": "user", "content": "x"}], "temperature": None, "stop": None}),
    ("completions", {"prompt": ""}), ("completions", {"prompt": ["a", "b"]}), ("completions", {"prompt": ["a"]}),
    ("generate", {"model_id": "m", "messages": [{"role": "user", "content": "x"}], "settings": {"kv_type": "q3"}}),
    ("generate", {"model_id": "m", "messages": [{"role": "user", "content": "x"}], "sampling": {"top_k": -1}}),
    ("generate", {"model_id": "m", "messages": [{"role": "user", "content": "x"}], "settings": {"arithmetic": "bf16"}}),
    ("load", {"model_id": "m", "settings": {"context": 0}}), ("load", {"model_id": ""}), ("load", {"model_id": "m"}),
    ("abort", {}), ("bench", {"model_url": "x.gguf", "max_tokens": 4}),
]
PROTOCOL_JS = (ROOT / "web" / "engine" / "protocol.js").as_uri()
PARITY_SCRIPT = """
const p = await import(process.argv[1]);
const cases = JSON.parse(process.argv[2]);
console.log(JSON.stringify(cases.map(([kind, body]) => {
  try { return {ok: true, value: p.validate(kind, body)}; } catch (e) { return {ok: false, message: e.message, param: e.param}; }
})));
"""


def test_python_and_the_page_validate_requests_alike():
    """One definition (pyshim/serve/protocol.py), two validators: the JS twin (web/engine/protocol.js, which
    the JS API runs before posting) refuses and normalizes exactly as Python does, message for message."""
    from pyshim.errors import BadRequestError
    from pyshim.serve.protocol import validate

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    js = json.loads(subprocess.run([node, "--input-type=module", "-e", PARITY_SCRIPT, PROTOCOL_JS, json.dumps(PARITY)],
                                   capture_output=True, text=True, timeout=60, check=True).stdout)
    refused = 0
    for (kind, body), got in zip(PARITY, js):
        try:
            want = {"ok": True, "value": validate(kind, body)}
        except BadRequestError as exc:
            want = {"ok": False, "message": str(exc), "param": exc.param}
            refused += 1
        assert got == want, (kind, body)
    assert refused >= len(PARITY) - 4
