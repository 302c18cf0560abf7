"""A GGUF model opened for reading: its header, the source of its bytes and its spec — what every
executor's loader starts with."""

from __future__ import annotations

from pathlib import Path

from pyshim.errors import BadRequestError
from pyshim.gguf.header import GGUFHeader, read_header_from_file
from pyshim.gguf.spec import ModelSpec
from pyshim.gguf.tensors import ByteSource, FileSource


def open_model(path: str | Path | None = None, *, header: GGUFHeader | None = None,
               source: ByteSource | None = None) -> tuple[GGUFHeader, ByteSource, ModelSpec]:
    """What every executor's loader starts with: the header and byte source (from `path`, or given) and
    the spec (which refuses an architecture pyshim does not run)."""
    if path is not None:
        header = read_header_from_file(path)
        source = FileSource(path)
    if header is None or source is None:
        raise BadRequestError("loading a model needs a path, or a header and a byte source")
    return header, source, ModelSpec.from_header(header)
