"""What /api/models says about one file, read from its header only (never the tensor data)."""

from __future__ import annotations

import threading
from pathlib import Path

from pyshim.errors import PyshimError

_cache: dict[tuple[str, int, int], dict] = {}
_lock = threading.Lock()


def _describe(path: Path) -> dict:
    from pyshim.gguf.header import read_header_from_file
    from pyshim.plan.probe import quant_summary

    header = read_header_from_file(path)
    return {
        "architecture": header.architecture,
        "model_name": header.get("general.name"),
        "quant": quant_summary(header),
        "tensor_count": len(header.tensors),
        "parameters": sum(t.n_elements for t in header.tensors),
        "context_length": header.get(f"{header.architecture}.context_length"),
        "error": None,
    }


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
