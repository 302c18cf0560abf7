"""The `pyshim` command. Each subcommand lives in `pyshim/cli/<name>.py` with
`add_arguments(parser)` and `run(args) -> int`. Command modules import only the standard library
at the top and their heavy dependencies inside `run`, so `pyshim serve` never pays for numpy.
`browser` runs one request in the site's Worker in headless Chromium (`--backend browser`);
`doctor_checks` holds the checks `doctor` runs, each in a process of its own.
May import: anything in pyshim."""

from __future__ import annotations

import argparse
import importlib
import sys

from pyshim.errors import PyshimError

# name -> one-line help; the module pyshim.cli.<name> does the work.
COMMANDS = {
    "setup": "vendor Pyodide, wheels and the default models into web/vendor and models/",
    "serve": "start the dev server (site, shaders, models with HTTP Range)",
    "inspect": "show a GGUF model's hyperparameters, tensor types and memory needs",
    "tokenize": "print a text's token ids for a model (same ids as llama.cpp)",
    "bench": "measure the engine and its peer (wllama) in headless Chromium; JSON, HTML and Markdown reports",
    "generate": "continue a prompt (or --chat) with a model, streaming the text",
    "score": "teacher-forced top-k logits after every prefix of a text (JSON; compare with llama.cpp)",
    "doctor": "check this machine: native and Chromium WebGPU adapters, kernel self-tests, optionally the benchmarks",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pyshim", description="GGUF language models on WebGPU, in the browser and natively.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, help_text in COMMANDS.items():
        module = importlib.import_module(f"pyshim.cli.{name}")
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(command_parser)
        command_parser.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return int(args._run(args) or 0)
    except PyshimError as exc:
        print(f"pyshim {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130

