"""Programs: a step's recorded dispatches, built once into pipelines, bind groups and a params arena.

Recording (pyshim.gpu.ops) appends a `Dispatch` per op: its shader key, its bindings, its params words
and its grid. Bindings are device buffers, (buffer, offset, size) ranges, or things that stand for a
buffer until build time: an `Activation` (pyshim.gpu.pool: given a buffer by liveness) or a weight slot's
`Part` (pyshim.gpu.slots: whichever buffer holds those rows now). Anything with a `phys` attribute is
such a stand-in.

`build()` compiles the pipelines (cached by ShaderKey), writes every params struct into one uniform
arena, creates the bind groups and hands the list to the device face (`encoded`); a step is then one
replay of it (or, where the program has `stops` — weights streamed from the store — one per stretch
between them): in the browser one FFI call, the encoding done in JavaScript. `rebind(parts)` makes again
only the bind groups of dispatches that bind those weight parts: how a slot is pointed at another
buffer between steps without recording again (the seam for weights streamed from the store).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from pyshim.gpu.pool import Activation, ActivationPool, Allocator


@dataclass(frozen=True)
class Tensor:
    """An activation: `shape` f32 elements, row-major, at element offset `off` of `buf`."""

    buf: Any
    off: int
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))


@dataclass
class Stop:
    """Where a step's submit pauses for the host, before dispatch `at`. Streamed experts: the router's
    expert ids (`ids`) are read back, and the layer's expert cache (`layer`, a
    pyshim.gpu.expert_cache.LayerCache, known once an expert matvec bound it) writes each one's slot into
    `slot_ids`, which the layer's expert matvecs read instead; `guess` is the next MoE layer's router
    (`guess_layer`, "blk.N") applied to this one's input, whose experts the host fetches while the GPU
    goes on. A streamed dense layer (`stream_layer`): its weights are put in place
    (pyshim.gpu.layer_stream), without waiting for the GPU."""

    at: int
    ids: Tensor | None = None
    slot_ids: Tensor | None = None
    layer: Any = None
    stream_layer: int | None = None
    guess: Tensor | None = None
    guess_layer: str | None = None


@dataclass
class Dispatch:
    key: Any                 # ShaderKey
    bindings: list           # in binding order, params excluded
    params: np.ndarray       # uint32 words
    grid: tuple[int, int, int]


def physical(binding):
    """The device binding behind a recorded one: a stand-in's buffer, (stand-in, offset, size) with the
    buffer in its place, anything else unchanged."""
    if isinstance(binding, tuple):
        return (physical(binding[0]),) + tuple(binding[1:])
    return binding.phys if hasattr(binding, "phys") else binding


def _stand_in(binding):
    """The stand-in a binding names (a weight view's rows: their slot's part)."""
    b = binding[0] if isinstance(binding, tuple) else binding
    return getattr(b, "part", b)


class Program:
    """Recorded dispatches of one step shape, then built into pipelines, bind groups and a uniform arena."""

    def __init__(self, n: int):
        self.n = n
        self.dispatches: list[Dispatch] = []
        self.output: Tensor | None = None
        self.argmax: Any = None          # buffer holding the winning id (when recorded)
        self.topk: Any = None            # buffer holding the TOPK (value, id) pairs (when recorded)
        self.stops: list[Stop] = []      # host pauses inside the step (streamed experts), in dispatch order
        self.uniforms: Any = None        # the params arena, made by build()
        self.ready: list = []            # (pipeline, bind group, grid) per dispatch
        self.encoded: Any = None         # `ready` as the device face keeps it for replay (GPUDevice.encode)
        self._pipelines: list = []
        self._offsets: list[int] = []

    async def build(self, device, kernels, pool: ActivationPool) -> None:
        keep = [b for b in (self.output.buf if self.output is not None else None, self.argmax) if isinstance(b, Activation)]
        pool.assign([d.bindings for d in self.dispatches], keep)
        align = max(16, device.caps.limits.get("min_uniform_buffer_offset_alignment", 256))
        sizes = [(d.params.nbytes + align - 1) // align * align for d in self.dispatches]
        arena = np.zeros(sum(sizes) // 4, dtype=np.uint32)
        self._offsets, at = [], 0
        for d, size in zip(self.dispatches, sizes):
            arena[at // 4: at // 4 + d.params.size] = d.params
            self._offsets.append(at)
            at += size
        self.uniforms = device.buffer(max(16, arena.nbytes), label=f"params_n{self.n}", uniform=True)
        device.write(self.uniforms, arena)
        self._pipelines = [await kernels.get(d.key) for d in self.dispatches]
        self.ready = [self._bind(device, i) for i in range(len(self.dispatches))]
        self.encoded = device.encode(self.ready)

    def _bind(self, device, i: int):
        d = self.dispatches[i]
        bindings = [physical(b) for b in d.bindings] + [(self.uniforms, self._offsets[i], d.params.nbytes)]
        return self._pipelines[i], device.bind_group(self._pipelines[i], bindings, label=d.key.label), d.grid

    def rebind(self, device, parts: Iterable) -> int:
        """Make again the bind groups of the dispatches that bind any of `parts` (weight slot parts whose
        buffer changed); returns how many."""
        parts = {id(p) for p in parts}
        changed = [i for i, d in enumerate(self.dispatches) if any(id(_stand_in(b)) in parts for b in d.bindings)]
        for i in changed:
            self.ready[i] = self._bind(device, i)
            device.set_dispatch(self.encoded, i, self.ready[i])
        return len(changed)

    def release(self, allocator: Allocator, device) -> None:
        """Free the buffers only this program uses (its params arena and sampled-token results); its
        activations stay in the shared pool."""
        for buf in (self.argmax, self.topk):
            if buf is not None and not isinstance(buf, Activation):
                allocator.release(buf)
        if self.uniforms is not None:
            device.release(self.uniforms)
        self.ready, self.encoded = [], None
