"""`pyshim bench --batch`: several sequences decoded together. Natively (`gpu`) one runner holds several
sequences in its paged KV cache (`load_gpu(max_seqs=...)`); each batched decode step runs one token of every sequence in one
program, so the weights a step reads serve all of them. For 1, 2, 4 (`--batches`) sequences with prompts
of different lengths: the aggregate decode tok/s (tokens of all sequences per second), each sequence's,
the speed-up over one sequence, and whether every sequence's greedy tokens equal the ones it gets alone.
Natively each step is timed from the second batched step on (the first records and builds the step's
program), the median step kept, and the batch sizes measured in turn twice (the faster kept). Then, through
the scheduler's path, the time to first token of a request arriving while the others decode, and the
prefill a request under a ~200-token system prompt saves by sharing another sequence's KV pages.

`--backends wasm`: the same natively on the WebAssembly CPU engine (one thread, under wasmtime), whose
batched step takes every sequence's token through one matmul.

In Chromium (`--backends browser`, a catalog model such as smollm2) the page makes an engine with
{parallel: N, device: "gpu"} (`browser-cpu`: the CPU engine) and sends N completions at once through the
JS API, twice: with one new token (their prompts alone) and with `--tokens`; the aggregate decode tok/s is
the extra tokens over the extra time.

Writes batch-<stamp>.json and .md. Usage:
  pyshim bench --batch [--models smollm2-135m] [--batches 1,2,4] [--tokens 16] [--backends gpu,browser]
"""

from __future__ import annotations

import asyncio
import datetime
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

PROMPTS = ["The harbour master kept a ledger of every ship that crossed the bar after dark, and",
           "Three rules for a good sourdough starter:",
           "In 1854 the physician John Snow mapped the cholera cases around Broad Street and found",
           "def fibonacci(n):",
           "The committee's report on the bridge listed four causes of the collapse. First,",
           "Dear Ms. Alvarez, thank you for your letter of the 12th. Regarding",
           "A haiku about autumn rain:",
           "Photosynthesis turns light into chemical energy in two stages:"]
CONTEXT = 512
ROUNDS = 2          # natively, the batch sizes measured in turn this many times, each one's faster median kept


@dataclass
class BatchConfig:
    models: list[str] = field(default_factory=lambda: ["smollm2-135m"])
    batches: list[int] = field(default_factory=lambda: [1, 2, 4])
    tokens: int = 16
    backends: list[str] = field(default_factory=lambda: ["gpu"])
    out: Path | None = None


# In the page: an engine with {parallel: n}, n completions at once (one new token, then `tokens`), timed.
BROWSER_JS = """async ([model, context, n, prompts, tokens, device]) => {
  const { createEngine } = await import('/pyshim.js');
  // the engine named ("auto" picks by a measured probe): WebGPU, or the CPU engine (`browser-cpu`)
  const engine = await createEngine({model, context, parallel: n, device});
  try {
    const run = async (max) => {
      const t0 = performance.now();
      const replies = await Promise.all(prompts.slice(0, n).map((prompt) =>
        engine.completions.create({prompt, max_tokens: max, temperature: 0, ignore_eos: true})));
      return {ms: performance.now() - t0, texts: replies.map((r) => r.choices[0].text)};
    };
    await run(2);                                   // the step programs built, the pipelines compiled
    const prefill = await run(1);
    const whole = await run(tokens);
    const worker = await engine.client.request('stats', {});
    return {prefill_ms: prefill.ms, whole_ms: whole.ms, texts: whole.texts, worker, adapter: engine.adapter?.summary ?? null};
  } finally {
    engine.terminate();
  }
}"""


async def _decode(runner, prompts: list[list[int]], tokens: int):
    """Prefill each sequence, then `tokens` greedy steps over all of them together (one sequence: the
    ordinary decode step): (each sequence's ids, the median seconds of the timed steps: on a shared machine
    a busy moment shows as a few slow steps, which a sum would count)."""
    from pyshim.exec.runner import Slice, Step, Want

    nexts, positions = [], []
    for seq, prompt in enumerate(prompts):
        runner.reset(seq)
        (first,) = await runner.step(Step.of(prompt, 0, seq=seq, want=Want.ARGMAX))
        nexts.append(first.token)
        positions.append(len(prompt))
    ids = [[t] for t in nexts]
    seconds = []
    for i in range(tokens):
        t0 = time.perf_counter()
        answers = await runner.step(Step(tuple(Slice((t,), p, seq) for seq, (t, p) in enumerate(zip(nexts, positions))),
                                         Want.ARGMAX))
        if i:                       # the first step builds the program
            seconds.append(time.perf_counter() - t0)
        nexts = [a.token for a in answers]
        positions = [p + 1 for p in positions]
        for seq, t in enumerate(nexts):
            ids[seq].append(t)
    return ids, statistics.median(seconds)


SYSTEM = ("You are the reference desk of a public library. Answer briefly and name the shelf where the reader "
          "finds more. The library holds fiction by author, non-fiction by the Dewey decimal system, periodicals "
          "for two years, maps in the basement, and a local history room open on Tuesdays and Thursdays. ")


async def _under_load(runner, tok, prompts: list[list[int]], tokens: int) -> dict:
    """Through the scheduler's path (BatchingRunner + the generation loop): the time to the first token of a
    request arriving while the others decode, against it alone; and a second request under a ~200-token
    system prompt another sequence holds, which shares its KV pages instead of prefilling it again."""
    from pyshim.serve.batching import BatchingRunner
    from pyshim.serve.generation import generate
    from pyshim.serve.sampling import SamplingParams

    greedy = SamplingParams(temperature=0.0)
    batching = BatchingRunner(runner)
    last = len(prompts) - 1
    alone = await generate(batching, prompts[last], greedy, 1, seq=last, reuse=False)
    others = [asyncio.ensure_future(generate(batching, p, greedy, 4 * tokens, seq=seq, reuse=False))
              for seq, p in enumerate(prompts[:last])]
    start = runner.stats.steps
    while runner.stats.steps < start + last + 3:        # their prompts in, a few decode steps run
        await asyncio.sleep(0.005)
    loaded = await generate(batching, prompts[last], greedy, 1, seq=last, reuse=False)
    await asyncio.gather(*others)
    system = tok.encode(SYSTEM * 4, add_special=True)[:200]
    first, second = system + tok.encode(" Where are the maps?"), system + tok.encode(" When is local history open?")
    await generate(batching, first, greedy, 1, seq=0, reuse=False)
    shared = await generate(batching, second, greedy, 1, seq=1)
    unshared = await generate(batching, second, greedy, 1, seq=1, reuse=False)
    return {"others": last, "ttft_alone_ms": round(alone.prefill_ms, 1), "ttft_under_load_ms": round(loaded.prefill_ms, 1),
            "system_tokens": len(system), "shared_tokens": shared.cached_tokens,
            "prefill_shared_ms": round(shared.prefill_ms, 1), "prefill_unshared_ms": round(unshared.prefill_ms, 1)}


async def _run_model(path: Path, config: BatchConfig, backend: str = "gpu") -> dict:
    """Natively: the GPU executor (`gpu`), or the WebAssembly CPU engine under wasmtime (`wasm`, one thread)."""
    from pyshim.exec.gpu_runner import load_gpu
    from pyshim.exec.wasm_runner import load_wasm
    from pyshim.plan.settings import RunSettings
    from pyshim.text.tokenizer import Tokenizer

    most = max(config.batches)
    if backend == "wasm":
        runner = load_wasm(path, settings=RunSettings(context=CONTEXT))
        adapter = f"the CPU engine under wasmtime ({runner.threads} thread{'s' * (runner.threads > 1)}, relaxed SIMD {'yes' if runner.relaxed_simd else 'no'})"
    else:
        runner = await load_gpu(path, settings=RunSettings(context=CONTEXT), max_seqs=most)
        adapter = runner.device.caps.summary()
    try:
        await runner.prepare()
        tok = Tokenizer.from_metadata(runner.header.metadata)
        prompts = [tok.encode(PROMPTS[i % len(PROMPTS)], add_special=True) for i in range(most)]
        alone = [(await _decode(runner, [p], config.tokens))[0][0] for p in prompts]   # each sequence's own tokens
        rows, one, steps, same = [], None, {}, {}
        for _ in range(ROUNDS):         # every batch size in turn, again: a slow minute hits them alike
            for b in config.batches:
                ids, step = await _decode(runner, prompts[:b], config.tokens)
                steps[b] = min(steps.get(b, step), step)
                same[b] = same.get(b, True) and ids == alone[:b]
        for b in config.batches:
            step = steps[b]
            aggregate = b / step
            one = one or (aggregate if b == 1 else None)
            rows.append({"sequences": b, "aggregate_tok_s": round(aggregate, 3),
                         "per_sequence_tok_s": round(1 / step, 3), "speedup": round(aggregate / one, 2) if one else None,
                         "ms_per_step": round(1e3 * step, 1), "same_tokens": same[b]})
        load = await _under_load(runner, tok, prompts, config.tokens) if most > 1 else None
        kv = runner.memory()["kv_bytes"] if backend == "wasm" else runner.ops.memory()["kv"]
        return {"adapter": adapter, "arithmetic": runner.arithmetic.value, "kv_mb": round(kv / 1e6, 1), "rows": rows,
                "under_load": load}
    finally:
        runner.close()


def _run_browser(name: str, config: BatchConfig, device: str = "gpu") -> dict:
    import harness
    from playwright.sync_api import sync_playwright

    from pyshim.setup import vendoring

    vendoring.refresh_pyshim()              # the page installs pyshim from this checkout's wheel
    rows, one, alone, adapter = [], None, None, None
    with harness.DevServer(isolated=True) as server, sync_playwright() as p:
        browser = harness.launch_chromium(p)
        context = browser.new_context()
        page, _ = harness.open_page(context, server.url + "examples/api.html")
        page.set_default_timeout(3_600_000)
        for b in config.batches:
            r = page.evaluate(BROWSER_JS, [name, CONTEXT, b, PROMPTS, config.tokens, device])
            seconds = (r["whole_ms"] - r["prefill_ms"]) / 1e3
            aggregate = b * (config.tokens - 1) / seconds
            one = one or (aggregate if b == 1 else None)
            alone = alone or (r["texts"] if b == 1 else None)
            adapter = adapter or r["adapter"]
            rows.append({"sequences": b, "aggregate_tok_s": round(aggregate, 3), "per_sequence_tok_s": round(aggregate / b, 3),
                         "speedup": round(aggregate / one, 2) if one else None,
                         "ms_per_step": round(1e3 * seconds / (config.tokens - 1), 1),
                         "same_tokens": r["texts"][:1] == (alone or [])[:1], "batched_steps": r["worker"]["batching"]
                         and r["worker"]["batching"]["batched_steps"]})
        context.close()
        browser.close()
    where = f"Chromium: {adapter}" if device == "gpu" else "Chromium: the CPU engine"
    return {"adapter": where, "arithmetic": "the engine's default", "kv_mb": None, "rows": rows}


def run(config: BatchConfig, log=print) -> dict:
    from pyshim.setup.catalog import resolve_model

    report = {"stamp": datetime.datetime.now().strftime("%Y%m%d-%H%M%S"), "tokens": config.tokens, "context": CONTEXT,
              "models": {}}
    for name in config.models:
        for backend in config.backends:
            log(f"[batch] {name} ({backend}): {', '.join(map(str, config.batches))} sequences, {config.tokens} tokens each")
            key = name if backend == "gpu" else f"{name} ({backend})"
            report["models"][key] = (asyncio.run(_run_model(resolve_model(name), config, backend)) if backend in ("gpu", "wasm")
                                     else _run_browser(name, config, device="cpu" if backend == "browser-cpu" else "gpu"))
    return report


def markdown(report: dict) -> str:
    lines = [f"Sequences decoded together (greedy, {report['tokens']} tokens each, context {report['context']}; "
             "aggregate = tokens of all sequences per second)", ""]
    for name, m in report["models"].items():
        kv = "" if m["kv_mb"] is None else f", KV cache {m['kv_mb']} MB"
        lines += [f"**{name}** on {m['adapter']}, {m['arithmetic']} route{kv}", "",
                  "| sequences | aggregate tok/s | per sequence tok/s | × one sequence | ms a step | same tokens as alone |",
                  "|---|---|---|---|---|---|"]
        for r in m["rows"]:
            lines.append(f"| {r['sequences']} | {r['aggregate_tok_s']} | {r['per_sequence_tok_s']} | {r['speedup']} | "
                         f"{r['ms_per_step']} | {'yes' if r['same_tokens'] else 'NO'} |")
        load = m.get("under_load")
        if load:
            lines += ["", f"Time to first token of a request arriving while {load['others']} others decode: "
                          f"{load['ttft_under_load_ms']} ms (alone {load['ttft_alone_ms']} ms). A request under the "
                          f"{load['system_tokens']}-token system prompt another sequence holds takes "
                          f"{load['shared_tokens']} tokens' keys from it: prefill {load['prefill_shared_ms']} ms "
                          f"(without sharing {load['prefill_unshared_ms']} ms)."]
        lines.append("")
    return "\n".join(lines)


def write_outputs(report: dict, out: Path) -> dict[str, Path]:
    from bench_report import write_markdown_report

    return write_markdown_report(report, markdown(report), out, "batch", "pyshim: sequences decoded together")
