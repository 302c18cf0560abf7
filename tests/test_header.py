"""The GGUF header reader: values and tensor table as gguf.GGUFReader sees them, prefixes, bad input."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from gguf import GGUFReader
from gguf import GGUFValueType as VT

from ggufgen import kv, kv_array, kv_str, kv_str_array, kv_u32, minimal, pstr, raw_gguf, tensor_info, writer_file
from pyshim.errors import GGUFFormatError, PyshimError
from pyshim.gguf.header import (
    MAX_HEADER_BYTES, AbsurdSizeError, BadAlignmentError, BadMagicError, BadTensorError, BadValueTypeError,
    DuplicateKeyError, DuplicateTensorError, NeedMoreBytes, TensorRangeError, TruncatedError, UnknownTensorTypeError,
    UnsupportedVersionError, raw_bytes, read_header, read_header_from_file,
)
from pyshim.gguf.types import TensorType

F32 = TensorType.F32


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    path = writer_file(tmp_path_factory.mktemp("gguf") / "small.gguf")
    return path, path.read_bytes()


def reader_value(field):
    """GGUFReader's value for a field, with string arrays as raw bytes (its contents() rejects bad UTF-8)."""
    if field.types[0] == VT.ARRAY and field.types[-1] == VT.STRING:
        return [bytes(field.parts[i]) for i in field.data]
    return field.contents()


def assert_same_as_reader(header, reader: GGUFReader):
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert list(header.metadata) == list(fields)
    for key, field in fields.items():
        ours = header.metadata[key]
        theirs = reader_value(field)
        assert header.value_types[key] == tuple(field.types), key
        if isinstance(ours, np.ndarray):
            assert ours.tolist() == theirs, key
        elif isinstance(ours, list):
            assert [raw_bytes(s) for s in ours] == theirs, key
        else:
            assert type(ours) is type(theirs) and ours == theirs, key
    assert header.version == reader.fields["GGUF.version"].contents()
    assert header.alignment == reader.alignment
    assert header.data_offset == reader.data_offset
    assert [t.name for t in header.tensors] == [t.name for t in reader.tensors]
    for ours, theirs in zip(header.tensors, reader.tensors):
        assert ours.type == theirs.tensor_type
        assert ours.shape == tuple(int(d) for d in theirs.shape)
        assert ours.offset == theirs.data_offset
        assert ours.nbytes == theirs.n_bytes
        assert ours.n_elements == theirs.n_elements


def test_agrees_with_gguf_reader(small):
    path, data = small
    assert_same_as_reader(read_header(data, file_size=len(data)), GGUFReader(path))


@pytest.mark.parametrize("alignment", [1, 8, 64, 4096])
def test_custom_alignment_is_honoured(tmp_path, alignment):
    path = writer_file(tmp_path / "a.gguf", alignment=alignment)
    header = read_header_from_file(path)
    assert header.alignment == alignment
    assert header.data_offset % alignment == 0
    assert all(t.offset % alignment == 0 for t in header.tensors)
    assert_same_as_reader(header, GGUFReader(path))


def test_value_types_and_conversions(small):
    _, data = small
    md = read_header(data).metadata
    assert md["test.u64"] == 2**63 + 5 and md["test.i64"] == -(2**62)
    assert md["test.f32"] == float(np.float32(0.1))
    assert md["test.bool"] is True
    assert md["test.str"] == "héllo ✓ 🙂"
    assert md["test.bools"].dtype == np.bool_ and md["test.bools"].tolist() == [True, False, True]
    assert md["test.u16s"].dtype == np.uint16
    assert md["tokenizer.ggml.scores"].dtype == np.float32 and md["tokenizer.ggml.token_type"].dtype == np.int32
    tokens = md["tokenizer.ggml.tokens"]
    assert isinstance(tokens, list) and tokens[5] == "日本"
    assert raw_bytes(tokens[3]) == b"\xff\xfe bad utf-8"   # kept exactly, as llama.cpp does


def test_arrays_are_copies_not_views(small):
    _, data = small
    buf = bytearray(data)
    scores = read_header(buf).metadata["tokenizer.ggml.scores"]
    buf[:] = b"\0" * len(buf)   # would fail (BufferError) or change scores if a view were kept
    assert scores[1] == -1.0


def test_every_buffer_kind_gives_the_same_header(small):
    path, data = small
    expected = read_header(data)
    arr = np.frombuffer(data, dtype=np.uint8)
    kinds = [bytearray(data), memoryview(data), arr, np.memmap(path, mode="r"), memoryview(arr)]
    for buf in kinds:
        header = read_header(buf)
        assert header.tensors == expected.tensors
        assert header.metadata["tokenizer.ggml.tokens"] == expected.metadata["tokenizer.ggml.tokens"]


def test_lookup_and_properties(small):
    _, data = small
    header = read_header(data, file_size=len(data))
    assert header.architecture == "llama"
    assert header.file_type_name == "Q4_K_M"
    t = header.tensor("blk.0.attn_q.weight")
    assert (t.type, t.shape, t.nbytes) == (TensorType.Q8_0, (256, 4), 4 * 8 * 34)
    assert header.has_tensor("output_norm.weight") and not header.has_tensor("output.weight")
    with pytest.raises(KeyError, match="output.weight"):
        header.tensor("output.weight")
    assert header.header_size <= header.data_offset < header.header_size + header.alignment
    assert header.file_size == len(data)


# ---- prefixes --------------------------------------------------------------------------------


def test_every_short_prefix_asks_for_more_and_never_too_much(small):
    _, data = small
    size = read_header(data).header_size
    for n in range(0, size):
        with pytest.raises(NeedMoreBytes) as info:
            read_header(data[:n])
        # a lower bound: never beyond the real header, always beyond what was given
        assert n < info.value.needed <= size, n
        with pytest.raises(NeedMoreBytes) as info2:
            read_header(data[:n], file_size=len(data))
        assert info2.value.needed == info.value.needed
    assert read_header(data[:size]).tensors == read_header(data).tensors


def test_feeding_needed_converges(small):
    _, data = small
    n, rounds = 0, 0
    while True:
        try:
            header = read_header(data[:n], file_size=len(data))
            break
        except NeedMoreBytes as more:
            n = more.needed
            rounds += 1
    assert header.header_size == n and rounds < 100
    assert isinstance(NeedMoreBytes(10, 5), PyshimError) and not isinstance(NeedMoreBytes(10, 5), GGUFFormatError)


def test_suggested_extrapolates_the_vocabulary():
    data = raw_gguf(minimal() + [kv_str_array("tokenizer.ggml.tokens", [f"token{i:05d}" for i in range(20_000)])])
    size = read_header(data).header_size
    with pytest.raises(NeedMoreBytes) as info:
        read_header(data[:size // 5])
    more = info.value
    # the lower bound counts 8 bytes per string still to come; the guess, their average length so far
    assert more.needed < size <= more.suggested < 1.5 * size


def test_read_header_from_file_reads_a_prefix_only(tmp_path, monkeypatch):
    # A file whose tensor data is 1 GiB of holes: the header must come back without reading it.
    body = raw_gguf(minimal() + [kv_str_array("tokenizer.ggml.tokens", [f"tok{i}" for i in range(100_000)])],
                    [tensor_info("big.weight", (1 << 28,), F32, 0)])
    path = tmp_path / "sparse.gguf"
    with open(path, "wb") as f:
        f.write(body)
        f.truncate(len(body) + (1 << 30))
    reads = []
    real_open = open

    def counting_open(*args, **kwargs):
        handle = real_open(*args, **kwargs)
        real_read = handle.read
        handle.read = lambda n=-1: reads.append(n) or real_read(n)
        return handle

    monkeypatch.setattr("builtins.open", counting_open)
    header = read_header_from_file(path)
    assert header.tensor("big.weight").nbytes == 1 << 30
    assert sum(reads) < 4 * len(body) and all(n >= 0 for n in reads)


# ---- bad input -------------------------------------------------------------------------------


def parse_error(data: bytes, cls: type, *fragments: str, file_size: int | None = -1):
    """read_header must raise `cls` (a GGUFFormatError) whose message holds every fragment."""
    with pytest.raises(cls) as info:
        read_header(data, file_size=len(data) if file_size == -1 else file_size)
    assert isinstance(info.value, GGUFFormatError)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    assert info.value.hint, "every format error says what to do"
    return message


def test_bad_magic():
    parse_error(b"PK\x03\x04" + b"\0" * 40, BadMagicError, "not a GGUF file", "PK")
    parse_error(b"GGML" + b"\0" * 40, BadMagicError, "GGML")
    with pytest.raises(BadMagicError):
        read_header(b"XY")            # two bytes are enough to tell
    with pytest.raises(NeedMoreBytes):
        read_header(b"GG")            # ...and two right bytes are not


def test_versions():
    parse_error(raw_gguf(minimal(), version=1), UnsupportedVersionError, "version 1", "obsolete")
    parse_error(raw_gguf(minimal(), version=4), UnsupportedVersionError, "version 4")
    big_endian = b"GGUF" + struct.pack(">IQQ", 3, 0, 0)
    parse_error(big_endian, UnsupportedVersionError, "big-endian")
    assert read_header(raw_gguf(minimal(), version=2)).version == 2


def test_truncated_header():
    data = raw_gguf(minimal() + [kv_str("general.name", "a model name")])
    for cut in range(4, read_header(data).header_size):
        # either a fixed-size field is cut ("ends at byte N") or a string runs past the end
        message = parse_error(data[:cut], (TruncatedError, AbsurdSizeError))
        assert f"ends at byte {cut}" in message or f"past the end of the file ({cut} bytes)" in message, message


def test_truncated_at_preamble_names_it():
    parse_error(raw_gguf(minimal())[:20], TruncatedError, "preamble", "ends at byte 20")


def test_absurd_counts_without_and_with_file_size():
    for n_kv, n_tensors in ((2**64 - 1, 0), (0, 2**63), (50_000_000, 0)):
        data = raw_gguf([], n_kv=n_kv, n_tensors=n_tensors)
        parse_error(data, AbsurdSizeError, "counts", file_size=None)
        parse_error(data, AbsurdSizeError, "counts")
    # plausible on its own, impossible for a 100-byte file
    parse_error(raw_gguf([], n_kv=1000), AbsurdSizeError, "1000 metadata entries", "file")


def test_absurd_string_lengths():
    huge_key = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 2**62) + b"general.architecture"
    parse_error(huge_key, AbsurdSizeError, "metadata key 0", "past the end of the file")
    parse_error(huge_key, AbsurdSizeError, f"{MAX_HEADER_BYTES >> 20} MiB", file_size=None)
    lying_value = minimal() + [kv("general.name", VT.STRING, struct.pack("<Q", 10**6) + b"short")]
    parse_error(raw_gguf(lying_value), AbsurdSizeError, "general.name", "1000000")
    lying_token = minimal() + [kv_array("tokenizer.ggml.tokens", VT.STRING, pstr("a") + struct.pack("<Q", 2**40) + b"b", 2)]
    parse_error(raw_gguf(lying_token), AbsurdSizeError, "string 1 of array 'tokenizer.ggml.tokens'")


def test_absurd_array_counts():
    floats = minimal() + [kv_array("tokenizer.ggml.scores", VT.FLOAT32, b"\0" * 8, 2**61)]
    parse_error(raw_gguf(floats), AbsurdSizeError, "tokenizer.ggml.scores")
    parse_error(raw_gguf(floats), AbsurdSizeError, "tokenizer.ggml.scores", file_size=None)
    strings = minimal() + [kv_array("tokenizer.ggml.tokens", VT.STRING, pstr("a"), 10**9)]
    parse_error(raw_gguf(strings), AbsurdSizeError, "tokenizer.ggml.tokens")


def test_unknown_value_types():
    parse_error(raw_gguf(minimal() + [kv("x.y", 13, b"\0" * 8)]), BadValueTypeError, "'x.y'", "value type 13")
    parse_error(raw_gguf(minimal() + [kv_array("x.arr", 99, b"", 0)]), BadValueTypeError, "'x.arr'", "item type 99")
    nested = kv_array("x.nested", VT.ARRAY, struct.pack("<IQ", VT.UINT8, 1) + b"\1", 1)
    parse_error(raw_gguf(minimal() + [nested]), BadValueTypeError, "'x.nested'", "arrays of arrays")


def test_duplicate_key():
    parse_error(raw_gguf(minimal() + [kv_u32("a.b", 1), kv_u32("a.b", 2)]), DuplicateKeyError, "'a.b'", "twice")


def test_alignment_key():
    parse_error(raw_gguf(minimal() + [kv_u32("general.alignment", 48)]), BadAlignmentError, "48", "power of two")
    parse_error(raw_gguf(minimal() + [kv_u32("general.alignment", 0)]), BadAlignmentError, "is 0")
    as_u64 = kv("general.alignment", VT.UINT64, struct.pack("<Q", 64))
    parse_error(raw_gguf(minimal() + [as_u64]), BadValueTypeError, "general.alignment", "UINT64")


def one_tensor(shape=(64,), ttype=F32, offset=0, data_bytes=256, name="w"):
    return raw_gguf(minimal(), [tensor_info(name, shape, ttype, offset)], data=b"\0" * data_bytes)


def test_good_single_tensor():
    header = read_header(one_tensor(), file_size=len(one_tensor()))
    assert header.tensor("w").offset == header.data_offset and header.tensor("w").nbytes == 256


def test_unknown_tensor_types():
    parse_error(one_tensor(ttype=99), UnknownTensorTypeError, "'w'", "type number 99")
    parse_error(one_tensor(ttype=4), UnknownTensorTypeError, "type number 4")   # the removed Q4_2


def test_bad_tensor_shapes():
    parse_error(one_tensor(shape=(2, 2, 2, 2, 2)), BadTensorError, "'w'", "5 dimensions")
    parse_error(one_tensor(shape=(100,), ttype=TensorType.Q4_0), BadTensorError, "'w'", "multiple of the 32-element block")
    parse_error(one_tensor(shape=(2**40, 2**40)), BadTensorError, "'w'")


def test_tensor_past_the_end():
    parse_error(one_tensor(data_bytes=100), TensorRangeError, "'w'", "past the end of the file")
    parse_error(one_tensor(offset=2**60), TensorRangeError, "past the end")
    assert read_header(one_tensor(data_bytes=100)).tensor("w").nbytes == 256   # without file_size: not checkable


def test_misaligned_tensor():
    parse_error(one_tensor(offset=4, data_bytes=512), TensorRangeError, "'w'", "alignment 32")


def test_overlapping_tensors():
    data = raw_gguf(minimal(), [tensor_info("a", (64,), F32, 0), tensor_info("b", (64,), F32, 128)], data=b"\0" * 512)
    parse_error(data, TensorRangeError, "'a'", "'b'", "overlap")
    fine = raw_gguf(minimal(), [tensor_info("a", (64,), F32, 256), tensor_info("b", (64,), F32, 0)], data=b"\0" * 512)
    assert [t.name for t in read_header(fine, file_size=len(fine)).tensors] == ["a", "b"]


def test_duplicate_tensor_names():
    data = raw_gguf(minimal(), [tensor_info("a", (64,), F32, 0), tensor_info("a", (64,), F32, 256)], data=b"\0" * 512)
    parse_error(data, DuplicateTensorError, "'a'")


def test_file_size_smaller_than_buffer_is_a_caller_error():
    with pytest.raises(ValueError):
        read_header(raw_gguf(minimal()), file_size=10)
