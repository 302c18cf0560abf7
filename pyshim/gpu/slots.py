"""GPU weights in named slots: each GGUF tensor a program binds, where its bytes live on the device.

A 2-D weight (or a 3-D one of experts) stays in its GGUF blocks, split by rows (by experts) into parts of at most one storage binding
(pyshim.plan.memory.row_parts: the rule "will it fit?" applies too); a 1-D one (norms, biases, rope
factors) is kept as f32, on the CPU for the executor's own use and in a buffer for the kernels. Programs
bind a slot's `Part`s, not buffers: a part's buffer can be refilled with the same rows (`refill`) or
replaced by another buffer (`rebind`, then `Program.rebind` makes the affected bind groups again) between
steps without recording anything again — the seam for weights streamed from the store. (Rope frequency
factors are the exception: recording folds them into the rope angle table, shared by every layer.)

Bytes arrive along `uploads` (file range -> buffer): written here from the byte source when
`upload_now`, or by the caller (the browser's store writes them from IndexedDB, never through Python).
The int8 route's weights are then rearranged on the GPU (`repack`, once, before the first step): on
lavapipe its Q4_K and Q6_K ones interleaved by rows (interleave.wgsl, KernelPolicy.row_group_for), then
its Q4_0, Q8_0 and Q6_K ones grouped in place (repack.wgsl).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from pyshim.errors import UnsupportedError
from pyshim.gguf.tensors import TensorRef, WeightStore, dequantize_rows
from pyshim.gguf.types import check_runnable
from pyshim.gpu.kernels import PARAMS, interleave_key, repack_bytes, repack_grid, repack_groups, repack_key, shader_block
from pyshim.gpu.pool import Allocator
from pyshim.gpu.program import Dispatch, Program
from pyshim.plan.memory import group_bytes, row_parts


INTERLEAVE_CHUNK = 16 << 20     # bytes of a row-grouped weight interleaved at a time (the scratch buffer's most)


@dataclass(frozen=True)
class Upload:
    """Copy file bytes [file_offset, file_offset + nbytes) into `buffer` at `buffer_offset`."""

    tensor: str
    file_offset: int
    nbytes: int
    buffer: Any
    buffer_offset: int


class Part:
    """Rows [row0, row0 + rows) of a 2-D weight (of a 3-D one: its rows counted flat, whole experts a
    part), held in `buffer` (what a program binds: `phys`) from its start (`offset` 0)."""

    __slots__ = ("buffer", "row0", "rows")
    offset = 0

    def __init__(self, buffer, row0: int, rows: int):
        self.buffer, self.row0, self.rows = buffer, row0, rows

    @property
    def phys(self):
        return self.buffer

    @property
    def part(self) -> "Part":
        return self


class PartView:
    """A weight view's rows inside one part of the slot that holds them: rows [row0, row0 + rows) of the
    view, at byte `offset` of the part's buffer (a kernel's w_off). Binds as the part itself does, so a
    part refilled or rebound serves its views too."""

    __slots__ = ("part", "row0", "rows", "offset")

    def __init__(self, part: Part, row0: int, rows: int, offset: int):
        self.part, self.row0, self.rows, self.offset = part, row0, rows, offset

    @property
    def phys(self):
        return self.part.buffer


class WeightSlot:
    """A bound tensor: 2-D ones as GGUF blocks in `parts` (`grouped`: rearranged by repack.wgsl;
    `row_group` > 1: its rows interleaved in groups of that many by interleave.wgsl), 1-D ones as f32
    `values` and a buffer of them (`f32_buf`). A slot may hold several tensors of one type and width,
    their rows one after the other (`members`: (tensor, first row)): q, k and v, or gate and up, so that
    one matvec reads them all (`WeightSlots.bind_rows`)."""

    def __init__(self, ref: TensorRef, shape: tuple[int, ...], grouped: bool = False, members=None):
        self.ref = ref
        self.shape = shape
        self.grouped = grouped
        self.row_group = 1
        self.members: list[tuple[TensorRef, int]] = members or [(ref, 0)]
        self.parts: list[Part] = []
        self.values: np.ndarray | None = None
        self.f32_buf = None

    @property
    def name(self) -> str:
        return self.ref.name

    def pieces(self, row0: int, rows: int):
        """The file ranges behind the slot's rows [row0, row0 + rows): (tensor, file offset, bytes, first
        row) for each member they cross."""
        row_bytes = self.ref.row_bytes
        for ref, first in self.members:      # (a 3-D tensor's rows counted flat, as its parts count them)
            lo, hi = max(row0, first), min(row0 + rows, first + ref.nbytes // row_bytes)
            if lo < hi:
                yield ref, ref.offset + (lo - first) * row_bytes, (hi - lo) * row_bytes, lo


class WeightView:
    """One member of a slot that holds several (WeightSlots.bind_rows): its own tensor (`ref`, `shape`),
    its rows [row0, row0 + shape[0]) of `slot`. Kernels read it through `parts` as through a slot's."""

    def __init__(self, slot: WeightSlot, ref: TensorRef, row0: int, shape: tuple[int, ...]):
        self.slot, self.ref, self.row0, self.shape = slot, ref, row0, shape
        self.grouped = slot.grouped
        self.row_group = slot.row_group

    @property
    def name(self) -> str:
        return self.ref.name

    @property
    def parts(self) -> list[PartView]:
        out, lo, hi = [], self.row0, self.row0 + self.shape[0]
        for p in self.slot.parts:
            a, b = max(lo, p.row0), min(hi, p.row0 + p.rows)
            if a < b:
                out.append(PartView(p, a - lo, b - a, (a - p.row0) * self.ref.row_bytes))
        return out


class WeightSlots:
    def __init__(self, device, allocator: Allocator, store: WeightStore, *, limit: int, grouped_types=frozenset(),
                 row_group=None, upload_now: bool = True):
        """`limit`: the most bytes one part may hold (the device's binding and buffer limits, or less: tests
        force splits); `grouped_types`: tensor types kept in the grouped layout (the int8 route's Q8_0);
        `row_group(qtype, k)`: rows a group of 2-D matrices interleaved by rows (KernelPolicy.row_group_for;
        1 or None: not), where every part and member starts on a whole group."""
        self.device, self.allocator, self.store = device, allocator, store
        self.limit = limit
        self.grouped_types = frozenset(grouped_types)
        self.row_group = row_group
        self.upload_now = upload_now
        self.slots: dict[str, WeightSlot] = {}
        self.uploads: list[Upload] = []
        self._repacks: list[tuple[Any, int, int]] = []     # (buffer, groups, first group) to rearrange once uploaded
        self._interleaves: list[tuple[Any, int, int, int, int]] = []   # (buffer, rows, row bytes, block bytes, row group) likewise

    def __contains__(self, name: str) -> bool:
        return name in self.store

    @property
    def nbytes(self) -> int:
        """Device bytes the slots' buffers take."""
        parts = sum(int(p.buffer.size) for w in self.slots.values() for p in w.parts)
        return parts + sum(int(w.f32_buf.size) for w in self.slots.values() if w.f32_buf is not None)

    def bind(self, name: str, shape: Sequence[int]) -> WeightSlot:
        ref = self.store.checked(name, shape)
        check_runnable(name, ref.qtype, "gpu")
        if name in self.slots:
            return self.slots[name]
        w = WeightSlot(ref, tuple(shape), grouped=len(shape) >= 2 and ref.qtype in self.grouped_types)
        if len(shape) == 1:
            self._bind_values(w)
        else:
            self._bind_2d(w)
        self.slots[name] = w
        return w

    def _bind_2d(self, w: WeightSlot) -> WeightSlot:
        """A 2-D (or 3-D) slot's parts, made and their uploads planned."""
        ref, shape = w.ref, w.shape
        if shape[-1] % shader_block(ref.qtype)[0]:
            raise UnsupportedError(f"tensor {ref.name!r}: rows of {shape[-1]} are not whole {ref.qtype.name} kernel blocks")
        pad = group_bytes(ref.qtype) if w.grouped else 0        # grouped parts round up to whole groups
        # a 3-D weight [experts, m, k] is split between experts, never inside one (its rows are then
        # counted flat: expert e's row r is row e * m + r)
        per = int(np.prod(shape[1:-1], dtype=np.int64))
        # rows interleaved in groups (KernelPolicy.row_group_for) where the matrix and its members are whole
        # groups; its parts then split between groups
        g = self.row_group(ref.qtype, shape[-1]) if self.row_group and per == 1 else 1
        if g > 1 and shape[0] % g == 0 and all(row0 % g == 0 for _, row0 in w.members) and g * ref.row_bytes + pad <= self.limit:
            w.row_group = g
            parts = [(u0 * g, n * g) for u0, n in row_parts(shape[0] // g, ref.row_bytes * g, self.limit, pad)]
        else:
            parts = row_parts(shape[0], ref.row_bytes * per, self.limit, pad)
        for unit0, units in parts:
            row0, rows = unit0 * per, units * per
            nbytes = repack_bytes(rows, ref.row_bytes, ref.qtype) if w.grouped else rows * ref.row_bytes
            part = Part(self.allocator.buffer(nbytes, f"{ref.name}[{row0}:]"), row0, rows)
            self._upload(w, part)
            self._queue_layouts(w, part)
            w.parts.append(part)
        return w

    def _queue_layouts(self, w: WeightSlot, part: Part) -> None:
        """The part's rearrangements for the next `repack`, once its file bytes are in: interleaved by rows
        (row-grouped slots), grouped (grouped slots)."""
        ref = w.ref
        if w.row_group > 1:
            self._interleaves.append((part.buffer, part.rows, ref.row_bytes, shader_block(ref.qtype)[1], w.row_group))
        if w.grouped:
            self._repacks.append((part.buffer, repack_groups(part.rows, ref.row_bytes, ref.qtype), 0, ref.qtype))

    def bind_rows(self, named: Sequence[tuple[str, Sequence[int]]]) -> list[WeightView] | None:
        """Several 2-D weights of one type and width in one slot, their rows one after the other (q, k, v):
        a view of each, or None where they cannot share one (types or widths differ, one is bound already
        alone). The same run asked for again (a model recorded again over these slots) gets the same slot."""
        refs = [self.store.checked(name, shape) for name, shape in named]
        first = refs[0]
        joined = self.slots.get("+".join(r.name for r in refs))
        if joined is not None:
            return [WeightView(joined, r, row0, tuple(shape)) for (r, row0), (_, shape) in zip(joined.members, named)]
        if (len(refs) < 2 or any(len(s) != 2 for _, s in named) or any(n in self.slots for n, _ in named)
                or any(r.qtype != first.qtype or r.shape[1:] != first.shape[1:] for r in refs)):
            return None
        for name, _ in named:
            check_runnable(name, first.qtype, "gpu")
        rows = sum(r.shape[0] for r in refs)
        starts = np.cumsum([0] + [r.shape[0] for r in refs[:-1]]).tolist()
        ref = TensorRef("+".join(r.name for r in refs), first.qtype, (rows, *first.shape[1:]), first.offset,
                        sum(r.nbytes for r in refs))
        w = self._bind_2d(WeightSlot(ref, ref.shape, grouped=first.qtype in self.grouped_types, members=list(zip(refs, starts))))
        self.slots[ref.name] = w
        return [WeightView(w, r, row0, tuple(shape)) for r, row0, (_, shape) in zip(refs, starts, named)]

    def _bind_values(self, w: WeightSlot) -> None:
        """Norms, biases, rope factors: small, needed as f32 (also on the CPU side: rope tables)."""
        w.values = dequantize_rows(self.store.raw(w.name), w.ref.qtype).reshape(-1).astype(np.float32)
        w.f32_buf = self.allocator.buffer(w.values.nbytes, w.name)
        self.device.write(w.f32_buf, w.values)

    def _upload(self, w: WeightSlot, part: Part) -> None:
        for ref, offset, nbytes, row in w.pieces(part.row0, part.rows):
            upload = Upload(ref.name, offset, nbytes, part.buffer, (row - part.row0) * w.ref.row_bytes)
            self.uploads.append(upload)
            if self.upload_now:
                self.device.write(part.buffer, self.store.source.read(offset, nbytes), upload.buffer_offset)

    def refill(self, w: WeightSlot) -> None:
        """Write the slot's rows into its buffers again from the byte source (grouped and row-grouped ones
        must be rearranged again before use: `repack` picks them up)."""
        for part in w.parts:
            for _, offset, nbytes, row in w.pieces(part.row0, part.rows):
                self.device.write(part.buffer, self.store.source.read(offset, nbytes), (row - part.row0) * w.ref.row_bytes)
            self._queue_layouts(w, part)

    def rebind(self, w: WeightSlot, index: int, buffer) -> Part:
        """Point part `index` of the slot at `buffer` (holding the same rows in the same layout); the
        programs binding it must then `rebind` that part."""
        part = w.parts[index]
        part.buffer = buffer
        return part

    def queue_repack(self, buffer, n_groups: int, first: int, qtype) -> None:
        """Groups [first, first + n_groups) of `buffer`, of grouped type `qtype`, get rearranged at the next
        `repack` (an expert cache's slot after a streamed expert's bytes were written into it)."""
        self._repacks.append((buffer, n_groups, first, qtype))

    async def repack(self, kernels, pool) -> None:
        """Interleave the row-grouped weights (interleave.wgsl), then rearrange the grouped ones in place
        (repack.wgsl; a row-grouped Q6_K's groups are then of its interleaved blocks): after their bytes are
        uploaded and before the first step that reads them. Nothing to do the second time."""
        if self._interleaves:
            await self._interleave(kernels, pool)
        if self._repacks:
            repacks, self._repacks = self._repacks, []
            program = Program(0)
            for buf, n_groups, first, qtype in repacks:
                program.dispatches.append(Dispatch(repack_key(qtype), [buf], PARAMS["repack"].pack(groups=n_groups, first=first),
                                                   repack_grid(n_groups)))
            await program.build(self.device, kernels, pool)
            self.device.submit(program.ready, label="repack")
            program.release(self.allocator, self.device)

    async def _interleave(self, kernels, pool) -> None:
        """Each row-grouped part a chunk of whole groups at a time: copied into a scratch buffer of at most
        INTERLEAVE_CHUNK bytes (or one group), then written back interleaved (one copy and one dispatch
        a chunk, in queue order)."""
        todo, self._interleaves = self._interleaves, []
        scratch_bytes = max(min(max(INTERLEAVE_CHUNK // (g * row_bytes), 1) * g * row_bytes, rows * row_bytes)
                            for _, rows, row_bytes, _, g in todo)
        scratch = self.allocator.buffer(scratch_bytes + 16, "interleave")    # (a pair's last word may read one past)
        program, copies = Program(0), []
        for buf, rows, row_bytes, block_bytes, g in todo:
            gb = g * row_bytes
            per = max(scratch_bytes // gb, 1)
            for g0 in range(0, rows // g, per):
                n = min(per, rows // g - g0)
                copies.append((buf, g0 * gb, scratch, 0, n * gb))
                blocks = n * gb // block_bytes
                program.dispatches.append(Dispatch(interleave_key(g, block_bytes), [scratch, buf], PARAMS["interleave"].pack(
                    blocks=blocks, row_blocks=row_bytes // block_bytes, block_bytes=block_bytes, dst_off=g0 * gb // 4),
                    repack_grid(blocks // 2 if block_bytes % 4 else blocks)))     # (PAIRS: two blocks an invocation)
        await program.build(self.device, kernels, pool)
        for copy, ready in zip(copies, program.ready):
            self.device.copy([copy])
            self.device.submit([ready], label="interleave")
        program.release(self.allocator, self.device)
        self.allocator.release(scratch)
