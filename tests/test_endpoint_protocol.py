"""The /v1 endpoint's relay between the service worker (web/engine/endpoint.js) and a page serving an
engine (web/engine/host.js), run under Node with real MessageChannels, fake pages and a fake queueing
engine (tests/endpoint_protocol.mjs): routing, JSON and Server-Sent Events, OpenAI error objects,
concurrent callers, cancellation. Fast; the real thing in Chromium is tests/test_openai_endpoint.py."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
NODE_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def seen() -> dict:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    run = subprocess.run([node, str(HERE / "endpoint_protocol.mjs")], capture_output=True, text=True, timeout=NODE_TIMEOUT_S)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def sse_chunks(text: str) -> list[dict]:
    assert text.endswith("data: [DONE]\n\n")
    events = text.split("\n\n")[:-2]
    assert all(e.startswith("data: ") for e in events)
    return [json.loads(e[len("data: "):]) for e in events]


def streamed_text(chunks: list[dict]) -> str:
    return "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)


def error_of(answer: dict, status: int) -> dict:
    assert answer["status"] == status and answer["type"].startswith("application/json")
    error = answer["body"]["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_only_paths_under_scope_v1_are_answered(seen):
    assert seen["outside"] is None and seen["not_v1"] is False


def test_without_a_host_requests_get_503_but_bad_ones_still_400(seen):
    assert error_of(seen["no_host"], 503)["code"] == "no_engine"
    assert error_of(seen["no_host_bad"], 400)["param"] == "max_tokens"
    assert seen["no_host_models"]["body"] == {"object": "list", "data": []}


def test_models_lists_every_hosts_model(seen):
    assert [m["id"] for m in seen["models"]["body"]["data"]] == ["m1", "m2"]


def test_json_and_sse_replies(seen):
    whole = seen["whole"]["body"]
    assert whole["object"] == "chat.completion" and whole["choices"][0]["message"]["content"] == "three two one"
    assert seen["stream"]["type"].startswith("text/event-stream")
    chunks = sse_chunks(seen["stream"]["text"])
    assert streamed_text(chunks) == "three two one"
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop" and chunks[-1]["usage"]["completion_tokens"] == 3
    assert len({c["id"] for c in chunks}) == 1


def test_text_completions_take_the_same_route(seen):
    body = seen["completion"]["body"]
    assert body["object"] == "text_completion" and body["model"] == "m2" and body["choices"][0]["text"] == "ONCE UPON"
    assert error_of(seen["completion_bad"], 400)["param"] == "prompt"


def test_routing_by_model_and_alias_and_caller(seen):
    assert seen["alias"]["body"]["model"] == "m2" and seen["alias"]["body"]["choices"][0]["message"]["content"] == "y x"
    error = error_of(seen["unknown_model"], 400)
    assert error["code"] == "model_not_found" and '"m1", "m2"' in error["message"]
    assert seen["prefers_caller"]["status"] == 200 and seen["served_by_caller"] is True


def test_malformed_requests(seen):
    assert "not valid JSON" in error_of(seen["bad_json"], 400)["message"]
    assert error_of(seen["wrong_method"], 405)["code"] == "method_not_allowed"
    assert error_of(seen["unknown_path"], 404)["code"] == "unknown_url"
    assert error_of(seen["bad_in_host"], 400)["param"] == "stop"   # refused by the engine, relayed as-is


def test_concurrent_callers_get_their_own_answers_in_turn(seen):
    for answer in seen["concurrent"]:
        expected = " ".join(reversed(answer["question"].split()))
        assert answer["status"] == 200
        text = streamed_text(sse_chunks(answer["text"])) if answer["text"] else answer["body"]["choices"][0]["message"]["content"]
        assert text == expected
    assert seen["e1_overlapped"] is False


def test_a_caller_that_goes_away_stops_the_engine(seen):
    assert seen["cancel"]["cancelled"] is True and seen["cancelled_in_engine"] == 1


def test_a_slow_non_streamed_reply_is_answered_in_time_and_padded(seen):
    """Chromium stops a service worker whose fetch event goes unanswered for 5 minutes: past
    TIMING.respondByMs the endpoint answers 200 and writes whitespace until the JSON is ready."""
    late = seen["late"]
    assert late["status"] == 200 and late["padding"] > 0
    assert late["body"]["choices"][0]["message"]["content"] == " ".join(["w"] * 30)
    assert seen["late_failure"]["status"] == 200 and seen["late_failure"]["body"]["error"]["code"] == "DeviceLostError"
    assert error_of(seen["early_failure"], 400)["param"] == "max_tokens"   # refusals come before the deadline
