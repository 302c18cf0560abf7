"""What /api/models says about one file, read from its header only (never the tensor data)."""

from __future__ import annotations

import threading
from pathlib import Path

from pyshim.errors import PyshimError

_cache: dict[tuple[str, int, int], dict] = {}
_lock = threading.Lock()


def _describe(path: Path) -> dict:
    from pyshim.header import read_header_from_file

    header = read_header_from_file(path)
    by_type: dict[str, int] = {}
    for t in header.tensors:
        by_type[t.type.name] = by_type.get(t.type.name, 0) + t.nbytes
    total = sum(by_type.values()) or 1
    quant = ", ".join(f"{name} {100 * n / total:.0f}%" for name, n in sorted(by_type.items(), key=lambda kv: -kv[1]))
    meta = header.metadata
    return {
        "architecture": header.architecture,
        "model_name": meta.get("general.name"),
        "quant": quant,
        "tensor_count": len(header.tensors),
        "parameters": sum(_elements(t.shape) for t in header.tensors),
        "context_length": meta.get(f"{header.architecture}.context_length"),
        "error": None,
    }


def _elements(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def summarize(path: Path) -> dict:
    """Size plus architecture and quant summary; a broken file gets `error` set instead of failing the listing."""
    try:
        stat = path.stat()
    except OSError as exc:
        return {"size": None, "error": f"cannot read file: {exc.strerror}"}
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    with _lock:
        cached = _cache.get(key)
    if cached is None:
        try:
            cached = _describe(path)
        except PyshimError as exc:
            cached = {"architecture": None, "quant": None, "error": str(exc)}
        except OSError as exc:
            cached = {"architecture": None, "quant": None, "error": f"cannot read file: {exc.strerror or exc}"}
        with _lock:
            _cache[key] = cached
    return {"size": stat.st_size, **cached}
