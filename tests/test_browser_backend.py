"""`pyshim generate/score --backend browser`: the request runs in the site's engine Worker inside headless
Chromium (Pyodide + the WebGPU executor on SwiftShader) and prints what `--backend cpu` prints.

Each CLI call starts its own dev server and Chromium (what a user's call does), boots Pyodide, stores
the model in the page's IndexedDB and loads it into the GPU: ~30 s before the first token here, then
SmolLM2 decodes at ~1 tok/s and Gemma 3 at ~0.5. So: few calls, short texts.

The reference runs in the browser's arithmetic: on a CPU adapter (SwiftShader) the executor takes its
int8 route (activations rounded as llama.cpp's CPU backend does; the JSON says "arithmetic": "int8"), so
the CPU reference runs with --like-llama-cpp, its exact emulation of that rounding.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from pyshim.catalog import model_path
from pyshim.cli import main

pytestmark = [pytest.mark.browser, pytest.mark.models]

PROMPT = "The capital of France is"
GREEDY_TOKENS = 32
SCORE_TEXT = "The harbour master kept a ledger of every ship that crossed the bar after dark."
# Positions where the CPU's best two logits are closer than this may flip on SwiftShader's rounding.
NEAR_TIE = 0.05
# The browser's best logit per position against the CPU's (f32 both; SwiftShader's exp/tanh are less exact).
LOGIT_ATOL = 0.05


def _model(name: str) -> str:
    path = model_path(name)
    if not path.is_file():
        pytest.fail(f"{name} is missing: run `pyshim setup`")
    return str(path)


def _json(capsys, argv: list[str]) -> dict:
    assert main(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _like(browser: dict) -> list[str]:
    """The reference's flag for the browser's arithmetic."""
    assert browser["arithmetic"] in ("int8", "f32")
    return ["--like-llama-cpp"] if browser["arithmetic"] == "int8" else []


def _greedy_pair(capsys, name: str) -> tuple[dict, dict]:
    argv = ["generate", _model(name), "--prompt", PROMPT, "--max-tokens", str(GREEDY_TOKENS), "--ignore-eos", "--ctx", "256", "--json"]
    browser = _json(capsys, argv + ["--backend", "browser"])
    cpu = _json(capsys, argv + _like(browser))
    assert cpu["arithmetic"] == browser["arithmetic"]
    return browser, cpu


def test_greedy_32_tokens_in_the_browser_equal_the_cpu_reference_smollm2(capsys):
    browser, cpu = _greedy_pair(capsys, "smollm2")
    print({k: v for k, v in browser.items() if k not in ("ids", "prompt_ids")})
    assert browser["prompt_ids"] == cpu["prompt_ids"]
    assert browser["ids"] == cpu["ids"] and len(cpu["ids"]) == GREEDY_TOKENS
    assert browser["text"] == cpu["text"] and browser["finish_reason"] == "length"
    assert browser["decode_tok_s"] > 0 and browser["load_ms"] > 0
    assert 0 <= browser["cpu_share_pct"] <= 100


@pytest.mark.slow
def test_greedy_32_tokens_in_the_browser_equal_the_cpu_reference_gemma3(capsys):
    browser, cpu = _greedy_pair(capsys, "gemma3")
    print({k: v for k, v in browser.items() if k not in ("ids", "prompt_ids")})
    assert browser["ids"] == cpu["ids"] and len(cpu["ids"]) == GREEDY_TOKENS


def test_score_in_the_browser_agrees_with_the_cpu_reference(capsys):
    argv = ["score", _model("smollm2"), "--text", SCORE_TEXT, "--top-k", "5", "--ctx", "256", "--json"]
    browser = _json(capsys, argv + ["--backend", "browser"])
    cpu = _json(capsys, argv + _like(browser))
    assert browser["ids"] == cpu["ids"] and len(browser["top_ids"]) == len(cpu["ids"])
    cpu_logits, got_logits = np.array(cpu["top_logits"]), np.array(browser["top_logits"])
    clear = cpu_logits[:, 0] - cpu_logits[:, 1] > NEAR_TIE
    top1_cpu, top1_browser = np.array(cpu["top_ids"])[:, 0], np.array(browser["top_ids"])[:, 0]
    assert clear.sum() >= 0.8 * len(clear)          # the check below covers most positions
    assert (top1_browser[clear] == top1_cpu[clear]).all()
    np.testing.assert_allclose(got_logits[:, 0], cpu_logits[:, 0], atol=LOGIT_ATOL)
