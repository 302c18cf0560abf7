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
    parser.add_argument("--backend", default="cpu", help="cpu (the NumPy reference executor) or gpu (WGSL kernels through native wgpu)")
    parser.add_argument("--chat", action="store_true", help="apply the model's chat template to the prompt")
    parser.add_argument("--json", action="store_true",
                        help='print one JSON object {"text", "ids", "prompt_ids", "prefill_tok_s", "decode_tok_s"}')


def run(args: argparse.Namespace) -> int:
    limit_blas_threads()
    from pyshim.catalog import resolve_model
    from pyshim.generate import generate_text
    from pyshim.loading import load
    from pyshim.sampling import SamplingParams
    from pyshim.tokenizer import Tokenizer

    params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                            repetition_penalty=args.repeat_penalty, presence_penalty=args.presence_penalty,
                            frequency_penalty=args.frequency_penalty, seed=args.seed)
    runner = load(resolve_model(args.model), n_ctx=args.ctx, backend=args.backend)
    tokenizer = Tokenizer.from_metadata(runner.metadata)
    stop_ids = set(tokenizer.eog_ids)
    if args.chat:
        from pyshim.chat import ChatTemplate
        template = ChatTemplate.from_metadata(runner.metadata, tokenizer)
        prompt_ids = template.encode(tokenizer, [{"role": "user", "content": args.prompt}])
        stop_ids |= set(template.stop_ids)
    else:
        prompt_ids = tokenizer.encode(args.prompt, add_special=True)

    runner.prepare()

    def show(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    result = generate_text(runner, prompt_ids, tokenizer.stream(), max_tokens=args.max_tokens, params=params,
                           stop_ids=sorted(stop_ids), stop_strings=args.stop,
                           on_text=None if args.json else show)
    stats = result.stats
    if args.json:
        print(json.dumps({"text": result.text, "ids": result.ids, "prompt_ids": result.prompt_ids,
                          "prefill_tok_s": round(stats.prefill_tok_s, 2), "decode_tok_s": round(stats.decode_tok_s, 2),
                          "finish_reason": stats.finish_reason}))
    else:
        print()
        print(f"[{stats.prompt_tokens} prompt tokens at {stats.prefill_tok_s:.1f} tok/s; {stats.generated} generated, "
              f"decode {stats.decode_tok_s:.1f} tok/s; {stats.finish_reason}]", file=sys.stderr)
    return 0
