"""Helpers for the site's browser tests (tests/test_site_*.py): a booted page per module, store calls
from Python, byte-range serving for crafted files through context.route, request counting, screenshots."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import harness
from pyshim.setup.catalog import MODELS, model_path

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = ROOT / "artifacts" / "screenshots"
README_SHOTS = ROOT / "playwright" / "screenshots"
CHUNK = 16 << 20                       # the store's default chunk size (web/store/store.js CHUNK_SIZE)
SMOLLM2 = MODELS["smollm2"]
SMOLLM2_URL_PATH = f"models/{SMOLLM2.file_name}"
VIEWPORT = {"width": 1280, "height": 860}
DOWNLOAD_TIMEOUT_MS = 120_000
# Offline, the dev server's listing cannot load; Chromium logs the failed fetch as a console error.
OFFLINE_CONSOLE_NOISE = ("ERR_INTERNET_DISCONNECTED", "Failed to load resource")


def smollm2_path() -> Path:
    path = model_path("smollm2")
    if not path.is_file():
        raise AssertionError("SmolLM2 is missing: run `pyshim setup`")
    return path


def open_site(chromium, dev_server, *, wait_gpu: bool = True, profile: Path | None = None):
    """A fresh context (its own IndexedDB) with the site open and Python booted: (context, page, watch).
    With `profile`, an on-disk profile there (a browser of its own), as a visitor's browser keeps: the
    storage it reports then counts the store's chunks (an incognito-like context keeps IndexedDB's Blobs
    out of navigator.storage's usage)."""
    if profile is None:
        context = chromium.new_context(viewport=VIEWPORT)
    else:
        from types import SimpleNamespace

        context = harness.launch_persistent(SimpleNamespace(chromium=chromium.browser_type), profile, viewport=VIEWPORT)
    page, watch = harness.open_page(context, dev_server.url)
    harness.wait_for_boot(page)
    if wait_gpu:
        page.wait_for_selector("#status[data-state=ready]", timeout=harness.BOOT_TIMEOUT_MS)
    page.set_default_timeout(DOWNLOAD_TIMEOUT_MS)
    return context, page, watch


def shot(page, name: str, *, readme: bool = False) -> Path:
    """A screenshot into artifacts/screenshots; a `readme` one also into playwright/screenshots (the README's
    pictures) when PYSHIM_README_SHOTS is set, so a plain test run leaves the tracked files alone."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path))
    if readme and os.environ.get("PYSHIM_README_SHOTS"):
        README_SHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, README_SHOTS / path.name)
    return path


def store(page, fn: str, *args):
    """Calls web/store/store.js's `fn(*args)` in the page and returns its (JSON-able) result."""
    return page.evaluate(
        """async ([fn, args]) => {
             const store = await import('./store/store.js');
             try { return {ok: true, value: await store[fn](...args)}; }
             catch (e) { return {ok: false, error: {name: e.name, message: e.message, hint: e.hint ?? null}}; }
           }""",
        [fn, list(args)],
    )


def store_ok(page, fn: str, *args):
    out = store(page, fn, *args)
    assert out["ok"], f"store.{fn} failed: {out['error']}"
    return out.get("value")


def read_range_hex(page, model_id: str, offset: int, size: int) -> str:
    return page.evaluate(
        """async ([id, offset, size]) => {
             const store = await import('./store/store.js');
             const bytes = await store.readRange(id, offset, size);
             return Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
           }""",
        [model_id, offset, size],
    )


def model_id(page, url_path: str) -> str:
    return page.evaluate("(p) => 'url:' + new URL(p, location.href).href", url_path)


def wait_status(page, name: str, status: str, timeout_ms: int = DOWNLOAD_TIMEOUT_MS) -> None:
    page.wait_for_function(
        """([name, status]) => [...document.querySelectorAll('#stored li')].some(li =>
             li.dataset.status === status && li.querySelector('.name').textContent === name)""",
        arg=[name, status], timeout=timeout_ms)


def row_text(page, name: str) -> str:
    return page.evaluate(
        """(name) => [...document.querySelectorAll('#stored li')].find(li => li.querySelector('.name').textContent === name)?.innerText ?? ''""",
        name)


_RANGE = re.compile(r"bytes=(\d+)-(\d*)")


def range_of(headers: dict) -> tuple[int, int] | None:
    """(first, last) of a request's Range header, or None."""
    match = _RANGE.fullmatch(headers.get("range", "").strip())
    if not match:
        return None
    return int(match.group(1)), int(match.group(2)) if match.group(2) else -1


def serve_bytes(route, data: bytes, *, total: int | None = None, etag: str = '"test-1"', honour_range: bool = True) -> None:
    """Answers `route` like a static file server holding `data` (claiming `total` bytes, padding with zeros)."""
    total = len(data) if total is None else total
    headers = {"Accept-Ranges": "bytes", "ETag": etag, "Content-Type": "application/octet-stream"}
    wanted = range_of(route.request.headers) if honour_range else None
    if wanted is None:
        route.fulfill(status=200, headers=headers, body=data.ljust(total, b"\0"))
        return
    first, last = wanted
    last = total - 1 if last < 0 else min(last, total - 1)
    body = data[first:last + 1].ljust(last + 1 - first, b"\0")
    route.fulfill(status=206, headers={**headers, "Content-Range": f"bytes {first}-{last}/{total}"}, body=body)


def start_url_download(page, url: str) -> None:
    """Types `url` into the URL tab and starts the download, as a visitor would."""
    page.click("[aria-controls=tab-url]")
    page.fill("#url-input", url)
    page.click("#url-form button[type=submit]")


def header_only_gguf(path: Path, *, n_vocab: int, n_embd: int, n_layers: int, n_ff: int, dtype: str = "F16",
                     arch: str = "llama", experts: int = 0, keys: dict | None = None) -> tuple[bytes, int]:
    """A llama-style GGUF header (F16 tensors, or `dtype`: another 2-byte type such as BF16) without its
    tensor data: (header bytes, the full file's size). `experts`: a mixture of that many experts (2 used
    per token) in 3-D tensors; `keys`: more `{arch}.*` integer keys.

    Serving the header and claiming the full size fakes a model of any size without writing it."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFWriter

    writer = GGUFWriter(str(path), arch)
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(2)
    for key, value in (keys or {}).items():
        writer.add_uint32(f"{arch}.{key}", value)
    writer.add_name("Oversized test model")
    writer.add_block_count(n_layers)
    writer.add_context_length(4096)
    writer.add_embedding_length(n_embd)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_embd // 128)
    writer.add_head_count_kv(8)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)

    def tensor(name: str, *shape: int) -> None:
        count = int(np.prod(shape))
        writer.add_tensor_info(name, shape, np.float16, count * 2, raw_dtype=GGMLQuantizationType[dtype])

    tensor("token_embd.weight", n_vocab, n_embd)
    ffn = (("ffn_gate_exps", experts, n_ff, n_embd), ("ffn_up_exps", experts, n_ff, n_embd), ("ffn_down_exps", experts, n_embd, n_ff),
           ("ffn_gate_inp", experts, n_embd)) if experts else \
        (("ffn_gate", n_ff, n_embd), ("ffn_up", n_ff, n_embd), ("ffn_down", n_embd, n_ff))
    for i in range(n_layers):
        for part, *shape in (("attn_q", n_embd, n_embd), ("attn_k", 1024, n_embd), ("attn_v", 1024, n_embd),
                             ("attn_output", n_embd, n_embd)) + ffn:
            tensor(f"blk.{i}.{part}.weight", *shape)
    return written_header(writer, path)


def written_header(writer, path: Path) -> tuple[bytes, int]:
    """Write a GGUFWriter's header and tensor table only (tensor infos added, no data): (the header bytes,
    the size the whole file would have)."""
    from pyshim.gguf.header import read_header

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    data = path.read_bytes()
    header = read_header(data)
    return data, header.data_offset + max(t.offset + t.nbytes for t in header.tensors)


def qwen7b_header_gguf(path: Path) -> tuple[bytes, int]:
    """(header bytes, the full file's size) of a GGUF with Qwen2.5-7B's shape in Q4_0 (4.3 GB), written
    without its data (pyshim.setup.synthetic's tensor layout)."""
    from pyshim.setup import synthetic

    s = synthetic.Shape(arch="qwen2", tokenizer_from="qwen2.5", n_layers=28, n_embd=3584, n_heads=28, n_kv_heads=4,
                        n_ff=18944, context=32768)
    return synthetic_header_gguf(path, s, 152064, "Qwen2.5-7B-shaped header")


def olmoe_header_gguf(path: Path) -> tuple[bytes, int]:
    """The same for the OLMoE-1B-7B shape of `pyshim bench --synthetic` (64 experts, 8 used; 3.9 GB)."""
    from pyshim.setup import synthetic

    return synthetic_header_gguf(path, synthetic.SHAPES["olmoe-1b-7b"], 49152, "OLMoE-1B-7B-shaped header")


def synthetic_header_gguf(path: Path, s, n_vocab: int, name: str) -> tuple[bytes, int]:
    """(header bytes, the full file's size) of a synthetic model of Shape `s` in Q4_0, written without its data."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFWriter

    from pyshim.setup import synthetic

    writer = GGUFWriter(str(path), s.arch)
    writer.add_name(name)
    writer.add_context_length(s.context)
    writer.add_embedding_length(s.n_embd)
    writer.add_block_count(s.n_layers)
    writer.add_feed_forward_length(s.n_ff)
    writer.add_head_count(s.n_heads)
    writer.add_head_count_kv(s.n_kv_heads)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(n_vocab)
    if s.n_experts:
        writer.add_expert_count(s.n_experts)
        writer.add_expert_used_count(s.n_experts_used)
    data = 0
    for tname, shape, kind in synthetic._tensors(s, n_vocab):
        if kind in ("norm", "router"):
            writer.add_tensor_info(tname, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
            data += int(np.prod(shape)) * 4
        else:
            byte_shape = (*shape[:-1], shape[-1] // 32 * 18)
            writer.add_tensor_info(tname, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)),
                                   raw_dtype=GGMLQuantizationType.Q4_0)
            data += int(np.prod(byte_shape))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    header = path.read_bytes()
    return header, len(header) + data + 64      # (alignment padding: generous)


# A stand-in for the engine's generate: streams tokens as the worker protocol will, with text that
# would run script if it were ever parsed as HTML, and honours abort.
FAKE_ENGINE_JS = """() => {
  const engine = window.pyshimEngine;
  const real = engine.request.bind(engine);
  const aborted = new Set();
  engine.request = async (kind, params, opts = {}) => {
    if (kind === 'abort') { aborted.add(params.request_id); return {aborted: true}; }
    if (kind !== 'generate') return real(kind, params, opts);
    const id = 'fake-' + Math.random();
    opts.onId?.(id);
    window.lastGenerate = params;
    const last = params.messages[params.messages.length - 1].content;
    window.fakeReplies = (window.fakeReplies ?? Date.now() % 100000) + 1;   // (a page reloaded goes on counting elsewhere)
    const tokens = last.startsWith('echo') ? ['reply ', `${window.fakeReplies} `, 'to: ', last]
      : last.includes('forever')
      ? Array.from({length: 400}, (_, i) => `word${i} `)
      : ['Here is **bold**, ', '<script>window.pwned = 1</script>', ' and <img src=x onerror="window.pwned = 2">', '\\n\\n```python\\nprint(\"hi\")\\n```'];
    let text = '';
    for (const [i, t] of tokens.entries()) {
      if (aborted.has(id)) return {text, finish_reason: 'abort', usage: {}, timings: {ttft_ms: 120}};
      await new Promise(r => setTimeout(r, 30));
      text += t;
      opts.onEvent?.('token', {text: t, token: i, index: i});
    }
    return {text, finish_reason: 'stop', usage: {prompt_tokens: 12, completion_tokens: tokens.length},
            timings: {ttft_ms: 250, decode_tok_per_s: 31.5}};
  };
  window.pyshimApp.setEngine(engine, true);
}"""
