"""Serving files: safe path resolution, MIME types, ETags, conditional and Range requests.

Written out rather than taken from Starlette's FileResponse because the model store in the browser
depends on exact Range semantics (206 with Content-Range, 416 with `bytes */size`, If-Range) and on
stable ETags to detect a file that changed between two chunks of a resumable download.
"""

from __future__ import annotations

import hashlib
import mimetypes
import os
import re
from pathlib import Path
from urllib.parse import unquote

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

READ_BLOCK = 1 << 20  # bytes per read when streaming a file body

MIME_TYPES = {
    ".wasm": "application/wasm",
    ".mjs": "text/javascript",
    ".js": "text/javascript",
    ".webmanifest": "application/manifest+json",
    ".gguf": "application/octet-stream",
    ".wgsl": "text/wgsl",
    ".json": "application/json",
    ".html": "text/html; charset=utf-8",
    ".css": "text/css",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".whl": "application/zip",
    ".zip": "application/zip",
    ".tar": "application/x-tar",
    ".py": "text/x-python",
    ".md": "text/markdown",
}
TEXT_TYPES_WITH_CHARSET = ("text/javascript", "text/css", "text/wgsl", "text/x-python", "text/markdown", "application/json")

_RANGE = re.compile(r"^\s*(\d*)\s*-\s*(\d*)\s*$")


def mime_type(path: Path) -> str:
    kind = MIME_TYPES.get(path.suffix.lower()) or mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    return f"{kind}; charset=utf-8" if kind in TEXT_TYPES_WITH_CHARSET else kind


def safe_join(root: Path, url_path: str) -> Path | None:
    """The file under `root` that `url_path` names, or None if it would leave `root` or is not a file.

    Rejects `..`, absolute paths, backslashes and NULs before touching the disk, then resolves
    symlinks and checks the real path is still inside the real root (a symlink pointing out is a 404).
    """
    rel = unquote(url_path)
    if "\x00" in rel or "\\" in rel or rel.startswith("/") or re.match(r"^[A-Za-z]:", rel):
        return None
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        return None
    real_root = root.resolve()
    try:
        target = real_root.joinpath(*parts).resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    if target == real_root or not target.is_relative_to(real_root):
        return None
    if target.is_dir():
        index = target / "index.html"
        return index if index.is_file() else None
    return target if target.is_file() else None


def etag_for(stat: os.stat_result) -> str:
    """Strong validator from size and mtime: changes whenever the file is replaced or rewritten."""
    digest = hashlib.blake2s(f"{stat.st_size}:{stat.st_mtime_ns}:{stat.st_ino}".encode(), digest_size=8).hexdigest()
    return f'"{digest}"'


def parse_range(header: str, size: int) -> tuple[int, int] | None | str:
    """One byte range `(first, last)` inclusive, None to serve the whole file, "unsatisfiable" for 416.

    Only `bytes=` with a single range is honoured; several ranges are answered with the whole file
    (allowed by RFC 9110, and nothing in pyshim asks for multipart bodies).
    """
    unit, _, spec = header.partition("=")
    if unit.strip().lower() != "bytes":
        return None
    if "," in spec:
        return None
    match = _RANGE.match(spec)
    if not match or (match.group(1) == "" and match.group(2) == ""):
        return "unsatisfiable"
    first_s, last_s = match.groups()
    if first_s == "":  # suffix range: the last N bytes
        n = int(last_s)
        if n == 0 or size == 0:
            return "unsatisfiable"
        return max(0, size - n), size - 1
    first = int(first_s)
    last = size - 1 if last_s == "" else min(int(last_s), size - 1)
    if first >= size or (last_s != "" and int(last_s) < first):
        return "unsatisfiable"
    return first, last


def _body(path: Path, first: int, length: int):
    with path.open("rb") as f:
        f.seek(first)
        remaining = length
        while remaining > 0:
            block = f.read(min(READ_BLOCK, remaining))
            if not block:
                break
            remaining -= len(block)
            yield block


def file_response(request: Request, path: Path, extra_headers: dict[str, str] | None = None) -> Response:
    stat = path.stat()
    size = stat.st_size
    etag = etag_for(stat)
    headers = {
        "Accept-Ranges": "bytes",
        "ETag": etag,
        # Revalidate every time: the pyshim wheel and the site change under the same URLs during development.
        "Cache-Control": "no-cache",
        "Content-Type": mime_type(path),
        **(extra_headers or {}),
    }
    if_none_match = request.headers.get("if-none-match")
    if if_none_match and etag in [t.strip() for t in if_none_match.split(",")]:
        return Response(status_code=304, headers={k: v for k, v in headers.items() if k != "Content-Type"})

    first, last, status = 0, size - 1, 200
    range_header = request.headers.get("range")
    if_range = request.headers.get("if-range")
    if range_header and (if_range is None or if_range.strip() == etag):
        parsed = parse_range(range_header, size)
        if parsed == "unsatisfiable":
            return Response(status_code=416, headers={**headers, "Content-Range": f"bytes */{size}", "Content-Type": "text/plain"},
                            content=f"Range {range_header!r} is not satisfiable for a file of {size} bytes\n")
        if parsed is not None:
            first, last = parsed
            status = 206
            headers["Content-Range"] = f"bytes {first}-{last}/{size}"
    length = max(0, last - first + 1)
    headers["Content-Length"] = str(length)
    if request.method == "HEAD":
        return Response(status_code=status, headers=headers)
    return StreamingResponse(_body(path, first, length), status_code=status, headers=headers)
