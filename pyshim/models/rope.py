"""Rotary position embedding: the settings of one layer's rope and the angle tables they give.

The math follows ggml's `rope_yarn` so results match llama.cpp: pair i of the rotated dims turns by
`pos * base^(-2i/dims)`, divided by `factor` where linear or YaRN scaling applies; YaRN blends the
scaled and unscaled angle per pair with a ramp between two "correction dims" and multiplies cos/sin by
`mscale`. Executors use `pair_tables` once at load (the GPU uploads them) and `cos_sin` per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

YARN_BETA_FAST = 32.0   # llama.cpp's defaults for YaRN's correction range
YARN_BETA_SLOW = 1.0


@dataclass(frozen=True)
class RopeSpec:
    dims: int                   # leading dims of each head that rotate (the rest pass through)
    base: float
    neox: bool                  # True: pairs (i, i + dims/2); False: pairs (2i, 2i + 1)
    scaling: str = "none"       # "none" | "linear" | "yarn"
    factor: float = 1.0         # context extension factor (freq_scale = 1/factor)
    n_ctx_orig: int = 0         # training context before extension (YaRN)
    attn_factor: float = 1.0    # GGUF rope.scaling.attn_factor
    yarn_log_mul: float = 0.0   # GGUF rope.scaling.yarn_log_multiplier

    @property
    def freq_scale(self) -> float:
        return 1.0 / self.factor if self.scaling in ("linear", "yarn") else 1.0


def _yarn_corr_dim(dims: int, n_ctx_orig: int, n_rot: float, base: float) -> float:
    return dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))


def _yarn_mscale(scale: float, mscale: float) -> float:
    return 1.0 if scale <= 1.0 else 0.1 * mscale * math.log(scale) + 1.0


def pair_tables(spec: RopeSpec, freq_factors: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, float]:
    """Per rotated pair: (inverse frequency [dims/2], YaRN extrapolation mix [dims/2]) and the cos/sin scale.

    angle(pos, i) = pos * inv_freq[i] * (freq_scale * (1 - mix[i]) + mix[i])."""
    half = spec.dims // 2
    inv_freq = spec.base ** (-np.arange(0, spec.dims, 2, dtype=np.float64) / spec.dims)
    if freq_factors is not None:
        inv_freq = inv_freq / np.asarray(freq_factors, dtype=np.float64)
    mix = np.zeros(half)
    mscale = spec.attn_factor
    if spec.scaling == "yarn" and spec.factor != 1.0:
        low = max(0.0, math.floor(_yarn_corr_dim(spec.dims, spec.n_ctx_orig, YARN_BETA_FAST, spec.base)))
        high = min(spec.dims - 1.0, math.ceil(_yarn_corr_dim(spec.dims, spec.n_ctx_orig, YARN_BETA_SLOW, spec.base)))
        ramp = (np.arange(half) - low) / max(0.001, high - low)
        mix = 1.0 - np.clip(ramp, 0.0, 1.0)
        # llama.cpp: attn_factor * mscale(factor, 1) / mscale(factor, log_mul) when log_mul is set, else mscale(factor, 1)
        mscale *= _yarn_mscale(spec.factor, 1.0)
        if spec.yarn_log_mul:
            mscale /= _yarn_mscale(spec.factor, spec.yarn_log_mul)
    return inv_freq, mix, mscale


def cos_sin(spec: RopeSpec, positions: np.ndarray, freq_factors: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of every (position, pair) angle, already multiplied by mscale: two [n, dims/2] f32 arrays."""
    inv_freq, mix, mscale = pair_tables(spec, freq_factors)
    per_pair = inv_freq * (spec.freq_scale * (1.0 - mix) + mix)
    angles = np.asarray(positions, dtype=np.float64)[:, None] * per_pair[None, :]
    return (np.cos(angles) * mscale).astype(np.float32), (np.sin(angles) * mscale).astype(np.float32)
