"""`pyshim score MODEL --text T --json`: teacher-forced top-k predictions after every prefix (how pyshim
is compared with llama.cpp)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pyshim.cli.generate import add_arithmetic_arguments, limit_blas_threads, load_options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="a .gguf path or a short name (smollm2, gemma3, qwen2.5)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", help="the text to score")
    source.add_argument("--file", type=Path, help="a UTF-8 file holding the text to score")
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--ctx", type=int, default=None, help="context length (default: min(model's, 4096))")
    parser.add_argument("--backend", default="cpu", help="cpu (the NumPy reference executor), gpu (WGSL kernels through "
                        "native wgpu) or browser (the site's engine Worker in headless Chromium, WebGPU from Pyodide)")
    parser.add_argument("--json", action="store_true", help="print JSON (the only output format)")
    add_arithmetic_arguments(parser)


def run(args: argparse.Namespace) -> int:
    limit_blas_threads()
    from pyshim.setup.catalog import resolve_model
    from pyshim.errors import BadRequestError
    from pyshim.serve.generation import score
    from pyshim.exec.loading import load
    from pyshim.serve.runs import arithmetic
    from pyshim.text.tokenizer import Tokenizer

    if args.top_k < 1:
        raise BadRequestError("--top-k must be at least 1")
    text = args.text if args.text is not None else args.file.read_text(encoding="utf-8")
    if args.backend == "browser":
        return _score_in_browser(args, resolve_model(args.model), text)
    runner = load(resolve_model(args.model), n_ctx=args.ctx, backend=args.backend, **load_options(args))
    ids = Tokenizer.from_metadata(runner.metadata).encode(text, add_special=True)
    top_ids, top_logits = score(runner, ids, args.top_k)
    print(json.dumps({"ids": ids, "top_ids": top_ids.tolist(),
                      "top_logits": [[round(float(v), 5) for v in row] for row in top_logits],
                      "arithmetic": arithmetic(runner)}))
    return 0


def _score_in_browser(args: argparse.Namespace, path, text: str) -> int:
    """The same ids scored in the site's engine Worker (pyshim.cli.browser); prints the same JSON."""
    from pyshim.cli import browser
    from pyshim.text.tokenizer import Tokenizer

    load_options(args)                  # checks the flags; the Worker takes --arithmetic and --kv-type itself
    header, n_ctx = browser.open_header(path, args.ctx)
    ids = Tokenizer.from_metadata(header.metadata).encode(text, add_special=True)
    r = browser.run(path, "score", {"context": n_ctx, "arithmetic": args.arithmetic, "kv_type": args.kv_type, "ids": ids,
                                            "top_k": args.top_k})
    print(json.dumps({"ids": r["ids"], "top_ids": r["top_ids"], "top_logits": r["top_logits"], "arithmetic": r["arithmetic"]}))
    return 0
