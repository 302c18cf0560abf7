"""Sampling on the GPU, recorded after the forward pass (mixed into pyshim.gpu.ops.GpuOps): the greedy
argmax of the last rows, and the top-k candidates a sampled reply draws from, so that a step reads back a
few bytes instead of the logits."""

from __future__ import annotations

from pyshim.gpu.kernels import TOPK, TOPK_CHUNK, argmax_keys, argmax_pass1, groups
from pyshim.gpu.pool import Activation
from pyshim.gpu.program import Tensor


class SamplingOps:
    def record_argmax(self, logits: Tensor, rows: int = 1):
        """Greedy sampling of the last `rows` rows on the GPU (a batched decode step's: one a sequence);
        returns the result buffer, a word a row."""
        vocab = logits.shape[-1]
        off = logits.off + (logits.size // vocab - rows) * vocab
        subgroup = self.policy.subgroup
        chunk, parts, grid = argmax_pass1(vocab, subgroup, rows)
        pass1, pass2 = argmax_keys(subgroup)
        partial = Activation(rows * parts * 8, "argmax_partial")
        result = self.allocator.buffer(max(16, 4 * rows), "argmax")
        self._record("argmax", pass1, [logits.buf, partial], grid, len=vocab, chunk=chunk, x_off=off)
        self._record("argmax", pass2, [partial, result], (1, rows, 1), len=parts, chunk=0, x_off=0)
        return result

    def record_topk(self, logits: Tensor):
        """The TOPK largest logits of the last row as (f32 bits, id) pairs, largest first; returns their buffer."""
        vocab = logits.shape[-1]
        off = logits.off + (logits.size // vocab - 1) * vocab
        parts = groups(vocab, TOPK_CHUNK)
        partial = Activation(parts * TOPK * 8, "topk_partial")
        result = self.allocator.buffer(TOPK * 8, "topk")
        self._record("topk", self._key("topk", K=TOPK, PASS1=True), [logits.buf, partial], (groups(parts), 1, 1),
                     len=vocab, chunk=TOPK_CHUNK, x_off=off)
        self._record("topk", self._key("topk", K=TOPK, PASS2=True), [partial, result], (1, 1, 1), len=parts * TOPK, chunk=0, x_off=0)
        return result
