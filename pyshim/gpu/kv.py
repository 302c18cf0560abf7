"""The GPU KV cache in pages: one pool of pages per layer, and per sequence a row of a page table.

A page holds PAGE positions of every KV head of one layer (keys in the layer's K pool, values in its V
pool), stored as the KV type says (pyshim.plan.settings.KV_TYPES; shaders/include/kv.wgsl). Page ids are
the same in every layer, so one page table serves them all: key position j of a sequence is in slot
    table[row + (j / PAGE) % row_len] * PAGE + j % PAGE
of its layer's pool. Two kinds of layers:
  - full-attention layers: a row of ceil(n_ctx / PAGE) pages, handed out from the pool as the sequence
    grows (`prepare`), shared by reference between sequences that hold the same prefix (`share`) and
    copied before one of them writes into a shared page (copy-on-write), freed when the sequence is reset;
  - sliding-window layers (when the window plus one step is shorter than the context): a ring of pages a
    sequence owns for good, `(j / PAGE) % row_len` wrapping over them; it holds the window plus one step's
    tokens less one, so a step never evicts a key its own queries still need.
Kernels read the table and each token's sequence from the step map (`positions` in the shaders): the
step's positions, then each token's sequence, then the two tables. One recorded program therefore serves
any sequence, and a batched decode step writes and attends for all its sequences in one dispatch each.

When the pool runs short, the pages of sequences no request is using (`idle`, least recently stepped
first) are taken back and those sequences forget what they held; when that is not enough the step is
refused with KVCacheFullError before anything is written, so no sequence ever reads another's keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from pyshim.errors import KVCacheFullError, OutOfMemoryError
from pyshim.gpu.pool import Allocator
from pyshim.plan.memory import kv_ring_pages
from pyshim.plan.settings import KV_PAGE as PAGE, kv_type as kv_type_named

NO_PAGE = 0xFFFFFFFF        # a table entry with no page behind it


@dataclass(frozen=True)
class LayerKV:
    k: Any              # buffer: the layer's K pool, [pages * PAGE, kv_heads, head_dim] values of the KV type
    v: Any              # buffer: its V pool, [pages * PAGE, kv_heads, head_dim_v]
    table_off: int      # word offset in the step map of its kind's page table
    table_len: int      # pages in a sequence's row of that table

    @property
    def cap(self) -> int:
        """Positions a sequence's row reaches before it wraps (a ring's size; the context for full layers)."""
        return self.table_len * PAGE


def page_bytes(spec, kv_type: str, layer: int = 0) -> tuple[int, int]:
    """Bytes of one page of layer `layer`'s keys and of its values (Gemma 4's layers differ)."""
    per_value = kv_type_named(kv_type).bytes_per_value
    k_row, v_row = spec.kv_row(layer)
    return math.ceil(PAGE * k_row * per_value), math.ceil(PAGE * v_row * per_value)


class PageTable:
    """Rows of page ids into a pool, one row per sequence, with a reference count per page."""

    def __init__(self, n_pages: int, n_seqs: int, row_len: int):
        self.rows = np.full((n_seqs, row_len), NO_PAGE, dtype=np.uint32)
        self.refs = np.zeros(n_pages, dtype=np.int32)
        self._free = list(range(n_pages - 1, -1, -1))      # a stack: low page ids first
        self.dirty = True                                   # the device's copy is stale

    @property
    def n_pages(self) -> int:
        return len(self.refs)

    @property
    def free(self) -> int:
        return len(self._free)

    def held(self, seq: int) -> int:
        return int(np.count_nonzero(self.rows[seq] != NO_PAGE))

    def take(self) -> int:
        page = self._free.pop()
        self.refs[page] = 1
        return page

    def drop(self, page: int) -> None:
        self.refs[page] -= 1
        if self.refs[page] == 0:
            self._free.append(int(page))

    def release(self, seq: int, first: int = 0) -> None:
        """Sequence `seq` lets go of its pages from row entry `first` on."""
        row = self.rows[seq]
        for i in np.flatnonzero(row[first:] != NO_PAGE) + first:
            self.drop(int(row[i]))
            row[i] = NO_PAGE
        self.dirty = True

    def needs(self, seq: int, first: int, end: int) -> int:
        """Pages writing row entries [first, end) takes from the pool: one per entry with no page or a shared one."""
        entries = self.rows[seq, first:end]
        return sum(1 for p in entries if p == NO_PAGE or self.refs[p] > 1)


class GpuKV:
    def __init__(self, allocator: Allocator, spec, n_ctx: int, max_chunk: int, kv_type: str = "f32", n_seqs: int = 1,
                 n_pages: int | None = None, max_binding: int | None = None):
        """`n_pages`: the full-attention layers' pool (default: every sequence's whole context); a ring of
        pages per sequence for the sliding-window layers comes on top."""
        kind = kv_type_named(kv_type)
        for il in range(spec.n_layers):
            kind.check_heads(*spec.head_dims(il))
        self.kv_type, self.n_seqs, self.spec = kv_type, n_seqs, spec
        self.row_len = math.ceil(n_ctx / PAGE)
        self.ring_len = kv_ring_pages(spec, n_ctx, max_chunk)
        self.n_pages = n_seqs * self.row_len if n_pages is None else n_pages
        if self.n_pages < 1:
            raise OutOfMemoryError(f"a KV cache of {self.n_pages} pages holds nothing", hint="give it at least one page")
        self.pages = PageTable(self.n_pages, n_seqs, self.row_len)
        # the step map: positions [max_chunk], each token's sequence [max_chunk], the full layers' table,
        # the rings' table (each sequence's ring: pages seq * ring_len, ...; it never changes)
        self.seq_off = max_chunk
        self.table_off = 2 * max_chunk
        self.ring_off = self.table_off + n_seqs * self.row_len
        self.map_words = self.ring_off + n_seqs * self.ring_len
        self.page_bytes = [page_bytes(spec, kv_type, il) for il in range(spec.n_layers)]     # per layer
        self._layers: list[LayerKV] = []
        for il in range(spec.n_layers):
            ring = bool(self.ring_len) and spec.swa_layers[il]
            pages = n_seqs * self.ring_len if ring else self.n_pages
            k_bytes, v_bytes = pages * self.page_bytes[il][0], pages * self.page_bytes[il][1]
            if max_binding is not None and max(k_bytes, v_bytes) > max_binding:
                raise OutOfMemoryError(
                    f"one layer's KV pool of {pages} pages ({max(k_bytes, v_bytes) >> 20} MiB of {kv_type}) is more than "
                    f"one storage binding ({max_binding >> 20} MiB)",
                    hint="use fewer parallel sequences, a shorter context, fewer KV pages or a smaller KV type (q8, q4)")
            self._layers.append(LayerKV(allocator.buffer(k_bytes, f"k{il}"), allocator.buffer(v_bytes, f"v{il}"),
                                        self.ring_off if ring else self.table_off, self.ring_len if ring else self.row_len))
        # pages on their way between two places of one pool (WebGPU copies never share a source and
        # destination): one, or a whole ring
        self._scratch = allocator.buffer(max(map(max, self.page_bytes)) * max(1, self.ring_len), "kv_page")
        self._last_step: dict[int, int] = {}   # sequence -> the step that last wrote it (least recent taken back first)
        self._steps = 0
        self.reclaimed = 0                     # sequences whose pages were taken back for others

    def layer(self, il: int) -> LayerKV:
        return self._layers[il]

    def buffers(self) -> list:
        """Every device buffer the cache holds (its pages, and the scratch page)."""
        return [b for l in self._layers for b in (l.k, l.v)] + [self._scratch]

    @property
    def nbytes(self) -> int:
        return sum(int(l.k.size) + int(l.v.size) for l in self._layers)

    def table_words(self) -> np.ndarray:
        """Both tables as the step map holds them (from word `table_off` on)."""
        rings = np.arange(self.n_seqs * self.ring_len, dtype=np.uint32)
        return np.concatenate([self.pages.rows.reshape(-1), rings])

    # --- pages as sequences run ---
    def prepare(self, writes: Sequence[tuple[int, int, int]], idle: Callable[[], Iterable[int]] = tuple,
                on_reclaim: Callable[[int], None] = lambda seq: None) -> list[tuple[Any, int, Any, int, int]]:
        """Give each (seq, start, end) of a step the pages its positions [start, end) are written to: new
        pages where it has none, its own copy of a page it shares (the copies to make before the step are
        returned: (src, offset, dst, offset, size) for the device). Pages of `idle()` sequences (least
        recently stepped first) are taken back when the pool is short (`on_reclaim(seq)`: it forgets what
        it held). Raises KVCacheFullError, having changed nothing of the step's sequences, when even
        that is not enough."""
        table = self.pages
        self._steps += 1
        stepping = {seq for seq, _, _ in writes}
        for seq, start, end in writes:
            if start > 0 and table.rows[seq, (start - 1) // PAGE] == NO_PAGE:
                raise KVCacheFullError(f"sequence {seq}'s keys before position {start} are gone (its pages were taken back)",
                                       hint="run its prompt again from the start")
        need = sum(table.needs(seq, start // PAGE, -(-end // PAGE)) for seq, start, end in writes)
        if need > table.free:
            for seq in sorted((s for s in idle() if s not in stepping and table.held(s)),
                              key=lambda s: self._last_step.get(s, 0)):
                table.release(seq)
                self.reclaimed += 1
                on_reclaim(seq)
                if need <= table.free:
                    break
        if need > table.free:
            raise KVCacheFullError(
                f"the KV cache has {table.free} free pages of {table.n_pages} ({PAGE} positions each) and this step "
                f"needs {need}: the running requests hold the rest",
                hint="retry when a request finishes, or load with fewer parallel sequences, more KV pages (kv_pages) "
                     "or a shorter context")
        copies = []
        for seq, start, end in writes:
            row = table.rows[seq]
            for i in range(start // PAGE, -(-end // PAGE)):
                old = int(row[i])
                if old != NO_PAGE and table.refs[old] == 1:
                    continue
                row[i] = table.take()
                if old != NO_PAGE:          # shared: this sequence writes into its own copy from now on
                    copies += self._page_copies(old, int(row[i]))
                    table.drop(old)
                table.dirty = True
            self._last_step[seq] = self._steps
        return copies

    def _page_copies(self, src: int, dst: int) -> list[tuple[Any, int, Any, int, int]]:
        """Page `src` of every full layer's pools into page `dst`, through the scratch page."""
        return self._copies(self.table_off, src, dst, 1)

    def _copies(self, table_off: int, src: int, dst: int, pages: int) -> list[tuple[Any, int, Any, int, int]]:
        """`pages` pages from page src * pages to page dst * pages of the pools of the layers whose table
        is at `table_off`, each through the scratch pages."""
        return [copy for layer, (k_bytes, v_bytes) in zip(self._layers, self.page_bytes) if layer.table_off == table_off
                for buf, size in ((layer.k, k_bytes * pages), (layer.v, v_bytes * pages))
                for copy in ((buf, src * size, self._scratch, 0, size), (self._scratch, 0, buf, dst * size, size))]

    def share(self, src: int, dst: int, n: int) -> list[tuple[Any, int, Any, int, int]]:
        """Sequence `dst` holds `src`'s keys for positions [0, n) from now on: the full layers' pages by
        reference (the last one, if `n` ends inside it, is copied when either writes there); each
        sliding-window layer's ring is copied whole — the copies to make are returned (the caller knows
        that the ring still holds the window before n)."""
        table, pages = self.pages, -(-n // PAGE)
        table.release(dst)
        table.rows[dst, :pages] = table.rows[src, :pages]
        for page in table.rows[dst, :pages]:
            if page != NO_PAGE:
                table.refs[page] += 1
        self._last_step[dst] = self._steps
        return self._copies(self.ring_off, src, dst, self.ring_len) if self.ring_len else []

    def release(self, seq: int) -> None:
        """Sequence `seq` starts over: its pages go back to the pool (a page another holds stays theirs)."""
        self.pages.release(seq)

    def stats(self) -> dict:
        return {"pages": self.pages.n_pages, "free_pages": self.pages.free, "page_positions": PAGE,
                "reclaimed": self.reclaimed}
