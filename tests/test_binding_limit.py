"""A 128 MiB storage binding, as many phone GPUs have: "will it fit?" (Python, and the site) applies the
executor's own rule — a weight larger than a binding is split by rows, so only a row must fit one — and
accepts SmolLM2 and Gemma 3 (whose 178 MB embedding table once made it refuse them); the GPU executor
then runs them with the limit forced, natively and in the site's Worker, giving the tokens it gives
without it."""

from __future__ import annotations

import asyncio

import pytest

from pyshim.gguf.header import read_header_from_file
from pyshim.plan.probe import probe
from pyshim.setup.catalog import resolve_model

pytestmark = [pytest.mark.models]
LIMIT = 128 << 20
LIMITS = {"max_storage_buffer_binding_size": LIMIT, "max_buffer_size": 256 << 20}
PROMPT = "The capital of France is"
TOKENS = 6


def prefix(path, n=16 << 20) -> bytes:
    with open(path, "rb") as f:
        return f.read(n)


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_will_it_fit_accepts_them_under_a_128_mib_binding(name):
    path = resolve_model(name)
    summary = probe(prefix(path), path.stat().st_size, context=2048, limits=LIMITS, judge=True, budget_bytes=2 << 30)
    assert summary["fit"]["ok"], summary["fit"]
    assert summary["widest_row"]["bytes"] < LIMIT
    if name == "gemma3":       # the rule that matters here: the embedding table alone is larger than a binding
        assert summary["largest_tensor"]["bytes"] > LIMIT
    tight = probe(prefix(path), path.stat().st_size, context=2048, judge=True,
                  limits={**LIMITS, "max_storage_buffer_binding_size": summary["widest_row"]["bytes"] - 1})
    assert not tight["fit"]["ok"] and "cannot run on this device" in " ".join(tight["fit"]["reasons"])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_the_gpu_executor_runs_them_under_a_128_mib_binding(name):
    from pyshim.exec.gpu_runner import load_gpu
    from pyshim.plan.settings import RunSettings
    from pyshim.serve.generation import generate
    from pyshim.serve.sampling import SamplingParams
    from pyshim.text.tokenizer import Tokenizer

    path = resolve_model(name)
    prompt = Tokenizer.from_metadata(read_header_from_file(path).metadata).encode(PROMPT, add_special=True)

    async def greedy(max_binding):
        runner = await load_gpu(path, settings=RunSettings(context=256), max_binding=max_binding)
        try:
            parts = max(len(w.parts) for w in runner.ops.slots.slots.values())
            return (await generate(runner, prompt, SamplingParams(), TOKENS)).token_ids, parts, runner.ops.max_binding
        finally:
            runner.close()

    forced, parts, binding = asyncio.run(greedy(LIMIT))
    assert binding <= LIMIT
    if name == "gemma3":
        assert parts >= 2                                   # the embedding table / output head, split by rows
    assert forced == asyncio.run(greedy(None))[0] and len(forced) == TOKENS


# The Worker runs Gemma 3 with the binding limit forced: the file fetched into Pyodide, then greedy
# tokens through the one generation loop on the browser face.
WORKER_RUN = """
import json
from js import fetch
from pyshim.exec.gpu_runner import load_gpu
from pyshim.gguf.header import read_header
from pyshim.gguf.tensors import BufferSource
from pyshim.plan.settings import RunSettings
from pyshim.serve.generation import generate
from pyshim.serve.sampling import SamplingParams

data = (await (await fetch("/models/{fname}")).arrayBuffer()).to_bytes()
header = read_header(data, file_size=len(data))
out = {{}}
for limit in ({limit}, None):
    runner = await load_gpu(header=header, source=BufferSource(data), settings=RunSettings(context=256), max_binding=limit)
    done = await generate(runner, {prompt}, SamplingParams(), {tokens})
    out[str(limit)] = {{"ids": done.token_ids, "parts": max(len(w.parts) for w in runner.ops.slots.slots.values()),
                        "binding": runner.ops.max_binding, "face": runner.device.caps.face}}
    runner.close()
json.dumps(out)
"""


@pytest.mark.browser
@pytest.mark.slow
def test_the_site_accepts_and_the_worker_runs_gemma3_under_a_128_mib_binding(site_page):
    import harness
    from pyshim.text.tokenizer import Tokenizer

    page, _, _ = site_page
    path = resolve_model("gemma3")
    verdict = page.evaluate("""async ([url, limits]) => {
        const { checkFit } = await import(new URL("engine/resolve.js", location.href).href);
        const head = await fetch(url, { headers: { Range: "bytes=0-16777215" } });
        const size = Number(head.headers.get("Content-Range").split("/")[1]);
        const prefix = new Uint8Array(await head.arrayBuffer());
        const adapter = (await window.pyshimEngine.request("gpu-selftest")).adapter;
        const forced = { ...adapter, limits: { ...adapter.limits, ...limits } };
        const v = await checkFit(window.pyshimEngine, forced, 2048, prefix, size);
        return { ok: v.ok, reasons: v.reasons, largest: v.summary.largest_tensor.bytes };
    }""", [f"models/{path.name}", LIMITS])
    assert verdict["ok"], verdict
    assert verdict["largest"] > LIMIT
    prompt = Tokenizer.from_metadata(read_header_from_file(path).metadata).encode(PROMPT, add_special=True)
    code = WORKER_RUN.format(fname=path.name, limit=LIMIT, prompt=prompt, tokens=TOKENS)
    out = harness.engine_request(page, "exec", {"code": code}, timeout_ms=900_000)
    forced, free = out[str(LIMIT)], out["None"]
    assert forced["face"] == "browser" and forced["binding"] <= LIMIT and forced["parts"] >= 2 and free["parts"] == 1
    assert forced["ids"] == free["ids"] and len(forced["ids"]) == TOKENS
