"""Qwen3 (dense): the Llama block with RMSNorm on each head of q and k before rope, NeoX rope, no biases."""

from __future__ import annotations

from pyshim.models.llama import Llama, LlamaBlock
from pyshim.models.ops import Ops
from pyshim.gguf.spec import ModelSpec


class Qwen3Block(LlamaBlock):
    def __init__(self, hp: ModelSpec, ops: Ops, il: int):
        super().__init__(hp, ops, il)
        p = f"blk.{il}."
        self.attn_q_norm = ops.weight(p + "attn_q_norm.weight", (hp.head_dim_k,))
        self.attn_k_norm = ops.weight(p + "attn_k_norm.weight", (hp.head_dim_k,))


class Qwen3(Llama):
    block = Qwen3Block

    def forward(self, ops: Ops, tokens, positions, all_logits: bool = False):
        """tokens, positions [n] -> logits [n, vocab] (or [1, vocab], the last position's)."""
        hp = self.hp
        n = tokens.shape[0]
        x = ops.embed(self.token_embd, tokens)                                   # [n, d]
        for b in self.blk:
            h = ops.rmsnorm(x, b.attn_norm, hp.norm_eps)                             # [n, d]
            q = ops.view(ops.matmul(h, b.attn_q), (n, hp.n_heads, hp.head_dim_k))  # [n, Hq, hd]
            k = ops.view(ops.matmul(h, b.attn_k), (n, hp.n_kv_heads, hp.head_dim_k))
            v = ops.view(ops.matmul(h, b.attn_v), (n, hp.n_kv_heads, hp.head_dim_v))
            q = ops.rope(ops.rmsnorm(q, b.attn_q_norm, hp.norm_eps), positions, b.rope)  # per-head norm, then rope
            k = ops.rope(ops.rmsnorm(k, b.attn_k_norm, hp.norm_eps), positions, b.rope)
            a = ops.attention(q, k, v, positions, b.attn)                        # [n, Hq * hd_v]
            x = ops.add(x, ops.matmul(a, b.attn_output))                         # [n, d]
            h = ops.rmsnorm(x, b.ffn_norm, hp.norm_eps)
            f = ops.glu(ops.matmul(h, b.ffn_gate), ops.matmul(h, b.ffn_up), "silu")  # [n, ff]
            x = ops.add(x, ops.matmul(f, b.ffn_down))                           # [n, d]
        if not all_logits:
            x = ops.last(x)                                                      # [1, d]
        x = ops.rmsnorm(x, self.output_norm, hp.norm_eps)
        return ops.matmul(x, self.output)                                        # [n | 1, vocab]
