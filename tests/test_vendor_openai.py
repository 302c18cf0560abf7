"""`pyshim setup`'s `openai` step: the tarball's integrity is checked against the registry's, only the
ES module graph from index.mjs is kept, and a bare import (which needs a bundler) is refused."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from pyshim.setup import vendoring
from pyshim.errors import ChecksumError, SetupError

FILES = {
    "package/index.mjs": b'export { OpenAI } from "./client.mjs";\nexport * from "./core/error.mjs";\n',
    "package/client.mjs": b"// import { x } from 'undici' is only a comment here\nimport * as state from './internal/state.js';\nexport class OpenAI {}\n",
    "package/core/error.mjs": b"export class APIError extends Error {}\n",
    "package/internal/state.js": b'"use strict"; if (typeof module !== "undefined") { exports.x = 1; }\n',
    "package/client.js": b"exports.OpenAI = class {};\n",
    "package/unused.mjs": b"export const unused = 1;\n",
    "package/index.d.mts": b"export {};\n",
    "package/client.mjs.map": b"{}",
    "package/src/client.ts": b"export class OpenAI {}\n",
    "package/LICENSE": b"Apache-2.0\n",
}


def make_tarball(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def vendored(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_only_the_module_graph_is_kept(tmp_path, monkeypatch):
    tarball = make_tarball(tmp_path / "openai-9.9.9.tgz", FILES)
    monkeypatch.setattr(vendoring, "npm", lambda spec: tarball)
    dest = tmp_path / "vendor" / "openai"
    detail = vendoring.vendor_openai(dest, version="9.9.9", integrity=vendoring.npm_integrity(tarball))
    assert "integrity matches" in detail
    assert vendored(dest) == [".version", "LICENSE", "client.mjs", "core/error.mjs", "index.mjs", "internal/state.js"]
    assert vendoring.vendor_openai(dest, version="9.9.9", integrity="unused once vendored") == "already there"


def test_a_tarball_with_other_bytes_is_refused_and_nothing_installed(tmp_path, monkeypatch):
    good = make_tarball(tmp_path / "good.tgz", FILES)
    tampered = make_tarball(tmp_path / "openai-9.9.9.tgz", {**FILES, "package/client.mjs": b"fetch('https://evil.example');\n"})
    monkeypatch.setattr(vendoring, "npm", lambda spec: tampered)
    vendor = tmp_path / "vendor"
    vendor.mkdir()
    with pytest.raises(ChecksumError, match="nothing was installed"):
        vendoring.vendor_openai(vendor / "openai", version="9.9.9", integrity=vendoring.npm_integrity(good))
    assert not list(vendor.iterdir())


def test_a_bare_import_is_refused(tmp_path, monkeypatch):
    tarball = make_tarball(tmp_path / "openai-9.9.9.tgz", {**FILES, "package/core/error.mjs": b"import { fetch } from 'undici';\n"})
    monkeypatch.setattr(vendoring, "npm", lambda spec: tarball)
    vendor = tmp_path / "vendor"
    vendor.mkdir()
    with pytest.raises(SetupError, match="'undici'.*bundler"):
        vendoring.vendor_openai(vendor / "openai", version="9.9.9", integrity=vendoring.npm_integrity(tarball))
    assert not list(vendor.iterdir())


def test_integrity_is_npms_sri_string(tmp_path):
    path = tmp_path / "x"
    path.write_bytes(b"abc")
    # sha512("abc") in base64, as npm writes it in package-lock.json and `npm view … dist.integrity`.
    assert vendoring.npm_integrity(path) == ("sha512-3a81oZNherrMQXNJriBBMRLm+k6JqX6iCp7u5ktV05ohkpkqJ0/BqDa6PCOj/uu9"
                                             "RU1EI2Q86A4qmslPpUyknw==")


def test_the_vendored_client_is_this_version_and_complete():
    root = vendoring.VENDOR_DIR / "openai"
    if not (root / "index.mjs").is_file():
        pytest.skip("pyshim setup has not run")
    assert (root / ".version").read_text().strip() == vendoring.OPENAI_VERSION
    files = {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*.*js")}
    graph = vendoring.es_module_graph(files, vendoring.OPENAI_ENTRY)
    assert len(graph) > 50 and "client.mjs" in graph   # the real client, not a stub
