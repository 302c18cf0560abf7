"""Open a GGUF file for running: header → hyperparameters → executor → model with every weight bound.

Every check that can fail (architecture, tensor names, shapes, types, context size) happens here,
before any tensor data is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pyshim.errors import BadRequestError, ContextOverflowError
from pyshim.models import build_model, check_architecture
from pyshim.models.hparams import HParams, hparams_from_metadata
from pyshim.weights import ByteSource, FileSource, TensorRef, WeightStore, tensor_refs_from_header

DEFAULT_N_CTX = 4096     # KV cache length when the caller does not ask (the model may allow more)


def read_header(path: str | Path) -> tuple[dict, list[TensorRef]]:
    """Metadata (plain Python values) and the tensor table of a GGUF file."""
    from pyshim.header import read_header_from_file
    header = read_header_from_file(path)
    return dict(header.metadata), tensor_refs_from_header(header)


@dataclass
class Runner:
    """A model bound to an executor: token ids in, logits out (NumPy), KV cache inside the executor."""

    hp: HParams
    metadata: dict
    ops: object
    model: object
    n_ctx: int
    path: Path | None = None

    def forward(self, ids, start: int, all_logits: bool = False) -> np.ndarray:
        """Logits [len(ids), vocab] (or [1, vocab] for the last id) for ids placed at positions start..."""
        if start + len(ids) > self.n_ctx:
            raise ContextOverflowError(f"positions up to {start + len(ids)} exceed the context of {self.n_ctx} tokens",
                                       hint="use a shorter prompt or a larger --ctx")
        logits = self.model.forward(self.ops, self.ops.tokens(ids), self.ops.positions(start, len(ids)), all_logits)
        return self.ops.read(logits)

    def reset(self) -> None:
        self.ops.reset()

    @property
    def weight_bytes(self) -> int:
        """Bytes of GGUF weights read per token (each bound tensor once)."""
        return sum(w.ref.nbytes for w in self.ops._bound.values())


def load(path: str | Path | None = None, *, source: ByteSource | None = None, metadata: dict | None = None,
         tensors: list[TensorRef] | None = None, n_ctx: int | None = None, backend: str = "cpu",
         cache_weights: bool = True) -> Runner:
    """A Runner for a GGUF file (`path`), or for header data plus a byte source (Pyodide)."""
    if backend != "cpu":
        raise BadRequestError(f"backend {backend!r} is not available here", hint="use --backend cpu")
    if path is not None:
        metadata, tensors = read_header(path)
        source = FileSource(path)
    if metadata is None or tensors is None or source is None:
        raise BadRequestError("load() needs a path, or metadata + tensors + source")
    check_architecture(str(metadata.get("general.architecture")))
    store = WeightStore(tensors, source)
    n_vocab = store.info("token_embd.weight").shape[0]
    hp = hparams_from_metadata(metadata, n_vocab)
    n_ctx = min(hp.n_ctx_train, DEFAULT_N_CTX) if n_ctx is None else int(n_ctx)
    if n_ctx < 1:
        raise BadRequestError(f"context length must be positive, got {n_ctx}")
    from pyshim.reference import NumpyOps
    ops = NumpyOps(store, hp, n_ctx, cache_weights=cache_weights)
    model = build_model(hp, ops)
    return Runner(hp=hp, metadata=metadata, ops=ops, model=model, n_ctx=n_ctx,
                  path=Path(path) if path is not None else None)
