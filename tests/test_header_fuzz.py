"""Property test: mutated and random headers never make the reader raise anything but GGUFFormatError
(or NeedMoreBytes for a short prefix), never hang, never allocate what the bytes cannot back.

Five strategies x EXAMPLES_EACH examples (>= 10,000 in all), seeded by real small headers written
with gguf's GGUFWriter plus hand-packed ones: byte flips, truncations, lying length/count/type fields,
inserted and deleted runs, and random bytes after a valid preamble. Headers that still parse are fed
on to ModelSpec and the memory estimate, which may only raise PyshimError subclasses.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ggufgen import kv, kv_array, kv_str, kv_str_array, kv_u32, raw_gguf, tensor_info, writer_file
from pyshim.errors import GGUFFormatError, PyshimError
from pyshim.gguf.header import MAX_HEADER_BYTES, NeedMoreBytes, read_header
from pyshim.plan.memory import estimate
from pyshim.gguf.spec import ModelSpec

pytestmark = pytest.mark.slow

EXAMPLES_EACH = 2_100
SETTINGS = settings(max_examples=EXAMPLES_EACH, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
# Values that make length/count fields lie in interesting ways.
INTERESTING_U64 = [0, 1, 2, 7, 8, 255, 256, 4096, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**62, 2**63 - 1, 2**63, 2**64 - 1]


def _hand_seed() -> bytes:
    kvs = [
        kv_str("general.architecture", "gemma3"),
        kv_u32("gemma3.block_count", 3),
        kv_u32("gemma3.context_length", 64),
        kv_u32("gemma3.embedding_length", 64),
        kv_u32("gemma3.feed_forward_length", 128),
        kv_u32("gemma3.attention.head_count", 2),
        kv_u32("gemma3.attention.sliding_window", 4),
        kv_array("gemma3.attention.sliding_window_pattern", VT.BOOL, b"\1\1\0", 3),
        kv("gemma3.attention.layer_norm_rms_epsilon", VT.FLOAT32, struct.pack("<f", 1e-6)),
        kv_u32("general.alignment", 64),
        kv_str_array("tokenizer.ggml.tokens", ["<pad>", "a", b"\xe2\x96", "\u2581b"]),
        kv_array("tokenizer.ggml.scores", VT.FLOAT32, struct.pack("<4f", 0, -1, -2, -3), 4),
    ]
    tensors = [tensor_info("token_embd.weight", (64, 4), QT.Q8_0, 0), tensor_info("output_norm.weight", (64,), QT.F32, 320),
               tensor_info("blk.0.attn_q.weight", (256, 1), QT.Q4_K, 640)]
    return raw_gguf(kvs, tensors, alignment=64, data=b"\x11" * 900)


@pytest.fixture(scope="module")
def seeds(tmp_path_factory) -> list[bytes]:
    folder = tmp_path_factory.mktemp("fuzz")
    written = [writer_file(folder / f"s{i}.gguf", n_vocab=8 + i, seed=i, alignment=a).read_bytes()
               for i, a in enumerate((None, 64))]
    return written + [_hand_seed()]


def _fields(data: bytes) -> list[tuple[int, int]]:
    """(offset, width) of every count, length and type field of a valid header: where lies hurt most.
    An independent walk of the layout, so the test does not trust the reader it tests."""
    out = [(8, 8), (16, 8)]
    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
    pos = 24

    def string(pos):
        out.append((pos, 8))
        return pos + 8 + struct.unpack_from("<Q", data, pos)[0]

    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    for _ in range(n_kv):
        pos = string(pos)
        out.append((pos, 4))
        vtype = struct.unpack_from("<I", data, pos)[0]
        pos += 4
        if vtype == VT.STRING:
            pos = string(pos)
        elif vtype == VT.ARRAY:
            out += [(pos, 4), (pos + 4, 8)]
            itype, count = struct.unpack_from("<IQ", data, pos)
            pos += 12
            for _ in range(count):
                pos = string(pos) if itype == VT.STRING else pos + sizes[itype]
        else:
            pos += sizes[vtype]
    for _ in range(n_tensors):
        pos = string(pos)
        out.append((pos, 4))
        n_dims = struct.unpack_from("<I", data, pos)[0]
        out += [(pos + 4 + 8 * i, 8) for i in range(n_dims)]
        pos += 4 + 8 * n_dims
        out += [(pos, 4), (pos + 4, 8)]
        pos += 12
    return out


def check(data: bytes, file_size: int | None) -> None:
    try:
        header = read_header(data, file_size=file_size)
    except NeedMoreBytes as more:
        assert file_size is None or file_size > len(data)
        assert len(data) < more.needed <= more.suggested <= (MAX_HEADER_BYTES if file_size is None else file_size)
        return
    except GGUFFormatError as error:
        assert str(error)
        return
    assert header.header_size <= header.data_offset
    assert all(t.offset >= header.data_offset for t in header.tensors)
    if file_size is not None:
        assert all(t.end <= file_size for t in header.tensors)
    try:
        spec = ModelSpec.from_header(header)
        if header.tensors:
            estimate(spec, header.tensors, context=min(spec.context_length, 1 << 20))
    except PyshimError as error:
        assert str(error)


def check_both(data: bytes) -> None:
    check(data, len(data))   # the whole file
    check(data, None)        # a prefix of unknown length


@SETTINGS
@given(st.data())
def test_byte_flips(seeds, data):
    buf = bytearray(data.draw(st.sampled_from(seeds)))
    for _ in range(data.draw(st.integers(1, 8))):
        buf[data.draw(st.integers(0, len(buf) - 1))] = data.draw(st.integers(0, 255))
    check_both(bytes(buf))


@SETTINGS
@given(st.data())
def test_truncations(seeds, data):
    seed = data.draw(st.sampled_from(seeds))
    cut = data.draw(st.integers(0, len(seed)))
    buf = bytearray(seed[:cut])
    if buf and data.draw(st.booleans()):
        buf[data.draw(st.integers(0, len(buf) - 1))] ^= 1 << data.draw(st.integers(0, 7))
    check(bytes(buf), len(buf))
    check(bytes(buf), None)
    check(bytes(buf), len(seed))   # a prefix of a file of known size


@SETTINGS
@given(st.data())
def test_lying_fields(seeds, data):
    seed = data.draw(st.sampled_from(seeds))
    buf = bytearray(seed)
    fields = _fields(seed)
    for _ in range(data.draw(st.integers(1, 3))):
        offset, width = data.draw(st.sampled_from(fields))
        if width == 8:
            value = data.draw(st.one_of(st.sampled_from(INTERESTING_U64), st.integers(0, 2**64 - 1),
                                        st.integers(0, len(seed) * 2)))
            struct.pack_into("<Q", buf, offset, value)
        else:
            struct.pack_into("<I", buf, offset, data.draw(st.one_of(st.integers(0, 64), st.integers(0, 2**32 - 1))))
    check_both(bytes(buf))


@SETTINGS
@given(st.data())
def test_splices(seeds, data):
    buf = bytearray(data.draw(st.sampled_from(seeds)))
    at = data.draw(st.integers(0, len(buf)))
    if data.draw(st.booleans()):
        buf[at:at] = data.draw(st.binary(min_size=1, max_size=40))
    else:
        del buf[at:at + data.draw(st.integers(1, 40))]
    check_both(bytes(buf))


@SETTINGS
@given(version=st.sampled_from([2, 3]), counts=st.tuples(st.integers(0, 40), st.integers(0, 40)),
       body=st.binary(max_size=400))
def test_random_bodies(version, counts, body):
    check_both(b"GGUF" + struct.pack("<IQQ", version, *counts) + body)


def test_field_walker_matches_seeds(seeds):
    # the walker above must itself be right for its mutations to land on fields
    for seed in seeds:
        fields = _fields(seed)
        assert len(fields) > 20 and max(o for o, _ in fields) < read_header(seed).header_size
        assert np.all(np.diff([o for o, _ in fields]) > 0)
