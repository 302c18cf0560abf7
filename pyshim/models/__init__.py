"""The architectures pyshim runs, by GGUF `general.architecture` name."""

from __future__ import annotations

from pyshim.errors import UnsupportedError
from pyshim.models.gemma3 import Gemma3
from pyshim.models.hparams import HParams
from pyshim.models.llama import Llama
from pyshim.models.phi3 import Phi3
from pyshim.models.qwen2 import Qwen2
from pyshim.models.qwen3 import Qwen3
from pyshim.ops import Ops

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


def build_model(hp: HParams, ops: Ops):
    """Bind every weight of `hp.arch` through `ops` (checks names, shapes, types; reads no tensor data)."""
    check_architecture(hp.arch)
    return ARCHITECTURES[hp.arch](hp, ops)
