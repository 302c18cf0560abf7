"""The site downloads SmolLM2 from the dev server into IndexedDB, in chunks, verified; the engine's
slice readers return the file's bytes (a streamed expert's ranges without reading their chunks whole);
deleting the model frees the storage. An on-disk profile, as a visitor's browser has."""

from __future__ import annotations

import hashlib
import time

import pytest

from site_helpers import (CHUNK, SMOLLM2, SMOLLM2_URL_PATH, model_id, open_site, read_range_hex, row_text, shot,
                          smollm2_path, store_ok, wait_status)

pytestmark = [pytest.mark.browser, pytest.mark.models, pytest.mark.slow]
NAME = "SmolLM2-135M-Instruct.Q4_1"
THROTTLE_S = 0.4   # per chunk response, so the "downloading" state can be seen and photographed


@pytest.fixture(scope="module")
def site(chromium, dev_server, tmp_path_factory):
    smollm2_path()
    context, page, watch = open_site(chromium, dev_server, profile=tmp_path_factory.mktemp("profile"))
    yield context, page, watch
    context.close()


def test_empty_page_looks_ready(site):
    _, page, _ = site
    page.wait_for_selector("#models li")
    assert page.is_visible("#stored-empty")
    assert "Pick a model" in page.inner_text("#notice")
    assert "software fallback" in page.inner_text("#status")   # SwiftShader is named as such
    shot(page, "01-empty")


def test_download_from_dev_server_is_chunked_and_verified(site):
    context, page, _ = site
    ranges = []

    def throttle(route):
        ranges.append(route.request.headers.get("range"))
        response = route.fetch()
        time.sleep(THROTTLE_S)
        route.fulfill(response=response)

    context.route("**/models/*.gguf", throttle)
    try:
        page.click(f"#models li:has-text('{NAME}') button")
        page.wait_for_selector("#stored li[data-phase=download]")
        # Read the progress line in the same evaluation that sees it: a moment later it may say "Verifying".
        text = page.wait_for_function(
            "() => { const t = document.querySelector('#stored li .progress-text')?.textContent; return t && t.includes('MB/s') ? t : null; }"
        ).json_value()
        shot(page, "02-downloading", readme=True)
        assert "of 98.4 MB" in text and "left" in text, text
        # the chat says what is happening and how far it is, not that the visitor did something wrong
        notice = page.wait_for_function(
            "() => { const n = document.getElementById('notice'); return n.dataset.kind === 'info' && n.innerText.includes('MB/s') ? n.innerText : null; }"
        ).json_value()
        assert f"{NAME} is downloading" in notice and "of 98.4 MB stored" in notice and "s left" in notice, notice
        wait_status(page, NAME, "ready")
    finally:
        context.unroute("**/models/*.gguf", throttle)
    n_chunks = -(-SMOLLM2.size // CHUNK)
    assert len(ranges) == n_chunks and all(r and r.startswith("bytes=") for r in ranges), ranges
    manifest = store_ok(page, "getModel", model_id(page, SMOLLM2_URL_PATH))
    assert manifest["status"] == "ready" and manifest["size"] == SMOLLM2.size
    assert manifest["sha256"] == SMOLLM2.sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert manifest["fit"]["ok"] and manifest["probe"]["architecture"] == "llama"
    assert "SHA-256" in row_text(page, NAME)
    page.wait_for_selector("#fit-panel[data-verdict=fits]")
    shot(page, "03-ready")


def test_stored_file_sha256_recomputed_from_indexeddb(site):
    _, page, _ = site
    assert store_ok(page, "wholeFileSha256", model_id(page, SMOLLM2_URL_PATH)) == SMOLLM2.sha256


def test_read_range_returns_the_file_bytes_across_chunks(site):
    _, page, _ = site
    data = smollm2_path().read_bytes()
    mid = model_id(page, SMOLLM2_URL_PATH)
    for offset, size in [(0, 64), (CHUNK - 100, 300), (SMOLLM2.size - 50, 50)]:
        assert read_range_hex(page, mid, offset, size) == data[offset:offset + size].hex(), (offset, size)
    offset, size = 3 * CHUNK - 7, 2 * CHUNK + 11   # across three chunks: compared by digest, not byte by byte
    digest = page.evaluate(
        """async ([id, offset, size]) => {
             const store = await import('./store/store.js');
             const d = new Uint8Array(await crypto.subtle.digest('SHA-256', await store.readRange(id, offset, size)));
             return Array.from(d, (b) => b.toString(16).padStart(2, '0')).join('');
           }""", [mid, offset, size])
    assert digest == hashlib.sha256(data[offset:offset + size]).hexdigest()


def test_slice_pieces_stream_chunk_by_chunk(site):
    _, page, _ = site
    data = smollm2_path().read_bytes()
    slices = [{"offset": 5 * CHUNK - 10, "size": 20, "buffer": "b"}, {"offset": 100, "size": CHUNK + 5, "buffer": "a"}]
    pieces = page.evaluate(
        """async ([id, slices]) => {
             const store = await import('./store/store.js');
             const out = [];
             for await (const {slice, at, bytes} of store.slicePieces(id, slices)) {
               const d = new Uint8Array(await crypto.subtle.digest('SHA-256', bytes));
               out.push({buffer: slice.buffer, at, size: bytes.length, sha: Array.from(d, b => b.toString(16).padStart(2, '0')).join('')});
             }
             return out;
           }""",
        [model_id(page, SMOLLM2_URL_PATH), slices])
    # in file order, split at chunk boundaries: slice "a" spans chunks 0-1, slice "b" chunks 4-5
    assert [(p["buffer"], p["at"], p["size"]) for p in pieces] == [
        ("a", 0, CHUNK - 100), ("a", CHUNK - 100, 105), ("b", 0, 10), ("b", 10, 10)]
    for p, (offset, size) in zip(pieces, [(100, CHUNK - 100), (CHUNK, 105), (5 * CHUNK - 10, 10), (5 * CHUNK, 10)]):
        assert p["sha"] == hashlib.sha256(data[offset:offset + size]).hexdigest()


def test_range_pieces_read_only_their_bytes(site):
    """The streamed-expert reader: each range from its chunk's Blob slice, split at chunk boundaries, given
    in the order asked; a range past the file is a RangeError. Timed against reading one chunk whole."""
    _, page, _ = site
    data = smollm2_path().read_bytes()
    slices = [{"offset": 5 * CHUNK - 10, "size": 20}, {"offset": 100, "size": 1 << 20}]
    out = page.evaluate(
        """async ([id, slices, chunk]) => {
             const store = await import('./store/store.js');
             const read = await import('./store/read.js');
             const pieces = [];
             const t0 = performance.now();
             for await (const {slice, at, bytes} of store.rangePieces(id, slices)) {
               const d = new Uint8Array(await crypto.subtle.digest('SHA-256', bytes));
               pieces.push({offset: slice.offset, at, size: bytes.length, sha: Array.from(d, b => b.toString(16).padStart(2, '0')).join('')});
             }
             const t1 = performance.now();
             const manifest = await store.getModel(id);
             await read.chunkBytes(manifest, 2);
             const t2 = performance.now();
             let error = null;
             try { for await (const _ of store.rangePieces(id, [{offset: manifest.size - 4, size: 8}])) {} }
             catch (e) { error = e.name; }
             return {pieces, slices_ms: t1 - t0, chunk_ms: t2 - t1, error};
           }""",
        [model_id(page, SMOLLM2_URL_PATH), slices, CHUNK])
    assert [(p["offset"], p["at"], p["size"]) for p in out["pieces"]] == [
        (5 * CHUNK - 10, 0, 10), (5 * CHUNK - 10, 10, 10), (100, 0, 1 << 20)]
    for p, (offset, size) in zip(out["pieces"], [(5 * CHUNK - 10, 10), (5 * CHUNK, 10), (100, 1 << 20)]):
        assert p["sha"] == hashlib.sha256(data[offset:offset + size]).hexdigest()
    assert out["error"] == "RangeError"
    print(f"rangePieces: 1 MiB + 2 x 10 B in {out['slices_ms']:.1f} ms; one 16 MiB chunk read whole: {out['chunk_ms']:.1f} ms")


def test_the_worker_reads_slices_from_indexeddb(site):
    _, page, _ = site
    data = smollm2_path().read_bytes()
    offset, size = CHUNK - 1000, 2 * CHUNK
    out = page.evaluate("([id, offset, size]) => window.pyshimEngine.request('store-digest', {model_id: id, offset, size})",
                        [model_id(page, SMOLLM2_URL_PATH), offset, size])
    assert out == {"sha256": hashlib.sha256(data[offset:offset + size]).hexdigest(), "pieces": 3}


def test_will_it_fit_follows_the_context_and_budget_settings(site):
    _, page, _ = site
    page.click("#settings-toggle")
    page.fill("#set-context", "8192")
    page.dispatch_event("#set-context", "change")
    page.wait_for_function("() => document.querySelector('#fit-panel').innerText.includes('8192 tokens')")
    manifest = store_ok(page, "getModel", model_id(page, SMOLLM2_URL_PATH))
    assert manifest["probe"]["context"] == 8192 and manifest["probe"]["kv_bytes"] == 2 * 188_743_680
    # 10 MiB: less than the embedding table, which stays resident whatever is streamed (at 200 MiB the
    # plan now streams layers rather than refuse)
    page.fill("#set-gpu-budget", "10")
    page.dispatch_event("#set-gpu-budget", "change")
    page.wait_for_selector("#fit-panel[data-verdict=refused]")
    assert "more than the 10.0 MiB of GPU memory assumed available" in page.inner_text("#fit-panel")
    shot(page, "04-fit-refused-by-settings")
    page.fill("#set-gpu-budget", "4096")
    page.dispatch_event("#set-gpu-budget", "change")
    page.fill("#set-context", "4096")
    page.dispatch_event("#set-context", "change")
    page.wait_for_function("() => document.querySelector('#fit-panel').dataset.verdict === 'fits' && "
                           "document.querySelector('#fit-panel').innerText.includes('4096 tokens')")
    page.click("#settings-toggle")

def test_delete_frees_storage(site):
    _, page, watch = site
    page.evaluate("() => navigator.storage.estimate()")
    before = page.evaluate("async () => (await navigator.storage.estimate()).usage")
    assert before > 90e6   # the model is counted
    page.click(f"#stored li:has-text('{NAME}') button:has-text('Delete')")
    page.wait_for_selector("#stored-empty", state="visible")
    assert store_ok(page, "listModels") == []
    page.wait_for_function("(before) => navigator.storage.estimate().then(e => e.usage < before - 90e6)", arg=before, timeout=30_000)
    # what the page shows follows (the browser removes the chunks' Blob files after the delete)
    page.wait_for_function("(before) => window.pyshimStorage.usage < before - 90e6", arg=before, timeout=30_000)
    watch.check()
