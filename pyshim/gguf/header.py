"""The GGUF header — metadata and tensor table — read from a prefix of the file, never the tensor data.

Layout (GGUF v2/v3, little-endian):
    magic "GGUF" | version u32 | tensor_count u64 | kv_count u64
    kv_count x (key: string | value_type u32 | value)
    tensor_count x (name: string | n_dims u32 | ne[n_dims] u64 | type u32 | offset u64)
    padding to general.alignment (default 32) | tensor data (offsets are relative to its start)
where string = length u64 + UTF-8 bytes, and an array value = item_type u32 + count u64 + items.

`read_header(prefix)` raises `NeedMoreBytes` (with `.needed`, the prefix length to fetch) when the
prefix ends inside the header, so the browser can fetch just enough and call again. Every malformed
input raises a `GGUFFormatError` subclass naming the byte, key or tensor at fault; sizes read from the
file are checked against the bytes that can exist before anything is allocated.

Values in `GGUFHeader.metadata`:
- integers -> int, float32/float64 -> float, bool -> bool, string -> str;
- numeric and bool arrays -> 1-D numpy arrays of the GGUF type (e.g. tokenizer.ggml.scores is float32,
  token_type int32), always copies, never views of the prefix;
- string arrays -> list[str].
Strings are decoded as UTF-8 with the `surrogateescape` handler: valid UTF-8 (nearly every token) decodes
as usual, and the few tokens that are not valid UTF-8 (llama.cpp keeps tokens as raw bytes) still
round-trip exactly through `raw_bytes(s)`.
"""

from __future__ import annotations

import codecs
import os
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gguf import GGUFValueType, LlamaFileType

from pyshim.errors import GGUFFormatError, PyshimError
from pyshim.gguf.types import TensorType, tensor_nbytes, tensor_type

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)      # v1 (Aug 2023) used 32-bit counts; v2 and v3 share one layout
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4                     # ggml tensors have at most 4 dimensions
# No real header comes near this (a 262k-token vocab is ~6.5 MB); bounding it keeps a corrupt length
# from asking the browser to fetch, or Python to allocate, gigabytes.
MAX_HEADER_BYTES = 256 << 20
FIRST_READ_BYTES = 1 << 20       # read_header_from_file's first guess at the header size
GUESS_MARGIN = 1.25              # NeedMoreBytes.suggested: string lengths vary along a vocabulary
INT64_MAX = (1 << 63) - 1

# The fewest bytes one more metadata entry / tensor record can take: what NeedMoreBytes adds to the
# bytes it knows it needs, so a caller's next fetch is not too short.
MIN_KV_BYTES = 8 + 4 + 1         # key length, value type, a one-byte value
MIN_TENSOR_BYTES = 8 + 4 + 4 + 8  # name length, n_dims, type, offset

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_PREAMBLE = struct.Struct("<4sIQQ")   # magic, version, tensor_count, kv_count
_ARRAY_HEAD = struct.Struct("<IQ")    # item type, count
_TENSOR_TAIL = struct.Struct("<IQ")   # type, offset

_STRING = GGUFValueType.STRING.value
_ARRAY = GGUFValueType.ARRAY.value
_BOOL = GGUFValueType.BOOL.value
# value type -> (struct for one scalar, numpy dtype for an array of them)
_SCALARS: dict[int, tuple[struct.Struct, str]] = {
    GGUFValueType.UINT8: (struct.Struct("<B"), "<u1"),
    GGUFValueType.INT8: (struct.Struct("<b"), "<i1"),
    GGUFValueType.UINT16: (struct.Struct("<H"), "<u2"),
    GGUFValueType.INT16: (struct.Struct("<h"), "<i2"),
    GGUFValueType.UINT32: (struct.Struct("<I"), "<u4"),
    GGUFValueType.INT32: (struct.Struct("<i"), "<i4"),
    GGUFValueType.FLOAT32: (struct.Struct("<f"), "<f4"),
    GGUFValueType.BOOL: (struct.Struct("<B"), "<u1"),
    GGUFValueType.UINT64: (struct.Struct("<Q"), "<u8"),
    GGUFValueType.INT64: (struct.Struct("<q"), "<i8"),
    GGUFValueType.FLOAT64: (struct.Struct("<d"), "<f8"),
}
_SCALARS = {int(k): v for k, v in _SCALARS.items()}

_REDOWNLOAD = "the file is damaged or not fully downloaded: download it again"


def _decode(raw) -> str:
    return codecs.utf_8_decode(raw, "surrogateescape", True)[0]


def raw_bytes(text: str) -> bytes:
    """The exact bytes a GGUF string held (see the module docstring on invalid UTF-8)."""
    return text.encode("utf-8", "surrogateescape")


# ----------------------------------------------------------------------------------------------
# Errors. NeedMoreBytes is not a format error: the bytes seen so far are fine, there are just too few.

class NeedMoreBytes(PyshimError):
    """The prefix ends inside the header. `needed` is the prefix length to fetch before calling again:
    a lower bound (everything still to come is counted at its smallest possible size), so fetching
    max(needed, 2 * len(prefix)) converges in a few rounds. `suggested` (>= needed) is a guess that
    saves rounds: when the prefix ends inside a string array (the vocabulary) it assumes the strings
    still to come are as long on average as those read."""

    def __init__(self, needed: int, have: int, suggested: int | None = None):
        super().__init__(f"the GGUF header continues past the {have} bytes given; at least {needed} are needed",
                         hint="fetch a longer prefix of the file and read again")
        self.needed = needed
        self.have = have
        self.suggested = needed if suggested is None else max(needed, suggested)


class BadMagicError(GGUFFormatError):
    """The file does not start with "GGUF"."""


class UnsupportedVersionError(GGUFFormatError):
    """A GGUF version this reader does not handle (1, big-endian files, or newer than 3)."""


class TruncatedError(GGUFFormatError):
    """The file ends inside the header."""


class AbsurdSizeError(GGUFFormatError):
    """A count or length in the header that cannot be true (more bytes than the file or the size cap)."""


class BadValueTypeError(GGUFFormatError):
    """A metadata value of an unknown type (or a known key with the wrong type)."""


class UnknownTensorTypeError(GGUFFormatError):
    """A tensor whose type number is not a known ggml type."""


class DuplicateKeyError(GGUFFormatError):
    """The same metadata key appears twice."""


class DuplicateTensorError(GGUFFormatError):
    """Two tensors with the same name."""


class BadTensorError(GGUFFormatError):
    """A tensor record that cannot describe a real tensor (too many dimensions, partial blocks, too large)."""


class TensorRangeError(GGUFFormatError):
    """A tensor's bytes are misaligned, overlap another tensor's, or run past the end of the file."""


class BadAlignmentError(GGUFFormatError):
    """general.alignment is not a power of two."""


class MissingKeyError(GGUFFormatError):
    """A metadata key the model needs is absent."""


# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TensorInfo:
    name: str
    type: TensorType
    shape: tuple[int, ...]   # GGUF order: ne0 (the contiguous dimension) first; NumPy shape is reversed
    offset: int              # absolute offset of the first byte in the file
    nbytes: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def end(self) -> int:
        return self.offset + self.nbytes


@dataclass(frozen=True, eq=False)   # eq=False: metadata holds numpy arrays
class GGUFHeader:
    version: int
    metadata: dict[str, Any]
    # key -> (value type,) or (ARRAY, item type): how each value was stored in the file
    value_types: dict[str, tuple[GGUFValueType, ...]]
    tensors: tuple[TensorInfo, ...]     # in file order
    alignment: int
    header_size: int                    # bytes up to the end of the tensor table
    data_offset: int                    # header_size rounded up to `alignment`: where tensor data starts
    file_size: int | None = None        # when the reader was told it
    _by_name: dict[str, TensorInfo] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self):
        self._by_name.update((t.name, t) for t in self.tensors)

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise MissingKeyError("the file has no general.architecture string, so pyshim cannot tell what model it is",
                                  hint="this GGUF is not a language model, or was written by a broken converter")
        return arch

    @property
    def file_type_name(self) -> str | None:
        """The quantization mix named by general.file_type ("Q4_K_M", "Q4_1", "F16"...), if present and known."""
        value = self.metadata.get("general.file_type")
        if isinstance(value, bool) or not isinstance(value, int):
            return None
        try:
            name = LlamaFileType(value).name
        except ValueError:
            return None
        return name.removeprefix("MOSTLY_").removeprefix("ALL_")

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def has_tensor(self, name: str) -> bool:
        return name in self._by_name

    def tensor(self, name: str) -> TensorInfo:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no tensor named {name!r} in this GGUF ({len(self.tensors)} tensors)") from None

    @property
    def tensor_map(self) -> dict[str, TensorInfo]:
        return dict(self._by_name)


# ----------------------------------------------------------------------------------------------

def _as_buffer(buf):
    """bytes / bytearray as they are; anything else (memoryview, numpy uint8 array) as a flat byte memoryview."""
    if isinstance(buf, (bytes, bytearray)):
        return buf
    if isinstance(buf, np.ndarray):
        return memoryview(np.ascontiguousarray(buf).reshape(-1).view(np.uint8))
    view = memoryview(buf)
    return view if view.ndim == 1 and view.format in ("B", "b", "c") and view.itemsize == 1 else view.cast("B")


class _Parser:
    """One pass over the header with a moving offset `pos`."""

    def __init__(self, buf, file_size: int | None):
        self.buf = buf
        self.have = len(buf)
        self.file_size = file_size
        self.limit = MAX_HEADER_BYTES if file_size is None else min(file_size, MAX_HEADER_BYTES)
        self.pos = 0
        self.rest = 0   # fewest bytes the records after the current one can take

    # -- bounds ----------------------------------------------------------------------------------
    def need(self, end: int, what: str, declared: int | None = None, guess: int = 0) -> None:
        """Bytes up to `end` must be in the prefix. `declared` is the count/length read from the file that
        put `end` where it is (then overshooting the file means a corrupt size, not just a short file);
        `guess` is a likelier total than `end` + the minimal rest, for NeedMoreBytes.suggested."""
        if end <= self.have:
            return
        if end > self.limit:
            raise self._overshoot(end, what, declared)
        raise NeedMoreBytes(min(end + self.rest, self.limit), self.have, min(guess, self.limit))

    def _overshoot(self, end: int, what: str, declared: int | None) -> GGUFFormatError:
        if self.file_size is not None and end > self.file_size and self.file_size <= MAX_HEADER_BYTES:
            if declared is None:
                return TruncatedError(f"the file ends at byte {self.file_size}, inside {what}", hint=_REDOWNLOAD)
            return AbsurdSizeError(f"{what} declares {declared}, which would run to byte {end}, "
                                   f"past the end of the file ({self.file_size} bytes)", hint=_REDOWNLOAD)
        return AbsurdSizeError(f"{what} would make the header longer than {MAX_HEADER_BYTES >> 20} MiB"
                               + ("" if declared is None else f" (it declares {declared})"),
                               hint="no real GGUF header is that large: " + _REDOWNLOAD)

    # -- primitives ------------------------------------------------------------------------------
    def u32(self, what: str) -> int:
        self.need(self.pos + 4, what)
        (value,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return value

    def string(self, what: str) -> str:
        pos = self.pos
        self.need(pos + 8, f"the length of {what} at byte {pos}")
        (length,) = _U64.unpack_from(self.buf, pos)
        end = pos + 8 + length
        self.need(end, f"the length of {what} at byte {pos}", declared=length)
        self.pos = end
        return _decode(self.buf[pos + 8:end])

    def value(self, vtype: int, key: str) -> Any:
        if vtype == _STRING:
            return self.string(f"the string value of '{key}'")
        scalar = _SCALARS.get(vtype)
        if scalar is not None:
            packer = scalar[0]
            self.need(self.pos + packer.size, f"the value of '{key}' at byte {self.pos}")
            (value,) = packer.unpack_from(self.buf, self.pos)
            self.pos += packer.size
            return bool(value) if vtype == _BOOL else value
        if vtype == _ARRAY:
            return self.array(key)
        raise BadValueTypeError(f"metadata key '{key}' has value type {vtype} at byte {self.pos - 4}; "
                                f"GGUF defines types 0-12", hint=_REDOWNLOAD + " (or it was written by a newer, incompatible tool)")

    def array(self, key: str) -> Any:
        pos = self.pos
        self.need(pos + _ARRAY_HEAD.size, f"the array header of '{key}' at byte {pos}")
        itype, count = _ARRAY_HEAD.unpack_from(self.buf, pos)
        pos += _ARRAY_HEAD.size
        self.pos = pos
        if itype == _STRING:
            return self.string_array(key, count)
        scalar = _SCALARS.get(itype)
        if scalar is None:
            what = "arrays of arrays" if itype == _ARRAY else f"item type {itype}"
            raise BadValueTypeError(f"metadata array '{key}' at byte {pos - 12} has {what}, which GGUF readers "
                                    "(llama.cpp included) do not accept", hint=_REDOWNLOAD)
        dtype = np.dtype(scalar[1])
        end = pos + count * dtype.itemsize
        self.need(end, f"the element count of array '{key}' at byte {pos - 8}", declared=count)
        values = np.frombuffer(self.buf, dtype=dtype, count=count, offset=pos).astype(dtype.newbyteorder("="))
        self.pos = end
        return values != 0 if itype == _BOOL else values

    def string_array(self, key: str, count: int) -> list[str]:
        # Every string takes at least its 8-byte length: refuse impossible counts before looping.
        # (Checked against the limit only: a short prefix is found out below, with a better `needed`.)
        start = self.pos
        if start + 8 * count > self.limit:
            raise self._overshoot(start + 8 * count, f"the element count of string array '{key}' at byte {start - 8}", count)
        # The hot loop of the whole reader (262,144 tokens for Gemma 3): locals only, no bounds checks
        # per item; running off the prefix shows up as struct.error and is sorted out afterwards.
        buf, unpack, decode = self.buf, _U64.unpack_from, codecs.utf_8_decode
        out: list[str] = []
        append = out.append
        pos = start
        length = 0
        i = -1
        try:
            for i in range(count):
                (length,) = unpack(buf, pos)
                first = pos + 8
                pos = first + length
                append(decode(buf[first:pos], "surrogateescape", True)[0])
        except (struct.error, OverflowError):
            # Item i's length field is not in the prefix: either string i - 1 ran past it, or the prefix
            # ends inside the length itself. need() raises in both cases (that is why unpack failed).
            self.rest += 8 * (count - i)
            per_item = (pos - start) / max(i, 1)
            guess = int(pos + GUESS_MARGIN * per_item * (count - i)) + self.rest - 8 * (count - i)
            if pos > self.have:
                self.need(pos, f"the length of string {i - 1} of array '{key}'", declared=length, guess=guess)
            self.rest -= 8
            self.need(pos + 8, f"the length of string {i} of array '{key}' at byte {pos}", guess=guess)
            raise
        if pos > self.have:   # the last string read ran past the prefix
            self.need(pos, f"the length of string {count - 1} of array '{key}'", declared=length)
        self.pos = pos
        return out


def read_header(buf, *, file_size: int | None = None) -> GGUFHeader:
    """Parse the header from `buf`, a prefix of a GGUF file (bytes, bytearray, memoryview or uint8 array).

    Give `file_size` whenever it is known: sizes are then checked against the real file, tensor ranges
    must lie inside it, and a prefix that is the whole file raises TruncatedError instead of NeedMoreBytes.
    """
    data = _as_buffer(buf)
    if file_size is not None and file_size < len(data):
        raise ValueError(f"file_size {file_size} is smaller than the {len(data)} bytes given")
    p = _Parser(data, file_size)

    start = bytes(data[:len(GGUF_MAGIC)])
    if start != GGUF_MAGIC[:len(start)]:
        raise BadMagicError(f"not a GGUF file: it starts with {start!r}, not b'GGUF'",
                            hint="pick a .gguf model file (other formats such as safetensors need converting with llama.cpp)")
    p.need(_PREAMBLE.size, "the 24-byte preamble (magic, version, counts)")
    _, version, n_tensors, n_kv = _PREAMBLE.unpack_from(data, 0)
    if version not in SUPPORTED_VERSIONS:
        raise _version_error(version)
    p.pos = _PREAMBLE.size
    # Each record has a minimum size: counts that cannot fit are refused before any loop runs.
    least = _PREAMBLE.size + n_kv * MIN_KV_BYTES + n_tensors * MIN_TENSOR_BYTES
    if least > p.limit:
        raise p._overshoot(least, f"the header's counts ({n_kv} metadata entries, {n_tensors} tensors)", n_kv + n_tensors)

    metadata: dict[str, Any] = {}
    value_types: dict[str, tuple[GGUFValueType, ...]] = {}
    for index in range(n_kv):
        p.rest = (n_kv - index - 1) * MIN_KV_BYTES + n_tensors * MIN_TENSOR_BYTES
        key_at = p.pos
        key = p.string(f"metadata key {index}")
        if key in metadata:
            raise DuplicateKeyError(f"metadata key '{key}' appears twice (again at byte {key_at})", hint=_REDOWNLOAD)
        vtype = p.u32(f"the value type of '{key}'")
        value_at = p.pos
        metadata[key] = p.value(vtype, key)
        types = (GGUFValueType(vtype),)
        if vtype == _ARRAY:
            types += (GGUFValueType(_ARRAY_HEAD.unpack_from(data, value_at)[0]),)
        value_types[key] = types

    alignment = _alignment(metadata, value_types)
    records = []
    for index in range(n_tensors):
        p.rest = (n_tensors - index - 1) * MIN_TENSOR_BYTES
        records.append(_tensor_record(p, index, alignment))
    header_size = p.pos
    data_offset = -(-header_size // alignment) * alignment
    tensors = tuple(TensorInfo(name, ttype, shape, data_offset + rel, nbytes) for name, ttype, shape, rel, nbytes in records)
    _check_ranges(tensors, file_size)
    return GGUFHeader(version=version, metadata=metadata, value_types=value_types, tensors=tensors, alignment=alignment,
                      header_size=header_size, data_offset=data_offset, file_size=file_size)


def _version_error(version: int) -> UnsupportedVersionError:
    if version == 1:
        return UnsupportedVersionError("this is a GGUF version 1 file (an obsolete format from 2023)",
                                       hint="convert the model again with a current llama.cpp")
    swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
    if version & 0xFFFF == 0 and swapped in SUPPORTED_VERSIONS:
        return UnsupportedVersionError(f"this is a big-endian GGUF file (version {swapped}); pyshim reads little-endian files only",
                                       hint="use the little-endian version of the model")
    return UnsupportedVersionError(f"GGUF version {version} is not supported (this reader handles versions 2 and 3)",
                                   hint="the file is damaged, or from a newer GGUF revision pyshim does not know yet")


def _alignment(metadata: dict[str, Any], value_types: dict[str, tuple[GGUFValueType, ...]]) -> int:
    if "general.alignment" not in metadata:
        return DEFAULT_ALIGNMENT
    if value_types["general.alignment"] != (GGUFValueType.UINT32,):
        raise BadValueTypeError(f"general.alignment is stored as {value_types['general.alignment'][0].name}, "
                                "but GGUF requires UINT32", hint=_REDOWNLOAD)
    alignment = metadata["general.alignment"]
    if alignment <= 0 or alignment & (alignment - 1):
        raise BadAlignmentError(f"general.alignment is {alignment}; it must be a power of two", hint=_REDOWNLOAD)
    return alignment


def _tensor_record(p: _Parser, index: int, alignment: int) -> tuple[str, TensorType, tuple[int, ...], int, int]:
    at = p.pos
    name = p.string(f"the name of tensor {index}")
    n_dims = p.u32(f"the dimension count of tensor '{name}'")
    if n_dims > MAX_DIMS:
        raise BadTensorError(f"tensor '{name}' (record at byte {at}) claims {n_dims} dimensions; ggml tensors have at most {MAX_DIMS}",
                             hint=_REDOWNLOAD)
    p.need(p.pos + 8 * n_dims + _TENSOR_TAIL.size, f"the shape, type and offset of tensor '{name}'")
    shape = struct.unpack_from(f"<{n_dims}Q", p.buf, p.pos)
    p.pos += 8 * n_dims
    raw_type, rel_offset = _TENSOR_TAIL.unpack_from(p.buf, p.pos)
    p.pos += _TENSOR_TAIL.size

    ttype = tensor_type(raw_type)
    if ttype is None:
        raise UnknownTensorTypeError(f"tensor '{name}' has type number {raw_type}, which is not a known ggml type",
                                     hint="the file is damaged, or uses a tensor type newer than pyshim knows")
    n_elements = 1
    for d in shape:
        n_elements *= d
    if any(d > INT64_MAX for d in shape) or n_elements > INT64_MAX:
        raise BadTensorError(f"tensor '{name}' has shape {list(shape)}, more elements than any file can hold", hint=_REDOWNLOAD)
    try:
        nbytes = tensor_nbytes(ttype, shape)
    except ValueError:
        raise BadTensorError(f"tensor '{name}' of type {ttype.name} has shape {list(shape)}: its first dimension must be a "
                             f"multiple of the {ttype.block_size}-element block", hint=_REDOWNLOAD) from None
    if rel_offset % alignment:
        raise TensorRangeError(f"tensor '{name}' starts at data offset {rel_offset}, not a multiple of the alignment {alignment}",
                               hint=_REDOWNLOAD)
    return name, ttype, shape, rel_offset, nbytes


def _check_ranges(tensors: tuple[TensorInfo, ...], file_size: int | None) -> None:
    seen: set[str] = set()
    for t in tensors:
        if t.name in seen:
            raise DuplicateTensorError(f"two tensors are named '{t.name}'", hint=_REDOWNLOAD)
        seen.add(t.name)
        if file_size is not None and t.end > file_size:
            raise TensorRangeError(f"tensor '{t.name}' occupies bytes {t.offset}..{t.end}, past the end of the file ({file_size} bytes)",
                                   hint=_REDOWNLOAD)
    previous = None
    for t in sorted((t for t in tensors if t.nbytes), key=lambda t: t.offset):
        if previous is not None and t.offset < previous.end:
            raise TensorRangeError(f"tensors '{previous.name}' (bytes {previous.offset}..{previous.end}) and '{t.name}' "
                                   f"(from byte {t.offset}) overlap", hint=_REDOWNLOAD)
        previous = t


def read_header_from_file(path: str | os.PathLike) -> GGUFHeader:
    """Read the header of a GGUF file on disk, reading only as much of the file as the header takes."""
    file_size = os.path.getsize(path)
    length = min(FIRST_READ_BYTES, file_size)
    with open(path, "rb") as f:
        data = f.read(length)
        while True:
            try:
                return read_header(data, file_size=file_size)
            except NeedMoreBytes as more:
                # needed > len(data) always, and needed <= file_size: the loop ends by the whole file at worst.
                length = min(file_size, max(more.suggested, 2 * len(data)))
                data += f.read(length - len(data))
