"""The architectures pyshim runs, by GGUF `general.architecture` name."""

from __future__ import annotations

from pyshim.errors import UnsupportedError
from pyshim.models.gemma3 import Gemma3
from pyshim.models.llama import Llama
from pyshim.models.phi3 import Phi3
from pyshim.models.qwen2 import Qwen2
from pyshim.models.qwen3 import Qwen3
from pyshim.models.ops import Ops
from pyshim.gguf.spec import ModelSpec

ARCHITECTURES = {
    "llama": Llama,     # also SmolLM2, TinyLlama, Mistral (converted as llama)
    "qwen2": Qwen2,
    "qwen3": Qwen3,
    "gemma3": Gemma3,
    "phi3": Phi3,
}


def check_architecture(arch: str) -> None:
    if arch not in ARCHITECTURES:
        raise UnsupportedError(f"architecture {arch!r} is not supported",
                               hint=f"pyshim runs: {', '.join(sorted(ARCHITECTURES))}")


def check_supported(spec: ModelSpec) -> None:
    """Raise UnsupportedError for what the forward passes here do not do."""
    check_architecture(spec.architecture)
    if spec.n_experts:
        raise UnsupportedError(f"{spec.architecture}: mixture-of-experts models are not supported")
    for rope in (spec.rope, spec.rope_swa):
        if rope.scaling not in ("none", "linear", "yarn"):
            raise UnsupportedError(f"{spec.architecture}: rope scaling {rope.scaling!r} is not supported",
                                   hint="supported: none, linear, yarn")


def build_model(spec: ModelSpec, ops: Ops):
    """Bind every weight of the architecture through `ops` (checks names, shapes, types; reads no tensor data)."""
    check_supported(spec)
    return ARCHITECTURES[spec.architecture](spec, ops)
