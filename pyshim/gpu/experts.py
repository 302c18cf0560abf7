"""The mixture-of-experts ops of the GPU executor (a part of GpuOps, kept apart for size).

The router runs on the GPU (router.wgsl) and writes each token's expert ids and weights into activation
buffers; the expert matvecs (matvec.wgsl / matvec_i8.wgsl with EXPERTS) read the ids there to find each
(token, slot) pair's matrix inside the 3-D weight. So a program is recorded once per step shape and
replayed whatever the router picks: expert choice is data, never a new program. Every weight type of the
dense matvecs runs, on both arithmetic routes; a weight split into parts (by whole experts) is read part
by part, each part serving the pairs whose expert it holds.

A step of several tokens on the int8 route (the CPU adapters' default) groups its pairs by expert first
(expert_group.wgsl, on the GPU: a counting sort of the router's ids), and the multi-token int8 matvec then
unpacks each block of an expert's matrix once for I8_TOKENS of the pairs that chose it (the types of
I8_TOKEN_TYPES); other steps run every pair through the one-row-per-pair matvec.
"""

from __future__ import annotations

from pyshim.errors import TensorShapeError, UnsupportedError
from pyshim.gpu.kernels import (I8_ACTIVATIONS, I8_BLOCKS, I8_TOKEN_TYPES, I8_TOKENS, MAX_EXPERTS,
                                UNIFORM_X_BYTES, UNIFORM_X_VEC4, WG, groups, i8_pairs, matvec_grid, matvec_i8_grid,
                                matvec_i8_key, matvec_key, moe_key, router_key)
from pyshim.gpu.pool import Activation
from pyshim.gpu.program import Stop, Tensor
from pyshim.gpu.shaderc import ShaderKey
from pyshim.gpu.slots import WeightSlot
from pyshim.models.ops import GATINGS, RouterSpec


class ExpertOps:
    """Mixed into pyshim.gpu.ops.GpuOps: route, expert_matmul, expert_sum, sigmoid_gate. With an expert
    cache (pyshim.gpu.expert_cache) the router's step stops for the host, and the expert matvecs read the
    cache's slots and the slot ids the host wrote; a guess at the next layer's ids (guess_route) is read
    back at the same stop."""

    _guess: tuple[Tensor, str] | None       # guess_route's ids and layer, for the next router's stop (begin resets it)

    def route(self, logits: Tensor, spec: RouterSpec, scales: WeightSlot | None = None) -> tuple[Tensor, Tensor]:
        if self.expert_cache is None:
            return self._router(logits, spec, scales)
        # streamed experts: the step stops here; the host reads the ids (and the guess at the next layer's
        # just after them: one readback), fills the cache and writes each pair's slot into a buffer of
        # this layer's own, which the expert matvecs read from its start (the grouping of pairs by expert
        # is keyed by it)
        n = logits.shape[0]
        ids_buf, slots_buf = self._stop_buffers(spec)
        weights, ids = self._router(logits, spec, scales, Tensor(ids_buf, 0, (n, spec.n_used)))
        slot_ids = Tensor(slots_buf, 0, (n, spec.n_used))
        guess, self._guess = self._guess, None
        self._program.stops.append(Stop(len(self._program.dispatches), ids=ids, slot_ids=slot_ids,
                                        guess=guess[0] if guess else None, guess_layer=guess[1] if guess else None))
        return weights, slot_ids

    def guess_route(self, x: Tensor, gate_inp: WeightSlot, spec: RouterSpec) -> None:
        """With experts streamed: the later layer's router on this layer's input, its ids kept for this
        layer's stop (the runner reads them back and fetches those experts while the GPU works on)."""
        if self.expert_cache is None:
            return
        n = x.shape[0]
        _, ids = self._router(self.matmul(x, gate_inp), spec, out=Tensor(self._stop_buffers(spec)[0], n * spec.n_used, (n, spec.n_used)))
        self._guess = (ids, gate_inp.name.rsplit(".ffn_", 1)[0])

    def _stop_buffers(self, spec: RouterSpec) -> tuple:
        """The buffers of the step's next MoE layer stop (one pair per MoE layer, made once): the router's
        ids with a guess's right after them, and the slot ids."""
        k = sum(1 for s in self._program.stops if s.ids is not None)       # this step's MoE layers so far
        if k == len(self._stop_bufs):
            words = max(4, self.max_chunk * spec.n_used)
            self._stop_bufs.append((self.allocator.buffer(2 * words * 4, f"stop_ids{k}"),
                                    self.allocator.buffer(words * 4, f"slot_ids{k}")))
        return self._stop_bufs[k]

    def _router(self, logits: Tensor, spec: RouterSpec, scales: WeightSlot | None = None,
                out: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """(weights, ids) of the router's choice, the ids into `out` if given."""
        n, experts = logits.shape
        if experts > MAX_EXPERTS or spec.n_used > experts:
            raise UnsupportedError(f"a router over {experts} experts ({spec.n_used} per token): the GPU router "
                                   f"takes at most {MAX_EXPERTS}")
        if spec.gating not in GATINGS:
            raise UnsupportedError(f"router gating {spec.gating!r} is not one of {GATINGS}")
        weights = self._tensor((n, spec.n_used), "router_weights")
        ids = out or self._tensor((n, spec.n_used), "router_ids")
        self._record("router", router_key(spec.gating, spec.norm, scales is not None),
                     [logits.buf] + ([scales.f32_buf] if scales is not None else []) + [ids.buf, weights.buf],
                     (groups(n), 1, 1), n=n, experts=experts, used=spec.n_used, logits_off=logits.off, ids_off=ids.off,
                     scale=spec.scale)
        return weights, ids

    def expert_matmul(self, x: Tensor, w: WeightSlot, ids: Tensor) -> Tensor:
        n, used = ids.shape
        rows_in, k = x.shape
        n_experts, m, k_w = w.shape
        if k != k_w or rows_in not in (n, n * used):
            raise TensorShapeError(f"expert matmul of x {x.shape} by {w.shape} for ids {ids.shape}")
        if self.expert_cache is not None:
            self._bind_stop(w, ids)
        pairs, pair_div = n * used, (used if rows_in == n else 1)
        out = self._tensor((pairs, m), "experts")
        common = dict(m=m, k=k, n=pairs, row_bytes=w.ref.row_bytes, w_off=0, y_off=out.off, bias_off=0, y_stride=m,
                      expert_bytes=m * w.ref.row_bytes, pair_div=pair_div)
        fmt = I8_ACTIVATIONS.get(w.ref.qtype) if self.policy.int8 else None
        int8 = fmt is not None and k % I8_BLOCKS[fmt][0] == 0
        rows = self.policy.matvec_rows
        if int8 and n > 1 and w.ref.qtype in I8_TOKEN_TYPES:
            xq, row_words = self._quantize(x, fmt)
            table = self._expert_groups(ids, n_experts)
            key = matvec_i8_key(w.ref.qtype, rows=self.policy.token_rows, tokens=I8_TOKENS, grouped=True, wg=self.policy.matvec_wg)
            tiles = groups(n, I8_TOKENS)            # an expert has at most n pairs (a token picks it once)
            common.update(x_off=0, pair_off=0, x_row_words=row_words, e_tiles=tiles, n_experts=n_experts)
            for part in w.parts:
                self._record("matvec_i8", key, [part, xq, table, out.buf],
                             (groups(m, self.policy.matvec_wg * self.policy.token_rows), part.rows // m * tiles, 1),
                             e_first=part.row0 // m, e_count=part.rows // m, **common)
            return out
        if int8:
            # each token's row is quantized once for all of its experts (llama.cpp's mul_mat_id does so too)
            xq, row_words = self._quantize(x, fmt)
            uniform_x = rows_in * row_words * 4 <= UNIFORM_X_BYTES
            key = matvec_i8_key(w.ref.qtype, uniform_x=uniform_x, rows=rows, experts=True,
                                pairs=self.policy.i8_pairs and i8_pairs(w.ref.qtype, k), wg=self.policy.matvec_wg)
            family, x_binding, grid = ("matvec_i8", (xq, 0, UNIFORM_X_BYTES) if uniform_x else xq,
                                       matvec_i8_grid(m, pairs, rows, wg=self.policy.matvec_wg))
            common.update(x_off=0, pair_off=0, x_row_words=row_words)
        else:
            reduce = self.policy.reduce
            uniform_x = not reduce and isinstance(x.buf, Activation) and x.off + rows_in * k <= 4 * UNIFORM_X_VEC4
            key = matvec_key(w.ref.qtype, reduce=reduce, uniform_x=uniform_x, rows=rows, subgroup=self.policy.subgroup,
                             experts=True, f16=self.policy.f16, reduce_wg=self.policy.reduce_wg, wg=self.policy.matvec_wg)
            family, x_binding, grid = ("matvec", (x.buf, 0, UNIFORM_X_BYTES) if uniform_x else x.buf,
                                       matvec_grid(m, pairs, reduce, rows, self.policy.matvec_wg))
            common.update(x_off=x.off)
        for part in w.parts:
            self._record(family, key, [part, x_binding, ids.buf, out.buf], grid, e_first=part.row0 // m,
                         e_count=part.rows // m, **common)
        return out

    def _bind_stop(self, w: WeightSlot, slot_ids: Tensor) -> None:
        """Tie the stop that writes `slot_ids` to the expert cache of `w`'s layer."""
        stop = next((s for s in self._program.stops if s.slot_ids is not None and s.slot_ids == slot_ids), None)
        if stop is None:
            raise TensorShapeError(f"expert matmul of {w.name!r}: its ids come from no router of this step")
        layer = self.expert_cache.layer_of(w)
        if stop.layer not in (None, layer):
            raise TensorShapeError(f"one router's experts read from two layers' caches ({stop.layer.layer}, {layer.layer})")
        stop.layer = layer

    def _expert_groups(self, ids: Tensor, n_experts: int) -> Activation:
        """The step's pairs grouped by expert (expert_group.wgsl), recorded once per router output in a
        program: a layer's gate, up and down matvecs share it."""
        if ids not in self._groups:
            table = Activation(max(16, (n_experts + 1 + ids.size) * 4), "expert_groups")
            self._record("expert_group", ShaderKey.of("expert_group", WG=WG), [ids.buf, table], (1, 1, 1),
                         pairs=ids.size, experts=n_experts)
            self._groups[ids] = table
        return self._groups[ids]

    def expert_sum(self, y: Tensor, weights: Tensor) -> Tensor:
        n, used = weights.shape
        d = y.shape[-1]
        out = self._tensor((n, d), "expert_sum")
        self._record("moe", moe_key("EXPERT_SUM"), [y.buf, weights.buf, out.buf], (groups(d // 4), n, 1), n=n, width=d,
                     used=used, x_off=y.off, g_off=weights.off, y_off=out.off)
        return out

    def sigmoid_gate(self, x: Tensor, g: Tensor) -> Tensor:
        n, d = x.shape
        out = self._tensor((n, d), "sigmoid_gate")
        self._record("moe", moe_key("SIGMOID_GATE"), [x.buf, g.buf, out.buf], (groups(d // 4), n, 1), n=n, width=d,
                     used=1, x_off=x.off, g_off=g.off, y_off=out.off)
        return out
