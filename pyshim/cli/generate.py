"""`pyshim generate MODEL --prompt P`: stream a continuation (or a chat reply with --chat), through the one
generation loop on the backend asked for (cpu, gpu, or the site's Worker in headless Chromium); with
--base-url, a chat reply from that OpenAI-compatible server instead (MODEL: the name it serves)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

# Matrix-vector products are memory-bound: one BLAS thread streams nearly as fast as several, and
# OpenBLAS threads spin-waiting on a busy machine made decode 12x slower in measurement. Applies only
# when the user set no thread count and numpy is not loaded yet.
BLAS_THREADS = "1"
BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
BACKENDS = ("cpu", "gpu", "wasm", "browser")
ARITHMETIC = ("f32", "int8", "llama.cpp-exact")      # pyshim.plan.settings.Arithmetic (kept light: no import)
KV_TYPES = ("auto", "f32", "f16", "q8", "q4")        # "auto" and pyshim.plan.settings.KV_TYPES (a test checks they agree)
ROPE_SCALINGS = ("none", "linear", "yarn")            # pyshim.plan.settings.ROPE_SCALINGS (likewise)
DEVICES = ("auto", "gpu", "cpu")                      # pyshim.plan.settings.DEVICES (likewise)


def limit_blas_threads() -> None:
    if not any(var in os.environ for var in BLAS_THREAD_VARS):
        for var in BLAS_THREAD_VARS:
            os.environ[var] = BLAS_THREADS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="a .gguf path or a short name (smollm2, gemma3, qwen2.5)")
    parser.add_argument("--prompt", required=True, help="the text to continue (the user message with --chat)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy")
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--min-p", type=float, default=0.0)
    parser.add_argument("--repeat-penalty", type=float, default=1.0)
    parser.add_argument("--presence-penalty", type=float, default=0.0)
    parser.add_argument("--frequency-penalty", type=float, default=0.0)
    parser.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--chat", action="store_true", help="apply the model's chat template to the prompt")
    parser.add_argument("--ignore-eos", action="store_true",
                        help="do not stop at end-of-generation tokens: always --max-tokens (fixed-length benchmark runs)")
    shape = parser.add_argument_group("constrained output (response_format)").add_mutually_exclusive_group()
    shape.add_argument("--json-schema", type=Path, default=None, metavar="FILE",
                       help="the reply must be JSON matching this JSON Schema (strict: objects take only the properties listed)")
    shape.add_argument("--json-object", action="store_true", help="the reply must be a JSON object")
    shape.add_argument("--grammar", type=Path, default=None, metavar="FILE", help="the reply must follow this GBNF grammar (rule root)")
    add_run_arguments(parser)
    remote = parser.add_argument_group("a model on a server (pyshim.serve.remote)")
    remote.add_argument("--base-url", default=None, metavar="URL",
                        help="an OpenAI-compatible server (llama.cpp's server, Ollama's /v1, vLLM), e.g. http://127.0.0.1:8080/v1: "
                             "MODEL is the name it serves, --chat is needed, the run flags do not apply")
    remote.add_argument("--api-key", default=None, metavar="KEY", help="its key (default: $OPENAI_API_KEY, if set)")
    parser.add_argument("--json", action="store_true",
                        help='print one JSON object {"text", "ids", "prompt_ids", "prefill_tok_s", "decode_tok_s", ...}')


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """--backend, --ctx, --arithmetic, --kv-type, --prefill-chunk and the rope overrides: where and how the
    model runs (shared with `pyshim score`)."""
    parser.add_argument("--backend", choices=BACKENDS, default="cpu",
                        help="cpu (the NumPy reference executor), gpu (WGSL kernels through native wgpu), wasm (the "
                             "WebAssembly SIMD CPU engine under wasmtime) or browser (the site's engine Worker in headless "
                             "Chromium, WebGPU from Pyodide)")
    parser.add_argument("--device", choices=DEVICES, default="auto",
                        help="browser backend: where the page runs the model — gpu (WebGPU), cpu (the WebAssembly "
                             "engine) or auto (default: the CPU engine without an adapter, the GPU on a real one, the faster of the two "
                             "by a measured matvec on a software adapter)")
    parser.add_argument("--threads", type=int, default=None,
                        help="the CPU engine's threads (wasm backend: default 1; browser with --device cpu: default the "
                             "cores, where the page is cross-origin isolated)")
    parser.add_argument("--ctx", type=int, default=None,
                        help="context length (default: with --kv-type auto the longest that fits the budget, up to the "
                             "model's training context or 32768; else min(model's, 4096))")
    parser.add_argument("--kv-type", choices=KV_TYPES, default="auto",
                        help="the KV cache: auto (default: the type of least rounding that fits the budget, among those "
                             "that keep needle retrieval — f32, f16, q8), f32, f16 (half the memory), q8 (int8 blocks, 28%%) "
                             "or q4 (4-bit blocks, 16%%); every backend")
    parser.add_argument("--budget-mb", type=float, default=None,
                        help="GPU memory the model may use, for --kv-type auto (default 4096 MiB, as the site assumes)")
    parser.add_argument("--expert-slots", type=int, default=None, metavar="N",
                        help="a mixture of experts: keep N experts of each layer on the GPU and read the others from the "
                             "store when the router picks them (default: resident if it fits --budget-mb, else as many "
                             "as fit; gpu and browser backends)")
    parser.add_argument("--streamed-layers", type=int, default=None, metavar="N",
                        help="stream the last N layers' weights from the store through two rotating GPU buffers, each "
                             "once per step (default: resident if it fits --budget-mb, else as few as fit; gpu and browser)")
    parser.add_argument("--prefill-chunk", type=int, default=None,
                        help="most prompt tokens per step (default 256); smaller steps keep a slow GPU under its "
                             "watchdog and need less activation memory")
    rope = parser.add_argument_group("rope scaling (as llama.cpp's flags of these names; default: the GGUF's keys)")
    rope.add_argument("--rope-scaling", choices=ROPE_SCALINGS, default=None, help="none, linear or yarn")
    rope.add_argument("--rope-scale", type=float, default=None, metavar="N",
                      help="context extension factor: positions turn N times slower (freq_scale = 1/N)")
    rope.add_argument("--yarn-orig-ctx", type=int, default=None, metavar="N",
                      help="YaRN's original context: the one the model was trained with (default: the GGUF's)")
    parser.add_argument("--arithmetic", choices=ARITHMETIC, default=None,
                        help="f32; int8 (activations rounded as llama.cpp's CPU backend does: the GPU executor's int8 "
                             "route, the cpu reference's emulation of it); or llama.cpp-exact (cpu only: llama.cpp's x86 "
                             "CPU arithmetic bit for bit, an oracle, slow; see pyshim/exec/llama_cpp.py). Default: the "
                             "backend's own — cpu f32, gpu/browser int8 on CPU adapters; the JSON says which ran")


def run_settings(args: argparse.Namespace):
    """The RunSettings the flags ask for (checked: a wrong value is a BadRequestError naming it)."""
    from pyshim.errors import BadRequestError
    from pyshim.plan.settings import PREFILL_CHUNK, Arithmetic, RunSettings

    if args.arithmetic == Arithmetic.EXACT.value and args.backend != "cpu":
        raise BadRequestError("--arithmetic llama.cpp-exact is a cpu-backend option", hint="use --arithmetic int8")
    return RunSettings(context=args.ctx, kv_type=args.kv_type, arithmetic=args.arithmetic,
                       prefill_chunk=PREFILL_CHUNK if args.prefill_chunk is None else args.prefill_chunk,
                       rope_scaling=args.rope_scaling, rope_scale=args.rope_scale, yarn_orig_ctx=args.yarn_orig_ctx,
                       budget_bytes=None if args.budget_mb is None else int(args.budget_mb * 2**20),
                       expert_slots=args.expert_slots, streamed_layers=args.streamed_layers, device=args.device,
                       threads=args.threads)


def run(args: argparse.Namespace) -> int:
    limit_blas_threads()
    import asyncio

    from pyshim.serve.protocol import Sampling
    from pyshim.setup.catalog import resolve_model

    settings = run_settings(args)
    sampling = Sampling.parse({
        "temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p, "min_p": args.min_p,
        "repetition_penalty": args.repeat_penalty, "presence_penalty": args.presence_penalty,
        "frequency_penalty": args.frequency_penalty, "seed": args.seed, "max_tokens": args.max_tokens,
        "stop": args.stop or None, "ignore_eos": args.ignore_eos, "response_format": response_format_arg(args)})
    if args.base_url:
        report = asyncio.run(_generate_remote(args, sampling))
        _print(args, report)
        return 0
    path = resolve_model(args.model)
    if args.backend == "browser":
        return _run_in_browser(args, path, settings, sampling)
    report = asyncio.run(_generate(args, path, settings, sampling))
    _print(args, report)
    return 0


async def _generate(args, path, settings, sampling) -> dict:
    from pyshim.exec.loading import load
    from pyshim.serve.session import Session

    runner = await load(path, backend=args.backend, settings=settings)
    try:
        session = Session(runner)
        prompt = _prompt_ids(args, session)
        await session.prepare()
        done = await session.complete(prompt, sampling, stop_ids=session.stop_ids(sampling, chat=args.chat),
                                      on_text=None if args.json else lambda piece, token: _show(piece))
        report = {"text": done.text, "ids": done.token_ids, "prompt_ids": prompt,
                  "prefill_tok_s": round(done.prefill_tok_per_s, 2), "decode_tok_s": round(done.decode_tok_per_s, 2),
                  "decode_median_step_ms": done.decode_median_step_ms,
                  "finish_reason": done.finish_reason, "arithmetic": runner.arithmetic.value,
                  "cpu_share_pct": None, "bytes_per_decode_step": done.bytes_per_decode_step,
                  "generated": len(done.token_ids), "context": runner.n_ctx, "kv_type": runner.settings.kv_type,
                  "auto": runner.auto}
        if args.backend == "gpu":
            report["cpu_share_pct"] = round(100 * done.cpu_ms / done.decode_ms, 2) if done.decode_ms else None
            report["cpu_ms_per_step"] = round(done.cpu_ms / done.decode_steps, 3) if done.decode_steps else None
            report["dispatches_per_token"] = await runner.dispatches_per_token()
            report.update(runner.memory())
            report["expert_cache"] = _per_token(runner.expert_cache_stats(), len(prompt) + len(done.token_ids))
            report["layer_stream"] = runner.layer_stream_stats()
        if args.backend == "wasm":
            report.update(runner.memory())
        return report
    finally:
        runner.close()


async def _generate_remote(args, sampling) -> dict:
    """A chat reply from the server at --base-url, streamed as it comes; the report its usage allows."""
    from pyshim.errors import BadRequestError
    from pyshim.serve.remote import RemoteSession

    if not args.chat:
        raise BadRequestError("--base-url sends chat requests: add --chat", param="chat")
    session = RemoteSession(args.base_url, args.model, args.api_key or os.environ.get("OPENAI_API_KEY"))
    try:
        await session.prepare()
        reply = await session.chat([{"role": "user", "content": args.prompt}], sampling,
                                   on_text=None if args.json else lambda piece, token: _show(piece))
    finally:
        session.close()
    usage = reply.usage() or {}
    return {"text": reply.text, "finish_reason": reply.finish_reason, "usage": usage, "remote": session.base_url,
            "model": args.model, "generated": usage.get("completion_tokens")}


def _print(args, report: dict) -> None:
    if args.json:
        print(json.dumps({k: v for k, v in report.items() if k != "generated"}))
        return
    print()
    if report.get("remote"):
        tokens = "" if report["generated"] is None else f"{report['generated']} tokens, "
        print(f"[{report['model']} on {report['remote']}: {tokens}{report['finish_reason']}]", file=sys.stderr)
        return
    if report.get("auto"):
        print(f"[{report['auto']['reason']}]", file=sys.stderr)
    if report.get("layer_stream"):
        c = report["layer_stream"]
        print(f"[layer stream: {c['streamed_layers']} of {c['layers']} layers streamed, {c['layer_uploads']} layer uploads, "
              f"{c['uploaded_bytes'] / 1e6:.1f} MB read from the store in {c['fetch_s']:.2f} s]", file=sys.stderr)
    if report.get("expert_cache"):
        c = report["expert_cache"]
        print(f"[expert cache: {c['slots']} slots a layer, hit rate {100 * c['hit_rate']:.1f}%, "
              f"{c['uploaded_bytes'] / 1e6:.1f} MB read from the store ({c['uploaded_bytes_per_token'] / 1e6:.2f} MB a token) "
              f"in {c['fetch_s']:.2f} s stalled and {c['ahead_s']:.2f} s ahead; {c['guess_hits']} of {c['guessed']} "
              f"experts fetched on a guess were wanted]", file=sys.stderr)
    cpu = "" if report.get("cpu_share_pct") is None else f", CPU side {report['cpu_share_pct']:.1f}% of decode"
    print(f"[{len(report['prompt_ids'])} prompt tokens at {report['prefill_tok_s']:.1f} tok/s; {report['generated']} generated, "
          f"decode {report['decode_tok_s']:.1f} tok/s{cpu}; {report['finish_reason']}]", file=sys.stderr)


def _show(piece: str) -> None:
    sys.stdout.write(piece)
    sys.stdout.flush()


def _prompt_ids(args: argparse.Namespace, session) -> list[int]:
    """The prompt's ids, through the chat template with --chat."""
    if args.chat:
        return session.template.encode(session.tokenizer, [{"role": "user", "content": args.prompt}])
    return session.tokenizer.encode(args.prompt, add_special=True)


def _per_token(cache: dict | None, tokens: int) -> dict | None:
    return cache and {**cache, "uploaded_bytes_per_token": cache["uploaded_bytes"] // max(1, tokens)}


def response_format_arg(args: argparse.Namespace) -> dict | None:
    """--json-schema FILE, --json-object or --grammar FILE as a request's response_format."""
    from pyshim.errors import BadRequestError

    def read(path: Path) -> str:
        try:
            return path.read_text(encoding="utf-8")
        except OSError as exc:
            raise BadRequestError(f"cannot read {path}: {exc.strerror}", param="response_format") from None

    if args.json_object:
        return {"type": "json_object"}
    if args.grammar is not None:
        return {"type": "grammar", "grammar": read(args.grammar)}
    if args.json_schema is None:
        return None
    try:
        schema = json.loads(read(args.json_schema))
    except json.JSONDecodeError as exc:
        raise BadRequestError(f"{args.json_schema} is not JSON: {exc}", param="response_format") from None
    return {"type": "json_schema", "json_schema": {"name": args.json_schema.stem, "schema": schema, "strict": True}}


def _run_in_browser(args: argparse.Namespace, path, settings, sampling) -> int:
    """The same request in the site's engine Worker (pyshim.cli.browser): the prompt is tokenized here,
    so both sides run the very same ids; the result prints like the native backends'."""
    from pyshim.cli import browser
    from pyshim.text.chat import ChatTemplate
    from pyshim.text.tokenizer import Tokenizer

    header = browser.open_header(path)
    tokenizer = Tokenizer.from_metadata(header.metadata)
    stop_ids = set(tokenizer.eog_ids)
    if args.chat:
        template = ChatTemplate.from_metadata(header.metadata, tokenizer)
        prompt_ids = template.encode(tokenizer, [{"role": "user", "content": args.prompt}])
        stop_ids |= set(template.stop_ids)
    else:
        prompt_ids = tokenizer.encode(args.prompt, add_special=True)
    params = sampling.params
    wire = {"temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p, "min_p": params.min_p,
            "repetition_penalty": params.repetition_penalty, "presence_penalty": params.presence_penalty,
            "frequency_penalty": params.frequency_penalty, "seed": params.seed, "max_tokens": sampling.max_tokens,
            "stop": list(sampling.stop) or None, "ignore_eos": sampling.ignore_eos, "response_format": response_format_arg(args)}
    r = browser.run(path, "complete", {"settings": settings.as_dict(), "prompt_ids": prompt_ids,
                                       "stop_token_ids": sorted(stop_ids), "sampling": wire},
                    on_text=None if args.json else _show)
    t = r["timings"]
    _print(args, {"text": r["text"], "ids": r["token_ids"], "prompt_ids": prompt_ids,
                  "prefill_tok_s": round(1e3 * len(prompt_ids) / t["prefill_ms"], 2) if t["prefill_ms"] else 0.0,
                  "decode_tok_s": round(t["decode_tok_per_s"], 2), "finish_reason": r["finish_reason"],
                  "load_ms": round(t["load_ms"], 1), "ttft_ms": round(t["ttft_ms"], 1),
                  "cpu_share_pct": round(100 * t["cpu_ms"] / t["decode_ms"], 2) if t["decode_ms"] else None,
                  "bytes_per_decode_step": t["bytes_per_decode_step"], "arithmetic": r["arithmetic"],
                  "generated": len(r["token_ids"]), "context": r.get("context"), "kv_type": r.get("kv_type"),
                  "auto": r.get("auto"), "expert_cache": _per_token(r.get("expert_cache"), len(prompt_ids) + len(r["token_ids"])),
                  "layer_stream": r.get("layer_stream"), "device": r.get("device"), "device_reason": r.get("device_reason"),
                  "threads": r.get("threads"),
                  "relaxed_simd": r.get("relaxed_simd"), "wasm64": r.get("wasm64")})
    return 0
