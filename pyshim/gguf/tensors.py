"""Where a model's tensor bytes come from, and the table saying which bytes are which tensor.

The engine never needs the whole file in the Python heap: in CPython a `numpy.memmap` of the GGUF
serves slices on demand; in Pyodide (no reliable mmap, a 2–4 GB wasm heap) the bytes come from
elsewhere (IndexedDB chunks, a JS ArrayBuffer), so everything here goes through `ByteSource`.

Shapes in `TensorRef` are in NumPy (row-major) order: the reverse of GGUF's `ne` order. A matmul
weight is `(n_out, n_in)`; its rows are `n_in / block_size` quant blocks each.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Protocol, Sequence

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

from pyshim.errors import GGUFFormatError, MissingTensorError, TensorShapeError


class ByteSource(Protocol):
    """Read-only random access to the bytes of one GGUF file."""

    def read(self, offset: int, nbytes: int) -> np.ndarray:
        """`nbytes` bytes from absolute file offset `offset`, as a uint8 array (may be a view)."""
        ...


class FileSource:
    """A GGUF file on disk, memory-mapped once (CPython)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._map = np.memmap(self.path, dtype=np.uint8, mode="r")

    @property
    def size(self) -> int:
        return int(self._map.shape[0])

    def read(self, offset: int, nbytes: int) -> np.ndarray:
        if offset < 0 or offset + nbytes > self._map.shape[0]:
            raise GGUFFormatError(f"{self.path}: tensor bytes [{offset}, {offset + nbytes}) lie past the end of the file "
                                  f"({self._map.shape[0]} bytes)", hint="the file is truncated; download it again")
        return self._map[offset:offset + nbytes]


class BufferSource:
    """A file already in memory (bytes, bytearray, memoryview, uint8 array): Pyodide, tests."""

    def __init__(self, data):
        self._data = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.view(np.uint8).reshape(-1)

    @property
    def size(self) -> int:
        return int(self._data.shape[0])

    def read(self, offset: int, nbytes: int) -> np.ndarray:
        if offset < 0 or offset + nbytes > self._data.shape[0]:
            raise GGUFFormatError(f"tensor bytes [{offset}, {offset + nbytes}) lie past the end of the buffer "
                                  f"({self._data.shape[0]} bytes)", hint="the file is truncated; download it again")
        return self._data[offset:offset + nbytes]


class RangeSource:
    """Only some ranges of a file, each read at the offset it was given (the browser's loader: the 1-D
    tensors and the key rows JS hands over from IndexedDB; the matrices go store -> GPU without Python)."""

    def __init__(self, ranges: dict[int, bytes]):
        self._ranges: dict[int, np.ndarray] = {}
        self.add(ranges)

    def add(self, ranges: dict[int, bytes]) -> None:
        self._ranges.update({int(offset): np.frombuffer(data, dtype=np.uint8) for offset, data in ranges.items()})

    def drop(self, offsets: Iterable[int]) -> None:
        for offset in offsets:
            self._ranges.pop(int(offset), None)

    def has(self, offset: int, nbytes: int) -> bool:
        data = self._ranges.get(int(offset))
        return data is not None and data.shape[0] >= nbytes

    def read(self, offset: int, nbytes: int) -> np.ndarray:
        data = self._ranges.get(int(offset))
        if data is None or data.shape[0] < nbytes:
            raise GGUFFormatError(f"bytes [{offset}, {offset + nbytes}) were not provided to the loader",
                                  hint="this is a bug in the upload plan: report it")
        return data[:nbytes]


@dataclass(frozen=True)
class TensorRef:
    """One tensor of the file: where its bytes are and how to read them."""

    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]      # NumPy order: (n_out, n_in) for a matmul weight, (n,) for a norm
    offset: int                 # absolute offset of the first byte in the file
    nbytes: int

    @property
    def block(self) -> tuple[int, int]:
        """(elements per block, bytes per block) of the tensor's type."""
        return GGML_QUANT_SIZES[self.qtype]

    @property
    def row_bytes(self) -> int:
        per_block, block_bytes = self.block
        return self.shape[-1] // per_block * block_bytes

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


def tensor_refs_from_header(header) -> list[TensorRef]:
    """TensorRefs from a `pyshim.gguf.header.GGUFHeader` (its TensorInfo shapes are in GGUF `ne` order)."""
    refs = []
    for info in header.tensors:
        refs.append(TensorRef(name=info.name, qtype=GGMLQuantizationType(int(info.type)),
                              shape=tuple(int(n) for n in reversed(tuple(info.shape))),
                              offset=int(info.offset), nbytes=int(info.nbytes)))
    return refs


class WeightStore:
    """The tensor table plus the source of its bytes; `raw(name)` gives one tensor's blocks."""

    def __init__(self, tensors: Iterable[TensorRef], source: ByteSource):
        self.tensors = {t.name: t for t in tensors}
        self.source = source

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def info(self, name: str) -> TensorRef:
        try:
            return self.tensors[name]
        except KeyError:
            raise MissingTensorError(f"the model has no tensor {name!r}",
                                     hint="the file is incomplete or was converted for another architecture") from None

    def checked(self, name: str, shape: Sequence[int]) -> TensorRef:
        """Tensor `name`, which must have `shape` (NumPy order; a 1-D vector may be asked for as a one-row
        matrix, (1, n): Qwen2-MoE's shared-expert gate is used as a matmul weight)."""
        ref = self.info(name)
        want = tuple(int(s) for s in shape)
        if tuple(ref.shape) != want and not (len(want) == 2 and want[0] == 1 and tuple(ref.shape) == want[1:]):
            raise TensorShapeError(f"tensor {name!r} has shape {tuple(ref.shape)}, expected {want} (NumPy order)",
                                   hint="the file does not match its own hyperparameters")
        return ref

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as uint8 `(rows, row_bytes)` (a 1-D tensor is one row)."""
        ref = self.info(name)
        data = self.source.read(ref.offset, ref.nbytes)
        rows = ref.nbytes // ref.row_bytes
        return data.reshape(rows, ref.row_bytes)

    def row_range(self, name: str, first: int, end: int) -> np.ndarray:
        """Rows first..end-1 of a matrix, read as one range: `(end - first, row_bytes)` uint8."""
        ref = self.info(name)
        return self.source.read(ref.offset + first * ref.row_bytes, (end - first) * ref.row_bytes).reshape(-1, ref.row_bytes)

    def raw_rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        """Only the given rows' bytes (embedding lookups): `(len(rows), row_bytes)` uint8."""
        ref = self.info(name)
        row_bytes = ref.row_bytes
        out = np.empty((len(rows), row_bytes), dtype=np.uint8)
        for i, row in enumerate(rows):
            out[i] = self.source.read(ref.offset + int(row) * row_bytes, row_bytes)
        return out


def dequantize_rows(raw: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """uint8 blocks (rows, row_bytes) -> f32 (rows, n_in), by gguf.quants (the reference's decoder, and
    how every executor reads the small 1-D tensors it keeps as f32)."""
    if qtype == GGMLQuantizationType.F32:
        return raw.view(np.float32)
    if qtype == GGMLQuantizationType.F16:
        return raw.view(np.float16).astype(np.float32)
    return quants.dequantize(raw, qtype).astype(np.float32, copy=False)
