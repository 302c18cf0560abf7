"""The Python API's Pyodide side, from CPython: what a PyScript page must install to `import pyshim.api`,
and the browser backend refused where it cannot run. (In the browser: tests/test_pyscript.py.)"""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from pyshim.api import load
from pyshim.errors import BadRequestError


def test_importing_the_api_needs_only_numpy():
    """A PyScript page installs numpy and the pyshim wheel, not gguf/jinja2/PyYAML: the engine and its
    dependencies are imported only by the native backends."""
    code = ("import sys, pyshim.api\n"
            "heavy = sorted(m for m in ('pyshim.serve.session', 'pyshim.gguf.header', 'pyshim.text.chat', 'gguf', 'jinja2', 'yaml') if m in sys.modules)\n"
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_browser_backend_outside_pyodide_is_a_clear_error():
    with pytest.raises(BadRequestError, match="only inside Pyodide"):
        asyncio.run(load("smollm2", backend="browser"))


def test_the_pyscript_example_installs_this_pyshim_from_the_site():
    """The example's PyScript config names the wheel by file: a version bump must update it."""
    import json
    import re

    from pyshim import __version__
    from pyshim.paths import ROOT

    page = (ROOT / "web" / "examples" / "pyscript.html").read_text()
    config = json.loads(re.search(r"<script type=\"py\"[^>]*config='([^']*)'", page).group(1))
    assert config["interpreter"] == "../vendor/pyodide/pyodide.mjs" and config["packages_cache"] == "never"
    assert f"../vendor/wheels/pyshim-{__version__}-py3-none-any.whl" in config["packages"]
    assert all(p == "numpy" or p.startswith("../vendor/") for p in config["packages"])   # nothing from a CDN or PyPI
    assert config["js_modules"]["main"] == {"../pyshim.js": "pyshim_js"}
