"""The numbers a forward pass needs, read from the GGUF `{arch}.*` metadata keys.

Defaults and per-architecture rules follow llama.cpp (so pyshim and llama.cpp agree on the same
file): rope style per architecture, Gemma 3's sliding-window pattern (5 local layers, then 1 global)
and local rope base 10000 unless the file says otherwise, Gemma's attention scale 1/sqrt(head_dim).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pyshim.errors import GGUFFormatError, UnsupportedError
from pyshim.rope import RopeSpec

# llama.cpp's rope style per architecture: NeoX (rotate halves) vs normal (rotate adjacent pairs; the
# converter permutes llama's q/k weights for it).
NEOX_ARCHS = {"qwen2", "qwen3", "gemma3", "phi3"}
GEMMA3_SWA_PATTERN = 6          # llama.cpp default: layers il % 6 < 5 use the sliding window
GEMMA3_ROPE_BASE_SWA = 10000.0


@dataclass(frozen=True)
class HParams:
    arch: str
    n_layers: int
    n_embd: int
    n_heads: int
    n_kv_heads: int
    head_dim: int               # of q and k
    head_dim_v: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    eps: float
    rope: RopeSpec              # global layers
    rope_swa: RopeSpec          # sliding-window layers (same as `rope` where there are none)
    window: int                 # 0: no sliding window
    swa_layers: tuple[bool, ...]
    attn_scale: float
    attn_softcap: float
    final_softcap: float

    def layer_window(self, il: int) -> int:
        return self.window if self.swa_layers[il] else 0

    def layer_rope(self, il: int) -> RopeSpec:
        return self.rope_swa if self.swa_layers[il] else self.rope


def _get(md: dict, key: str, default=None, *, required: bool = False):
    if key in md:
        return md[key]
    if required:
        raise GGUFFormatError(f"the GGUF metadata has no {key!r}", hint="the file is incomplete or not a language model")
    return default


def hparams_from_metadata(md: dict, n_vocab: int) -> HParams:
    """`md`: the GGUF key/value metadata as plain Python values; `n_vocab`: rows of token_embd."""
    arch = str(_get(md, "general.architecture", required=True))
    a = arch + "."
    n_embd = int(_get(md, a + "embedding_length", required=True))
    n_heads = int(_get(md, a + "attention.head_count", required=True))
    n_kv = _get(md, a + "attention.head_count_kv", n_heads)
    if isinstance(n_kv, (list, tuple, np.ndarray)):
        if len(set(n_kv)) != 1:
            raise UnsupportedError(f"{arch}: a KV head count that varies per layer is not supported")
        n_kv = n_kv[0]
    n_ff = _get(md, a + "feed_forward_length", required=True)
    if isinstance(n_ff, (list, tuple, np.ndarray)):
        if len(set(n_ff)) != 1:
            raise UnsupportedError(f"{arch}: a feed-forward size that varies per layer is not supported")
        n_ff = n_ff[0]
    head_dim = int(_get(md, a + "attention.key_length", n_embd // n_heads))
    head_dim_v = int(_get(md, a + "attention.value_length", head_dim))
    n_layers = int(_get(md, a + "block_count", required=True))
    n_ctx_train = int(_get(md, a + "context_length", 4096))
    eps = float(_get(md, a + "attention.layer_norm_rms_epsilon", 1e-5))

    scaling = str(_get(md, a + "rope.scaling.type", "none"))
    factor = float(_get(md, a + "rope.scaling.factor", 1.0) or 1.0)
    if scaling not in ("none", "linear", "yarn"):
        raise UnsupportedError(f"{arch}: rope scaling {scaling!r} is not supported", hint="supported: none, linear, yarn")
    rope = RopeSpec(
        dims=int(_get(md, a + "rope.dimension_count", head_dim)),
        base=float(_get(md, a + "rope.freq_base", 10000.0)),
        neox=arch in NEOX_ARCHS,
        scaling=scaling if factor != 1.0 else "none",
        factor=factor,
        n_ctx_orig=int(_get(md, a + "rope.scaling.original_context_length", n_ctx_train)),
        attn_factor=float(_get(md, a + "rope.scaling.attn_factor", 1.0)),
        yarn_log_mul=float(_get(md, a + "rope.scaling.yarn_log_multiplier", 0.0)),
    )

    window = 0
    swa_layers = (False,) * n_layers
    rope_swa = rope
    attn_scale = 1.0 / math.sqrt(head_dim)
    if arch == "gemma3":
        window = int(_get(md, a + "attention.sliding_window", 0))
        if window > 0:
            pattern = _get(md, a + "attention.sliding_window_pattern", GEMMA3_SWA_PATTERN)
            if isinstance(pattern, (list, tuple, np.ndarray)):
                swa_layers = tuple(bool(p) for p in pattern)
            else:
                n = int(pattern)
                swa_layers = tuple(n == 0 or il % n < n - 1 for il in range(n_layers))
            # local layers: their own base, no context scaling (llama.cpp's freq_scale_swa = 1)
            rope_swa = RopeSpec(dims=rope.dims, base=float(_get(md, a + "rope.freq_base_swa", GEMMA3_ROPE_BASE_SWA)),
                                neox=True)
    if len(swa_layers) != n_layers:
        raise GGUFFormatError(f"{arch}: sliding_window_pattern has {len(swa_layers)} entries for {n_layers} layers")

    return HParams(
        arch=arch, n_layers=n_layers, n_embd=n_embd, n_heads=n_heads, n_kv_heads=int(n_kv),
        head_dim=head_dim, head_dim_v=head_dim_v, n_ff=int(n_ff), n_vocab=int(n_vocab), n_ctx_train=n_ctx_train,
        eps=eps, rope=rope, rope_swa=rope_swa, window=window, swa_layers=swa_layers, attn_scale=attn_scale,
        attn_softcap=float(_get(md, a + "attn_logit_softcapping", 0.0) or 0.0),
        final_softcap=float(_get(md, a + "final_logit_softcapping", 0.0) or 0.0),
    )
