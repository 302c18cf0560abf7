"""Llama-family decoder (SmolLM2, TinyLlama, Llama 2/3.x, Mistral): pre-norm blocks with RMSNorm,
grouped-query attention with normal (adjacent-pair) rope, SwiGLU feed-forward, optional tied output."""

from __future__ import annotations

from pyshim.models.common import layer_attn, layer_rope
from pyshim.models.ops import Ops
from pyshim.gguf.spec import ModelSpec


class LlamaBlock:
    def __init__(self, hp: ModelSpec, ops: Ops, il: int):
        d, q_out, kv_out = hp.n_embd, hp.n_heads * hp.head_dim_k, hp.n_kv_heads * hp.head_dim_k
        p = f"blk.{il}."
        self.attn_norm = ops.weight(p + "attn_norm.weight", (d,))
        self.attn_q = ops.weight(p + "attn_q.weight", (q_out, d))
        self.attn_k = ops.weight(p + "attn_k.weight", (kv_out, d))
        self.attn_v = ops.weight(p + "attn_v.weight", (hp.n_kv_heads * hp.head_dim_v, d))
        self.attn_output = ops.weight(p + "attn_output.weight", (d, hp.n_heads * hp.head_dim_v))
        self.ffn_norm = ops.weight(p + "ffn_norm.weight", (d,))
        self.ffn_gate = ops.weight(p + "ffn_gate.weight", (hp.n_ff, d))
        self.ffn_up = ops.weight(p + "ffn_up.weight", (hp.n_ff, d))
        self.ffn_down = ops.weight(p + "ffn_down.weight", (d, hp.n_ff))
        self.rope = layer_rope(hp, il)
        self.attn = layer_attn(hp, il)


class Llama:
    block = LlamaBlock      # subclasses (qwen2, qwen3) bind extra per-layer weights

    def __init__(self, hp: ModelSpec, ops: Ops):
        self.hp = hp
        self.token_embd = ops.weight("token_embd.weight", (hp.n_vocab, hp.n_embd))
        self.output_norm = ops.weight("output_norm.weight", (hp.n_embd,))
        tied = not ops.has_weight("output.weight")
        self.output = self.token_embd if tied else ops.weight("output.weight", (hp.n_vocab, hp.n_embd))
        # Llama 3.1+: per-pair rope frequency factors, one tensor shared by all layers
        self.rope_freqs = ops.weight("rope_freqs.weight", (hp.rope.dims // 2,)) if ops.has_weight("rope_freqs.weight") else None
        self.blk = [self.block(hp, ops, il) for il in range(hp.n_layers)]

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
            q = ops.rope(q, positions, b.rope, self.rope_freqs)
            k = ops.rope(k, positions, b.rope, self.rope_freqs)
            a = ops.attention(q, k, v, positions, b.attn)                        # [n, Hq * hd_v]
            x = ops.add(x, ops.matmul(a, b.attn_output))                         # [n, d]
            h = ops.rmsnorm(x, b.ffn_norm, hp.norm_eps)
            f = ops.glu(ops.matmul(h, b.ffn_gate), ops.matmul(h, b.ffn_up), "silu")  # [n, ff]
            x = ops.add(x, ops.matmul(f, b.ffn_down))                           # [n, d]
        if not all_logits:
            x = ops.last(x)                                                      # [1, d]
        x = ops.rmsnorm(x, self.output_norm, hp.norm_eps)
        return ops.matmul(x, self.output)                                        # [n | 1, vocab]
