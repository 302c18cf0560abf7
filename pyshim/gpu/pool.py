"""Device memory: the counting allocator every buffer of an executor comes from, and the pool that
gives recorded activations their buffers.

Programs record activations as `Activation`s (virtual buffers); at build time each gets a physical
buffer from a pool shared by every program of the executor. An activation is live from the first
dispatch that binds it to the last (the program's output to the end). Walking the dispatches in order,
an activation takes the smallest free pool buffer that fits (or a new one) and frees it after its last
use, so a step needs about two layers' worth of activations instead of one buffer per op. Programs never
run at the same time (a step is submitted, then its output read, before the next), so they share the
pool: the peak is the largest program's, not the sum.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from pyshim.errors import OutOfMemoryError

POOL_ALIGN = 256        # buffer sizes rounded up to this: near-equal activations reuse each other's buffers
BUFFER_ALIGN = 16


class Allocator:
    """Makes and frees device buffers, keeping the running total (`allocated`: the executor's memory)."""

    def __init__(self, device):
        self.device = device
        self.allocated = 0

    def buffer(self, nbytes: int, label: str, *, also_uniform: bool = False, uniform: bool = False):
        nbytes = max(BUFFER_ALIGN, (int(nbytes) + BUFFER_ALIGN - 1) // BUFFER_ALIGN * BUFFER_ALIGN)
        if nbytes > self.device.caps.limits["max_buffer_size"]:
            raise OutOfMemoryError(f"buffer {label} needs {nbytes} bytes, more than the device allows "
                                   f"({self.device.caps.limits['max_buffer_size']})", hint="use a smaller context or prefill chunk")
        self.allocated += nbytes
        return self.device.buffer(nbytes, label=label, also_uniform=also_uniform, uniform=uniform)

    def release(self, buffer) -> None:
        self.allocated -= int(buffer.size)
        self.device.release(buffer)


class Activation:
    """A virtual activation buffer: `nbytes`, then `phys` once its program is built."""

    __slots__ = ("nbytes", "label", "phys")

    def __init__(self, nbytes: int, label: str):
        self.nbytes = int(nbytes)
        self.label = label
        self.phys: Any = None

    @property
    def size(self) -> int:
        return self.nbytes


class ActivationPool:
    def __init__(self, allocator: Allocator, min_bytes: int = 0):
        """Buffers come from `allocator` (storage buffers that may also be bound as uniforms: the
        barrier-free matvec reads a one-token x that way); every buffer has at least `min_bytes`."""
        self.allocator = allocator
        self.min_bytes = min_bytes
        self.buffers: list[tuple[int, Any]] = []      # (nbytes, buffer), every buffer ever made

    @property
    def nbytes(self) -> int:
        return sum(n for n, _ in self.buffers)

    def assign(self, uses: Sequence[Iterable], keep: Iterable[Activation] = ()) -> None:
        """`uses[i]`: the bindings of dispatch i. Gives every Activation among them a physical buffer;
        those in `keep` (the program's outputs) stay live to the end."""
        last: dict[Activation, int] = {}
        uses = [[b[0] if isinstance(b, tuple) else b for b in bindings] for bindings in uses]
        for i, bindings in enumerate(uses):
            for b in bindings:
                if isinstance(b, Activation):
                    last[b] = i
        for act in keep:
            last[act] = len(uses)
        free = list(range(len(self.buffers)))           # indices into self.buffers
        ending: dict[int, list[int]] = {}
        taken: set[Activation] = set()
        for i, bindings in enumerate(uses):
            for b in bindings:
                if isinstance(b, Activation) and b not in taken:
                    taken.add(b)
                    fits = [j for j in free if self.buffers[j][0] >= b.nbytes]
                    if fits:
                        j = min(fits, key=lambda j: self.buffers[j][0])
                        free.remove(j)
                    else:
                        size = (max(b.nbytes, self.min_bytes) + POOL_ALIGN - 1) // POOL_ALIGN * POOL_ALIGN
                        self.buffers.append((size, self.allocator.buffer(size, f"act{len(self.buffers)}", also_uniform=True)))
                        j = len(self.buffers) - 1
                    b.phys = self.buffers[j][1]
                    ending.setdefault(last[b], []).append(j)
            free.extend(ending.pop(i, []))
