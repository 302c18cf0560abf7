"""Open a GGUF file for running: header → ModelSpec → executor → model with every weight bound.

Every check that can fail (architecture, tensor names, shapes, types, context size) happens here,
before any tensor data is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pyshim.errors import BadRequestError, ContextOverflowError
from pyshim.gguf.header import GGUFHeader, read_header_from_file
from pyshim.models import build_model, check_architecture
from pyshim.gguf.spec import ModelSpec
from pyshim.gguf.tensors import ByteSource, FileSource, WeightStore, tensor_refs_from_header

DEFAULT_N_CTX = 4096     # KV cache length when the caller does not ask (the model may allow more)
BACKENDS = ("cpu", "gpu")   # gpu: the WebGPU executor (pyshim.gpu) through native wgpu


@dataclass
class Runner:
    """A model bound to an executor: token ids in, logits out (NumPy), KV cache inside the executor."""

    spec: ModelSpec
    header: GGUFHeader
    ops: object
    model: object
    n_ctx: int

    @property
    def metadata(self) -> dict:
        return self.header.metadata

    def forward(self, ids, start: int, all_logits: bool = False) -> np.ndarray:
        """Logits [len(ids), vocab] (or [1, vocab] for the last id) for ids placed at positions start..."""
        if start + len(ids) > self.n_ctx:
            raise ContextOverflowError(f"positions up to {start + len(ids)} exceed the context of {self.n_ctx} tokens",
                                       hint="use a shorter prompt or a larger --ctx")
        logits = self.model.forward(self.ops, self.ops.tokens(ids), self.ops.positions(start, len(ids)), all_logits)
        return self.ops.read(logits)

    def reset(self) -> None:
        self.ops.reset()

    def prepare(self) -> None:
        """Do the executor's one-time work (dequantizing cached weights) before anything is timed."""
        self.ops.prepare()

    @property
    def weight_bytes(self) -> int:
        """Bytes of GGUF weights streamed per token (each bound tensor once)."""
        return self.ops.bound_bytes


def open_model(path: str | Path | None = None, *, header: GGUFHeader | None = None, source: ByteSource | None = None,
               n_ctx: int | None = None) -> tuple[GGUFHeader, ByteSource, ModelSpec, int]:
    """What every executor's loader starts with: the header and byte source (from `path`, or given),
    the architecture checked, the spec, and the KV length (default: the training context, capped)."""
    if path is not None:
        header = read_header_from_file(path)
        source = FileSource(path)
    if header is None or source is None:
        raise BadRequestError("loading a model needs a path, or a header and a byte source")
    check_architecture(header.architecture)
    spec = ModelSpec.from_header(header)
    n_ctx = min(spec.context_length, DEFAULT_N_CTX) if n_ctx is None else int(n_ctx)
    if n_ctx < 1:
        raise BadRequestError(f"the context length must be positive, got {n_ctx}")
    return header, source, spec, n_ctx


def load(path: str | Path | None = None, *, header: GGUFHeader | None = None, source: ByteSource | None = None,
         n_ctx: int | None = None, backend: str = "cpu", cache_weights: bool = True,
         emulate_llama_cpp: bool | str = False, kv_type: str = "f32", int8: bool | None = None,
         max_chunk: int | None = None) -> Runner:
    """A Runner for a GGUF file (`path`), or for a parsed header plus a byte source (Pyodide). `int8` (gpu):
    the executor's int8 route on or off (None: the adapter's default, pyshim.gpu.kernels.default_int8);
    `max_chunk` (gpu): most tokens per GPU step (prefill is split into steps of at most this many).
    `emulate_llama_cpp` (cpu): True rounds each matmul input as llama.cpp's CPU backend does (the GPU int8
    route's oracle); pyshim.exec.reference.EXACT repeats llama.cpp's x86 CPU arithmetic bit for bit."""
    if backend not in BACKENDS:
        raise BadRequestError(f"backend {backend!r} is not available here", hint=f"use one of: {', '.join(BACKENDS)}")
    if backend == "gpu":
        if emulate_llama_cpp:
            raise BadRequestError("emulating llama.cpp's activation rounding is a cpu-backend option")
        from pyshim.exec.gpu_runner import load_gpu
        return load_gpu(path, header=header, source=source, n_ctx=n_ctx, kv_type=kv_type, int8=int8,
                        **({} if max_chunk is None else {"max_chunk": max_chunk}))
    header, source, spec, n_ctx = open_model(path, header=header, source=source, n_ctx=n_ctx)
    from pyshim.exec.reference import NumpyOps
    ops = NumpyOps(WeightStore(tensor_refs_from_header(header), source), spec, n_ctx, cache_weights=cache_weights,
                   emulate_llama_cpp=emulate_llama_cpp, kv_type=kv_type)
    model = build_model(spec, ops)
    return Runner(spec=spec, header=header, ops=ops, model=model, n_ctx=n_ctx)
