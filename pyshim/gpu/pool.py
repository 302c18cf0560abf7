"""Activation memory: programs record activations as `Slot`s (virtual buffers); at build time each
slot gets a physical buffer from a pool shared by every program of the executor.

A slot is live from the first dispatch that binds it to the last (the program's output to the end).
Walking the dispatches in order, a slot takes the smallest free pool buffer that fits (or a new one)
and frees it after its last use, so a step needs about two layers' worth of activations instead of one
buffer per op. Programs never run at the same time (a step is submitted, then its output read, before
the next), so they share the pool: the peak is the largest program's, not the sum.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

POOL_ALIGN = 256        # buffer sizes rounded up to this: near-equal activations reuse each other's buffers


class Slot:
    """A virtual activation buffer: `nbytes`, then `phys` once its program is built."""

    __slots__ = ("nbytes", "label", "phys")

    def __init__(self, nbytes: int, label: str):
        self.nbytes = int(nbytes)
        self.label = label
        self.phys: Any = None

    @property
    def size(self) -> int:
        return self.nbytes


def physical(binding):
    """The device binding behind a recorded one: a Slot's assigned buffer, (Slot, offset, size) with the
    buffer in place of the Slot, anything else unchanged."""
    if isinstance(binding, tuple):
        return (physical(binding[0]),) + tuple(binding[1:])
    return binding.phys if isinstance(binding, Slot) else binding


class ActivationPool:
    def __init__(self, make_buffer, min_bytes: int = 0):
        """`make_buffer(nbytes, label)` creates a device buffer; every buffer has at least `min_bytes`."""
        self._make = make_buffer
        self.min_bytes = min_bytes
        self.buffers: list[tuple[int, Any]] = []      # (nbytes, buffer), every buffer ever made

    @property
    def nbytes(self) -> int:
        return sum(n for n, _ in self.buffers)

    def assign(self, uses: Sequence[Iterable], keep: Iterable[Slot] = ()) -> None:
        """`uses[i]`: the bindings of dispatch i. Gives every Slot among them a physical buffer; slots in
        `keep` (the program's outputs) stay live to the end."""
        last: dict[Slot, int] = {}
        uses = [[b[0] if isinstance(b, tuple) else b for b in bindings] for bindings in uses]
        for i, bindings in enumerate(uses):
            for b in bindings:
                if isinstance(b, Slot):
                    last[b] = i
        for slot in keep:
            last[slot] = len(uses)
        free = list(range(len(self.buffers)))           # indices into self.buffers
        ending: dict[int, list[int]] = {}
        taken: set[Slot] = set()
        for i, bindings in enumerate(uses):
            for b in bindings:
                if isinstance(b, Slot) and b not in taken:
                    taken.add(b)
                    fits = [j for j in free if self.buffers[j][0] >= b.nbytes]
                    if fits:
                        j = min(fits, key=lambda j: self.buffers[j][0])
                        free.remove(j)
                    else:
                        size = (max(b.nbytes, self.min_bytes) + POOL_ALIGN - 1) // POOL_ALIGN * POOL_ALIGN
                        self.buffers.append((size, self._make(size, f"act{len(self.buffers)}")))
                        j = len(self.buffers) - 1
                    b.phys = self.buffers[j][1]
                    ending.setdefault(last[b], []).append(j)
            free.extend(ending.pop(i, []))
