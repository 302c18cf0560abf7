"""Models: the forward pass of each architecture family, written once against the ops interface.

Holds the ops interface every executor implements (`ops`), rope's math (`rope`) and the llama-family
decoder (`decoder`), which covers every architecture pyshim.gguf.spec.ARCHITECTURES lists. A model
maps (tokens, positions) to logits and nothing else: it never samples, loops or knows its executor.
May import: pyshim.errors, pyshim.gguf (never an executor: models know nothing of where they run).
"""

from __future__ import annotations

from pyshim.gguf.spec import ModelSpec, check_supported
from pyshim.models.decoder import Decoder
from pyshim.models.ops import Ops


def build_model(spec: ModelSpec, ops: Ops) -> Decoder:
    """Bind every weight of the architecture through `ops` (checks names, shapes, types; reads no tensor data)."""
    check_supported(spec)
    return Decoder(spec, ops)
