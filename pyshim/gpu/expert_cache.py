"""Routed experts streamed from the store: a GPU cache of a few experts per MoE layer, filled on a miss
(TurboFieldfare's idea: the shared weights stay resident, only the experts a token picks are read).

With a cache, each MoE layer's 3-D expert tensors are bound as `slots` experts instead of all of them
([slots, rows, cols], the same GGUF blocks). A step's program then stops after each such layer's router
(pyshim.gpu.program.Stop): the runner reads the router's expert ids back (tokens x used words),
`LayerCache.resolve` gives each expert a slot — a hit, or a miss that takes a free slot or the least
recently used expert's that this step does not want — uploads the missed experts' rows of every tensor of
the layer, and writes the slot ids where the layer's expert matvecs read them. Those matvecs are the
resident ones: to them the cache is a mixture of `slots` experts, so a streamed model's tokens equal the
resident model's bit for bit.

A step can want at most `slots` distinct experts in a layer, so a cached model's steps are at most
slots // used tokens long (the runner's capacity says so; the generation loop cuts prompts to fit).

While the GPU runs toward a layer's router, the host can already be fetching what that router will
probably pick: each MoE layer's step also applies the next MoE layer's router to its own router input
(pyshim.gpu.experts, `guess_route`), and the runner reads that guess back with the layer's ids and hands
it to `prefetch` after the GPU has been given the next stretch of the step (the idea of pre-gated MoE: the
residual stream changes little from one layer to the next in a trained model). A good guess turns the next
router's misses into hits whose bytes were read while the GPU computed; a wrong one costs its bytes and may
evict an expert that would have hit. So each layer checks every guess against what its router then picks
and fetches on guesses only while they mostly come true (`LayerCache.trust`): on a model whose layers
guess badly (random weights) nothing is fetched ahead and nothing is lost. `ahead = False` turns guessing
off (the bench compares both).

The bytes come through `fetch` (a list of pyshim.gpu.slots.Upload -> awaitable): natively read from the
file and written here; in the browser the store writes them from IndexedDB straight into the buffer.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Awaitable, Callable, Sequence

import numpy as np

from pyshim.errors import UnsupportedError
from pyshim.gguf.types import check_runnable
from pyshim.gpu.kernels import repack_bytes
from pyshim.gpu.slots import Part, Upload, WeightSlot, WeightSlots
from pyshim.plan.memory import group_bytes, row_parts

Fetch = Callable[[list[Upload]], Awaitable[None]]

GUESS_TRUST = 0.5       # a layer's guesses are fetched while at least this share of them has come true
GUESS_KEEP = 0.75       # the running share's memory: each check's experts count this much less a step later
GUESS_PRIOR = 8         # it starts as this many experts guessed, none right (trust is earned)


@dataclass
class CacheStats:
    """What the cache did since load (or the last `reset`): experts wanted by steps, how many were
    already on the GPU, the bytes uploaded and the seconds spent waiting for them."""

    wanted: int = 0
    hits: int = 0
    uploaded_bytes: int = 0         # all of them, fetched ahead or not
    fetch_s: float = 0.0            # waiting for missed experts with the GPU stopped
    stops: int = 0
    guessed: int = 0                # experts uploaded ahead on a guess
    guess_hits: int = 0             # of those, wanted by the router they were guessed for
    checked: int = 0                # experts a guess named that were not held, fetched or not
    checked_right: int = 0          # of those, wanted by the router
    ahead_bytes: int = 0
    ahead_s: float = 0.0            # fetching ahead, while the GPU worked

    @property
    def hit_rate(self) -> float:
        return self.hits / self.wanted if self.wanted else 1.0

    def as_dict(self) -> dict:
        return {"wanted": self.wanted, "hits": self.hits, "hit_rate": round(self.hit_rate, 4),
                "uploaded_bytes": self.uploaded_bytes, "fetch_s": round(self.fetch_s, 4), "stops": self.stops,
                "guessed": self.guessed, "guess_hits": self.guess_hits, "checked": self.checked,
                "checked_right": self.checked_right, "ahead_bytes": self.ahead_bytes,
                "ahead_s": round(self.ahead_s, 4)}


class LayerCache:
    """One MoE layer's expert slots: which expert each holds, least recently used first."""

    def __init__(self, layer: str, n_slots: int, n_experts: int):
        self.layer, self.n_slots, self.n_experts = layer, n_slots, n_experts
        self.tensors: list[WeightSlot] = []           # the layer's cached expert tensors (gate, up, down)
        self.held: OrderedDict[int, int] = OrderedDict()   # expert -> slot, least recently used first
        self.free = list(range(n_slots - 1, -1, -1))
        self.guessed: set[int] = set()    # held on a guess (plan_ahead), not yet wanted
        self.noted: list[int] = []        # the last guess's experts that were not held, fetched or not
        self.right_w, self.noted_w = 0.0, float(GUESS_PRIOR)     # the running counts `trust` divides
        self.checked = (0, 0)             # the last router's check of a guess: (experts guessed, wanted)

    def plan(self, ids: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """(the slot of each id, the (expert, slot) pairs to upload). Raises when a step wants more
        distinct experts than there are slots (the runner's capacity keeps steps short enough). A guess
        made for this step is checked against `ids` first (`trust`)."""
        wanted = list(dict.fromkeys(int(e) for e in ids.reshape(-1)))
        if any(not 0 <= e < self.n_experts for e in wanted):
            raise ValueError(f"{self.layer}: the router picked experts {wanted} of {self.n_experts}")
        if len(wanted) > self.n_slots:
            raise UnsupportedError(f"{self.layer}: a step wants {len(wanted)} distinct experts, the cache holds {self.n_slots}",
                                   hint="run steps of fewer tokens (the runner's max_step_tokens)")
        right = len(set(self.noted).intersection(wanted))
        self.checked = (len(self.noted), right)
        if self.noted:
            self.right_w = GUESS_KEEP * self.right_w + right
            self.noted_w = GUESS_KEEP * self.noted_w + len(self.noted)
            self.noted = []
        misses = self._take(wanted)
        self.guessed.difference_update(wanted)
        slot_of = np.array([self.held[int(e)] for e in ids.reshape(-1)], dtype=np.uint32).reshape(ids.shape)
        return slot_of, misses

    @property
    def trust(self) -> float:
        """The running share of guessed experts (not held when guessed) that the router then wanted, each
        check weighing as many experts as it had."""
        return self.right_w / self.noted_w

    def plan_ahead(self, ids: np.ndarray) -> list[tuple[int, int]]:
        """The (expert, slot) pairs to upload for a guess at the next step's ids (the first `n_slots`
        distinct experts it names), or none while this layer's guesses have come true less than GUESS_TRUST
        of the time (a wrong guess costs its bytes and evicts an expert that might have hit; the guess is
        still checked, so a layer whose guesses improve starts fetching). The experts fetched count as
        guessed until a router wants them or they are evicted."""
        guess = list(dict.fromkeys(int(e) for e in ids.reshape(-1)))
        if any(not 0 <= e < self.n_experts for e in guess):
            raise ValueError(f"{self.layer}: a guess named experts {guess} of {self.n_experts}")
        guess = guess[:self.n_slots]
        self.noted = [e for e in guess if e not in self.held]
        if self.trust < GUESS_TRUST:
            return []
        misses = self._take(guess)
        self.guessed.update(e for e, _ in misses)
        return misses

    def _take(self, wanted: list[int]) -> list[tuple[int, int]]:
        """Slots for `wanted` (distinct, at most n_slots): those held become the most recently used, the
        others take a free slot or the least recently used expert's that `wanted` does not name."""
        for e in wanted:                              # hits first: they must not be evicted by this step's misses
            if e in self.held:
                self.held.move_to_end(e)
        misses = []
        for e in wanted:
            if e in self.held:
                continue
            if self.free:
                slot = self.free.pop()
            else:
                victim = next(v for v in self.held if v not in wanted)
                slot = self.held.pop(victim)
                self.guessed.discard(victim)
            self.held[e] = slot
            misses.append((e, slot))
        return misses

    def forget(self, misses: list[tuple[int, int]]) -> None:
        """The uploads of `misses` failed: their experts are not held, their slots free again."""
        for expert, slot in misses:
            if self.held.get(expert) == slot:
                del self.held[expert]
                self.free.append(slot)
            self.guessed.discard(expert)


class ExpertCache:
    """The expert caches of every MoE layer, allocated beside the weight slots."""

    def __init__(self, slots: WeightSlots, n_slots: int, fetch: Fetch | None = None):
        self.weights = slots
        self.n_slots = n_slots
        self.fetch = fetch or self._read_and_write
        self.layers: dict[str, LayerCache] = {}
        self.stats = CacheStats()
        self.ahead = True        # fetch each next MoE layer's guessed experts while the GPU works

    @property
    def nbytes(self) -> int:
        return sum(int(p.buffer.size) for layer in self.layers.values() for w in layer.tensors for p in w.parts)

    @property
    def expert_bytes(self) -> int:
        """File bytes of one expert of every cached tensor of a layer (what a miss uploads)."""
        return max((sum(w.ref.nbytes // layer.n_experts for w in layer.tensors) for layer in self.layers.values()), default=0)

    def bind(self, name: str, shape: Sequence[int]) -> WeightSlot:
        """The cache standing for the 3-D expert tensor `name` [experts, rows, cols]: [slots, rows, cols]."""
        if name in self.weights.slots:
            return self.weights.slots[name]
        store, limit = self.weights.store, self.weights.limit
        ref = store.checked(name, shape)
        check_runnable(name, ref.qtype, "gpu")
        n_experts = int(shape[0])
        if self.n_slots >= n_experts:
            raise UnsupportedError(f"an expert cache of {self.n_slots} slots for {n_experts} experts: keep the model resident")
        layer_name = name.rsplit(".ffn_", 1)[0]
        layer = self.layers.setdefault(layer_name, LayerCache(layer_name, self.n_slots, n_experts))
        w = WeightSlot(ref, (self.n_slots, *shape[1:]), grouped=ref.qtype in self.weights.grouped_types)
        per = int(np.prod(shape[1:-1], dtype=np.int64))            # rows of one expert
        expert_bytes = per * ref.row_bytes
        if w.grouped and expert_bytes % group_bytes(ref.qtype):
            raise UnsupportedError(f"tensor {name!r}: an expert of {expert_bytes} bytes is not whole groups of the int8 "
                                   f"route's {ref.qtype.name} layout, so it cannot be streamed on that route", hint="use --arithmetic f32")
        for unit0, units in row_parts(self.n_slots, expert_bytes, limit, 0):
            nbytes = repack_bytes(units * per, ref.row_bytes, ref.qtype) if w.grouped else units * expert_bytes
            w.parts.append(Part(self.weights.allocator.buffer(nbytes, f"{name}[cache {unit0}:]"), unit0 * per, units * per))
        layer.tensors.append(w)
        self.weights.slots[name] = w
        return w

    def layer_of(self, w: WeightSlot) -> LayerCache:
        return self.layers[w.name.rsplit(".ffn_", 1)[0]]

    async def resolve(self, layer: LayerCache, ids: np.ndarray) -> np.ndarray:
        """The slot of each of the router's `ids` [tokens, used], the missed experts uploaded (and, on the
        int8 route, queued for rearranging before the layer's matvecs read them)."""
        distinct = {int(e) for e in ids.reshape(-1)}
        from_guess = len(layer.guessed & distinct)
        slot_of, misses = layer.plan(ids)
        self.stats.stops += 1
        self.stats.wanted += len(distinct)
        self.stats.hits += len(distinct) - len(misses)
        self.stats.guess_hits += from_guess
        self.stats.checked += layer.checked[0]
        self.stats.checked_right += layer.checked[1]
        t0 = time.perf_counter()
        self.stats.uploaded_bytes += await self._fill(layer, misses)
        self.stats.fetch_s += time.perf_counter() - t0
        return slot_of

    async def prefetch(self, layer_name: str, ids: np.ndarray) -> None:
        """Upload the experts of a guess at layer `layer_name`'s next router ids (missing ones only), while
        the GPU works toward that router. Their rearranging (int8 route) is queued like a miss's."""
        layer = self.layers.get(layer_name)
        if layer is None or not self.ahead:
            return
        misses = layer.plan_ahead(ids)
        t0 = time.perf_counter()
        nbytes = await self._fill(layer, misses)
        self.stats.ahead_s += time.perf_counter() - t0
        self.stats.guessed += len(misses)
        self.stats.ahead_bytes += nbytes
        self.stats.uploaded_bytes += nbytes

    async def _fill(self, layer: LayerCache, misses: list[tuple[int, int]]) -> int:
        """Upload `misses` (expert, slot) of every cached tensor of `layer`; returns the bytes. On a failed
        read the cache forgets them (those slots hold nothing usable)."""
        if not misses:
            return 0
        uploads = [self._upload(w, expert, slot) for w in layer.tensors for expert, slot in misses]
        try:
            await self.fetch(uploads)
        except BaseException:
            layer.forget(misses)
            raise
        for w in layer.tensors:
            if w.grouped:
                for _, slot in misses:
                    self._queue_repack(w, slot)
        return sum(u.nbytes for u in uploads)

    def _place(self, w: WeightSlot, slot: int) -> tuple[Part, int]:
        """(the part holding slot `slot` of cached tensor `w`, the slot's byte offset in it)."""
        per = w.shape[1] if len(w.shape) == 3 else 1
        row = slot * per
        for part in w.parts:
            if part.row0 <= row < part.row0 + part.rows:
                return part, (row - part.row0) * w.ref.row_bytes
        raise IndexError(f"{w.name}: no slot {slot}")

    def _upload(self, w: WeightSlot, expert: int, slot: int) -> Upload:
        per = w.shape[1]
        part, offset = self._place(w, slot)
        return Upload(w.name, w.ref.offset + expert * per * w.ref.row_bytes, per * w.ref.row_bytes, part.buffer, offset)

    def _queue_repack(self, w: WeightSlot, slot: int) -> None:
        part, offset = self._place(w, slot)
        group = group_bytes(w.ref.qtype)
        self.weights.queue_repack(part.buffer, w.shape[1] * w.ref.row_bytes // group, offset // group, w.ref.qtype)

    async def _read_and_write(self, uploads: list[Upload]) -> None:
        """Natively: the bytes read from the file (memory-mapped) and queued onto the GPU."""
        source, device = self.weights.store.source, self.weights.device
        for u in uploads:
            device.write(u.buffer, source.read(u.file_offset, u.nbytes), u.buffer_offset)

    def reset_stats(self) -> None:
        self.stats = CacheStats()
