"""`pyshim score MODEL --text T --json`: teacher-forced top-k predictions after every prefix (how pyshim
is compared with llama.cpp)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pyshim.cli.generate import add_run_arguments, limit_blas_threads, run_settings
from pyshim.cli.tokenize import read_text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="a .gguf path or a short name (smollm2, gemma3, qwen2.5)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", help="the text to score")
    source.add_argument("--file", type=Path, help="a UTF-8 file holding the text to score (read as its bytes: CRLF kept)")
    parser.add_argument("--top-k", type=int, default=10)
    parser.add_argument("--json", action="store_true", help="print JSON (the only output format)")
    add_run_arguments(parser)


def run(args: argparse.Namespace) -> int:
    limit_blas_threads()
    import asyncio

    from pyshim.setup.catalog import resolve_model

    settings = run_settings(args)
    text = args.text if args.text is not None else read_text(args.file)
    path = resolve_model(args.model)
    if args.backend == "browser":
        return _score_in_browser(args, path, settings, text)
    print(json.dumps(asyncio.run(_score(args, path, settings, text))))
    return 0


async def _score(args, path, settings, text: str) -> dict:
    from pyshim.exec.loading import load
    from pyshim.serve.generation import score
    from pyshim.text.tokenizer import Tokenizer

    runner = await load(path, backend=args.backend, settings=settings)
    try:
        ids = Tokenizer.from_metadata(runner.header.metadata).encode(text, add_special=True)
        scores = (await score(runner, ids, args.top_k)).as_dict()
        return {"ids": ids, "top_ids": scores["top_ids"], "top_logits": scores["top_logits"], "arithmetic": runner.arithmetic.value,
                "kv_type": runner.settings.kv_type, "layer_stream": runner.layer_stream_stats()}
    finally:
        runner.close()


def _score_in_browser(args: argparse.Namespace, path, settings, text: str) -> int:
    """The same ids scored in the site's engine Worker (pyshim.cli.browser); prints the same JSON."""
    from pyshim.cli import browser
    from pyshim.text.tokenizer import Tokenizer

    ids = Tokenizer.from_metadata(browser.open_header(path).metadata).encode(text, add_special=True)
    r = browser.run(path, "score", {"settings": settings.as_dict(), "ids": ids, "top_k": args.top_k})
    print(json.dumps({"ids": r["ids"], "top_ids": r["top_ids"], "top_logits": r["top_logits"], "arithmetic": r["arithmetic"],
                      "kv_type": r["kv_type"], "layer_stream": r["layer_stream"]}))
    return 0
