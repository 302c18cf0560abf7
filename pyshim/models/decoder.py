"""The llama-family decoder, written once: SmolLM2, TinyLlama, Llama 2/3.x, Mistral and Mixtral (`llama`),
Qwen2 / Qwen2.5 (`qwen2`), Qwen3 (`qwen3`), Gemma 3 (`gemma3`), Phi-3 (`phi3`), the mixtures of
experts Qwen1.5/2-MoE (`qwen2moe`), Qwen3-MoE (`qwen3moe`) and OLMoE (`olmoe`), and Gemma 4 26B-A4B and
31B (`gemma4`).

Every one of them is pre-norm blocks of grouped-query attention and a gated feed-forward, RMSNorm
throughout, rope on q and k. What differs is a handful of switches, all read off the `ModelSpec` (which
reads them off the file's keys and tensor table):
- q, k, v as three projections or one fused `attn_qkv` (phi3), with or without biases (qwen2);
- RMSNorm on each head of q and k before rope (qwen3, gemma3);
- norms after the attention and feed-forward outputs, before the residual add (gemma3);
- q/k norms over the whole projection before the heads are split (olmoe);
- gate and up as two projections or one fused `ffn_up` holding [gate; up] (phi3);
- the feed-forward as a mixture of experts (any architecture with an expert_count): a router picks
  n_used of n_experts per token, their gated feed-forwards run on it and their outputs are summed by the
  router's weights (llama.cpp's build_moe_ffn); Qwen2-MoE adds a shared expert behind a sigmoid gate;
- SiLU or tanh-GELU gating (gemma3), token embeddings scaled (gemma3), final logits soft-capped (gemma3);
- gemma4: per-layer head sizes and KV heads (sliding vs full layers), values RMS-normed without a weight
  (and, where a layer has no attn_v, taken from the keys' projection), unscaled scores, a mixture's experts
  beside the dense MLP with their own norms and router input, per-expert output scales, and each layer's
  output scaled by `layer_output_scale`;
- per-pair rope frequency factors (`rope_freqs`: Llama 3.1+; `rope_factors_short`: Phi-3 LongRoPE, whose
  short factors serve contexts up to the original training length); rope pairing (normal for llama,
  NeoX for the others) and per-layer sliding windows come with each layer's RopeSpec and AttnSpec.

Like llama.cpp, the sliding window some Phi-3 files declare is not applied (pyshim.gguf.spec).
Attributes carry the GGUF tensor names, so binding needs no renaming table.
"""

from __future__ import annotations

from dataclasses import fields

from pyshim.gguf.spec import ModelSpec
from pyshim.models.key_scales import KeyScales
from pyshim.models.ops import AttnSpec, Ops, RouterSpec
from pyshim.models.rope import RopeSpec

ACTIVATION = {"silu": "silu", "gelu": "gelu_tanh"}     # ModelSpec.ffn_activation -> the ops' glu activation
FREQ_FACTOR_TENSORS = ("rope_freqs.weight", "rope_factors_short.weight")
_ROPE_FIELDS = tuple(f.name for f in fields(RopeSpec))


def layer_rope(spec: ModelSpec, il: int) -> RopeSpec:
    """The ops-facing rope settings of layer `il` (sliding-window layers have their own)."""
    params = spec.rope_for_layer(il)
    return RopeSpec(**{name: getattr(params, name) for name in _ROPE_FIELDS})


def layer_attn(spec: ModelSpec, il: int) -> AttnSpec:
    hd, hd_v = spec.head_dims(il)
    return AttnSpec(layer=il, n_heads=spec.n_heads, n_kv_heads=spec.kv_heads(il), head_dim=hd, head_dim_v=hd_v,
                    scale=spec.attn_scale, window=spec.sliding_window if spec.swa_layers[il] else 0,
                    softcap=spec.attn_logit_softcap or 0.0)


class Experts:
    """One layer's mixture of experts: the router, the 3-D expert tensors [n_experts, rows, cols] and the
    optional shared expert (a dense gated feed-forward whose output a sigmoid of `ffn_gate_inp_shexp` scales).
    Gemma 4's (`moe_beside_dense`): the router reads rms(x) / sqrt(d) * `ffn_gate_inp.scale`, each expert's
    output is scaled by `ffn_down_exps.scale`, and the experts' sum has norms of its own before and after."""

    def __init__(self, hp: ModelSpec, w):
        d, ff, e = hp.n_embd, hp.n_ff_expert, hp.n_experts
        self.router = RouterSpec(n_experts=e, n_used=hp.n_experts_used, gating=hp.expert_gating, norm=hp.expert_norm)
        self.ffn_gate_inp = w("ffn_gate_inp.weight", (e, d))
        self.beside_dense = hp.moe_beside_dense
        if self.beside_dense:
            self.ffn_gate_inp_scale = w("ffn_gate_inp.scale", (d,))
            self.ffn_down_exps_scale = w("ffn_down_exps.scale", (e,))
            self.pre_ffw_norm_2 = w("pre_ffw_norm_2.weight", (d,))
            self.post_ffw_norm_1 = w("post_ffw_norm_1.weight", (d,))
            self.post_ffw_norm_2 = w("post_ffw_norm_2.weight", (d,))
        self.fused = hp.fused_gate_up_exps
        if self.fused:
            self.ffn_gate_up_exps = w("ffn_gate_up_exps.weight", (e, 2 * ff, d))   # rows: gate, then up
        else:
            self.ffn_gate_exps = w("ffn_gate_exps.weight", (e, ff, d))
            self.ffn_up_exps = w("ffn_up_exps.weight", (e, ff, d))
        self.ffn_down_exps = w("ffn_down_exps.weight", (e, d, ff))
        self.shared = hp.n_ff_shared > 0
        if self.shared:
            self.ffn_gate_shexp = w("ffn_gate_shexp.weight", (hp.n_ff_shared, d))
            self.ffn_up_shexp = w("ffn_up_shexp.weight", (hp.n_ff_shared, d))
            self.ffn_down_shexp = w("ffn_down_shexp.weight", (d, hp.n_ff_shared))
            self.ffn_gate_inp_shexp = w("ffn_gate_inp_shexp.weight", (1, d))        # a 1-D vector, used as one row


class Block:
    """One layer's weights, bound by their GGUF names; absent parts are None."""

    def __init__(self, hp: ModelSpec, ops: Ops, il: int):
        d, (hd, hd_v), kv_heads = hp.n_embd, hp.head_dims(il), hp.kv_heads(il)
        p = f"blk.{il}."
        w = lambda name, shape: ops.weight(p + name, shape)                      # noqa: E731
        self.hd, self.hd_v, self.kv_heads = hd, hd_v, kv_heads
        self.q_out, self.kv_out, self.v_out = hp.n_heads * hd, kv_heads * hd, kv_heads * hd_v
        self.attn_norm = w("attn_norm.weight", (d,))
        # Gemma 4's full layers may have no attn_v: their values are the keys' projection (before its norm)
        self.v_is_k = bool(hp.keys_as_values) and hp.keys_as_values[il]
        if hp.fused_qkv:
            qkv = self.q_out + self.kv_out + self.v_out
            self.attn_qkv = w("attn_qkv.weight", (qkv, d))
            self.attn_qkv_bias = w("attn_qkv.bias", (qkv,)) if hp.qkv_bias else None
        elif self.v_is_k:
            self.attn_q, self.attn_k = ops.weights([(p + "attn_q.weight", (self.q_out, d)),
                                                    (p + "attn_k.weight", (self.kv_out, d))])
            self.attn_v = None
        else:
            # bound together: an executor may read all three in one pass
            self.attn_q, self.attn_k, self.attn_v = ops.weights([(p + "attn_q.weight", (self.q_out, d)),
                                                                 (p + "attn_k.weight", (self.kv_out, d)),
                                                                 (p + "attn_v.weight", (self.v_out, d))])
            self.attn_q_bias = w("attn_q.bias", (self.q_out,)) if hp.qkv_bias else None
            self.attn_k_bias = w("attn_k.bias", (self.kv_out,)) if hp.qkv_bias else None
            self.attn_v_bias = w("attn_v.bias", (self.v_out,)) if hp.qkv_bias else None
        self.attn_q_norm = w("attn_q_norm.weight", (self.q_out if hp.qk_norm_full else hd,)) if hp.qk_norm else None
        self.attn_k_norm = w("attn_k_norm.weight", (self.kv_out if hp.qk_norm_full else hd,)) if hp.qk_norm else None
        self.attn_output = w("attn_output.weight", (d, hp.n_heads * hd_v))
        self.post_attention_norm = w("post_attention_norm.weight", (d,)) if hp.post_norms else None
        self.ffn_norm = w("ffn_norm.weight", (d,))
        # (Gemma 4 decides per layer: a layer with a router is a mixture, beside its dense MLP)
        moe = hp.n_experts and (not hp.moe_beside_dense or ops.has_weight(p + "ffn_gate_inp.weight"))
        self.experts = Experts(hp, w) if moe else None
        if self.experts is None or hp.moe_beside_dense:
            if hp.fused_gate_up:
                self.ffn_up = w("ffn_up.weight", (2 * hp.n_ff, d))               # rows: gate, then up
                self.ffn_gate = None
            else:
                self.ffn_gate, self.ffn_up = ops.weights([(p + "ffn_gate.weight", (hp.n_ff, d)),
                                                          (p + "ffn_up.weight", (hp.n_ff, d))])
            self.ffn_down = w("ffn_down.weight", (d, hp.n_ff))
        self.post_ffw_norm = w("post_ffw_norm.weight", (d,)) if hp.post_norms else None
        # gemma4: the layer's output (the residual stream) scaled by a constant of the file
        self.out_scale = ops.scalar(p + "layer_output_scale.weight") if hp.layer_output_scale else None
        self.rope = layer_rope(hp, il)           # gemma3's local layers: their own base, no context scaling
        self.rope_factors = not hp.swa_layers[il] or hp.swa_rope_factors   # (gemma4: full layers only)
        self.attn = layer_attn(hp, il)
        self.key_scales: KeyScales | None = None  # a q8/q4 cache's (pyshim.models.key_scales; set by build_model)


class Decoder:
    def __init__(self, hp: ModelSpec, ops: Ops):
        self.hp = hp
        self.act = ACTIVATION[hp.ffn_activation]
        self.token_embd = ops.weight("token_embd.weight", (hp.n_vocab, hp.n_embd))
        self.output_norm = ops.weight("output_norm.weight", (hp.n_embd,))
        tied = not ops.has_weight("output.weight")
        self.output = self.token_embd if tied else ops.weight("output.weight", (hp.n_vocab, hp.n_embd))
        factors = next((name for name in FREQ_FACTOR_TENSORS if ops.has_weight(name)), None)
        self.rope_factors = ops.weight(factors, (hp.rope.dims // 2,)) if factors else None   # shared by all layers
        self.blk = [Block(hp, ops, il) for il in range(hp.n_layers)]
        # each block's next mixture of experts (whose router a mixture guesses at: guess_route)
        moe = [b.experts for b in self.blk]
        self.ahead = [next((e for e in moe[il + 1:] if e is not None), None) for il in range(hp.n_layers)]

    def forward(self, ops: Ops, tokens, positions, all_logits: bool = False):
        """tokens, positions [n] -> logits [n, vocab] (or [1, vocab], the last position's)."""
        hp = self.hp
        x = ops.embed(self.token_embd, tokens)                                         # [n, d]
        if hp.embedding_scale != 1.0:
            x = ops.scale(x, hp.embedding_scale)
        for b, ahead in zip(self.blk, self.ahead):  # each block adds its result to x (the skip connection)
            x = self.attention(ops, b, ops.rmsnorm(x, b.attn_norm, hp.norm_eps), positions, x)
            x = self.feed_forward(ops, b, ops.rmsnorm(x, b.ffn_norm, hp.norm_eps), x, ahead)
            if b.out_scale is not None:
                x = ops.scale(x, b.out_scale)
        if not all_logits:
            x = ops.last(x)                                                            # [1, d]
        logits = ops.matmul(ops.rmsnorm(x, self.output_norm, hp.norm_eps), self.output)  # [n | 1, vocab]
        if hp.final_logit_softcap:
            logits = ops.softcap(logits, hp.final_logit_softcap)
        return logits

    def attention(self, ops: Ops, b: Block, h, positions, x):
        """h [n, d] (normed) -> x + the attention block's output [n, d]."""
        hp = self.hp
        n = h.shape[0]
        if hp.fused_qkv:
            q, k, v = ops.split(ops.matmul(h, b.attn_qkv, b.attn_qkv_bias), (b.q_out, b.kv_out, b.v_out))
        elif b.v_is_k:
            q, k = ops.matmuls(h, (b.attn_q, b.attn_k), (None, None))
            v = k
        else:
            q, k, v = ops.matmuls(h, (b.attn_q, b.attn_k, b.attn_v), (b.attn_q_bias, b.attn_k_bias, b.attn_v_bias))
        if hp.qk_norm_full:                      # olmoe: each projection normed whole, then split into heads
            q, k = ops.rmsnorm(q, b.attn_q_norm, hp.norm_eps), ops.rmsnorm(k, b.attn_k_norm, hp.norm_eps)
        q = ops.view(q, (n, hp.n_heads, b.hd))                                        # [n, Hq, hd]
        k = ops.view(k, (n, b.kv_heads, b.hd))                                        # [n, Hkv, hd]
        v = ops.view(v, (n, b.kv_heads, b.hd_v))                                      # [n, Hkv, hd_v]
        if hp.v_norm:                            # gemma4: each value head RMS-normed, no weight
            v = ops.rmsnorm(v, None, hp.norm_eps)
        # keys divided pair by pair, queries multiplied (a q4 cache: then both turned by one orthonormal H):
        # the same dot products
        ks = b.key_scales
        qs, kscale, rot = (ks.q, ks.k, ks.rotation) if ks else (None, None, 0)
        factors = self.rope_factors if b.rope_factors else None
        q = ops.rope(self.head_norm(ops, q, b.attn_q_norm), positions, b.rope, factors, qs, rot)
        k = ops.rope(self.head_norm(ops, k, b.attn_k_norm), positions, b.rope, factors, kscale, rot)
        a = ops.attention(q, k, v, positions, b.attn)                                  # [n, Hq * hd_v]
        if b.post_attention_norm is None:
            return ops.matmul(a, b.attn_output, residual=x)                            # [n, d]
        return ops.rmsnorm(ops.matmul(a, b.attn_output), b.post_attention_norm, hp.norm_eps, residual=x)

    def head_norm(self, ops: Ops, x, w):
        """qwen3 and gemma3 norm each head of q and k before rope."""
        return x if w is None or self.hp.qk_norm_full else ops.rmsnorm(x, w, self.hp.norm_eps)

    def feed_forward(self, ops: Ops, b: Block, h, x, ahead: Experts | None = None):
        """h [n, d] (normed) -> x + the gated feed-forward's output [n, d]. `ahead`: the next layer's
        mixture of experts, whose choice a mixture here guesses at."""
        hp = self.hp
        if b.experts is not None and b.experts.beside_dense:     # gemma4: the dense MLP and the experts, each normed
            e = b.experts
            dense = ops.rmsnorm(self.dense(ops, b, h), e.post_ffw_norm_1, hp.norm_eps)
            route_in = ops.scale(ops.rmsnorm(x, e.ffn_gate_inp_scale, hp.norm_eps), hp.n_embd ** -0.5)
            experts = self.mixture(ops, e, ops.rmsnorm(x, e.pre_ffw_norm_2, hp.norm_eps), route_in, ahead)
            f = ops.add(dense, ops.rmsnorm(experts, e.post_ffw_norm_2, hp.norm_eps))
            return ops.rmsnorm(f, b.post_ffw_norm, hp.norm_eps, residual=x)
        if b.post_ffw_norm is not None:
            f = self.mixture(ops, b.experts, h, ahead=ahead) if b.experts is not None else self.dense(ops, b, h)
            return ops.rmsnorm(f, b.post_ffw_norm, hp.norm_eps, residual=x)
        if b.experts is not None:
            return ops.add(x, self.mixture(ops, b.experts, h, ahead=ahead))
        return self.dense(ops, b, h, x)

    def dense(self, ops: Ops, b: Block, h, x=None):
        """h [n, d] (normed) -> the gated feed-forward's output [n, d] (+ x)."""
        hp = self.hp
        if b.ffn_gate is None:
            gate, up = ops.split(ops.matmul(h, b.ffn_up), (hp.n_ff, hp.n_ff))         # [n, ff] each
            g = ops.glu(gate, up, self.act)
        else:
            g = ops.glu_matmul(h, b.ffn_gate, b.ffn_up, self.act)                      # [n, ff]
        return ops.matmul(g, b.ffn_down, residual=x)                                   # [n, ff] -> [n, d]

    def mixture(self, ops: Ops, x: Experts, h, route_in=None, ahead: Experts | None = None):
        """h [n, d] (normed) -> the experts' weighted sum [n, d] (+ the gated shared expert). The router
        reads `route_in` where the architecture feeds it something else (gemma4), else h; the `ahead`
        layer's router reads it too, a guess at that layer's experts."""
        scales = x.ffn_down_exps_scale if x.beside_dense else None
        r = h if route_in is None else route_in
        if ahead is not None:
            ops.guess_route(r, ahead.ffn_gate_inp, ahead.router)
        weights, ids = ops.route(ops.matmul(r, x.ffn_gate_inp), x.router, scales)      # [n, used] each
        if x.fused:
            gate, up = ops.split(ops.expert_matmul(h, x.ffn_gate_up_exps, ids), (self.hp.n_ff_expert,) * 2)
        else:
            gate, up = ops.expert_matmul(h, x.ffn_gate_exps, ids), ops.expert_matmul(h, x.ffn_up_exps, ids)
        y = ops.expert_matmul(ops.glu(gate, up, self.act), x.ffn_down_exps, ids)      # [n * used, d]
        out = ops.expert_sum(y, weights)                                               # [n, d]
        if x.shared:
            shared = ops.matmul(ops.glu(ops.matmul(h, x.ffn_gate_shexp), ops.matmul(h, x.ffn_up_shexp), self.act),
                                x.ffn_down_shexp)
            out = ops.add(out, ops.sigmoid_gate(shared, ops.matmul(h, x.ffn_gate_inp_shexp)))
        return out
