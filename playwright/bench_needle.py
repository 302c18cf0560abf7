"""`pyshim bench --needle`: does a smaller KV cache still find a fact in a long context?

A haystack of English prose (CPython's own pydoc topics, shuffled by seed) with one needle — "The secret
number of the archive is 48213." — placed at 15%, 50% and 85% of its depth; at the end the text starts the
sentence again ("The secret number of the archive is") and the model continues greedily. A cell retrieves
when its continuation holds the number. Every cell runs with each KV cache type on the native GPU
executor (the kernels the browser runs; `--backends wasm`: the WebAssembly CPU engine, whose caches round
as the GPU's do, and whose prefill is faster on a machine without a GPU), over several seeds and context lengths; beside retrieval it
reports the share of answer tokens equal to the f32 cache's (next-token agreement on the same prompt).

Writes needle-<stamp>.json (every cell), .md (the tables) and .html (the same tables, opens offline).

Usage: pyshim bench --needle [--models qwen2.5,smollm2] [--contexts 1024,2048,4096] [--seeds 3]
                             [--depths 0.15,0.5,0.85] [--kv-types f32,f16,q8,q4] [--out DIR]
"""

from __future__ import annotations

import asyncio
import datetime
import html
import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

DEPTHS = (0.15, 0.50, 0.85)
NEEDLE = "\nThe secret number of the archive is {key}.\n"
QUESTION = "\n\nThe secret number of the archive is"
ANSWER_TOKENS = 8


@dataclass
class NeedleConfig:
    models: list[str] = field(default_factory=lambda: ["qwen2.5", "smollm2"])
    contexts: list[int] = field(default_factory=lambda: [1024, 2048, 4096])
    seeds: int = 3
    kv_types: list[str] = field(default_factory=lambda: ["f32", "f16", "q8", "q4"])
    depths: tuple[float, ...] = DEPTHS
    backend: str = "gpu"        # or "wasm": the WebAssembly CPU engine under wasmtime, on THREADS threads
    out: Path | None = None


THREADS = 2                     # the CPU engine's threads (`wasm`)


def filler_paragraphs() -> list[str]:
    from pydoc_data.topics import topics

    return [p.strip() for k in sorted(topics) for p in topics[k].split("\n\n") if len(p.strip()) > 80]


def haystack(tokenizer, paragraphs: list[str], n_tokens: int, depth: float, seed: int) -> tuple[list[int], str]:
    """Token ids of about `n_tokens` (a little less: the question must fit) with the needle at `depth`,
    ending in the question; and the key the answer must hold."""
    rng = random.Random(seed * 1000 + int(depth * 100))
    key = str(rng.randrange(10000, 100000))
    order = paragraphs[:]
    rng.shuffle(order)
    needle = tokenizer.encode(NEEDLE.format(key=key), add_special=False)
    question = tokenizer.encode(QUESTION, add_special=False)
    room = n_tokens - len(needle) - len(question) - ANSWER_TOKENS - 2
    filler: list[int] = []
    for paragraph in order:
        filler += tokenizer.encode(paragraph + "\n\n", add_special=False)
        if len(filler) >= room:
            break
    filler = filler[:room]
    at = int(len(filler) * depth)
    start = tokenizer.encode("", add_special=True)       # the model's BOS, if it has one
    return start + filler[:at] + needle + filler[at:] + question, key


async def _answer(runner, ids: list[int]) -> list[int]:
    """Greedy continuation of `ids`, ANSWER_TOKENS long (the GPU picks each token: 4 bytes read back)."""
    from pyshim.exec.runner import Step, Want

    runner.reset()
    chunk = runner.capacity.max_step_tokens
    last = (len(ids) - 1) // chunk * chunk
    for at in range(0, last, chunk):
        await runner.step(Step.of(ids[at:at + chunk], at, want=Want.NONE))
    out = [(await runner.step(Step.of(ids[last:], last, want=Want.ARGMAX)))[0].token]
    for i in range(ANSWER_TOKENS - 1):
        out.append((await runner.step(Step.of([out[-1]], len(ids) + i, want=Want.ARGMAX)))[0].token)
    return out


async def run_model(name: str, config: NeedleConfig, log) -> list[dict]:
    from pyshim.exec.gpu_runner import load_gpu
    from pyshim.exec.wasm_runner import load_wasm
    from pyshim.gguf.header import read_header_from_file
    from pyshim.plan.settings import RunSettings
    from pyshim.setup.catalog import resolve_model
    from pyshim.text.tokenizer import Tokenizer

    path = resolve_model(name)
    tokenizer = Tokenizer.from_metadata(read_header_from_file(path).metadata)
    paragraphs = filler_paragraphs()
    cells = []
    for context in config.contexts:
        prompts = [(depth, seed, *haystack(tokenizer, paragraphs, context, depth, seed))
                   for depth in config.depths for seed in range(config.seeds)]
        answers_f32: dict[tuple, list[int]] = {}
        for kv_type in config.kv_types:
            if config.backend == "wasm":
                runner = load_wasm(path, settings=RunSettings(context=context, kv_type=kv_type, threads=THREADS))
            else:
                runner = await load_gpu(path, settings=RunSettings(context=context, kv_type=kv_type))
            try:
                for depth, seed, ids, key in prompts:
                    t0 = time.perf_counter()
                    answer = await _answer(runner, ids)
                    text = tokenizer.decode(answer)
                    cell = {"model": name, "context": context, "kv_type": kv_type, "depth": depth, "seed": seed,
                            "prompt_tokens": len(ids), "key": key, "answer": text, "found": key in text,
                            "seconds": round(time.perf_counter() - t0, 2)}
                    if kv_type == "f32":
                        answers_f32[(depth, seed)] = answer
                    elif (depth, seed) in answers_f32:
                        same = sum(a == b for a, b in zip(answer, answers_f32[(depth, seed)]))
                        cell["agreement_with_f32"] = same / ANSWER_TOKENS
                    cells.append(cell)
                    log(f"{name} ctx {context} {kv_type} depth {depth:.0%} seed {seed}: "
                        f"{'found' if cell['found'] else 'missed'} ({text!r}, {cell['seconds']:.0f} s)")
            finally:
                runner.close()
    return cells


def tables(report: dict) -> dict[str, dict]:
    """Per model: rows (context, kv type) -> found counts per depth, of how many, and mean agreement."""
    out: dict[str, dict] = {}
    for c in report["cells"]:
        row = out.setdefault(c["model"], {}).setdefault((c["context"], c["kv_type"]), {"found": {}, "of": {}, "agree": []})
        row["found"][c["depth"]] = row["found"].get(c["depth"], 0) + int(c["found"])
        row["of"][c["depth"]] = row["of"].get(c["depth"], 0) + 1
        if "agreement_with_f32" in c:
            row["agree"].append(c["agreement_with_f32"])
    return out


def _rows(report: dict, model: str) -> tuple[list[str], list[list[str]]]:
    depths = report["config"]["depths"]
    header = ["context", "KV"] + [f"{d:.0%} depth" for d in depths] + ["answer tokens = f32's"]
    rows = []
    for (context, kv_type), row in sorted(tables(report)[model].items(), key=lambda kv: (kv[0][0], report["config"]["kv_types"].index(kv[0][1]))):
        agree = f"{sum(row['agree']) / len(row['agree']):.0%}" if row["agree"] else "–"
        rows.append([str(context), kv_type] + [f"{row['found'].get(d, 0)}/{row['of'].get(d, 0)}" for d in depths] + [agree])
    return header, rows


def markdown(report: dict) -> str:
    lines = [f"Needle in a haystack ({report['adapter']}; {report['elapsed_s']:.0f} s): needles found per depth, of seeds"]
    for model in tables(report):
        header, rows = _rows(report, model)
        lines += ["", f"**{model}**", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def html_report(report: dict) -> str:
    parts = []
    for model in tables(report):
        header, rows = _rows(report, model)
        parts.append(f"<h2>{html.escape(model)}</h2><table><thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header)
                     + "</tr></thead><tbody>" + "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
                     + "</tbody></table>")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>pyshim needle {html.escape(report['started_at'])}</title>
<style>body {{ font-family: sans-serif; margin: 2em; color: #222; }} table {{ border-collapse: collapse; font-size: 13px; }}
th, td {{ border: 1px solid #ccc; padding: 3px 8px; text-align: right; }}</style></head><body>
<h1>Needle in a haystack, by KV cache type</h1>
<p>{html.escape(report['started_at'])} · {html.escape(report['adapter'])} · {report['elapsed_s']:.0f} s. A fact at 15/50/85% depth of
English prose, asked for at the end; found = the greedy {ANSWER_TOKENS}-token continuation holds it, per seed.</p>
{''.join(parts)}
<details><summary>every cell</summary><pre>{html.escape(json.dumps(report['cells'], indent=1))}</pre></details>
</body></html>
"""


def run(config: NeedleConfig, log=print) -> dict:
    from pyshim.gpu import open_device

    started = datetime.datetime.now(datetime.timezone.utc)
    t0 = time.perf_counter()

    async def adapter_summary() -> str:
        device = await open_device()
        try:
            return device.caps.summary()
        finally:
            device.destroy()

    adapter = (f"the CPU engine under wasmtime ({THREADS} threads)" if config.backend == "wasm"
               else asyncio.run(adapter_summary()))
    cells = []
    for name in config.models:
        cells += asyncio.run(run_model(name, config, log))
    config_json = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items()}
    return {"started_at": started.strftime("%Y-%m-%dT%H:%M:%S+0000"), "adapter": adapter, "config": config_json,
            "cells": cells, "elapsed_s": time.perf_counter() - t0}


def write_outputs(report: dict, out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    stem = "needle-" + report["started_at"].replace(":", "").replace("-", "").replace("+0000", "Z")
    paths = {"json": out / f"{stem}.json", "markdown": out / f"{stem}.md", "html": out / f"{stem}.html"}
    paths["json"].write_text(json.dumps(report, indent=1))
    paths["markdown"].write_text(markdown(report) + "\n")
    paths["html"].write_text(html_report(report))
    return paths
