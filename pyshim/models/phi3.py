"""Phi-3 (dense): pre-norm blocks with one fused q|k|v projection and one fused gate|up projection,
NeoX rope (possibly on only part of each head), SwiGLU. Like llama.cpp, the sliding window some
Phi-3 files declare is not applied. Files with LongRoPE factors use the short factors (contexts up to
the original training length)."""

from __future__ import annotations

from pyshim.models.common import layer_attn, layer_rope
from pyshim.models.ops import Ops
from pyshim.gguf.spec import ModelSpec


class Phi3Block:
    def __init__(self, hp: ModelSpec, ops: Ops, il: int):
        d = hp.n_embd
        p = f"blk.{il}."
        self.qkv_sizes = (hp.n_heads * hp.head_dim_k, hp.n_kv_heads * hp.head_dim_k, hp.n_kv_heads * hp.head_dim_v)
        self.attn_norm = ops.weight(p + "attn_norm.weight", (d,))
        self.attn_qkv = ops.weight(p + "attn_qkv.weight", (sum(self.qkv_sizes), d))
        self.attn_output = ops.weight(p + "attn_output.weight", (d, hp.n_heads * hp.head_dim_v))
        self.ffn_norm = ops.weight(p + "ffn_norm.weight", (d,))
        self.ffn_up = ops.weight(p + "ffn_up.weight", (2 * hp.n_ff, d))     # rows: gate, then up
        self.ffn_down = ops.weight(p + "ffn_down.weight", (d, hp.n_ff))
        self.rope = layer_rope(hp, il)
        self.attn = layer_attn(hp, il)


class Phi3:
    def __init__(self, hp: ModelSpec, ops: Ops):
        self.hp = hp
        self.token_embd = ops.weight("token_embd.weight", (hp.n_vocab, hp.n_embd))
        self.output_norm = ops.weight("output_norm.weight", (hp.n_embd,))
        tied = not ops.has_weight("output.weight")
        self.output = self.token_embd if tied else ops.weight("output.weight", (hp.n_vocab, hp.n_embd))
        short = "rope_factors_short.weight"
        self.rope_factors = ops.weight(short, (hp.rope.dims // 2,)) if ops.has_weight(short) else None
        self.blk = [Phi3Block(hp, ops, il) for il in range(hp.n_layers)]

    def forward(self, ops: Ops, tokens, positions, all_logits: bool = False):
        """tokens, positions [n] -> logits [n, vocab] (or [1, vocab], the last position's)."""
        hp = self.hp
        n = tokens.shape[0]
        x = ops.embed(self.token_embd, tokens)                                            # [n, d]
        for b in self.blk:
            h = ops.rmsnorm(x, b.attn_norm, hp.norm_eps)                                      # [n, d]
            q, k, v = ops.split(ops.matmul(h, b.attn_qkv), b.qkv_sizes)                  # [n, q | k | v]
            q = ops.rope(ops.view(q, (n, hp.n_heads, hp.head_dim_k)), positions, b.rope, self.rope_factors)
            k = ops.rope(ops.view(k, (n, hp.n_kv_heads, hp.head_dim_k)), positions, b.rope, self.rope_factors)
            v = ops.view(v, (n, hp.n_kv_heads, hp.head_dim_v))
            a = ops.attention(q, k, v, positions, b.attn)                                 # [n, Hq * hd_v]
            x = ops.add(x, ops.matmul(a, b.attn_output))                                  # [n, d]
            h = ops.rmsnorm(x, b.ffn_norm, hp.norm_eps)
            gate, up = ops.split(ops.matmul(h, b.ffn_up), (hp.n_ff, hp.n_ff))            # [n, ff] each
            x = ops.add(x, ops.matmul(ops.glu(gate, up, "silu"), b.ffn_down))            # [n, d]
        if not all_logits:
            x = ops.last(x)                                                               # [1, d]
        x = ops.rmsnorm(x, self.output_norm, hp.norm_eps)
        return ops.matmul(x, self.output)                                                 # [n | 1, vocab]
