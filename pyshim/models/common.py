"""Per-layer settings every architecture derives the same way from a `ModelSpec`."""

from __future__ import annotations

from dataclasses import fields

from pyshim.models.ops import AttnSpec
from pyshim.models.rope import RopeSpec
from pyshim.gguf.spec import ModelSpec

_ROPE_FIELDS = tuple(f.name for f in fields(RopeSpec))


def layer_window(spec: ModelSpec, il: int) -> int:
    """Tokens layer `il` attends to (0: all)."""
    return spec.sliding_window if spec.swa_layers[il] else 0


def layer_rope(spec: ModelSpec, il: int) -> RopeSpec:
    """The ops-facing rope settings of layer `il` (sliding-window layers have their own)."""
    params = spec.rope_for_layer(il)
    return RopeSpec(**{name: getattr(params, name) for name in _ROPE_FIELDS})


def layer_attn(spec: ModelSpec, il: int) -> AttnSpec:
    return AttnSpec(layer=il, n_heads=spec.n_heads, n_kv_heads=spec.n_kv_heads, head_dim=spec.head_dim_k,
                    head_dim_v=spec.head_dim_v, scale=spec.attn_scale, window=layer_window(spec, il),
                    softcap=spec.attn_logit_softcap or 0.0)
