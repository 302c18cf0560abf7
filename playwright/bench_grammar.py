"""`pyshim bench --grammar`: what constrained decoding (response_format) costs per token, against the same
prompts decoded without a constraint, natively (llguidance) and in headless Chromium (XGrammar's wasm).

For each model and backend, one load: each of the first --schemas test schemas (tests/json_schemas.py's
generator, prompts asking for that JSON) is answered greedily twice — plain (a fixed number of tokens,
end of generation ignored) and constrained by its schema (until the JSON ends). A row gives decode ms
per token both ways (decode time over decode steps: prefill excluded — a constrained reply's first token,
`{`, is usually forced and taken before the prompt's GPU work has finished, so that work lands in its
decode time: the plain run's prefill of the same prompt is taken off it), the extra share, the grammar
engine's own ms per token (its masks and advances), the steps whose top-k held too few allowed tokens
(re-run for all logits), and whether every constrained reply validated against its schema.

Writes grammar-<stamp>.json, .md and .html. Usage:
  pyshim bench --grammar [--models qwen2.5,smollm2] [--backends gpu,browser] [--schemas 4] [--tokens 32]
"""

from __future__ import annotations

import asyncio
import datetime
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent.parent / "tests"
CONTEXT = 1024


@dataclass
class GrammarConfig:
    models: list[str] = field(default_factory=lambda: ["qwen2.5", "smollm2"])
    backends: list[str] = field(default_factory=lambda: ["gpu", "browser"])
    schemas: int = 4
    tokens: int = 32            # the plain runs' length (the constrained ones end with their JSON)
    out: Path | None = None


def _schemas():
    if str(TESTS_DIR) not in sys.path:
        sys.path.insert(0, str(TESTS_DIR))
    import json_schemas

    return json_schemas


def _valid(text: str, schema: dict) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def _wire(tokens: int, fmt: dict | None) -> dict:
    if fmt is None:
        return {"temperature": 0, "max_tokens": tokens, "ignore_eos": True}
    return {"temperature": 0, "max_tokens": 4 * tokens, "response_format": fmt}


async def _native(path: Path, jobs: list[dict], tokens: int) -> list[dict]:
    from pyshim.exec.gpu_runner import load_gpu
    from pyshim.plan.settings import RunSettings
    from pyshim.serve.protocol import Sampling
    from pyshim.serve.session import Session

    runner = await load_gpu(path, settings=RunSettings(context=CONTEXT))
    session = Session(runner)
    try:
        await session.prepare()
        out = []
        for job in jobs:
            ids = session.template.encode(session.tokenizer, [{"role": "user", "content": job["prompt"]}])
            done = await session.complete(ids, Sampling.parse(_wire(tokens, job["format"])), stop_ids=session.stop_ids(
                Sampling.parse({}), chat=True), reuse=False)        # (each job's whole prompt: its prefill is subtracted)
            out.append({"text": done.text, **done.timings()})
        return out
    finally:
        session.close()


def _browser(path: Path, jobs: list[dict], tokens: int) -> list[dict]:
    from pyshim.cli import browser
    from pyshim.text.chat import ChatTemplate
    from pyshim.text.tokenizer import Tokenizer

    header = browser.open_header(path)
    tokenizer = Tokenizer.from_metadata(header.metadata)
    template = ChatTemplate.from_metadata(header.metadata, tokenizer)
    stops = sorted(set(tokenizer.eog_ids) | set(template.stop_ids))
    out = []
    with browser.session(path, {"context": CONTEXT}) as request:
        for job in jobs:
            ids = template.encode(tokenizer, [{"role": "user", "content": job["prompt"]}])
            r = request("complete", {"settings": {"context": CONTEXT}, "prompt_ids": ids, "stop_token_ids": stops,
                                     "sampling": _wire(tokens, job["format"]), "reuse": False})
            out.append({"text": r["text"], **r["timings"]})
    return out


def _mean(values) -> float:
    """The mean of the figures a run has (None: no decode step to divide by; 0.0 is a figure)."""
    return statistics.mean(v for v in values if v is not None)


def _per_token(r: dict, key: str = "decode_ms") -> float | None:
    return r[key] / r["decode_steps"] if r["decode_steps"] else None


def _constrained_per_token(r: dict, prefill_ms: float) -> float | None:
    """Decode ms per token of a constrained reply, its prompt's GPU work (`prefill_ms`, the plain runs' best
    prefill of the same prompt) taken off (see the docstring)."""
    if not r["decode_steps"]:
        return None
    return max(0.0, r["prefill_ms"] + r["decode_ms"] - prefill_ms) / r["decode_steps"]


def run(config: GrammarConfig, log=print) -> dict:
    from pyshim.setup.catalog import resolve_model

    json_schemas = _schemas()
    cases = json_schemas.cases(config.schemas)
    jobs = []
    for case in cases:          # plain, then constrained, per schema: the same prompt, the same load
        jobs.append({"prompt": case["prompt"], "format": None})
        jobs.append({"prompt": case["prompt"], "format": json_schemas.response_format(case)})
    report = {"stamp": datetime.datetime.now().strftime("%Y%m%d-%H%M%S"), "schemas": config.schemas, "tokens": config.tokens, "rows": []}
    for name in config.models:
        path = resolve_model(name)
        for backend in config.backends:
            log(f"[grammar] {name} on {backend}: {len(cases)} schemas, plain and constrained")
            # the first job once more before them, not counted: a prompt's first prefill compiles its pipelines,
            # which would land in the first plain run's prefill, the figure the constrained runs subtract
            # (SmolLM2 on lavapipe, one schema: the constrained estimate came out at 0 under that)
            warmed = [jobs[0], *jobs]
            warm, *results = asyncio.run(_native(path, warmed, config.tokens)) if backend == "gpu" else _browser(path, warmed, config.tokens)
            plain, constrained = results[0::2], results[1::2]
            plain_ms = _mean(map(_per_token, plain))
            # the least a prefill of each prompt took: a neighbour's load only ever adds to one, and a plain
            # prefill slowed so by a busy machine took the whole constrained estimate to 0 (a CI run, SmolLM2)
            prefills = [p["prefill_ms"] for p in plain]
            prefills[0] = min(prefills[0], warm["prefill_ms"])
            kept_ms = _mean(map(_constrained_per_token, constrained, prefills))
            grammar_ms = _mean(_per_token(r, "grammar_ms") for r in constrained)
            report["rows"].append({
                "model": name, "backend": backend, "plain_ms_per_token": round(plain_ms, 2), "constrained_ms_per_token": round(kept_ms, 2),
                "extra_pct": round(100 * (kept_ms / plain_ms - 1), 1), "grammar_ms_per_token": round(grammar_ms, 2),
                "constrained_tokens": sum(r["decode_steps"] for r in constrained),
                "fallbacks": sum(r.get("grammar_fallbacks", 0) for r in constrained),
                "forced": sum(r.get("grammar_forced", 0) for r in constrained),
                "valid": sum(_valid(r["text"], c["schema"]) for r, c in zip(constrained, cases)), "replies": len(cases),
                "texts": [r["text"] for r in constrained]})
    return report


def markdown(report: dict) -> str:
    lines = [f"Constrained decoding (response_format json_schema), greedy, {report['schemas']} schemas; "
             f"plain runs {report['tokens']} tokens", "",
             "| model | backend | plain ms/token | constrained ms/token | extra | grammar engine ms/token | "
             "all-logits re-runs | forced tokens | valid replies |", "|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        lines.append(f"| {r['model']} | {r['backend']} | {r['plain_ms_per_token']} | {r['constrained_ms_per_token']} | "
                     f"{r['extra_pct']:+.1f}% | {r['grammar_ms_per_token']} | {r['fallbacks']} of {r['constrained_tokens']} | "
                     f"{r.get('forced', '–')} | {r['valid']}/{r['replies']} |")
    return "\n".join(lines) + "\n"


def write_outputs(report: dict, out: Path) -> dict[str, Path]:
    from bench_report import write_markdown_report

    return write_markdown_report(report, markdown(report), out, "grammar", "pyshim constrained decoding")
