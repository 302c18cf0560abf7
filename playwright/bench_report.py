"""The benchmark's outputs: the JSON (everything), a Markdown summary table (printed to the terminal),
and an HTML report with inline SVG charts that opens offline (no scripts at all, no external files)."""

from __future__ import annotations

import html
import json
import math
from pathlib import Path

from bench_engines import KERNEL_PREFIX

ENGINE_COLOURS = {
    "browser": "#2f6fd6", "wasm-1t": "#e07b39", "wasm-2t": "#b8541a", "gpu": "#1f9e89", "cpu": "#8c6bb1",
    "wllama-1t": "#e0892b", "wllama-2t": "#c2452d", "wllama-webgpu": "#d4a017", "llamacpp-1t": "#9a9a9a", "llamacpp-2t": "#5a5a5a",
}
FALLBACK_COLOUR = "#777777"
TEXT_PREFIX = 32           # characters of greedy text compared across engines
BAR_HEIGHT = 18
BAR_GAP = 6
LABEL_WIDTH = 190
PLOT_WIDTH = 420
VALUE_WIDTH = 150


def _fmt(value, digits: int = 1, scale: float = 1.0) -> str:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return "–"
    v = value * scale
    return f"{v:,.{digits}f}" if abs(v) < 1e4 else f"{v:,.0f}"


def _status_cell(r: dict) -> str:
    s = r["status"]
    return "ok" if s == "ok" else s


def _flag_note(report: dict) -> str:
    """Said after Chromium's version when it was launched with the real-GPU flags (harness.CHROMIUM_GPU_FLAGS)."""
    return " (launched with the real-GPU flags)" if "--enable-gpu" in report.get("browser", {}).get("flags", ()) else ""


def refusals(report: dict) -> list[str]:
    """One sentence per engine that declined the adapter (wllama-webgpu without shader-f16), with the note
    on what that means; empty when nothing was refused."""
    refused = {}
    for r in report["results"]:
        if r.get("refused"):
            refused.setdefault((r["engine"], r["refused"]), []).append(r["model"])
    lines = [f"{engine} refused ({', '.join(models)}): {reason}." for (engine, reason), models in refused.items()]
    if any(engine == "wllama-webgpu" for engine, _ in refused):
        lines.append("On an adapter without shader-f16 llama.cpp's WebGPU backend does not run: there pyshim is the only "
                     "GGUF engine in the browser that runs on the GPU.")
    return lines


def _load_cell(m: dict) -> str:
    if m.get("load_ms") is not None:
        return _fmt(m["load_ms"], 1, 1e-3)
    # `pyshim generate` in a subprocess: its wall clock beyond prefill and decode (process start + load).
    return _fmt(m.get("startup_and_load_ms"), 1, 1e-3) + "*" if m.get("startup_and_load_ms") is not None else "–"


def _cpu_step_cell(m: dict) -> str:
    """CPU ms a decode step, with the JavaScript encoding's share where the engine measured it (the browser)."""
    cell = _fmt(m.get("cpu_ms_per_step"), 2)
    encode = m.get("encode_ms_per_step")
    return cell if encode is None or cell == "–" else f"{cell} ({encode:.2f} JS)"


def _memory_cell(m: dict) -> str:
    """The GPU executor's peak allocation in MB, then the memory plan's prediction and how far off it was;
    and what was streamed, where the model did not fit the budget resident."""
    peak, plan, mode = m.get("peak_gpu_bytes"), m.get("planned_gpu_bytes"), m.get("memory_mode")
    streamed = f"; {mode}" if mode and mode != "resident" else ""
    if not peak:
        return "–"
    if not plan:
        return _fmt(peak, 1, 1e-6) + streamed
    return f"{_fmt(peak, 1, 1e-6)} ({_fmt(plan, 1, 1e-6)}, {100 * (peak - plan) / plan:+.1f}%{streamed})"


def text_agreement(report: dict) -> dict[tuple[str, str], str]:
    """(model, engine) -> "yes" | "no": does its greedy continuation start like most engines' do? The
    first TEXT_PREFIX characters are compared (native llama.cpp may drift late on f16 rounding)."""
    marks = {}
    for model in {r["model"] for r in report["results"]}:
        texts = {r["engine"]: r["median"].get("text") for r in report["results"] if r["model"] == model and r["median"].get("text")}
        prefixes = [t[:TEXT_PREFIX] for t in texts.values()]
        if len(prefixes) < 2:
            continue
        common = max(set(prefixes), key=prefixes.count)
        for engine, text in texts.items():
            marks[(model, engine)] = "yes" if text[:TEXT_PREFIX] == common else "no"
    return marks


def summary_rows(report: dict) -> tuple[list[str], list[list[str]]]:
    """The summary table as (header, rows) of strings: one row per model and engine."""
    prompts = report["config"]["settings"]["prompt_tokens"]
    # a × column per peer that measured something (a refused peer has no speed to divide by)
    peer_names = sorted({r["engine"] for r in report["results"] if r["peer"] and r["median"].get("decode_tok_s")})
    header = (["model", "engine", "status", "ready s", "header ms", "store MB/s", "load s", "TTFT ms"]
              + [f"prefill {n} tok/s" for n in prompts]
              + ["decode tok/s", "GB/s", "roofline GB/s", "% roofline", "% roofline, median step", "CPU side %", "CPU ms/step",
                 "dispatches/token",
                 "GPU MB (plan)", "JS heap MB", "same text"]
              + [f"decode ×{p}" for p in peer_names])
    agree = text_agreement(report)
    rows = []
    for r in report["results"]:
        m = r["median"]
        decode = _fmt(m.get("decode_tok_s"), 1)
        if decode == "–" and r.get("refused"):
            decode = "refused"
        elif decode == "–" and not r["status"].startswith("error"):
            decode = "n/a (not built yet)" if r["engine"] in ("browser", "wasm-1t", "wasm-2t", "gpu", "cpu") else "–"
        row = [r["model"], r["engine"], _status_cell(r), _fmt(m.get("ready_ms"), 1, 1e-3), _fmt(m.get("header_ms"), 0),
               _fmt(m.get("store_MBps"), 0), _load_cell(m), _fmt(m.get("ttft_ms"), 0)]
        row += [_fmt(m.get(f"prefill_{n}_tok_s"), 1) for n in prompts]
        row += [decode, _fmt(m.get("achieved_GBps"), 2), _fmt(m.get("roofline_GBps"), 2), _roofline_cell(m),
                _roofline_cell(m, "roofline_steady"), _fmt(m.get("cpu_share_pct"), 1), _cpu_step_cell(m), _fmt(m.get("dispatches_per_token"), 0),
                _memory_cell(m), _fmt(m.get("peak_js_heap_bytes"), 0, 1e-6), agree.get((r["model"], r["engine"]), "–")]
        row += [_fmt(r.get("vs_peer", {}).get(f"decode_tok_s_vs_{p}"), 2) if not r["peer"] else "" for p in peer_names]
        rows.append(row)
    return header, rows


def _roofline_cell(m: dict, key: str = "roofline") -> str:
    """% of roofline (`key` "roofline_steady": from the median step), or the flag a figure over 100% gets
    instead (bench.derive): the roofline read low."""
    if m.get(f"{key}_over_pct"):
        return f"over 100% ({m[f'{key}_over_pct']:.0f}%): roofline read low, not a figure"
    return _fmt(m.get(f"{key}_pct"), 1)


def markdown(report: dict) -> str:
    header, rows = summary_rows(report)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows]
    m = report["machine"]
    adapter = (report.get("adapter") or {}).get("summary") or "–"
    lines.append("")
    lines += refusals(report)
    lines.append(f"Machine: {m['cpu_count']} CPUs, {_fmt((m.get('memory_bytes') or 0) / 2**30, 0)} GiB, load average "
                 f"{m['load_average_start'][0]:.1f} → {m.get('load_average_end', [0])[0]:.1f}; "
                 + (f"Chromium {report['browser']['version']}{_flag_note(report)}; WebGPU adapter: {adapter}."
                    if "browser" in report else "no browser in this run."))
    native = report["rooflines"].get("gpu", {}).get("adapter")
    if native:
        lines.append(f"Native adapter (`gpu` rows, wgpu): {native.get('summary')}.")
    host = report["rooflines"].get("host", {})
    if host.get("GBps"):
        lines.append(f"Host memory read (NumPy, one core): {host['GBps']:.1f} GB/s — the peer's and the cpu engine's roofline.")
    lines.append(f"Medians of {report['config']['settings']['runs']} run(s), each in a fresh page or process; "
                 f"decode = {report['config']['settings']['decode_tokens']} tokens greedy; × = pyshim ÷ peer; "
                 "load s* = process start + load (wall clock beyond prefill and decode); "
                 "CPU side = share of a decode step outside GPU waits (Python, FFI, encoding), CPU ms/step = that "
                 "time per decode step (in brackets the part spent encoding its dispatches in JavaScript; – where not "
                 "measured: the cpu engine, peers); dispatches/token = compute "
                 "dispatches a decode step encodes; % roofline = the higher of bytes/s over the adapter's best streaming "
                 "bytes/s and the adapter's streaming probes' time for a token's weight elements (Q6_K's at the 6-bit "
                 "probe's rate, the rest at the best element rate) over the token's time (the mean step's; \"median step\": "
                 "the same over the median decode step, beside probes that keep their best pass: a shared machine's bursts "
                 "land in a mean); JS heap MB = the page's and its Workers' JS heaps at their peak "
                 "while the model loaded and read its prompt (performance.measureUserAgentSpecificMemory, paused while decode "
                 "is timed; the browser rows); "
                 f"same text = the greedy continuation's first {TEXT_PREFIX} characters match most engines'.")
    return "\n".join(lines)


# --- HTML --------------------------------------------------------------------------------------------

def bar_chart(title: str, bars: list[tuple[str, str, float | None, str]], unit: str) -> str:
    """A horizontal bar chart as inline SVG. bars: (label, engine, value or None, note for a missing value)."""
    values = [v for _, _, v, _ in bars if isinstance(v, (int, float))]
    top = max(values) if values else 1.0
    height = len(bars) * (BAR_HEIGHT + BAR_GAP) + 30
    width = LABEL_WIDTH + PLOT_WIDTH + VALUE_WIDTH
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="{html.escape(title)}" font-family="sans-serif" font-size="12">',
             f'<text x="0" y="14" font-weight="bold">{html.escape(title)}</text>']
    for i, (label, engine, value, note) in enumerate(bars):
        y = 24 + i * (BAR_HEIGHT + BAR_GAP)
        parts.append(f'<text x="{LABEL_WIDTH - 6}" y="{y + 13}" text-anchor="end">{html.escape(label)}</text>')
        if isinstance(value, (int, float)):
            w = max(1.0, PLOT_WIDTH * value / top)
            colour = ENGINE_COLOURS.get(engine, FALLBACK_COLOUR)
            parts.append(f'<rect x="{LABEL_WIDTH}" y="{y}" width="{w:.1f}" height="{BAR_HEIGHT}" fill="{colour}"/>')
            parts.append(f'<text x="{LABEL_WIDTH + w + 4:.1f}" y="{y + 13}">{_fmt(value, 2 if value < 10 else 1)} {html.escape(unit)}</text>')
        else:
            parts.append(f'<text x="{LABEL_WIDTH + 4}" y="{y + 13}" fill="#888">{html.escape(note)}</text>')
    parts.append("</svg>")
    return "".join(parts)


BAR_NOTE_CHARS = 70        # a missing bar's note fits beside the label; the full reason is under the table


def _short(text: str) -> str:
    return text if len(text) <= BAR_NOTE_CHARS else text[:BAR_NOTE_CHARS - 1] + "…"


def _bars(report: dict, key: str) -> list[tuple[str, str, float | None, str]]:
    bars = []
    for r in report["results"]:
        value = r["median"].get(key)
        note = ("n/a (not built yet)" if r["status"].startswith(("n/a", "partial")) else "error" if r["status"].startswith("error")
                else _short("refused: " + r["refused"]) if r.get("refused")
                else "over 100%: roofline read low" if key == "roofline_pct" and r["median"].get("roofline_over_pct")
                else "not measured")
        bars.append((f"{r['model']} · {r['engine']}", r["engine"], value if isinstance(value, (int, float)) else None, note))
    return bars


SIZE_WIDTH = 560           # a size chart's plot area (the axis labels beside it)
SIZE_HEIGHT = 220
SIZE_MARGIN = 56
SIZE_TICKS_GB = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50)


def _model_gb(facts: dict) -> float | None:
    """The weights a decode token reads, in GB (the file's weights for a dense model; a mixture's active experts)."""
    size = facts.get("weight_bytes_per_token") or facts.get("file_bytes")
    return size / 1e9 if size else None


def size_points(report: dict, key: str) -> dict[str, list[tuple[float, float, str]]]:
    """Per engine, (GB a token reads, the figure, model) for each model it measured, smallest model first."""
    series: dict[str, list[tuple[float, float, str]]] = {}
    for r in report["results"]:
        gb = _model_gb(report["models"].get(r["model"], {}))
        value = r["median"].get(key)
        if gb and isinstance(value, (int, float)) and not isinstance(value, bool):
            series.setdefault(r["engine"], []).append((gb, float(value), r["model"]))
    return {engine: sorted(points) for engine, points in series.items()}


def size_chart(title: str, series: dict[str, list[tuple[float, float, str]]], unit: str, *, log_y: bool = False) -> str:
    """A figure against model size as inline SVG: x the GB a token reads (log scale), y the figure (from 0, or
    with `log_y` on a log scale: tok/s spans orders of magnitude); one line per engine through its models, each
    point labelled with its value, the models named under the axis."""
    xs = [gb for points in series.values() for gb, _, _ in points]
    values = [v for points in series.values() for _, v, _ in points if v > 0 or not log_y]
    if log_y and not values:        # (nothing above 0 to put on a log scale)
        log_y, values = False, [v for points in series.values() for _, v, _ in points]
    top = max(values, default=1.0) or 1.0
    lo, hi = math.log10(min(xs)) - 0.15, math.log10(max(xs)) + 0.15
    y_lo, y_hi = (math.floor(math.log10(min(values))), math.ceil(math.log10(top))) if log_y else (0.0, top * 1.1)
    y_hi = max(y_hi, y_lo + 1) if log_y else max(y_hi, 100.0) if unit == "%" else y_hi     # (percentages: the whole 0-100)
    width, height = SIZE_WIDTH + 2 * SIZE_MARGIN + 120, SIZE_HEIGHT + 2 * SIZE_MARGIN + 24
    bottom = SIZE_MARGIN + SIZE_HEIGHT

    def px(gb: float) -> float:
        return SIZE_MARGIN + SIZE_WIDTH * (math.log10(gb) - lo) / (hi - lo)

    def py(v: float) -> float:
        t = math.log10(v) if log_y else v
        return bottom - SIZE_HEIGHT * (t - y_lo) / (y_hi - y_lo)

    scale = "log scale" if log_y else "from 0"
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="{html.escape(title)}" font-family="sans-serif" font-size="12">',
             f'<text x="0" y="14" font-weight="bold">{html.escape(title)} ({html.escape(unit)}, {scale})</text>',
             f'<line x1="{SIZE_MARGIN}" y1="{bottom}" x2="{SIZE_MARGIN + SIZE_WIDTH}" y2="{bottom}" stroke="#888"/>',
             f'<line x1="{SIZE_MARGIN}" y1="{bottom}" x2="{SIZE_MARGIN}" y2="{SIZE_MARGIN}" stroke="#888"/>',
             f'<text x="{SIZE_MARGIN + SIZE_WIDTH / 2}" y="{height - 8}" text-anchor="middle">GB of weights a token reads (log scale)</text>']
    for gb in SIZE_TICKS_GB:
        if lo <= math.log10(gb) <= hi:
            parts.append(f'<text x="{px(gb):.1f}" y="{bottom + 16}" text-anchor="middle">{gb:g}</text>')
    ticks = ([10.0 ** e for e in range(int(y_lo), int(y_hi) + 1)] if log_y else [0.0, 25.0, 50.0, 75.0, 100.0] if unit == "%"
             else [0.0, top / 2, top])
    for v in ticks:
        label = f"{v:g}" if log_y else _fmt(v, 0 if unit == "%" else 2 if top < 10 else 1)
        parts.append(f'<text x="{SIZE_MARGIN - 6}" y="{py(v) + 4:.1f}" text-anchor="end">{label}</text>')
    models = sorted({(gb, model) for points in series.values() for gb, _, model in points})
    for i, (gb, model) in enumerate(models):     # under the axis, every other one a line lower: near sizes stay legible
        parts.append(f'<text x="{px(gb):.1f}" y="{bottom + 32 + 13 * (i % 2)}" text-anchor="middle" font-size="10" '
                     f'fill="#555">{html.escape(model)}</text>')
    tops: dict[float, float] = {}
    lows: dict[float, float] = {}
    for gb, v, _ in (p for points in series.values() for p in points):
        tops[gb], lows[gb] = max(tops.get(gb, v), v), min(lows.get(gb, v), v)
    for i, (engine, points) in enumerate(sorted(series.items())):
        colour = ENGINE_COLOURS.get(engine, FALLBACK_COLOUR)
        points = [(gb, v, model) for gb, v, model in points if v > 0 or not log_y]
        if len(points) > 1:
            path = " ".join(f"{px(gb):.1f},{py(v):.1f}" for gb, v, _ in points)
            parts.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for gb, v, model in points:
            parts.append(f'<circle cx="{px(gb):.1f}" cy="{py(v):.1f}" r="4" fill="{colour}"><title>{html.escape(model)} · '
                         f'{html.escape(engine)}: {_fmt(v, 2 if v < 10 else 1)} {html.escape(unit)}</title></circle>')
            # the value above its point where it is the model's highest, below where lowest, beside it between
            dy = -5 if v >= tops[gb] else 14 if v <= lows[gb] else 4
            parts.append(f'<text x="{px(gb) + 6:.1f}" y="{py(v) + dy:.1f}" font-size="10" fill="{colour}">{_fmt(v, 2 if v < 10 else 1)}</text>')
        legend_y = SIZE_MARGIN + 16 * i
        parts.append(f'<rect x="{SIZE_MARGIN + SIZE_WIDTH + 20}" y="{legend_y - 9}" width="10" height="10" fill="{colour}"/>')
        parts.append(f'<text x="{SIZE_MARGIN + SIZE_WIDTH + 34}" y="{legend_y}">{html.escape(engine)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def size_charts(report: dict) -> list[str]:
    """Decode tok/s and % of the roofline against model size, where the run measured models of more than one size."""
    charts = []
    for key, title, unit, log_y in (("decode_tok_s", "Decode speed against model size", "tok/s", True),
                                    ("roofline_pct", "Decode: % of the device's streaming roofline against model size", "%", False)):
        series = size_points(report, key)
        if len({gb for points in series.values() for gb, _, _ in points}) > 1:
            charts.append(size_chart(title, series, unit, log_y=log_y))
    return charts


def kernel_charts(report: dict) -> list[str]:
    """Per model and engine with a kernel profile: where a decode step's time goes, ms per shader group
    (pyshim.exec.profile: each group submitted alone; they add up to about the whole step)."""
    charts = []
    for r in report["results"]:
        groups = {k[len(KERNEL_PREFIX):]: v for k, v in r["median"].items()
                  if k.startswith(KERNEL_PREFIX) and isinstance(v, (int, float))}
        if groups:
            bars = [(name, r["engine"], ms, "") for name, ms in sorted(groups.items(), key=lambda kv: -kv[1])]
            step = r["median"].get("kernel_step_ms")
            title = f"{r['model']} · {r['engine']}: a decode step by kernel, ms" + (f" (whole step {_fmt(step)} ms)" if step else "")
            charts.append(bar_chart(title, bars, "ms"))
    return charts


def html_report(report: dict) -> str:
    header, rows = summary_rows(report)
    prompts = report["config"]["settings"]["prompt_tokens"]
    charts = [
        bar_chart("Decode, tokens per second (higher is better)", _bars(report, "decode_tok_s"), "tok/s"),
        bar_chart(f"Prefill of a {prompts[0]}-token prompt, tokens per second", _bars(report, f"prefill_{prompts[0]}_tok_s"), "tok/s"),
        bar_chart("Decode: % of the device's streaming roofline", _bars(report, "roofline_pct"), "%"),
        bar_chart("Python ready in the Worker (Pyodide + packages), seconds", [
            (label, engine, v / 1e3 if v else None, note) for label, engine, v, note in _bars(report, "ready_ms") if engine == "browser"], "s"),
    ] + size_charts(report) + kernel_charts(report)
    refused = "".join(f"<p><strong>{html.escape(line)}</strong></p>" for line in refusals(report))
    m = report["machine"]
    adapter = report.get("adapter") or {}
    table = ["<table><thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr></thead><tbody>"]
    for row in rows:
        table.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>")
    table.append("</tbody></table>")
    facts = [
        f"Machine: {m['cpu_count']} CPUs, {_fmt((m.get('memory_bytes') or 0) / 2**30, 0)} GiB memory, {html.escape(m['platform'])}; "
        f"load average {m['load_average_start'][0]:.1f} at the start, {m.get('load_average_end', [0])[0]:.1f} at the end.",
        f"Browser: Chromium {html.escape(str(report.get('browser', {}).get('version', '?')))}{html.escape(_flag_note(report))}, headless, cross-origin isolated (COOP/COEP).",
        f"Native adapter (gpu rows, wgpu): {html.escape(str(report['rooflines'].get('gpu', {}).get('adapter', {}).get('summary') or '–'))}.",
        f"WebGPU adapter in the browser: {html.escape(str(adapter.get('summary') or '–'))}"
        + (" — a CPU (software) adapter: GPU figures here measure SwiftShader on this machine's cores, not a graphics card."
           if adapter.get("is_fallback") else ""),
        "Kernel breakdown: each shader group of a decode step submitted alone and timed (no timestamp queries "
        "on these adapters), browser rows.",
    ]
    models = "".join(
        f"<li>{html.escape(f['name'])}: {html.escape(f['file'])} ({f['file_bytes'] / 1e6:.0f} MB, {html.escape(f['architecture'])}); "
        f"{f['bytes_per_token'] / 1e6:.1f} MB read per decode token; prompts "
        + ", ".join(f"{w['name']} = {w['token_count']} tokens" for w in f["workload"]) + "</li>"
        for f in report["models"].values())
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>pyshim bench {html.escape(report['started_at'])}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; max-width: 1200px; color: #222; }}
table {{ border-collapse: collapse; font-size: 13px; margin: 1em 0; }}
th, td {{ border: 1px solid #ccc; padding: 3px 6px; text-align: right; }}
th:nth-child(-n+3), td:nth-child(-n+3) {{ text-align: left; }}
.charts svg {{ display: block; margin: 1.5em 0; }}
pre {{ font-size: 11px; background: #f6f6f6; padding: 1em; overflow-x: auto; }}
</style></head><body>
<h1>pyshim benchmark</h1>
<p>{html.escape(report['started_at'])} · git {html.escape(str(m.get('git_commit')))} · {'quick run' if report['config']['quick'] else 'full run'},
medians of {report['config']['settings']['runs']} run(s) each in a fresh page or process · took {report.get('elapsed_s', 0):.0f} s</p>
<ul>{''.join(f'<li>{f}</li>' for f in facts)}</ul>
<h2>Models</h2><ul>{models}</ul>
<h2>Summary</h2>{''.join(table)}
{refused}
<p>× = pyshim ÷ peer (decode tok/s). wllama-Nt: the peer, llama.cpp compiled to wasm, in the same browser on N threads
(CPU only, no WebGPU offload). wllama-webgpu: the same peer with every layer on llama.cpp's WebGPU backend (needs
shader-f16; its % roofline is of the browser adapter's). CPU ms/step: a decode step's time outside GPU waits. llamacpp-Nt, when present: native llama.cpp (llama-cpp-python) on this machine, for context.
Peers run on the CPU: their % roofline is of the host's single-core memory read bandwidth.</p>
<div class="charts">{''.join(charts)}</div>
<h2>Everything measured</h2>
<details><summary>the JSON report</summary><pre>{html.escape(json.dumps(report, indent=1))}</pre></details>
</body></html>
"""


def write_all(report: dict, out: Path, stem: str) -> dict[str, Path]:
    paths = {"json": out / f"{stem}.json", "html": out / f"{stem}.html", "markdown": out / f"{stem}.md"}
    paths["json"].write_text(json.dumps(report, indent=1))
    paths["html"].write_text(html_report(report))
    paths["markdown"].write_text(markdown(report) + "\n")
    return paths


if __name__ == "__main__":
    # Re-render a saved report: python playwright/bench_report.py bench-<stamp>.json (writes .html and .md beside it)
    import sys

    source = Path(sys.argv[1])
    saved = json.loads(source.read_text())
    source.with_suffix(".html").write_text(html_report(saved))
    source.with_suffix(".md").write_text(markdown(saved) + "\n")
    print(markdown(saved))


def markdown_page(md: str, title: str) -> str:
    """A report's Markdown (paragraphs and tables) as one offline HTML page."""
    out, in_table = [], False
    for line in md.splitlines():
        if line.startswith("|---"):
            continue
        if line.startswith("|"):
            tag = "td" if in_table else "th"
            if not in_table:
                out.append("<table>")
                in_table = True
            cells = [html.escape(c.strip()) for c in line.strip("|").split("|")]
            out.append("<tr>" + "".join(f"<{tag}>{c}</{tag}>" for c in cells) + "</tr>")
            continue
        if in_table:
            out.append("</table>")
            in_table = False
        if line:
            out.append(f"<p>{html.escape(line)}</p>")
    if in_table:
        out.append("</table>")
    return (f"<!doctype html><meta charset=utf-8><title>{html.escape(title)}</title>"
            "<style>td,th{border:1px solid #ccc;padding:2px 6px}table{border-collapse:collapse}</style>\n" + "\n".join(out) + "\n")


def write_markdown_report(report: dict, md: str, out: Path, kind: str, title: str) -> dict[str, Path]:
    """A report whose HTML is its Markdown (markdown_page): <kind>-<stamp>.json, .md and .html in `out`."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    stem = folder / f"{kind}-{report['stamp']}"
    paths = {"json": stem.with_suffix(".json"), "md": stem.with_suffix(".md"), "html": stem.with_suffix(".html")}
    paths["json"].write_text(json.dumps(report, indent=2))
    paths["md"].write_text(md)
    paths["html"].write_text(markdown_page(md, f"{title} {report['stamp']}"))
    return paths
