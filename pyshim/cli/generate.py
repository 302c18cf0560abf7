"""`pyshim generate MODEL --prompt P`: stream a continuation (or a chat reply with --chat)."""

from __future__ import annotations

import argparse
import json
import os
import sys


# Matrix-vector products are memory-bound: one BLAS thread streams nearly as fast as several, and
# OpenBLAS threads spin-waiting on a busy machine made decode 12x slower in measurement. Applies only
# when the user set no thread count and numpy is not loaded yet.
BLAS_THREADS = "1"
BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


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
    parser.add_argument("--ctx", type=int, default=None, help="context length (default: min(model's, 4096))")
    parser.add_argument("--backend", default="cpu", help="cpu (the NumPy reference executor), gpu (WGSL kernels through "
                        "native wgpu) or browser (the site's engine Worker in headless Chromium, WebGPU from Pyodide)")
    parser.add_argument("--chat", action="store_true", help="apply the model's chat template to the prompt")
    add_arithmetic_arguments(parser)
    parser.add_argument("--ignore-eos", action="store_true",
                        help="do not stop at end-of-generation tokens: always --max-tokens (fixed-length benchmark runs)")
    parser.add_argument("--json", action="store_true",
                        help='print one JSON object {"text", "ids", "prompt_ids", "prefill_tok_s", "decode_tok_s"}')


def add_arithmetic_arguments(parser: argparse.ArgumentParser) -> None:
    """--like-llama-cpp, --arithmetic, --kv-type and --prefill-chunk: how the model is set up (shared with
    `pyshim score`)."""
    parser.add_argument("--kv-type", choices=("f32", "f16", "q8"), default="f32",
                        help="the KV cache: f32, f16 (half the memory) or q8 (int8 blocks, 28%%); every backend")
    parser.add_argument("--prefill-chunk", type=int, default=None,
                        help="gpu: most prompt tokens per GPU step (default 256); smaller steps keep a slow GPU under "
                             "its watchdog and need less activation memory")
    parser.add_argument("--like-llama-cpp", action="store_true",
                        help="cpu backend: repeat llama.cpp's x86 CPU arithmetic bit for bit (its activation rounding, "
                             "kernels' summation order, GELU table; slow: an oracle, see pyshim/exec/ggml_cpu.py)")
    parser.add_argument("--arithmetic", choices=("f32", "int8"), default=None,
                        help="f32, or int8 (activations rounded as llama.cpp's CPU backend does: the GPU executor's "
                             "int8 route, the cpu reference's emulation of it). Default: the backend's own — cpu f32, "
                             "gpu/browser int8 on CPU adapters; the JSON says which ran")


def load_options(args: argparse.Namespace) -> dict:
    """load() options for the setup asked for: arithmetic, KV cache type, prefill chunk (gpu)."""
    from pyshim.errors import BadRequestError

    options = {**arithmetic_options(args), "kv_type": args.kv_type}
    if args.prefill_chunk is not None:
        if args.backend != "gpu":
            raise BadRequestError("--prefill-chunk is a gpu-backend option (the cpu reference has no GPU steps to bound)")
        from pyshim.serve.generation import PREFILL_CHUNK     # the most the prefill loop hands the runner at once

        if not 1 <= args.prefill_chunk <= PREFILL_CHUNK:
            raise BadRequestError(f"--prefill-chunk must be in [1, {PREFILL_CHUNK}], got {args.prefill_chunk}")
        options["max_chunk"] = args.prefill_chunk
    return options


def arithmetic_options(args: argparse.Namespace) -> dict:
    """load() options for the arithmetic asked for: the cpu reference's emulation, or the GPU's route."""
    from pyshim.errors import BadRequestError

    if args.like_llama_cpp and args.arithmetic == "f32":
        raise BadRequestError("--like-llama-cpp rounds activations to int8 as llama.cpp does: drop --arithmetic f32")
    if args.backend == "cpu":
        from pyshim.exec.reference import EXACT

        # --like-llama-cpp: bit for bit with llama.cpp; --arithmetic int8: its rounding only (the GPU int8
        # route's oracle, which cannot repeat x86 summation order)
        return {"emulate_llama_cpp": EXACT if args.like_llama_cpp else args.arithmetic == "int8"}
    if args.like_llama_cpp:
        raise BadRequestError("--like-llama-cpp is a cpu-backend option", hint="use --arithmetic int8")
    return {} if args.arithmetic is None else {"int8": args.arithmetic == "int8"}


def run(args: argparse.Namespace) -> int:
    limit_blas_threads()
    from pyshim.setup.catalog import resolve_model
    from pyshim.serve.generation import generate_text
    from pyshim.exec.loading import load
    from pyshim.serve.runs import arithmetic, gpu_bytes
    from pyshim.serve.sampling import SamplingParams
    from pyshim.text.tokenizer import Tokenizer

    params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                            repetition_penalty=args.repeat_penalty, presence_penalty=args.presence_penalty,
                            frequency_penalty=args.frequency_penalty, seed=args.seed)
    path = resolve_model(args.model)
    if args.backend == "browser":
        return _run_in_browser(args, path, params)
    runner = load(path, n_ctx=args.ctx, backend=args.backend, **load_options(args))
    tokenizer = Tokenizer.from_metadata(runner.metadata)
    prompt_ids, stop_ids = _prompt(args, tokenizer, runner.metadata)

    runner.prepare()
    result = generate_text(runner, prompt_ids, tokenizer.stream(), max_tokens=args.max_tokens, params=params,
                           stop_ids=[] if args.ignore_eos else sorted(stop_ids), stop_strings=args.stop,
                           on_text=None if args.json else _show)
    stats = result.stats
    if args.json:
        print(json.dumps({"text": result.text, "ids": result.ids, "prompt_ids": result.prompt_ids,
                          "prefill_tok_s": round(stats.prefill_tok_s, 2), "decode_tok_s": round(stats.decode_tok_s, 2),
                          "finish_reason": stats.finish_reason, "arithmetic": arithmetic(runner),
                          "cpu_share_pct": None if stats.cpu_share_pct is None else round(stats.cpu_share_pct, 2),
                          **(gpu_bytes(runner) if args.backend == "gpu" else {})}))
    else:
        print()
        print(f"[{stats.prompt_tokens} prompt tokens at {stats.prefill_tok_s:.1f} tok/s; {stats.generated} generated, "
              f"decode {stats.decode_tok_s:.1f} tok/s; {stats.finish_reason}]", file=sys.stderr)
    return 0


def _show(piece: str) -> None:
    sys.stdout.write(piece)
    sys.stdout.flush()


def _prompt(args: argparse.Namespace, tokenizer, metadata: dict) -> tuple[list[int], set[int]]:
    """The prompt's ids (through the chat template with --chat) and the ids that end generation."""
    stop_ids = set(tokenizer.eog_ids)
    if args.chat:
        from pyshim.text.chat import ChatTemplate
        template = ChatTemplate.from_metadata(metadata, tokenizer)
        return template.encode(tokenizer, [{"role": "user", "content": args.prompt}]), stop_ids | set(template.stop_ids)
    return tokenizer.encode(args.prompt, add_special=True), stop_ids


def _run_in_browser(args: argparse.Namespace, path, params) -> int:
    """The same request in the site's engine Worker (pyshim.cli.browser): the prompt is tokenized
    here, so both sides run the very same ids; the result prints like the native backends'."""
    from pyshim.cli import browser
    from pyshim.text.tokenizer import Tokenizer

    load_options(args)                  # checks the flags; the Worker takes --arithmetic and --kv-type itself
    header, n_ctx = browser.open_header(path, args.ctx)
    prompt_ids, stop_ids = _prompt(args, Tokenizer.from_metadata(header.metadata), header.metadata)
    sampling = {"temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p, "min_p": params.min_p,
                "repetition_penalty": params.repetition_penalty, "presence_penalty": params.presence_penalty,
                "frequency_penalty": params.frequency_penalty, "seed": params.seed, "max_tokens": args.max_tokens,
                "stop": args.stop, "ignore_eos": args.ignore_eos}
    r = browser.run(path, "complete", {"context": n_ctx, "arithmetic": args.arithmetic, "kv_type": args.kv_type, "prompt_ids": prompt_ids,
                                              "stop_token_ids": sorted(stop_ids), "sampling": sampling},
                            on_text=None if args.json else _show)
    t = r["timings"]
    prefill_tok_s = 1e3 * len(prompt_ids) / t["prefill_ms"] if t["prefill_ms"] else 0.0
    cpu_share = 100 * t["cpu_ms"] / t["decode_ms"] if t["decode_ms"] else None
    if args.json:
        print(json.dumps({"text": r["text"], "ids": r["token_ids"], "prompt_ids": prompt_ids,
                          "prefill_tok_s": round(prefill_tok_s, 2), "decode_tok_s": round(t["decode_tok_per_s"], 2),
                          "finish_reason": r["finish_reason"], "load_ms": round(t["load_ms"], 1),
                          "ttft_ms": round(t["ttft_ms"], 1), "cpu_share_pct": None if cpu_share is None else round(cpu_share, 2),
                          "arithmetic": r["arithmetic"]}))
    else:
        print()
        print(f"[{len(prompt_ids)} prompt tokens at {prefill_tok_s:.1f} tok/s; {len(r['token_ids'])} generated, "
              f"decode {t['decode_tok_per_s']:.1f} tok/s, CPU side {cpu_share or 0:.1f}% of decode; {r['finish_reason']}]",
              file=sys.stderr)
    return 0
