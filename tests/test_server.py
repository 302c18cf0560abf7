"""The dev server over real HTTP: Range requests, MIME types, ETags, traversal attempts, model listing."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
import uvicorn

from server.app import create_app
from server.discovery import ModelRoots
from server.files import parse_range, safe_join

BODY = bytes(range(256)) * 40  # 10,240 bytes with position-dependent content


def write_tiny_gguf(path: Path, arch: str = "llama") -> Path:
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(32)
    w.add_feed_forward_length(64)
    w.add_head_count(4)
    w.add_tensor("token_embd.weight", np.ones((16, 32), dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(32, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    base = tmp_path_factory.mktemp("srv")
    web, shaders, models, home = base / "web", base / "shaders", base / "models", base / "home"
    for d in (web / "vendor", shaders, models / "sub", home):
        d.mkdir(parents=True)
    (web / "index.html").write_text("<!doctype html><title>t</title>")
    (web / "blob.bin").write_bytes(BODY)
    for name in ("a.wasm", "a.mjs", "app.webmanifest", "x.json"):
        (web / name).write_text("{}")
    (shaders / "k.wgsl").write_text("fn main() {}")
    (base / "secret.txt").write_text("top secret")
    write_tiny_gguf(models / "good.gguf")
    good = (models / "good.gguf").read_bytes()
    (models / "sub" / "truncated.gguf").write_bytes(good[:100])
    (models / "notgguf.gguf").write_bytes(b"PK\x03\x04 this is a zip, not a model" * 10)
    (models / "escape.gguf").symlink_to(base / "secret.txt")
    (web / "escape.txt").symlink_to(base / "secret.txt")
    # Other tools' caches, laid out as those tools lay them out.
    hf_snap = home / ".cache/huggingface/hub/models--org--tiny/snapshots/0123456789abcdef0123"
    hf_snap.mkdir(parents=True)
    write_tiny_gguf(hf_snap / "tiny-f32.gguf", arch="qwen2")
    ollama = home / ".ollama/models"
    (ollama / "blobs").mkdir(parents=True)
    digest = "ab" * 32
    write_tiny_gguf(ollama / "blobs" / f"sha256-{digest}")
    manifest_dir = ollama / "manifests/registry.ollama.ai/library/tinyllama"
    manifest_dir.mkdir(parents=True)
    (manifest_dir / "latest").write_text(json.dumps({"layers": [
        {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}", "size": 1},
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "cd" * 32}]}))
    lms = home / ".lmstudio/models/pub/repo"
    lms.mkdir(parents=True)
    write_tiny_gguf(lms / "lms.gguf")
    return {"base": base, "web": web, "shaders": shaders, "models": models, "home": home}


@pytest.fixture(scope="module")
def server(tree):
    roots = ModelRoots.default(tree["models"], home=tree["home"], env={})
    app = create_app(web_dir=tree["web"], shader_dir=tree["shaders"], roots=roots)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, log_level="error"))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield port
    srv.should_exit = True
    thread.join(10)


def get(port, path, headers=None, method="GET"):
    """Raw HTTP so paths go out exactly as written (no client-side `..` normalisation)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request(method, path, headers=headers or {})
    r = conn.getresponse()
    body = r.read()
    conn.close()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, body


def test_whole_file_with_validators(server):
    status, h, body = get(server, "/blob.bin")
    assert status == 200 and body == BODY
    assert h["accept-ranges"] == "bytes" and h["etag"].startswith('"') and h["content-length"] == str(len(BODY))


@pytest.mark.parametrize("spec,first,last", [
    ("bytes=0-99", 0, 99),             # first bytes
    ("bytes=5000-5099", 5000, 5099),   # middle
    ("bytes=10140-", 10140, 10239),    # to the end
    ("bytes=10200-99999", 10200, 10239),  # past the end is clipped
    ("bytes=-100", 10140, 10239),      # suffix: the last 100
    ("bytes=-999999", 0, 10239),       # suffix longer than the file
])
def test_range_requests(server, spec, first, last):
    status, h, body = get(server, "/blob.bin", {"Range": spec})
    assert status == 206
    assert h["content-range"] == f"bytes {first}-{last}/{len(BODY)}"
    assert body == BODY[first:last + 1] and h["content-length"] == str(last - first + 1)


@pytest.mark.parametrize("spec", ["bytes=10240-", "bytes=20000-30000", "bytes=500-100", "bytes=-0", "bytes=abc", "bytes=-"])
def test_bad_ranges_get_416(server, spec):
    status, h, _ = get(server, "/blob.bin", {"Range": spec})
    assert status == 416 and h["content-range"] == f"bytes */{len(BODY)}"


def test_if_range_with_a_stale_etag_gets_the_whole_file(server):
    _, h, _ = get(server, "/blob.bin")
    status, _, body = get(server, "/blob.bin", {"Range": "bytes=0-9", "If-Range": h["etag"]})
    assert status == 206 and body == BODY[:10]
    status, _, body = get(server, "/blob.bin", {"Range": "bytes=0-9", "If-Range": '"changed"'})
    assert status == 200 and body == BODY


def test_etag_changes_when_the_file_changes_and_304_when_not(server, tree):
    path = tree["web"] / "changing.bin"
    path.write_bytes(b"one")
    _, h1, _ = get(server, "/changing.bin")
    assert get(server, "/changing.bin", {"If-None-Match": h1["etag"]})[0] == 304
    time.sleep(0.01)
    path.write_bytes(b"two!")
    _, h2, body = get(server, "/changing.bin")
    assert h2["etag"] != h1["etag"] and body == b"two!"


def test_head_has_length_and_no_body(server):
    status, h, body = get(server, "/blob.bin", method="HEAD")
    assert status == 200 and h["content-length"] == str(len(BODY)) and body == b""


@pytest.mark.parametrize("path,mime", [
    ("/a.wasm", "application/wasm"),
    ("/a.mjs", "text/javascript"),
    ("/app.webmanifest", "application/manifest+json"),
    ("/models/good.gguf", "application/octet-stream"),
    ("/shaders/k.wgsl", "text/wgsl"),
    ("/", "text/html"),
])
def test_mime_types(server, path, mime):
    status, h, _ = get(server, path)
    assert status == 200 and h["content-type"].split(";")[0] == mime


@pytest.mark.parametrize("path", [
    "/../secret.txt", "/%2e%2e/secret.txt", "/vendor/../../secret.txt", "/models/..%2fsecret.txt",
    "/models/%2e%2e/%2e%2e/etc/passwd", "//etc/passwd", "/models//etc/passwd", "/shaders/%2Fetc%2Fpasswd",
    "/escape.txt", "/models/escape.gguf", "/models/..\\secret.txt", "/%00index.html", "/C:/Windows/win.ini",
    "/models/hf/../../secret.txt", "/nonexistent.js",
])
def test_no_escape_from_served_folders(server, path):
    status, _, body = get(server, path)
    assert status == 404, (path, status)
    assert b"top secret" not in body


def test_safe_join_rejects_before_touching_disk(tmp_path):
    (tmp_path / "ok.txt").write_text("x")
    assert safe_join(tmp_path, "ok.txt") == (tmp_path / "ok.txt").resolve()
    for bad in ("../x", "/etc/passwd", "a/../../x", "a\\b", "x\x00y", "C:/x", ""):
        assert safe_join(tmp_path, bad) is None


def test_parse_range_multiple_ranges_fall_back_to_whole_file():
    assert parse_range("bytes=0-1,5-6", 100) is None
    assert parse_range("items=0-1", 100) is None


def test_model_listing(server):
    status, _, body = get(server, "/api/models")
    assert status == 200
    models = {m["id"]: m for m in json.loads(body)["models"]}
    good = models["good.gguf"]
    assert good["architecture"] == "llama" and good["error"] is None and good["size"] > 0
    assert "F32" in good["quant"] and good["url"] == "/models/good.gguf"
    # the broken files are listed with an error, not dropped and not crashing the listing
    assert models["sub/truncated.gguf"]["error"] and models["sub/truncated.gguf"]["architecture"] is None
    assert "GGUF" in models["notgguf.gguf"]["error"] or "magic" in models["notgguf.gguf"]["error"].lower()
    assert "escape.gguf" not in models  # a symlink out of models/ is not listed
    by_source = {m["source"]: m for m in models.values()}
    assert by_source["huggingface"]["architecture"] == "qwen2" and by_source["huggingface"]["name"] == "org/tiny/tiny-f32.gguf"
    assert by_source["ollama"]["name"] == "tinyllama:latest" and by_source["ollama"]["error"] is None
    assert by_source["lmstudio"]["name"] == "pub/repo/lms.gguf"


def test_listed_external_models_are_served_with_range(server):
    models = json.loads(get(server, "/api/models")[2])["models"]
    for m in models:
        if m["source"] in ("huggingface", "ollama", "lmstudio"):
            status, h, body = get(server, m["url"], {"Range": "bytes=0-3"})
            assert status == 206 and body == b"GGUF", m
    # an id that merely looks like a cache path, but was never listed, is not served
    assert get(server, "/models/ollama/library/nothing/latest")[0] == 404


def test_isolation_headers_only_when_asked(tree):
    from starlette.testclient import TestClient

    roots = ModelRoots(models=tree["models"])
    plain = TestClient(create_app(web_dir=tree["web"], shader_dir=tree["shaders"], roots=roots)).get("/")
    isolated = TestClient(create_app(web_dir=tree["web"], shader_dir=tree["shaders"], roots=roots, isolated=True)).get("/")
    assert "cross-origin-embedder-policy" not in plain.headers
    assert isolated.headers["cross-origin-opener-policy"] == "same-origin"
    assert isolated.headers["cross-origin-embedder-policy"] == "require-corp"
