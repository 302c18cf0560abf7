"""The model's ops that run in fewer passes than the ops interface spells them (mixed into
pyshim.gpu.ops.GpuOps, as pyshim.gpu.experts is): a decode step is a few hundred dispatches, and on a real GPU
encoding them is its whole CPU cost (on CPU adapters each also has a fixed cost).

- Weights of one type and width that the model multiplies by the same input (q, k, v; gate, up) share a
  weight slot (`weights`), so a one-token step reads them in one matvec (`matmuls`), gate and up with the
  activation in its epilogue (`glu_matmul`).
- An op may compute what the op before it computed, inside its own pass: recording remembers what each
  foldable dispatch computed (`_produced`: a norm, a rope), a consumer that can fold it in asks
  (`_producer`), and at the end of recording `drop_unread` removes the dispatches whose output nobody reads
  any more (the int8 route's quantize norms its input itself, and the attention pass rounds its output to
  the next matmul's int8 blocks itself; kv_write ropes, and norms, the keys; rope norms each head of q).
Every fused kernel computes what its unfused chain computes (tests/test_kernels_fused.py).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import numpy as np

from pyshim.gpu.kernels import (I8_ACTIVATIONS, I8_BLOCKS, UNIFORM_X_BYTES, UNIFORM_X_VEC4, i8_pairs, matvec_grid,
                                matvec_i8_grid, matvec_i8_key, matvec_key)
from pyshim.gpu.pool import Activation
from pyshim.gpu.program import Dispatch, Program, Tensor
from pyshim.models.ops import ACTIVATIONS
from pyshim.models.rope import RopeSpec


class Norm(NamedTuple):
    """An rmsnorm as recorded: its input, weight and epsilon."""

    x: Tensor
    w: Any
    eps: float


def drop_unread(program: Program, candidates: list[Dispatch]) -> None:
    """Remove those of `candidates` whose output (their last binding) no other dispatch binds and the step
    does not return: their consumers computed it themselves. Stops keep their places."""
    binds: dict[int, int] = {}
    for d in program.dispatches:
        for b in d.bindings:
            binds[id(_buf(b))] = binds.get(id(_buf(b)), 0) + 1
    returned = id(program.output.buf) if program.output is not None else None
    dead = {id(d) for d in candidates if id(_buf(d.bindings[-1])) != returned and binds.get(id(_buf(d.bindings[-1])), 0) == 1}
    if not dead:
        return
    before, removed = [], 0          # dispatches removed before each index
    for d in program.dispatches:
        before.append(removed)
        removed += id(d) in dead
    for stop in program.stops:
        stop.at -= before[stop.at] if stop.at < len(before) else removed
    program.dispatches = [d for d in program.dispatches if id(d) not in dead]


def _buf(binding):
    return binding[0] if isinstance(binding, tuple) else binding


class Rope(NamedTuple):
    """A rope as recorded: its input (before the head norm it folded in, if any), positions, settings,
    angle table and mscale."""

    x: Tensor
    positions: Tensor
    spec: RopeSpec
    theta: Any
    mscale: float
    norm: Norm | None


class Attention(NamedTuple):
    """A one-pass decode attention as recorded: what recording it again takes."""

    q: Tensor
    kc: Any
    vc: Any
    positions: Tensor
    spec: Any                   # pyshim.models.ops.AttnSpec
    kv_type: str
    params: dict
    grid: tuple[int, int, int]


class F32Values(NamedTuple):
    """f32 values made on the device side, bound like a norm's or a bias's slot: several weights' biases
    in one buffer (GpuOps.matmuls), a weightless norm's ones (GpuOps.rmsnorm)."""

    f32_buf: Any


def _run(ws: Sequence, i: int) -> list:
    """ws[i] and the weights after it that continue its rows in the same slot (WeightSlots.bind_rows)."""
    run = [ws[i]]
    slot = getattr(ws[i], "slot", None)
    while (slot is not None and i + len(run) < len(ws) and getattr(ws[i + len(run)], "slot", None) is slot
           and ws[i + len(run)].row0 == run[-1].row0 + run[-1].shape[0]):
        run.append(ws[i + len(run)])
    return run


class FusedOps:
    """Mixed into GpuOps: the shared slots of `weights`, the fused `matmuls` and `glu_matmul`, and the
    bookkeeping of foldable dispatches (`_produced`, `_producer`)."""

    def _produced(self, out: Tensor, what) -> None:
        """`out` is the output of the dispatch just recorded, which computed `what`: a later op may compute
        it again inside its own pass; if then nothing reads `out`, end() drops that dispatch."""
        self._producers[id(out.buf)] = (self._program.dispatches[-1], what)

    def _producer(self, x: Tensor, kind: type):
        """What computed x (a whole activation), when it was recorded as foldable and is of `kind`."""
        entry = self._producers.get(id(x.buf)) if x.off == 0 else None
        return entry[1] if entry is not None and isinstance(entry[1], kind) else None

    def weights(self, named: Sequence[tuple[str, Sequence[int]]]) -> list:
        """Runs of consecutive weights of one type and width share a slot, their rows one after the other
        (q and k of Gemma 3, whose v has another type; all three of SmolLM2): `matmuls` and `glu_matmul`
        read such a run in one matvec. Streamed layers keep a slot each."""
        if self.layer_stream is not None and any(self.layer_stream.streams(n, s) for n, s in named):
            return [self.weight(n, s) for n, s in named]
        refs = [self.slots.store.checked(n, s) for n, s in named]
        out, i = [], 0
        while i < len(named):
            j = i + 1
            while j < len(named) and (refs[j].qtype, refs[j].shape[1:]) == (refs[i].qtype, refs[i].shape[1:]):
                j += 1
            views = self.slots.bind_rows(named[i:j]) if j - i > 1 else None
            out += views or [self.weight(n, s) for n, s in named[i:j]]
            i = j
        return out

    async def repack(self) -> None:
        await self.slots.repack(self.kernels, self.pool)

    def matmuls(self, x: Tensor, ws: Sequence, biases: Sequence) -> list[Tensor]:
        """One token: each run of weights that fill a slot together (`weights`) as one matvec over the slot
        (their biases joined), its output cut into views; otherwise (prompts) one matmul each, reading its
        rows where they lie."""
        out, i = [], 0
        while i < len(ws):
            run = _run(ws, i)
            slot = ws[i].slot if len(run) > 1 else None
            if x.shape[0] == 1 and slot is not None and run[0].row0 == 0 and sum(w.shape[0] for w in run) == slot.shape[0]:
                bs = biases[i:i + len(run)]
                y = self.matmul(x, slot, self._joined_bias(run, bs) if any(b is not None for b in bs) else None)
                at = 0
                for w in run:
                    out.append(Tensor(y.buf, y.off + at, (1, w.shape[0])))
                    at += w.shape[0]
            else:
                out += [self.matmul(x, w, b) for w, b in zip(run, biases[i:i + len(run)])]
            i += len(run)
        return out

    def _joined_bias(self, ws: Sequence, biases: Sequence):
        """The biases of a run of weights as one f32 buffer (zeros for a weight without one), made once."""
        key = tuple(b.name if b is not None else w.shape[0] for w, b in zip(ws, biases))
        if key not in self._joined:
            values = np.concatenate([b.values if b is not None else np.zeros(w.shape[0], np.float32) for w, b in zip(ws, biases)])
            buf = self.allocator.buffer(values.nbytes, "+".join(str(k) for k in key))
            self.device.write(buf, values)
            self._joined[key] = F32Values(buf)
        return self._joined[key]

    def glu_matmul(self, x: Tensor, gate, up, act: str) -> Tensor:
        """One token with gate and up filling one slot part (`weights`): one matvec whose epilogue stores
        act(gate) * up; otherwise two matmuls and glu."""
        n, k = x.shape
        f = gate.shape[0]
        slot = getattr(gate, "slot", None)
        fused = (n == 1 and slot is not None and getattr(up, "slot", None) is slot and gate.row0 == 0 and up.row0 == f
                 and up.shape[0] == f and len(slot.parts) == 1 and act in ACTIVATIONS)
        if not fused:
            return self.glu(self.matmul(x, gate), self.matmul(x, up), act)
        part = slot.parts[0]
        out = self._tensor((1, f), "glu")
        fmt = I8_ACTIVATIONS.get(slot.ref.qtype) if self.policy.int8 else None
        common = dict(m=f, k=k, n=1, row_bytes=slot.ref.row_bytes, w_off=0, y_off=out.off, y_stride=f, bias_off=0)
        if fmt is not None and k % I8_BLOCKS[fmt][0] == 0:
            xq, row_words = self._quantize(x, fmt)
            uniform_x = row_words * 4 <= UNIFORM_X_BYTES
            rows = self.policy.one_token_rows(slot.ref.qtype, k, glu=True, row_group=slot.row_group)
            key = matvec_i8_key(slot.ref.qtype, uniform_x=uniform_x, rows=rows, glu=act,
                                pairs=self.policy.i8_pairs and i8_pairs(slot.ref.qtype, k), wg=self.policy.matvec_wg,
                                row_group=slot.row_group)
            self._record("matvec_i8", key, [part, (xq, 0, UNIFORM_X_BYTES) if uniform_x else xq, out.buf],
                         matvec_i8_grid(f, 1, rows, wg=self.policy.matvec_wg), x_off=0, pair_off=0, x_row_words=row_words, **common)
            return out
        reduce = self.policy.reduce
        uniform_x = not reduce and isinstance(x.buf, Activation) and x.off + k <= 4 * UNIFORM_X_VEC4
        key = matvec_key(slot.ref.qtype, reduce=reduce, uniform_x=uniform_x, rows=self.policy.matvec_rows,
                         subgroup=self.policy.subgroup, glu=act, f16=self.policy.f16, reduce_wg=self.policy.reduce_wg,
                         wg=self.policy.matvec_wg)
        self._record("matvec", key, [part, (x.buf, 0, UNIFORM_X_BYTES) if uniform_x else x.buf, out.buf],
                     matvec_grid(f, 1, reduce, self.policy.matvec_rows, self.policy.matvec_wg), x_off=x.off, **common)
        return out
