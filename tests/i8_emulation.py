"""NumPy emulation of the int8 route (shaders/quantize.wgsl + shaders/matvec_i8.wgsl): the quantized rows
exactly as the GPU lays them out, and the matvec result as llama.cpp's CPU backend computes it (through
pyshim.exec.reference's emulation of llama.cpp's activation rounding, which is this route's oracle)."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as QT

from pyshim.exec.llama_cpp import llama_cpp_activations, q8_1_sum_correction
from pyshim.exec.reference import dequantize_rows
from pyshim.gpu.kernels import I8_ACTIVATIONS, I8_BLOCKS, lanes_words, xq_row_words
from pyshim.plan.memory import REPACK_GROUP_BLOCKS


def quantize(x: np.ndarray, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """x [n, k] f32 -> (int8 values [n, k], f32 metadata [n, blocks, words]) as quantize.wgsl writes them."""
    per, words = I8_BLOCKS[fmt]
    n, k = x.shape
    blocks = x.astype(np.float32).reshape(n, k // per, per)
    info = np.zeros((n, k // per, words), np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        if fmt == "q8_0":
            amax = np.abs(blocks).max(axis=2)
            inv = np.where(amax == 0, np.float32(0), np.float32(127.0) / amax).astype(np.float32)
            q = np.rint(blocks * inv[..., None]).astype(np.int32)
            d = (amax / np.float32(127.0)).astype(np.float32)
            sums = q.sum(axis=2)
            info[..., 0] = d.astype(np.float16)
            info[..., 1] = (d * sums.astype(np.float32)).astype(np.float16)
            info[..., 2] = sums
        else:
            at = np.argmax(np.abs(blocks), axis=2)
            biggest = np.take_along_axis(blocks, at[..., None], axis=2)[..., 0]
            iscale = np.where(biggest == 0, np.float32(0), np.float32(-127.0) / biggest).astype(np.float32)
            d = np.where(iscale == 0, np.float32(0), np.float32(1.0) / iscale).astype(np.float32)
            q = np.minimum(127, np.rint(iscale[..., None] * blocks)).astype(np.int32)
            info[..., 0] = d
            info[..., 4:] = q.reshape(n, k // per, 16, 16).sum(axis=3)
    return q.reshape(n, k).astype(np.int8), info


def pack(q: np.ndarray, info: np.ndarray) -> np.ndarray:
    """(values, metadata) -> the u32 rows the GPU reads: k/4 words of packed int8, then the metadata."""
    n, k = q.shape
    values = q.reshape(n, k // 4, 4).view(np.uint32).reshape(n, k // 4)
    return np.concatenate([values, info.reshape(n, -1).view(np.uint32)], axis=1)


def with_lanes(q: np.ndarray, info: np.ndarray) -> tuple[np.ndarray, int]:
    """pack's rows followed by lanes.wgsl's token pairs (x[2p] + 65536 * x[2p + 1] per element, a last odd
    token paired with itself) -> (words, the pairs' word offset)."""
    n, k = q.shape
    rows = pack(q, info).reshape(-1)
    pair_off, total = lanes_words(n, k, rows.size // n)
    lo = q[0::2].astype(np.int32)
    hi = q[np.minimum(np.arange(1, n + 1, 2), n - 1)].astype(np.int32)
    out = np.zeros(total, np.uint32)
    out[:rows.size] = rows
    out[pair_off:] = (lo + 65536 * hi).view(np.uint32).reshape(-1)
    return out, pair_off


def unpack(words: np.ndarray, n: int, k: int, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of pack, for rows read back from the GPU."""
    per, nwords = I8_BLOCKS[fmt]
    rows = words[: n * xq_row_words(k, fmt)].reshape(n, -1)
    q = rows[:, : k // 4].copy().view(np.int8).reshape(n, k)
    info = rows[:, k // 4:].copy().view(np.float32).reshape(n, k // per, nwords)
    return q, info


def dequantized(q: np.ndarray, info: np.ndarray, fmt: str) -> np.ndarray:
    """The activation values the int8 matvec multiplies by: q * d per block."""
    per, _ = I8_BLOCKS[fmt]
    n, k = q.shape
    return (q.reshape(n, k // per, per).astype(np.float32) * info[..., :1]).reshape(n, k)


def matvec(raw: np.ndarray, qtype: QT, q: np.ndarray, info: np.ndarray) -> np.ndarray:
    """What matvec_i8 computes from these quantized rows, in f64: W_dequantized @ (q*d), plus Q4_1's
    min term taken with Q8_1's f16 block sum (as llama.cpp does)."""
    fmt = I8_ACTIVATIONS[qtype]
    m = raw.shape[0]
    k = q.shape[1]
    w = dequantize_rows(raw, qtype).reshape(m, k).astype(np.float64)
    y = dequantized(q, info, fmt).astype(np.float64) @ w.T
    if qtype == QT.Q4_1:
        mins = raw.reshape(m, k // 32, 20)[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
        exact = dequantized(q, info, fmt).reshape(q.shape[0], -1, 32).sum(axis=2, dtype=np.float64)
        y += (info[..., 1].astype(np.float64) - exact) @ mins.T
    return y


def llama_cpp_matvec(raw: np.ndarray, qtype: QT, x: np.ndarray) -> np.ndarray:
    """The reference executor's llama.cpp emulation of x @ W.T (independent of this module's quantize)."""
    m = raw.shape[0]
    k = x.shape[1]
    w = dequantize_rows(raw, qtype).reshape(m, k)
    y = llama_cpp_activations(x, qtype).astype(np.float64) @ w.T.astype(np.float64)
    if qtype == QT.Q4_1:
        mins = raw.reshape(m, k // 32, 20)[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        y += q8_1_sum_correction(x, mins)
    return y


def grouped(raw: np.ndarray, qtype) -> np.ndarray:
    """Q4_0, Q8_0 or Q6_K bytes in repack.wgsl's layout, stated independently of the shader: blocks in file order,
    8 to a group, the last group padded with zero blocks; a group is each field of its 8 blocks one block
    after another, field after field (Q4_0, Q8_0: quants, then f16 scales; Q6_K: ql, qh, scales, then f16 d).
    -> uint8, flat."""
    size, fields = {QT.Q4_0: (18, [(2, 18), (0, 2)]), QT.Q8_0: (34, [(2, 34), (0, 2)]),
                    QT.Q6_K: (210, [(0, 128), (128, 192), (192, 208), (208, 210)])}[QT(qtype)]
    blocks = raw.reshape(-1, size)
    pad = -len(blocks) % REPACK_GROUP_BLOCKS
    blocks = np.concatenate([blocks, np.zeros((pad, size), np.uint8)]).reshape(-1, REPACK_GROUP_BLOCKS, size)
    return np.concatenate([blocks[:, :, a:b].reshape(len(blocks), -1) for a, b in fields], axis=1).reshape(-1)
