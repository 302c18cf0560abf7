"""Models: the forward pass of each architecture family, written once against the ops interface.

Holds the ops interface every executor implements (`ops`), rope's math (`rope`) and the llama-family
decoder (`decoder`), which covers every architecture pyshim.gguf.spec.ARCHITECTURES lists. A model
maps (tokens, positions) to logits and nothing else: it never samples, loops or knows its executor.
May import: pyshim.errors, pyshim.gguf (never an executor: models know nothing of where they run).
"""

from __future__ import annotations

from pyshim.gguf.spec import ModelSpec, check_supported
from pyshim.gguf.tensors import WeightStore
from pyshim.models.decoder import Decoder
from pyshim.models.key_scales import key_scales
from pyshim.models.ops import Ops


def build_model(spec: ModelSpec, ops: Ops, key_store: WeightStore | None = None, rotate_keys: bool = False) -> Decoder:
    """Bind every weight of the architecture through `ops` (checks names, shapes, types; reads no tensor
    data). `key_store`: for a KV cache that stores scaled keys (pyshim.plan.settings.KVType.scaled_keys),
    the weights the scales are made from (the key projections and norms are read from it now);
    `rotate_keys`: such a cache also rotates them (KVType.rotated_keys)."""
    check_supported(spec)
    model = Decoder(spec, ops)
    if key_store is not None:
        for b, scales in zip(model.blk, key_scales(spec, key_store, [b.rope for b in model.blk], rotate_keys)):
            b.key_scales = scales
    return model
