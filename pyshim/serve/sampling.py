"""Choosing the next token from logits: pure functions over NumPy arrays and a seeded Generator.

The order follows llama.cpp's default chain: penalties, top-k, top-p, min-p, temperature, then a draw
(or argmax when the temperature is 0). The same seed and the same logits give the same token.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from pyshim.errors import BadRequestError

PENALTY_LAST_N = 64      # how many recent tokens the penalties look at (llama.cpp's default)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0        # 0: greedy
    top_k: int = 0                  # 0: off
    top_p: float = 1.0              # 1: off
    min_p: float = 0.0              # 0: off
    repetition_penalty: float = 1.0  # 1: off (divides positive logits, multiplies negative ones)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_last_n: int = PENALTY_LAST_N
    seed: int | None = None

    def __post_init__(self):
        checks = [
            (self.temperature >= 0, "temperature must be >= 0"),
            (self.top_k >= 0, "top_k must be >= 0"),
            (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (0 <= self.min_p <= 1, "min_p must be in [0, 1]"),
            (self.repetition_penalty > 0, "repetition_penalty must be > 0"),
            (self.penalty_last_n >= 0, "penalty_last_n must be >= 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise BadRequestError(message)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def make_rng(seed: int | None) -> np.random.Generator:
    return np.random.default_rng(seed)


def apply_penalties(logits: np.ndarray, history: Sequence[int], repetition: float = 1.0,
                    presence: float = 0.0, frequency: float = 0.0) -> np.ndarray:
    """Penalize tokens in `history` (the caller passes the recent window): a new array."""
    if not history or (repetition == 1.0 and presence == 0.0 and frequency == 0.0):
        return logits
    out = logits.astype(np.float32, copy=True)
    counts = Counter(int(t) for t in history)
    ids = np.fromiter(counts.keys(), dtype=np.int64)
    n = np.fromiter(counts.values(), dtype=np.float32)
    vals = out[ids]
    vals = np.where(vals > 0, vals / repetition, vals * repetition)
    out[ids] = vals - n * frequency - presence
    return out


def top_k_filter(logits: np.ndarray, k: int) -> np.ndarray:
    """Keep the k largest logits (ties at the k-th value kept), others -inf."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = np.partition(logits, -k)[-k]
    return np.where(logits >= kth, logits, -np.inf)


def _probs(logits: np.ndarray) -> np.ndarray:
    z = logits - np.max(logits)
    p = np.exp(z, dtype=np.float64)
    return p / p.sum()


def top_p_filter(logits: np.ndarray, p: float) -> np.ndarray:
    """Keep the smallest set of most likely tokens whose probability reaches p."""
    if p >= 1.0:
        return logits
    probs = _probs(logits)
    order = np.argsort(-probs, kind="stable")
    cum = np.cumsum(probs[order])
    keep_n = int(np.searchsorted(cum, p)) + 1
    keep = np.zeros(logits.shape, dtype=bool)
    keep[order[:keep_n]] = True
    return np.where(keep, logits, -np.inf)


def min_p_filter(logits: np.ndarray, p: float) -> np.ndarray:
    """Drop tokens whose probability is below p times the most likely token's."""
    if p <= 0.0:
        return logits
    probs = _probs(logits)
    return np.where(probs >= p * probs.max(), logits, -np.inf)


def greedy(logits: np.ndarray) -> int:
    return int(np.argmax(logits))


def draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    """An index drawn from `probs` with one uniform number (inverse CDF, ids in ascending order). Zeros add
    nothing to the cumulative sums, so a draw over the vocabulary and one over just the tokens that can
    win (the GPU's top-k) pick the same token for the same seed."""
    cdf = np.cumsum(probs)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(cdf) - 1))


def can_sample_top_k(params: SamplingParams, k_max: int) -> bool:
    """Whether `sample_top_k` over the k largest logits gives what `sample` over all of them would: top-k
    sampling with no penalty (penalties change logits, and so which ones are largest)."""
    return (not params.greedy and 0 < params.top_k <= k_max and params.repetition_penalty == 1.0
            and not params.presence_penalty and not params.frequency_penalty)


def sample_top_k(values: np.ndarray, ids: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """`sample` from the top_k largest logits (`values`, their token `ids`), as picked on the GPU."""
    order = np.argsort(ids, kind="stable")
    values, ids = values[order], ids[order]
    logits = top_p_filter(values, params.top_p)
    logits = min_p_filter(logits, params.min_p)
    return int(ids[draw(_probs(logits / params.temperature), rng)])


def sample(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator,
           history: Sequence[int] = ()) -> int:
    """One token id from logits [vocab]; `history` = ids so far (prompt and generated)."""
    recent = list(history)[-params.penalty_last_n:] if params.penalty_last_n else []
    logits = apply_penalties(logits, recent, params.repetition_penalty, params.presence_penalty,
                             params.frequency_penalty)
    if params.greedy:
        return greedy(logits)
    logits = top_k_filter(logits, params.top_k)
    logits = top_p_filter(logits, params.top_p)
    logits = min_p_filter(logits, params.min_p)
    return draw(_probs(logits / params.temperature), rng)
