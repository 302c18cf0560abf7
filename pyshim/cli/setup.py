"""`pyshim setup`: vendor what the site needs into web/vendor/ and place the default models in models/.

Idempotent and offline once done: every download is cached, every step skips what is already right.
"""

from __future__ import annotations

import argparse
import time


def add_arguments(parser):
    parser.add_argument("--test-models", action="store_true", help="also place the models only the tests use (Qwen2.5-Coder-0.5B)")
    parser.add_argument("--no-models", action="store_true", help="vendor the site only")


def default_args() -> argparse.Namespace:
    return argparse.Namespace(test_models=False, no_models=False)


def run(args) -> int:
    from pyshim.setup import model_files
    from pyshim.setup import vendoring
    from pyshim.exec import wasm_module
    from pyshim.errors import PyshimError

    steps = [
        (f"Pyodide {vendoring.PYODIDE_VERSION} runtime (npm)", vendoring.vendor_pyodide),
        ("numpy, micropip, packaging for Pyodide (checked against pyodide-lock.json)", vendoring.vendor_pyodide_packages),
        ("pure wheels: gguf, jinja2, PyYAML, MarkupSafe", vendoring.vendor_wheels),
        ("pyshim wheel (with shaders/)", vendoring.vendor_pyshim),
        (f"@pyscript/core {vendoring.PYSCRIPT_VERSION} (npm)", vendoring.vendor_pyscript),
        (f"@wllama/wllama {vendoring.WLLAMA_VERSION} (npm; the benchmark's peer)", vendoring.vendor_wllama),
        (f"openai {vendoring.OPENAI_VERSION} (npm, integrity checked; the OpenAI example's client)", vendoring.vendor_openai),
        (f"@mlc-ai/web-xgrammar {vendoring.XGRAMMAR_VERSION} (npm, integrity checked; the page's grammar engine)", vendoring.vendor_xgrammar),
        (f"axe-core {vendoring.AXE_VERSION} (npm, integrity checked; the tests' accessibility audit)", vendoring.vendor_axe),
        ("CPU engine: shaders/wasm/engine.c -> web/vendor/pyshim-cpu*.wasm (zig cc; SIMD128 and relaxed SIMD, one thread and threaded, 32- and 64-bit memory)", wasm_module.build_step),
        ("web/vendor/manifest.json", vendoring.write_manifest),
        ("web/vendor/definitions.js (request schemas and known models, from Python)", vendoring.write_definitions),
    ]
    if not args.no_models:
        for model in model_files.models_to_place(args.test_models):
            steps.append((f"model {model.name}: {model.file_name}", lambda m=model: model_files.place(m)))

    total = len(steps)
    start_all = time.perf_counter()
    for i, (label, step) in enumerate(steps, 1):
        print(f"[setup {i}/{total}] {label} ...", flush=True)
        start = time.perf_counter()
        try:
            detail = step()
        except PyshimError as exc:
            raise type(exc)(f"step {i}/{total} ({label}) failed: {exc}") from exc
        print(f"[setup {i}/{total}] ok in {time.perf_counter() - start:.1f} s — {detail}", flush=True)
    print(f"[setup] done in {time.perf_counter() - start_all:.1f} s", flush=True)
    return 0
