"""Dense layers streamed from the store (airllm's idea, on the GPU): the last `n_streamed` layers' matrices
live in two rotating sets of buffers instead of each their own, filled from the store ahead of use.

Streamed layer i (counted among the streamed ones) binds set i % 2: its weight slots' parts stand for that
set's buffers, so programs are recorded once as for a resident model. Recording puts a stop
(pyshim.gpu.program.Stop) before a streamed layer's first dispatch; at the stop for layer i the runner
(`before_layer`) makes sure set i % 2 holds layer i — uploaded at the previous stop, or now — and then
uploads layer i + 1 into the other set, whose last user (layer i - 1) is already submitted: WebGPU orders
writes and submits on the queue, so the upload of the next layer overlaps the GPU's work on this one
without a wait. After a step the first streamed layer is fetched for the next. A step of n tokens runs
every token through a layer at once, so a prompt pays each upload once per chunk, not once per token.

Norms and biases (1-D) stay resident, as do the embeddings, output head and the first layers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from pyshim.errors import UnsupportedError
from pyshim.gguf.types import check_runnable
from pyshim.gpu.kernels import PARAMS, repack_bytes, repack_grid, repack_groups, repack_key, shader_block
from pyshim.gpu.program import Dispatch, Program
from pyshim.gpu.slots import Part, Upload, WeightSlot, WeightSlots
from pyshim.plan.memory import group_bytes, row_parts

SETS = 2


@dataclass
class StreamStats:
    uploads: int = 0            # layers uploaded
    uploaded_bytes: int = 0
    fetch_s: float = 0.0

    def as_dict(self) -> dict:
        return {"layer_uploads": self.uploads, "uploaded_bytes": self.uploaded_bytes, "fetch_s": round(self.fetch_s, 4)}


def layer_of(name: str) -> int | None:
    if not name.startswith("blk."):
        return None
    return int(name.split(".", 2)[1])


class LayerStream:
    def __init__(self, slots: WeightSlots, n_layers: int, n_streamed: int, fetch=None):
        if not 0 < n_streamed <= n_layers:
            raise UnsupportedError(f"{n_streamed} streamed layers of {n_layers}")
        self.weights = slots
        self.first = n_layers - n_streamed                     # layers [first, n_layers) are streamed
        self.layers = list(range(self.first, n_layers))
        self.fetch = fetch or self._read_and_write
        self.stats = StreamStats()
        # set -> (tensor suffix, shape, grouped type or None) -> part buffers: a set holds a matrix of each shape
        # its layers have (Gemma 4's sliding and full layers' attention differ), at the largest type among them
        self._buffers: list[dict[tuple, list]] = [{} for _ in range(SETS)]
        self._slots: dict[int, list[WeightSlot]] = {i: [] for i in self.layers}
        self.held: list[int | None] = [None] * SETS            # which layer each set holds
        self._repack: dict[int, Program] = {}                  # layer -> its grouped parts' repack
        self.part_layer: dict[int, int] = {}                   # id(part) -> its streamed layer (recording's stops)

    def streams(self, name: str, shape) -> bool:
        layer = layer_of(name)
        return layer is not None and layer >= self.first and len(shape) >= 2

    def set_of(self, layer: int) -> int:
        return (layer - self.first) % SETS

    @property
    def nbytes(self) -> int:
        return sum(int(b.size) for s in self._buffers for bufs in s.values() for b in bufs)

    @property
    def layer_bytes(self) -> int:
        return max((sum(w.ref.nbytes for w in ws) for ws in self._slots.values()), default=0)

    def bind(self, name: str, shape) -> WeightSlot:
        if name in self.weights.slots:
            return self.weights.slots[name]
        store = self.weights.store
        ref = store.checked(name, shape)
        check_runnable(name, ref.qtype, "gpu")
        if shape[-1] % shader_block(ref.qtype)[0]:
            raise UnsupportedError(f"tensor {name!r}: rows of {shape[-1]} are not whole {ref.qtype.name} kernel blocks")
        layer = layer_of(name)
        suffix = name.split(".", 2)[2]
        grouped = ref.qtype in self.weights.grouped_types
        # the type may differ (Q4_K_M: Q6_K in some layers): buffers fit the largest of a layout
        key = (suffix, tuple(shape), ref.qtype if grouped else None)
        s = self.set_of(layer)
        w = WeightSlot(ref, tuple(shape), grouped=grouped)
        parts = self._parts(ref, shape, grouped)
        if key not in self._buffers[s]:
            self._buffers[s][key] = [self.weights.allocator.buffer(nbytes, f"stream{s}.{suffix}[{i}]")
                                     for i, nbytes in enumerate(self._part_sizes(s, key))]
        per = int(np.prod(shape[1:-1], dtype=np.int64))
        for (unit0, units), buf in zip(parts, self._buffers[s][key]):
            w.parts.append(Part(buf, unit0 * per, units * per))
            self.part_layer[id(w.parts[-1])] = layer
        self._slots[layer].append(w)
        self.weights.slots[name] = w
        return w

    def _parts(self, ref, shape, grouped: bool) -> list[tuple[int, int]]:
        """(first unit, units) of each part a tensor of `ref`'s type is split into (pyshim.plan.memory.row_parts)."""
        per = int(np.prod(shape[1:-1], dtype=np.int64))
        return row_parts(shape[0], ref.row_bytes * per, self.weights.limit, group_bytes(ref.qtype) if grouped else 0)

    def _part_sizes(self, s: int, key: tuple) -> list[int]:
        """The buffers of set `s` for tensor `key` (suffix, shape, grouped type): part by part, the largest
        any of the set's layers with that shape and layout needs."""
        suffix, shape, grouped_type = key
        grouped = grouped_type is not None
        per = int(np.prod(shape[1:-1], dtype=np.int64))
        sizes: list[int] = []
        for layer in self.layers:
            name = f"blk.{layer}.{suffix}"
            if self.set_of(layer) != s or name not in self.weights.store:
                continue
            ref = self.weights.store.info(name)
            if tuple(ref.shape) != shape or (ref.qtype if ref.qtype in self.weights.grouped_types else None) != grouped_type:
                continue
            for i, (_, units) in enumerate(self._parts(ref, shape, grouped)):
                nbytes = repack_bytes(units * per, ref.row_bytes, ref.qtype) if grouped else units * per * ref.row_bytes
                if i < len(sizes):
                    sizes[i] = max(sizes[i], nbytes)
                else:
                    sizes.append(nbytes)
        return sizes

    async def before_layer(self, layer: int, kernels, pool, device) -> None:
        """At the stop before streamed `layer`: it must be in its set; the next streamed layer goes into the
        other set now (its last user is already submitted)."""
        await self._ensure(layer, kernels, pool, device)
        at = self.layers.index(layer)
        if at + 1 < len(self.layers):
            await self._ensure(self.layers[at + 1], kernels, pool, device)

    async def after_step(self, kernels, pool, device) -> None:
        """The first streamed layer, for the next step (every layer of this one is submitted)."""
        await self._ensure(self.layers[0], kernels, pool, device)

    async def _ensure(self, layer: int, kernels, pool, device) -> None:
        s = self.set_of(layer)
        if self.held[s] == layer:
            return
        self.held[s] = None                 # until the upload succeeded
        uploads = [Upload(w.name, w.ref.offset + p.row0 * w.ref.row_bytes, p.rows * w.ref.row_bytes, p.buffer, 0)
                   for w in self._slots[layer] for p in w.parts]
        t0 = time.perf_counter()
        await self.fetch(uploads)
        self.stats.fetch_s += time.perf_counter() - t0
        self.stats.uploads += 1
        self.stats.uploaded_bytes += sum(u.nbytes for u in uploads)
        await self._regroup(layer, kernels, pool, device)
        self.held[s] = layer

    async def _regroup(self, layer: int, kernels, pool, device) -> None:
        """The int8 route's grouped matrices of `layer` rearranged again (repack.wgsl) after its upload: one
        program per layer, built once (a set's buffers of another layout were not written, so they are left)."""
        if layer not in self._repack:
            program = Program(0)
            for w in self._slots[layer]:
                if w.grouped:
                    for p in w.parts:
                        n_groups = repack_groups(p.rows, w.ref.row_bytes, w.ref.qtype)
                        program.dispatches.append(Dispatch(repack_key(w.ref.qtype), [p.buffer],
                                                           PARAMS["repack"].pack(groups=n_groups, first=0), repack_grid(n_groups)))
            await program.build(device, kernels, pool)
            self._repack[layer] = program
        if self._repack[layer].ready:
            device.submit(self._repack[layer].ready, label=f"repack_stream{layer}")

    async def _read_and_write(self, uploads: list[Upload]) -> None:
        source, device = self.weights.store.source, self.weights.device
        for u in uploads:
            device.write(u.buffer, source.read(u.file_offset, u.nbytes), u.buffer_offset)
