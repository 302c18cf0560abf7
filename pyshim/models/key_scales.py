"""Per-model key scales for the quantized KV caches (q8, q4): why Qwen2.5's q4 cache lost its needles, and the fix.

A q4 cache rounds each block of 32 key values to 16 steps of the block's largest value. Keys have a few
channels far larger than the rest (Qwen2's key biases; rope's slow pairs carry them almost unturned), so
in those blocks every other channel rounds to a step or two: next-token agreement with the f32 cache fell
to 31-46% on Qwen2.5-0.5B. Dividing each rope pair of the keys by a scale s and multiplying the queries'
same pair by s leaves every dot product q.k unchanged — a rotation turns a pair as a whole, so scaling a
pair commutes with rope — while the cache now stores keys whose channels are alike.

s comes from the weights, so it is one constant per layer and model: no calibration text, the same for
every sequence (shared prefixes, batching and rings need nothing more). A key channel i is
k_i = W_i . x (+ b_i) with x the attention norm's output (unit mean square, times the norm's weight g), so
its expected square is sum_j W_ij^2 g_j^2 (+ b_i^2); a head norm (qwen3, gemma3) or a whole-projection norm
(olmoe) rescales those to unit mean square times its own weight. A pair's magnitude is the square root of
its two channels' sum, and s is that magnitude to the power 1/2 — SmoothQuant's migration strength 0.5,
which splits the spread between keys and queries. Measured with the NumPy reference (tests/bench_kv_types.py,
400 tokens of English, top-1 agreement with the f32 cache): q4 on Qwen2.5 46% -> 84%, Gemma 3 79% -> 85%,
SmolLM2 76% -> 78%; q8 on Qwen2.5 93.5% -> 98.5%. Power 1 gave 72% on Qwen2.5's q4, 0.4 gave 66%;
per-sequence scales from the first chunk's largest pairs gave 82-85%, no better, at the cost of
per-sequence state.

A q4 cache then also turns each scaled key (and its query) by a Hadamard rotation within the head: an
orthonormal H leaves q.k as it was, and spreads every channel over the whole head, so a block's step is
set by the head's overall size rather than by one channel that a token makes large. Measured the same
way: SmolLM2 q4 78% -> 86%, Gemma 3 84% -> 87.5%; SmolLM2's needles in the middle of the text (`pyshim
bench --needle` on the CPU engine, 3 seeds at 50% depth), each lost to a digit dropped from the number,
from 1 of 3 found to 2 at 1k and from 0 to 3 at 2k. Keys that carry a bias (Qwen2's) are the exception:
the bias is a large, steady part of every key that the scales already even out pair by pair, and a
rotation smears it over every block instead (emulated: Qwen2.5 q4 84% -> 74%, and needles lost), so those
keys are only scaled.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pyshim.gguf.spec import ModelSpec
from pyshim.gguf.tensors import WeightStore, dequantize_rows, tensor_refs_from_header

STRENGTH = 0.5          # s = pair magnitude ** STRENGTH
FLOOR = 1e-3            # a pair's magnitude at least this fraction of the head's largest (a zero row divides nothing)
MAX_ROTATION = 256      # widest Hadamard rotation (rope.wgsl's ROTATE turns a head of up to 512 in workgroup memory)


@dataclass(frozen=True)
class KeyScales:
    """One layer's scales, as rope multiplies the rotated heads: q [n_heads, head_dim] (each query head its
    KV head's s) and k [n_kv_heads, head_dim] (1 / s, rounded to f32 once, so every executor multiplies
    by the same numbers)."""

    q: np.ndarray
    k: np.ndarray
    rotation: int = 0       # then rotate q and k by a Hadamard matrix in groups of this many values (0: not)


def key_tensors(spec: ModelSpec, il: int) -> list[tuple[str, tuple[int, int] | None]]:
    """The GGUF tensors layer `il`'s scales are made of, each with the rows read of it (None: all): of a
    fused attn_qkv only the key rows, a third of Phi-3's (the browser hands these bytes to Python; the whole
    matrices were 594 MB of Phi-3.5-mini's JS heap)."""
    p = f"blk.{il}."
    if not spec.fused_qkv:
        names = [(p + "attn_norm.weight", None), (p + "attn_k.weight", None)]
        names += [(p + "attn_k.bias", None)] if spec.qkv_bias else []
    else:
        hd, hkv = spec.head_dims(il)[0], spec.kv_heads(il)
        k_rows = (spec.n_heads * hd, (spec.n_heads + hkv) * hd)
        names = [(p + "attn_norm.weight", None), (p + "attn_qkv.weight", k_rows)]
        names += [(p + "attn_qkv.bias", k_rows)] if spec.qkv_bias else []
    if spec.qk_norm:
        names.append((p + "attn_k_norm.weight", None))
    return names


def key_scales(spec: ModelSpec, store: WeightStore, pairs: list, rotate: bool = False) -> list[KeyScales]:
    """Every layer's scales; `pairs[il]` is layer il's RopeSpec (its rotated dims and NeoX pairing).
    `rotate`: the cache rotates keys where the model allows (KVType.rotated_keys, rotation_width)."""
    return [_layer(spec, store, il, pairs[il], rotation_width(spec, il) if rotate else 0) for il in range(spec.n_layers)]


def rotation_width(spec: ModelSpec, layer: int = 0) -> int:
    """How many values of a head of layer `layer` one Hadamard rotation spans: the largest power of two that
    divides the head (the whole head for 64, 128, 256; 32 for Phi-3's 96), at most MAX_ROTATION; 0 for keys
    with a bias."""
    if spec.qkv_bias:
        return 0
    hd = spec.head_dims(layer)[0]
    return min(hd & -hd, MAX_ROTATION)


def hadamard(x: np.ndarray, width: int) -> np.ndarray:
    """x [..., head_dim] (f32) with each group of `width` values along the head multiplied by the orthonormal
    Sylvester Hadamard matrix H / sqrt(width) — its own inverse. Computed as the kernels do, so every
    executor gets the same bits: log2(width) butterfly stages (a + b, a - b) over pairs `half` apart
    (half = 1, 2, 4, ...), then a multiply by f32(1 / sqrt(width))."""
    shape = x.shape
    y = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, width)
    half = 1
    while half < width:
        y = y.reshape(-1, width // (2 * half), 2, half)
        a, b = y[:, :, 0], y[:, :, 1]
        y = np.stack([a + b, a - b], axis=2)
        half *= 2
    return (y.reshape(shape) * hadamard_norm(width)).astype(np.float32)


def hadamard_norm(width: int) -> np.float32:
    """1 / sqrt(width) as every executor multiplies by it (rounded to f32 once)."""
    return np.float32(1.0 / np.sqrt(width))


def key_ranges(spec: ModelSpec, header) -> list[tuple[int, int]]:
    """The file ranges (offset, bytes) of every layer's key_tensors, layer by layer, from the GGUF header."""
    refs = {ref.name: ref for ref in tensor_refs_from_header(header)}
    out = []
    for il in range(spec.n_layers):
        for name, rows in key_tensors(spec, il):
            ref = refs[name]
            if rows is None or len(ref.shape) == 1:
                out.append((ref.offset, ref.nbytes))
            else:
                out.append((ref.offset + rows[0] * ref.row_bytes, (rows[1] - rows[0]) * ref.row_bytes))
    return out


def _dense(store: WeightStore, name: str, rows: tuple[int, int] | None) -> np.ndarray:
    ref = store.info(name)
    if rows is not None and len(ref.shape) == 1:        # a bias: one row, of which these elements
        return dequantize_rows(store.raw(name), ref.qtype).reshape(-1)[rows[0]:rows[1]].astype(np.float64)
    raw = store.raw(name) if rows is None else store.row_range(name, *rows)
    return dequantize_rows(raw, ref.qtype).reshape(-1, ref.shape[-1]).astype(np.float64)


def _layer(spec: ModelSpec, store: WeightStore, il: int, rope, rotation: int) -> KeyScales:
    hd, hkv = spec.head_dims(il)[0], spec.kv_heads(il)
    reads = key_tensors(spec, il)
    g = _dense(store, *reads[0]).reshape(-1)
    w = _dense(store, *reads[1])
    e = (w ** 2) @ (g ** 2)                                                 # [kv_out]: expected k_i^2
    at = 2
    if spec.qkv_bias:
        e = e + _dense(store, *reads[at]).reshape(-1) ** 2
        at += 1
    e = e.reshape(hkv, hd)
    if spec.qk_norm:
        norm = _dense(store, *reads[at]).reshape(-1) ** 2
        if spec.qk_norm_full:      # the whole projection normed: unit mean square over it, then its weight
            e = e / e.mean() * norm.reshape(hkv, hd)
        else:                      # each head normed
            e = e / e.mean(axis=-1, keepdims=True) * norm[None, :]
    half = rope.dims // 2
    a = np.arange(half) if rope.neox else np.arange(0, rope.dims, 2)
    b = a + half if rope.neox else a + 1
    mag = np.sqrt(e)                                                        # the pass-through dims: each its own
    mag[:, a] = mag[:, b] = np.sqrt(e[:, a] + e[:, b])
    mag = np.maximum(mag, FLOOR * mag.max(axis=-1, keepdims=True))
    mag[mag == 0] = 1.0                                                     # a head of zeros: left as it is
    s = mag ** STRENGTH
    s = (s / np.exp(np.log(s).mean(axis=-1, keepdims=True))).astype(np.float32)   # geometric mean 1 per head
    group = spec.n_heads // hkv
    return KeyScales(q=np.repeat(s, group, axis=0), k=(np.float32(1) / s).astype(np.float32), rotation=rotation)
