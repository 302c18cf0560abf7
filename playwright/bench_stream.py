"""`pyshim bench --stream`: a model bigger than its GPU budget, streamed from the store, against the same
model fully resident: a mixture of experts with its routed experts in an expert cache
(pyshim.gpu.expert_cache), a dense model with its last layers through rotating buffers
(pyshim.gpu.layer_stream) — whichever pyshim.plan.auto plans for the budget.

For each model: a resident run (the reference tokens and decode speed), then one run per budget with the
plan auto makes for it. Each run prefills the same prompt and decodes greedily; a row reports decode
tok/s, the cache's hit rate, store bytes and seconds per decode token (prefill excluded), GPU MB against
the budget, whether the tokens equal the resident run's, and the tok/s predicted before the run: the
resident token time plus the store bytes a token reads (experts: at random routing) over the store → GPU
speed measured first (read and upload of 64 MiB of the file).

A mixture's native run is made twice: with each layer fetching the next layer's guessed experts while the
GPU works where its guesses come true (pyshim.gpu.expert_cache; the row says how many guessed experts the
router then wanted, how many were fetched ahead, and the seconds spent so) and without guessing.

Native GPU (wgpu) by default; `--backends browser,gpu` adds a row per budget in headless Chromium (the
model stored in an on-disk profile's IndexedDB, missed experts read from there).

Writes stream-<stamp>.json and .md. Usage:
  pyshim bench --stream [--models olmoe-1b-7b] [--budgets-mb 1000,2000] [--tokens 16] [--backends gpu]
"""

from __future__ import annotations

import asyncio
import datetime
import time
from dataclasses import dataclass, field
from pathlib import Path

PROMPT = "The harbour master kept a ledger of every ship that crossed the bar after dark, and"
PROBE_BYTES = 64 << 20
CONTEXT = 1024          # every run's (the streamed ones' KV type is auto's pick; the resident run's q8, alike)


@dataclass
class StreamConfig:
    models: list[str] = field(default_factory=lambda: ["olmoe-1b-7b"])
    budgets_mb: list[float] = field(default_factory=lambda: [1000.0, 2000.0])
    tokens: int = 16
    backends: list[str] = field(default_factory=lambda: ["gpu"])
    out: Path | None = None


class _FirstToken:
    """A decoder stand-in whose first output marks the end of the prompt (the cache's stats are taken there)."""

    def __init__(self, on_first):
        self.on_first, self.seen = on_first, False

    def add(self, token: int) -> str:
        if not self.seen:
            self.seen = True
            self.on_first()
        return ""

    def finish(self) -> str:
        return ""


def store_speed(path: Path, device) -> float:
    """Bytes per second from the file to a GPU buffer (memory-mapped read + queued write, then waited), the
    second of two passes over the same range: the file warm in the page cache, as a streamed model's is
    once it has run (the first pass measures the disk)."""
    from pyshim.gguf.tensors import FileSource

    source = FileSource(path)
    n = min(PROBE_BYTES, source.size // 2) // 4 * 4
    buf = device.buffer(n, label="store_probe")
    for _ in range(2):
        t0 = time.perf_counter()
        device.write(buf, source.read(source.size - n, n))
        asyncio.run(device.read(buf, 4))
        seconds = time.perf_counter() - t0
    device.release(buf)
    return n / seconds


async def _run_native(path: Path, prompt: list[int], tokens: int, budget_bytes: int | None, context: int,
                      guess: bool = True) -> dict:
    from pyshim.exec.gpu_runner import load_gpu
    from pyshim.plan.settings import RunSettings
    from pyshim.serve.generation import generate
    from pyshim.serve.sampling import SamplingParams

    settings = (RunSettings(kv_type="auto", budget_bytes=budget_bytes, context=context) if budget_bytes
                else RunSettings(context=context, kv_type="q8"))
    t0 = time.perf_counter()
    runner = await load_gpu(path, settings=settings)
    try:
        await runner.prepare()
        load_s = time.perf_counter() - t0
        cache, stream = runner.ops.expert_cache, runner.ops.layer_stream
        if cache is not None:
            cache.ahead = guess
        marks = {}
        decoder = _FirstToken(lambda: marks.update(prefill=None if cache is None else cache.stats.as_dict(),
                                                   layers=None if stream is None else stream.stats.as_dict()))
        done = await generate(runner, prompt, SamplingParams(), tokens, decoder=decoder, on_text=lambda piece, token: None,
                              reuse=False)
        row = {"load_s": round(load_s, 2), "ids": done.token_ids, "decode_tok_s": round(done.decode_tok_per_s, 3),
               "prefill_tok_s": round(done.prefill_tok_per_s, 3), "decode_tokens": done.decode_steps,
               "gpu_mb": round(runner.ops.memory()["total"] / 1e6, 1), "auto": runner.auto}
        if cache is not None:
            end, start = cache.stats.as_dict(), marks["prefill"]
            wanted, hits = end["wanted"] - start["wanted"], end["hits"] - start["hits"]
            steps = max(1, done.decode_steps)
            row.update(slots=cache.n_slots, hit_rate=round(hits / wanted, 4) if wanted else 1.0,
                       store_mb_per_token=round((end["uploaded_bytes"] - start["uploaded_bytes"]) / steps / 1e6, 2),
                       store_s_per_token=round((end["fetch_s"] - start["fetch_s"]) / steps, 4),
                       ahead_s_per_token=round((end["ahead_s"] - start["ahead_s"]) / steps, 4),
                       guesses=_guesses({k: end[k] - start[k] for k in ("checked", "checked_right", "guessed", "guess_hits")}),
                       prefill_hit_rate=start["hit_rate"])
        if stream is not None:
            end, start = stream.stats.as_dict(), marks["layers"]
            steps = max(1, done.decode_steps)
            row.update(streamed_layers=len(stream.layers),
                       store_mb_per_token=round((end["uploaded_bytes"] - start["uploaded_bytes"]) / steps / 1e6, 2),
                       store_s_per_token=round((end["fetch_s"] - start["fetch_s"]) / steps, 4),
                       prefill_store_mb=round(start["uploaded_bytes"] / 1e6, 1))
        return row
    finally:
        runner.close()


def _guesses(c: dict) -> str:
    """The guesses at the next layer's experts: how many came true, how many were fetched ahead and used."""
    return f"{c['checked_right']} of {c['checked']} right; {c['guessed']} fetched, {c['guess_hits']} used"


def _run_browser(path: Path, prompt: list[int], tokens: int, budget_bytes: int, context: int) -> dict:
    from pyshim.cli import browser

    wire = {"temperature": 0, "max_tokens": tokens, "ignore_eos": True}
    t0 = time.perf_counter()
    # (the GPU engine: on a software adapter auto would pick the CPU engine, which streams nothing)
    r = browser.run(path, "complete", {"settings": {"kv_type": "auto", "budget_bytes": budget_bytes, "context": context,
                                                    "device": "gpu"},
                                       "prompt_ids": prompt, "sampling": wire})
    t = r["timings"]
    cache, stream = r.get("expert_cache") or {}, r.get("layer_stream") or {}
    return {"wall_s": round(time.perf_counter() - t0, 1), "ids": r["token_ids"], "decode_tok_s": round(t["decode_tok_per_s"], 3),
            "load_s": round(t["load_ms"] / 1e3, 2), "slots": cache.get("slots"), "hit_rate": cache.get("hit_rate"),
            "streamed_layers": stream.get("streamed_layers"),
            "guesses": _guesses(cache) + " (prompt included)" if cache else None,
            "store_mb_total": round((cache or stream).get("uploaded_bytes", 0) / 1e6, 1), "auto": r.get("auto")}


def run(config: StreamConfig, log=print) -> dict:
    from pyshim.gguf.header import read_header_from_file
    from pyshim.gguf.spec import ModelSpec
    from pyshim.gpu import open_device
    from pyshim.plan import auto
    from pyshim.plan.memory import streamed_bytes_per_token
    from pyshim.setup.catalog import resolve_model
    from pyshim.text.tokenizer import Tokenizer

    device = asyncio.run(open_device())
    speed = store_speed(resolve_model(config.models[0]), device)
    adapter = device.caps.summary()
    device.destroy()
    log(f"[stream] store -> GPU {speed / 1e6:.0f} MB/s on {adapter}")
    report = {"stamp": datetime.datetime.now().strftime("%Y%m%d-%H%M%S"), "adapter": adapter,
              "store_mb_s": round(speed / 1e6, 1), "tokens": config.tokens, "models": {}}
    for name in config.models:
        path = resolve_model(name)
        header = read_header_from_file(path)
        spec = ModelSpec.from_header(header)
        context = min(CONTEXT, spec.context_length)
        prompt = Tokenizer.from_metadata(header.metadata).encode(PROMPT, add_special=True)[:context // 2]
        log(f"[stream] {name}: resident")
        resident = asyncio.run(_run_native(path, prompt, config.tokens, None, context))
        rows = [{"mode": "resident", "backend": "gpu", "budget_mb": None, **resident, "same_tokens": True}]
        t_token = 1 / resident["decode_tok_s"] if resident["decode_tok_s"] else 0.0
        for mb in config.budgets_mb:
            budget = int(mb * 1e6)
            choice = auto.choose(spec, header.tensors, budget_bytes=budget, context=context)
            if choice is None or choice.mode == "resident":
                rows.append({"mode": "none fits" if choice is None else "resident", "budget_mb": mb})
                continue
            what = f"{choice.expert_slots} slots" if choice.expert_slots else f"{choice.streamed_layers} layers streamed"
            per_token = streamed_bytes_per_token(spec, header.tensors, expert_slots=choice.expert_slots,
                                                 streamed_layers=choice.streamed_layers)
            predicted = 1 / (t_token + per_token / speed)
            # natively the experts run twice: fetching the next layer's guessed experts ahead, and not
            runs = [(b, True) for b in config.backends] + [("gpu", False)] * ("gpu" in config.backends and bool(choice.expert_slots))
            for backend, guess in runs:
                log(f"[stream] {name}: {mb:.0f} MB budget, {what}, {backend}{'' if guess else ', no guessing ahead'}")
                row = (asyncio.run(_run_native(path, prompt, config.tokens, budget, context, guess)) if backend == "gpu"
                       else _run_browser(path, prompt, config.tokens, budget, context))
                # (predicted from the native resident run and the file's speed: the browser's own store and
                # compute speeds are not measured here, so its rows carry no prediction)
                rows.append({"mode": choice.mode + ("" if guess else ", no guess"), "backend": backend, "budget_mb": mb,
                             **row, "predicted_tok_s": round(predicted, 3) if backend == "gpu" else None,
                             "same_tokens": row["ids"] == resident["ids"]})
        report["models"][name] = {"file_mb": round(header.file_size / 1e6, 1), "experts": spec.n_experts,
                                  "used": spec.n_experts_used, "layers": spec.n_layers, "rows": rows}
    return report


def markdown(report: dict) -> str:
    lines = [f"Streaming from the store, {report['tokens']} decode tokens; store -> GPU {report['store_mb_s']} MB/s "
             f"({report['adapter']})", ""]
    for name, m in report["models"].items():
        what = f"{m['experts']} experts, {m['used']} per token" if m["experts"] else f"{m['layers']} layers"
        lines += [f"**{name}** ({m['file_mb']:,.0f} MB, {what})", "",
                  "| mode | backend | budget MB | slots / streamed layers | GPU MB | decode tok/s | predicted | hit rate | "
                  "store MB/token | store s/token (stalled) | fetched ahead s/token | guesses at the next layer | same tokens |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in m["rows"]:
            cell = lambda k: "" if r.get(k) is None else str(r[k])  # noqa: E731
            held = cell("slots") or cell("streamed_layers")
            lines.append(f"| {r['mode']} | {cell('backend')} | {cell('budget_mb')} | {held} | {cell('gpu_mb')} | "
                         f"{cell('decode_tok_s')} | {cell('predicted_tok_s')} | {cell('hit_rate')} | "
                         f"{cell('store_mb_per_token')} | {cell('store_s_per_token')} | {cell('ahead_s_per_token')} | "
                         f"{cell('guesses')} | {cell('same_tokens')} |")
        lines.append("")
    return "\n".join(lines)


def write_outputs(report: dict, out: Path) -> dict[str, Path]:
    from bench_report import write_markdown_report

    return write_markdown_report(report, markdown(report), out, "stream", "pyshim streaming from the store")
