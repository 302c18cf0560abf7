"""The foundation in a real headless Chromium: WebGPU adapter, Python booted in the Worker and in the
page, and a WGSL compute shader dispatched from Python through navigator.gpu with the right numbers."""

from __future__ import annotations

import pytest

import harness

pytestmark = [pytest.mark.browser]

SELFTEST_PY = "import json\nfrom pyshim.gpu.selftest import selftest\njson.dumps(await selftest())"


def test_page_has_a_webgpu_adapter(site_page):
    page, _, _ = site_page
    info = harness.require_adapter(page)
    assert info["ok"] and info["maxStorageBufferBindingSize"] >= 128 << 20


def test_worker_boots_python_with_timings(site_page):
    page, _, boot = site_page
    assert boot["versions"]["pyshim"] == __import__("pyshim").__version__
    assert boot["versions"]["numpy"] == "2.0.2" and boot["versions"]["python"].startswith("3.12")
    steps = [t["step"] for t in boot["timings"]]
    assert steps == ["manifest", "pyodide", "numpy", "wheels", "import"]
    assert all(t["ms"] >= 0 for t in boot["timings"]) and boot["total_ms"] > 0
    page.wait_for_selector("#status[data-state=ready]")
    assert "Python ready" in page.inner_text("#status")


def test_worker_runs_numpy_and_gguf(site_page):
    page, _, _ = site_page
    result = harness.engine_request(page, "exec", {"code": (
        "import json, numpy as np, gguf\n"
        "blocks = gguf.quants.quantize(np.arange(64, dtype=np.float32).reshape(2, 32), gguf.GGMLQuantizationType.Q8_0)\n"
        "back = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q8_0)\n"
        "json.dumps({'sum': float(np.arange(10).sum()), 'q8_err': float(abs(back - np.arange(64).reshape(2, 32)).max())})")})
    assert result["sum"] == 45.0
    assert result["q8_err"] < 0.3


# Modules that only make sense in CPython (native GPU, downloads and the dev server's commands).
CPYTHON_ONLY = ("pyshim.gpu.native", "pyshim.cli.", "pyshim.setup.downloads", "pyshim.setup.vendoring", "pyshim.setup.model_files", "pyshim.cli")


def test_every_engine_module_imports_in_pyodide(site_page):
    page, _, _ = site_page
    result = harness.engine_request(page, "exec", {"code": (
        "import importlib, json, pkgutil, pyshim\n"
        f"skip = {CPYTHON_ONLY!r}\n"
        "names = [m.name for m in pkgutil.walk_packages(pyshim.__path__, 'pyshim.') if not m.name.startswith(skip)]\n"
        "failed = {}\n"
        "for n in names:\n"
        "    try:\n        importlib.import_module(n)\n"
        "    except Exception as e:\n        failed[n] = f'{type(e).__name__}: {e}'\n"
        "json.dumps({'names': names, 'failed': failed})")})
    assert not result["failed"], result["failed"]
    assert {"pyshim.gguf.header", "pyshim.text.tokenizer", "pyshim.gpu.browser"} <= set(result["names"])


def test_wgsl_from_python_in_worker(site_page):
    page, _, _ = site_page
    result = harness.engine_request(page, "gpu-selftest")
    assert result["ok"], result
    assert result["max_abs_err"] == 0.0 and result["n"] == 1000
    assert result["adapter"]["face"] == "browser"
    page.wait_for_function("() => document.querySelector('#fact-gpu').textContent.includes('passed')")


def test_wgsl_from_python_in_page_main_thread(site_page):
    page, _, _ = site_page
    result = page.evaluate(
        """async (code) => {
             const { bootPython } = await import('./engine/python.js');
             const { pyodide, report } = await bootPython();
             return { report, selftest: JSON.parse(await pyodide.runPythonAsync(code)) };
           }""",
        SELFTEST_PY,
    )
    assert result["report"]["versions"]["pyshim"]
    assert result["selftest"]["ok"] and result["selftest"]["max_abs_err"] == 0.0


def test_model_listing_shows_on_page(site_page):
    page, _, _ = site_page
    page.wait_for_selector("#models li")
    assert "llama" in page.inner_text("#models")


def test_page_stayed_local_and_clean(site_page):
    _, watch, _ = site_page
    watch.check()
    assert any("/vendor/pyodide/pyodide.asm.wasm" in r for r in watch.requests)


def test_outside_requests_are_caught_even_from_a_worker(chromium, dev_server):
    context = chromium.new_context()
    try:
        page, watch = harness.open_page(context, dev_server.url + "vendor/manifest.json")
        page.evaluate("""async () => {
            const src = "fetch('http://203.0.113.7/x').catch(() => 0).finally(() => postMessage('done'))";
            const w = new Worker(URL.createObjectURL(new Blob([src], {type: 'text/javascript'})));
            await new Promise(r => { w.onmessage = r; });
            await fetch('http://198.51.100.9/y').catch(() => 0);
        }""")
        assert any("198.51.100.9" in u for u in watch.outside_requests)
        assert any("203.0.113.7" in u for u in watch.outside_requests)
        with pytest.raises(AssertionError, match="non-local"):
            watch.check()
    finally:
        context.close()
