"""Files the site must refuse, each with a message that says why and what to do: not a GGUF, a
truncated GGUF, a model too big for this GPU (refused after the header, before the body), more
than the storage quota, a server that ignores Range, and a file that changes mid-download."""

from __future__ import annotations

import re

import pytest

from site_helpers import (CHUNK, SMOLLM2, header_only_gguf, model_id, open_site, qwen7b_header_gguf, row_text, serve_bytes, shot,
                          smollm2_path, start_url_download, store_ok, wait_status)

pytestmark = [pytest.mark.browser, pytest.mark.slow]
FAKE = "fake"   # URL folder the tests answer through context.route; the dev server has no such folder


@pytest.fixture(scope="module")
def site(chromium, dev_server):
    context, page, watch = open_site(chromium, dev_server)
    yield context, page, watch
    context.close()


def fake_url(page, name: str) -> str:
    return page.evaluate("(p) => new URL(p, location.href).href", f"{FAKE}/{name}")


WAIT_MS = 60_000


def refused_row(page, name: str) -> str:
    wait_status(page, name, "refused", WAIT_MS)
    return row_text(page, name)


def refused_from_header(site, tmp_path, name: str, **model) -> str:
    """Offer a header-only GGUF (site_helpers.header_only_gguf(**model)) claiming its full size; assert it
    is refused having fetched the first chunk only (the header), never the body; -> the row's text."""
    context, page, _ = site
    header, total = header_only_gguf(tmp_path / name, **model)
    requests = []
    context.route(f"**/{FAKE}/{name}", lambda route: (requests.append(route.request.headers.get("range")), serve_bytes(route, header, total=total)))
    start_url_download(page, fake_url(page, name))
    text = refused_row(page, name)
    assert requests == [f"bytes=0-{CHUNK - 1}"]
    return text


def test_non_gguf_file_is_refused(site):
    _, page, _ = site
    start_url_download(page, page.evaluate("() => new URL('vendor/pyodide/pyodide-lock.json', location.href).href"))
    text = refused_row(page, "pyodide-lock.json")
    assert "not a GGUF file" in text, text
    manifest = store_ok(page, "getModel", model_id(page, "vendor/pyodide/pyodide-lock.json"))
    assert manifest["status"] == "refused" and not any(manifest["chunks"])   # nothing kept
    shot(page, "05-refused-not-gguf")


@pytest.mark.models
def test_truncated_gguf_is_refused(site):
    context, page, _ = site
    prefix = smollm2_path().read_bytes()[:4 << 20]
    context.route(f"**/{FAKE}/truncated.gguf", lambda route: serve_bytes(route, prefix))
    start_url_download(page, fake_url(page, "truncated.gguf"))
    text = refused_row(page, "truncated.gguf")
    assert "past the end of the file" in text and "download it again" in text, text


def test_model_too_big_for_the_gpu_is_refused_after_the_header_only(site, tmp_path):
    context, page, _ = site
    # 5.6 GB of F16 weights, more than the GPU memory the page assumes (4 GiB); its 4.2 GB embedding table
    # alone exceeds SwiftShader's 1 GiB storage binding, which is no reason (the executor splits it by rows)
    header, total = header_only_gguf(tmp_path / "big.gguf", n_vocab=256_000, n_embd=8192, n_layers=1, n_ff=11008)
    requests = []
    context.route(f"**/{FAKE}/big.gguf", lambda route: (requests.append(route.request.headers.get("range")), serve_bytes(route, header, total=total)))
    start_url_download(page, fake_url(page, "big.gguf"))
    text = refused_row(page, "big.gguf")
    assert "of GPU memory assumed available" in text and "storage binding" not in text, text
    assert requests == [f"bytes=0-{CHUNK - 1}"]   # the first chunk (the header), never the body
    page.click("#stored li:has-text('big.gguf') .row-main")
    page.wait_for_selector("#fit-panel[data-verdict=refused]")
    assert "Won't run here" in page.inner_text("#fit-panel") and page.is_visible("#fit-panel .fit-facts")
    manifest = store_ok(page, "getModel", model_id(page, fake_url(page, "big.gguf")))
    assert not any(manifest["chunks"]) and manifest["probe"]["weight_bytes"] > 5e9
    shot(page, "06-refused-too-big")


def test_an_unsupported_tensor_type_is_refused_by_name_before_the_download(site, tmp_path):
    """A BF16 model (no executor decodes BF16 yet) is refused from its header: the type is named, and
    nothing past the first chunk is fetched."""
    _, page, _ = site
    text = refused_from_header(site, tmp_path, "bf16.gguf", n_vocab=32_000, n_embd=1024, n_layers=2, n_ff=2816, dtype="BF16")
    assert "won't run" in text and "BF16" in text, text
    manifest = store_ok(page, "getModel", model_id(page, fake_url(page, "bf16.gguf")))
    assert manifest["status"] == "refused" and not any(manifest["chunks"])


def test_an_expert_layout_pyshim_does_not_compute_is_refused_by_name_before_the_download(site, tmp_path):
    """A Qwen3-MoE whose file asks for sigmoid gating (its architecture routes by softmax, in llama.cpp
    too): refused from the header, the gating named."""
    text = refused_from_header(site, tmp_path, "moe.gguf", n_vocab=32_000, n_embd=1024, n_layers=2, n_ff=512,
                               arch="qwen3moe", experts=16, keys={"expert_gating_func": 2})
    assert "gated by sigmoid" in text and "qwen3moe" in text, text


@pytest.mark.models
def test_model_over_the_memory_budget_is_refused(site):
    context, page, _ = site
    data = smollm2_path().read_bytes()
    # a 10 MiB GPU: less than SmolLM2's embedding table (18 MB), which stays resident even when every layer
    # is streamed (with 100 MiB the site would now take it, its layers streamed: tests/test_layer_streaming.py)
    page.evaluate("() => localStorage.setItem('pyshim.gpuBudgetMiB', '10')")
    try:
        context.route(f"**/{FAKE}/budget.gguf", lambda route: serve_bytes(route, data))
        start_url_download(page, fake_url(page, "budget.gguf"))
        text = refused_row(page, "budget.gguf")
    finally:
        page.evaluate("() => localStorage.removeItem('pyshim.gpuBudgetMiB')")
    assert "more than the 10.0 MiB of GPU memory assumed available" in text, text


def test_more_than_the_quota_is_refused_with_the_space_needed(site, tmp_path):
    context, page, _ = site
    header, total = header_only_gguf(tmp_path / "huge.gguf", n_vocab=128_256, n_embd=8192, n_layers=80, n_ff=28672)
    quota = page.evaluate("async () => (await navigator.storage.estimate()).quota")
    assert total > quota, "the fake model must exceed this browser's quota"
    context.route(f"**/{FAKE}/huge.gguf", lambda route: serve_bytes(route, header, total=total))
    start_url_download(page, fake_url(page, "huge.gguf"))
    wait_status(page, "huge.gguf", "error", WAIT_MS)
    text = row_text(page, "huge.gguf")
    assert re.search(r"needs 13\d\.\d\d GB more storage, but this browser allows this site only", text), text
    assert "delete stored models or free" in text, text
    assert not any(store_ok(page, "getModel", model_id(page, fake_url(page, "huge.gguf")))["chunks"])   # nothing kept


@pytest.mark.models
def test_server_ignoring_range_is_explained(site):
    context, page, _ = site
    data = smollm2_path().read_bytes()[:20 << 20]
    context.route(f"**/{FAKE}/norange.gguf", lambda route: serve_bytes(route, data, honour_range=False))
    start_url_download(page, fake_url(page, "norange.gguf"))
    wait_status(page, "norange.gguf", "error", WAIT_MS)
    text = row_text(page, "norange.gguf")
    assert "ignored the byte-range request (HTTP 200 instead of 206)" in text and "import it as a local file" in text, text
    shot(page, "07-error-no-range")


@pytest.mark.models
def test_file_changed_during_download_is_detected(site):
    context, page, watch = site
    data = smollm2_path().read_bytes()

    def changing(route):
        if route.request.headers.get("if-range"):   # after the first chunk the file "is replaced"
            serve_bytes(route, data[::-1], etag='"test-2"') if route.request.headers["if-range"] == '"test-2"' else \
                route.fulfill(status=200, headers={"ETag": '"test-2"', "Content-Type": "application/octet-stream"}, body=data[:1 << 20])
        else:
            serve_bytes(route, data, etag='"test-1"')

    context.route(f"**/{FAKE}/changing.gguf", changing)
    start_url_download(page, fake_url(page, "changing.gguf"))
    wait_status(page, "changing.gguf", "error", WAIT_MS)
    text = row_text(page, "changing.gguf")
    assert "changed since the download started" in text and "start again" in text, text
    assert SMOLLM2.size > CHUNK
    watch.check(allow_console_errors=("Failed to load resource",))


def fit_panel_of_header(site, tmp_path, name: str, budget_bytes: float) -> tuple[str, dict]:
    """A Qwen2.5-7B-shaped header (4.3 GB claimed; the body refused by the fake server) downloaded with a GPU
    budget of `budget_bytes`: (the fit panel's text, the stored manifest), the model deleted again."""
    context, page, _ = site
    header, total = qwen7b_header_gguf(tmp_path / name)
    page.evaluate("(mib) => localStorage.setItem('pyshim.gpuBudgetMiB', String(mib))", budget_bytes / 2 ** 20)
    try:
        def answer(route):
            if route.request.headers.get("range") == f"bytes=0-{CHUNK - 1}":
                serve_bytes(route, header, total=total)
            else:
                route.abort()
        context.route(f"**/{FAKE}/{name}", answer)
        start_url_download(page, fake_url(page, name))
        page.wait_for_function("""(name) => [...document.querySelectorAll('#stored li')].some(li =>
            li.querySelector('.name').textContent === name && li.dataset.status !== 'new')""", arg=name, timeout=WAIT_MS)
        page.click(f"#stored li:has-text('{name}') .row-main")
        page.wait_for_selector("#fit-panel[data-verdict=fits]", timeout=WAIT_MS)
        panel = page.eval_on_selector("#fit-panel", "el => el.textContent")
    finally:
        page.evaluate("() => localStorage.removeItem('pyshim.gpuBudgetMiB')")
    manifest = store_ok(page, "getModel", model_id(page, fake_url(page, name)))
    store_ok(page, "deleteModel", manifest["id"])
    return panel, manifest


def test_auto_settings_fit_a_7b_model_in_6_gb_and_the_panel_says_why(site, tmp_path):
    """kv_type "auto" (the site's default): a 4.3 GB Qwen2.5-7B-shaped file and a 6 GB budget get a small
    cache at a context that fits, and the fit panel says what was picked and why. (The body is refused by
    the fake server: the panel is the header's verdict.)"""
    panel, manifest = fit_panel_of_header(site, tmp_path, "qwen7b.gguf", 6e9)
    picked = manifest["probe"]["auto"]
    assert picked["kv_type"] in ("q8", "q4") and picked["context"] >= 8192 and picked["total_bytes"] <= 6e9
    assert "auto picked a q" in panel and "f32 would need" in panel and "of the 6.00 GB budget" in panel, panel


def test_a_7b_model_in_a_2_gb_budget_gets_a_streaming_plan_not_a_refusal(site, tmp_path):
    """Where the weights do not fit at all, "will it fit?" answers with the plan that streams the last
    layers from the store (pyshim.plan.auto), before the download: resident layers, bytes a step reads."""
    panel, manifest = fit_panel_of_header(site, tmp_path, "qwen7b-2g.gguf", 2e9)
    picked = manifest["probe"]["auto"]
    assert picked["mode"] == "layers streamed" and 0 < picked["streamed_layers"] < 28 and picked["total_bytes"] <= 2e9
    assert manifest["probe"]["streamed_layers"] == picked["streamed_layers"]
    assert "auto streams layers" in panel and "of 28 layers stay on the GPU" in panel, panel
