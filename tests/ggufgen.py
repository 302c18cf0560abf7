"""Small GGUF files for header tests: valid ones through gguf's own GGUFWriter, malformed ones by hand.

`raw_gguf` assembles a file from packed pieces so a test can break exactly one thing (a duplicate key,
a lying count, a misaligned offset) that GGUFWriter would refuse to write.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT
from gguf import GGUFWriter

# ---- hand-packed pieces ------------------------------------------------------------------------


def pstr(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def kv(key: str, vtype: int, payload: bytes) -> bytes:
    return pstr(key) + struct.pack("<I", vtype) + payload


def kv_u32(key: str, value: int) -> bytes:
    return kv(key, VT.UINT32, struct.pack("<I", value))


def kv_str(key: str, value: str | bytes) -> bytes:
    return kv(key, VT.STRING, pstr(value))


def kv_array(key: str, item_type: int, items: bytes, count: int) -> bytes:
    return kv(key, VT.ARRAY, struct.pack("<IQ", item_type, count) + items)


def kv_str_array(key: str, values: list[str | bytes]) -> bytes:
    return kv_array(key, VT.STRING, b"".join(pstr(v) for v in values), len(values))


def tensor_info(name: str | bytes, shape: tuple[int, ...], ttype: int, offset: int) -> bytes:
    return pstr(name) + struct.pack(f"<I{len(shape)}QIQ", len(shape), *shape, ttype, offset)


def raw_gguf(kvs: list[bytes], tensors: list[bytes] = (), *, version: int = 3, magic: bytes = b"GGUF",
             n_kv: int | None = None, n_tensors: int | None = None, alignment: int = 32, data: bytes = b"") -> bytes:
    """magic | version | counts | kvs | tensor infos | zero padding to `alignment` | data."""
    head = magic + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                               len(kvs) if n_kv is None else n_kv)
    head += b"".join(kvs) + b"".join(tensors)
    head += b"\0" * (-len(head) % alignment)
    return head + data


def minimal(arch: str = "llama") -> list[bytes]:
    return [kv_str("general.architecture", arch)]


# ---- files written by GGUFWriter --------------------------------------------------------------


def writer_file(path: Path, *, alignment: int | None = None, n_vocab: int = 40, seed: int = 0) -> Path:
    """A small but varied valid GGUF: every scalar type, numeric/bool/string arrays (with a token that is
    not valid UTF-8), F32/F16/Q8_0/Q4_K tensors."""
    rng = np.random.default_rng(seed)
    w = GGUFWriter(path, "llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4_000_000_000)
    w.add_int32("test.i32", -2_000_000_000)
    w.add_float32("test.f32", 0.1)
    w.add_uint64("test.u64", 2**63 + 5)
    w.add_int64("test.i64", -(2**62))
    w.add_float64("test.f64", 1e-300)
    w.add_bool("test.bool", True)
    w.add_string("test.str", "héllo ✓ 🙂")
    w.add_array("test.bools", [True, False, True])
    w.add_key_value("test.u16s", [1, 2, 65535], VT.ARRAY, VT.UINT16)
    w.add_key_value("test.f64s", [0.5, -2.25], VT.ARRAY, VT.FLOAT64)
    w.add_uint32("llama.block_count", 2)
    w.add_uint32("llama.context_length", 128)
    w.add_uint32("llama.embedding_length", 256)
    w.add_uint32("llama.feed_forward_length", 512)
    w.add_uint32("llama.attention.head_count", 4)
    w.add_uint32("llama.attention.head_count_kv", 2)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_uint32("general.file_type", 15)
    tokens: list[str | bytes] = ["<unk>", "<s>", "</s>", b"\xff\xfe bad utf-8", "\u2581the", "日本"]
    tokens += [f"t{i}" for i in range(n_vocab - len(tokens))]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([float(-i) for i in range(n_vocab)])
    w.add_token_types([1] * n_vocab)
    w.add_tensor("token_embd.weight", rng.standard_normal((n_vocab, 256), dtype=np.float32).astype(np.float16))
    w.add_tensor("output_norm.weight", rng.standard_normal(256, dtype=np.float32))
    q8 = rng.integers(0, 256, size=(4, 256 // 32 * 34), dtype=np.uint8)
    w.add_tensor("blk.0.attn_q.weight", q8, raw_dtype=QT.Q8_0)
    q4k = rng.integers(0, 256, size=(2, 144), dtype=np.uint8)
    w.add_tensor("blk.0.ffn_up.weight", q4k, raw_dtype=QT.Q4_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
