"""`pyshim tokenize MODEL (--text T | --file F)`: the model's token ids for a text, as llama.cpp gives them."""

from __future__ import annotations

import json
import sys


def add_arguments(parser):
    parser.add_argument("model", help="a .gguf path or a short name (smollm2, gemma3, qwen2.5)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", help="the text to tokenize")
    source.add_argument("--file", help="a UTF-8 file to tokenize, read as its bytes: CRLF kept ('-' reads standard input)")
    parser.add_argument("--add-special", action="store_true", help="add BOS/EOS as the model's GGUF asks")
    parser.add_argument("--parse-special", action="store_true",
                        help="turn control-token texts such as <|im_start|> into single tokens")
    parser.add_argument("--json", action="store_true", help='print {"ids": [...]} only')


def read_text(path) -> str:
    """A file's text exactly as its bytes say (no newline translation: llama.cpp reads bytes too)."""
    from pyshim.errors import BadRequestError

    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequestError(f"{path} is not UTF-8 text (byte {exc.start})") from None


def run(args) -> int:
    from pathlib import Path

    from pyshim.gguf.header import read_header_from_file
    from pyshim.setup.catalog import resolve_model
    from pyshim.text.tokenizer import Tokenizer

    if args.text is not None:
        text = args.text
    elif args.file == "-":
        raw = getattr(sys.stdin, "buffer", None)           # bytes: no newline translation
        text = raw.read().decode("utf-8") if raw is not None else sys.stdin.read()
    else:
        text = read_text(Path(args.file))
    tokenizer = Tokenizer.from_metadata(read_header_from_file(resolve_model(args.model)).metadata)
    ids = tokenizer.encode(text, add_special=args.add_special, parse_special=args.parse_special)
    if args.json:
        print(json.dumps({"ids": ids}))
        return 0
    for token_id in ids:
        print(f"{token_id:>8}  {tokenizer.token_to_piece(token_id, special=True)!r}")
    print(f"{len(ids)} token{'' if len(ids) == 1 else 's'}")
    return 0
