"""GGUF headers read in the browser: the Worker fetches only a prefix with Range requests and Python
(in Pyodide) parses it. Prints the parse time of Gemma 3's 262k-token header (the bar: ≤ 3 s)."""

from __future__ import annotations

import pytest

import harness
from pyshim.setup.catalog import MODELS, model_path

pytestmark = [pytest.mark.browser, pytest.mark.models]


@pytest.mark.parametrize("name,arch", [("smollm2", "llama"), ("gemma3", "gemma3")])
def test_header_from_a_prefix_in_pyodide(site_page, name, arch):
    if not model_path(name).is_file():
        pytest.fail(f"{name} is missing: run `pyshim setup`")
    page, _, _ = site_page
    result = harness.engine_request(page, "read-header", {"url": f"models/{MODELS[name].file_name}"})
    print(f"\n{name}: header {result['header_bytes'] / 1e6:.2f} MB parsed in Pyodide in {result['parse_ms']:.0f} ms "
          f"({result['rounds']} fetch round(s), {result['fetched_bytes'] / 1e6:.1f} MB fetched)")
    assert result["architecture"] == arch and result["supported"] is True
    assert result["fetched_bytes"] < MODELS[name].size / 4  # a prefix, never the whole file
    assert result["header_bytes"] <= result["fetched_bytes"]
    assert result["weight_bytes"] > 0.9 * MODELS[name].size * (0.9 if name == "gemma3" else 1) * 0.9


def test_header_of_a_non_gguf_file_is_refused_clearly(site_page):
    page, _, _ = site_page
    with pytest.raises(harness.HarnessError, match="GGUF"):
        harness.engine_request(page, "read-header", {"url": "vendor/pyodide/pyodide-lock.json"})
