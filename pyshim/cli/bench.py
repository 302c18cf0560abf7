"""`pyshim bench`: the engine and its peer (wllama) measured side by side in headless Chromium.

The work lives in the checkout's playwright/bench.py, next to the browser harness it drives (it imports
only the standard library at the top); this command finds it and shares its argument list."""

from __future__ import annotations

import sys

from pyshim.paths import ROOT

BENCH_DIR = ROOT / "playwright"


def _bench_module():
    if str(BENCH_DIR) not in sys.path:
        sys.path.insert(0, str(BENCH_DIR))
    import bench

    return bench


def add_arguments(parser):
    if (BENCH_DIR / "bench.py").is_file():
        _bench_module().add_arguments(parser)


def run(args) -> int:
    from pyshim.errors import SetupError

    if not (BENCH_DIR / "bench.py").is_file():
        raise SetupError(f"{BENCH_DIR / 'bench.py'} is missing: `pyshim bench` runs from a pyshim checkout",
                         hint="clone the repository and install it with `pip install -e .`")
    bench = _bench_module()
    return bench.run_and_report(bench.config_from_args(args))
