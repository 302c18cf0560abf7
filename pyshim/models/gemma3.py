"""Gemma 3 (text): embeddings scaled by sqrt(d); RMSNorm before and after both attention and FFN;
RMSNorm on each q and k head; 5 of every 6 layers attend within a sliding window and use their own
rope base; GELU(tanh) gated FFN; optional final logit softcap. The GGUF norm weights already
include Gemma's "+1", so they are plain RMSNorm weights here."""

from __future__ import annotations

from pyshim.models.common import layer_attn, layer_rope
from pyshim.models.ops import Ops
from pyshim.gguf.spec import ModelSpec


class Gemma3Block:
    def __init__(self, hp: ModelSpec, ops: Ops, il: int):
        d, hd = hp.n_embd, hp.head_dim_k
        p = f"blk.{il}."
        self.attn_norm = ops.weight(p + "attn_norm.weight", (d,))
        self.attn_q = ops.weight(p + "attn_q.weight", (hp.n_heads * hd, d))
        self.attn_k = ops.weight(p + "attn_k.weight", (hp.n_kv_heads * hd, d))
        self.attn_v = ops.weight(p + "attn_v.weight", (hp.n_kv_heads * hp.head_dim_v, d))
        self.attn_q_norm = ops.weight(p + "attn_q_norm.weight", (hd,))
        self.attn_k_norm = ops.weight(p + "attn_k_norm.weight", (hd,))
        self.attn_output = ops.weight(p + "attn_output.weight", (d, hp.n_heads * hp.head_dim_v))
        self.post_attention_norm = ops.weight(p + "post_attention_norm.weight", (d,))
        self.ffn_norm = ops.weight(p + "ffn_norm.weight", (d,))
        self.ffn_gate = ops.weight(p + "ffn_gate.weight", (hp.n_ff, d))
        self.ffn_up = ops.weight(p + "ffn_up.weight", (hp.n_ff, d))
        self.ffn_down = ops.weight(p + "ffn_down.weight", (d, hp.n_ff))
        self.post_ffw_norm = ops.weight(p + "post_ffw_norm.weight", (d,))
        self.rope = layer_rope(hp, il)           # local layers: base 10000; global: the file's base
        self.attn = layer_attn(hp, il)


class Gemma3:
    def __init__(self, hp: ModelSpec, ops: Ops):
        self.hp = hp
        self.token_embd = ops.weight("token_embd.weight", (hp.n_vocab, hp.n_embd))
        self.output_norm = ops.weight("output_norm.weight", (hp.n_embd,))
        tied = not ops.has_weight("output.weight")
        self.output = self.token_embd if tied else ops.weight("output.weight", (hp.n_vocab, hp.n_embd))
        self.blk = [Gemma3Block(hp, ops, il) for il in range(hp.n_layers)]

    def forward(self, ops: Ops, tokens, positions, all_logits: bool = False):
        """tokens, positions [n] -> logits [n, vocab] (or [1, vocab], the last position's)."""
        hp = self.hp
        n = tokens.shape[0]
        x = ops.scale(ops.embed(self.token_embd, tokens), hp.embedding_scale)          # [n, d]
        for b in self.blk:
            h = ops.rmsnorm(x, b.attn_norm, hp.norm_eps)                                      # [n, d]
            q = ops.view(ops.matmul(h, b.attn_q), (n, hp.n_heads, hp.head_dim_k))          # [n, Hq, hd]
            k = ops.view(ops.matmul(h, b.attn_k), (n, hp.n_kv_heads, hp.head_dim_k))       # [n, Hkv, hd]
            v = ops.view(ops.matmul(h, b.attn_v), (n, hp.n_kv_heads, hp.head_dim_v))
            q = ops.rope(ops.rmsnorm(q, b.attn_q_norm, hp.norm_eps), positions, b.rope)
            k = ops.rope(ops.rmsnorm(k, b.attn_k_norm, hp.norm_eps), positions, b.rope)
            a = ops.attention(q, k, v, positions, b.attn)                                 # [n, Hq * hd_v]
            a = ops.rmsnorm(ops.matmul(a, b.attn_output), b.post_attention_norm, hp.norm_eps)  # [n, d]
            x = ops.add(x, a)
            h = ops.rmsnorm(x, b.ffn_norm, hp.norm_eps)
            f = ops.glu(ops.matmul(h, b.ffn_gate), ops.matmul(h, b.ffn_up), "gelu_tanh")  # [n, ff]
            f = ops.rmsnorm(ops.matmul(f, b.ffn_down), b.post_ffw_norm, hp.norm_eps)          # [n, d]
            x = ops.add(x, f)
        if not all_logits:
            x = ops.last(x)                                                               # [1, d]
        x = ops.rmsnorm(x, self.output_norm, hp.norm_eps)
        logits = ops.matmul(x, self.output)                                               # [n | 1, vocab]
        if hp.final_logit_softcap:
            logits = ops.softcap(logits, hp.final_logit_softcap)
        return logits
