"""What the smaller KV caches change (not a test): next-token top-1 agreement with the f32 cache over a
passage of English, per model and cache type, in the NumPy reference (whose caches round as the GPU's
do: tests/test_kv_types.py). Besides the shipped types it emulates them without their key scales
(pyshim.models.key_scales) and the other 4-bit layouts considered — one f32 scale per head row (Shimmy's:
symmetric levels -8..7, d = amax / 7), Hadamard-rotated blocks — to show why q4 uses llama.cpp's blocks of
32 with scaled (and, without a key bias, rotated) keys. Also prints each layout's bytes per value.

    .venv/bin/python tests/bench_kv_types.py [smollm2 gemma3 qwen2.5] [--tokens N]
"""

from __future__ import annotations

import argparse
import time
from fractions import Fraction

import numpy as np

from english_text import long_english_text
from pyshim.exec import kvcache
from pyshim.exec.loading import load_reference
from pyshim.plan import settings as run_settings
from pyshim.plan.settings import KV_TYPES, KVType, RunSettings
from pyshim.setup.catalog import resolve_model
from pyshim.text.tokenizer import Tokenizer


def q4_per_head(x: np.ndarray) -> np.ndarray:
    """x [..., head_dim] with one scale per head row: d = amax / 7, levels -8..7."""
    x = x.astype(np.float32)
    d = np.abs(x).max(axis=-1, keepdims=True) / np.float32(7)
    with np.errstate(divide="ignore"):
        inv = np.where(d > 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    return np.clip(np.round(x * inv), -8, 7).astype(np.float32) * d


def hadamard(n: int) -> np.ndarray:
    h = np.ones((1, 1), np.float32)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return (h / np.sqrt(n)).astype(np.float32)


def rotated(rounding, width: int):
    """`rounding` applied to x rotated by an orthonormal Hadamard matrix in groups of `width` (0: the whole
    head), then rotated back: what a cache storing rotated values gives the attention's dot products."""
    def apply(x: np.ndarray) -> np.ndarray:
        w = width or x.shape[-1]
        h = hadamard(w)
        g = x.astype(np.float32).reshape(*x.shape[:-1], x.shape[-1] // w, w)
        return (rounding((g @ h).reshape(x.shape)).reshape(g.shape) @ h).reshape(x.shape)
    return apply


def emulate_other_layouts(head_dim: int) -> None:
    """Registers the layouts considered beside the shipped types: q8 and q4 without the key scales
    ("q8-plain", "q4-plain": what shipped before pyshim.models.key_scales), q4 with scaled keys that are not
    rotated ("q4-scaled": what shipped before the rotation), one scale per head row ("q4-head": half a byte
    a value, 4 per row), and q4 over unscaled keys and values rotated by a Hadamard matrix in blocks of 32
    or the whole head ("q4-rot32", "q4-rothead": q4's bytes)."""
    run_settings.KV_TYPES["q4-scaled"] = KVType("q4-scaled", KV_TYPES["q4"].bytes_per_value, note="emulated",
                                                scaled_keys=True)
    kvcache.ROUNDING["q4-scaled"] = kvcache.q4_round
    for name, bpv, rounding in (("q8-plain", KV_TYPES["q8"].bytes_per_value, kvcache.q8_round),
                                ("q4-plain", KV_TYPES["q4"].bytes_per_value, kvcache.q4_round),
                                ("q4-head", Fraction(1, 2) + Fraction(4, head_dim), q4_per_head),
                                ("q4-rot32", KV_TYPES["q4"].bytes_per_value, rotated(kvcache.q4_round, 32)),
                                ("q4-rothead", KV_TYPES["q4"].bytes_per_value, rotated(kvcache.q4_round, 0))):
        run_settings.KV_TYPES[name] = KVType(name, bpv, note="emulated")
        kvcache.ROUNDING[name] = rounding


def logits(path, ids: list[int], kv_type: str) -> np.ndarray:
    runner = load_reference(path, settings=RunSettings(context=len(ids), kv_type=kv_type))
    return runner.logits(ids, all_logits=True)


def bench(name: str, tokens: int) -> None:
    path = resolve_model(name)
    probe = load_reference(path, settings=RunSettings(context=16))
    ids = Tokenizer.from_metadata(probe.header.metadata).encode(long_english_text(8))[:tokens]
    emulate_other_layouts(probe.spec.head_dim_k)
    t0 = time.perf_counter()
    base = logits(path, ids, "f32")
    top = base.argmax(-1)
    print(f"{name}: {len(ids)} tokens, head dim {probe.spec.head_dim_k} (f32 cache: {time.perf_counter() - t0:.0f} s)")
    for kv_type in [t for t in KV_TYPES if t != "f32"]:
        got = logits(path, ids, kv_type)
        agree = float((got.argmax(-1) == top).mean())
        err = float(np.abs(got - base).max())
        bpv = float(KV_TYPES[kv_type].bytes_per_value)
        print(f"  {kv_type:8s} {bpv:5.3f} B/value ({bpv / 4:5.1%} of f32)  top-1 agreement {agree:6.1%}  "
              f"max |d logit| {err:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["smollm2", "gemma3", "qwen2.5"])
    parser.add_argument("--tokens", type=int, default=400)
    args = parser.parse_args()
    for name in args.models:
        bench(name, args.tokens)


if __name__ == "__main__":
    main()
