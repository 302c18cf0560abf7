"""Tiny random GGUF models, one per (architecture, tensor type), written with gguf's own writer.

They are small enough for fast tests (n_embd 256 — the K-quant block —, 2–3 layers, 320 tokens) yet
exercise every feature of each architecture: GQA, tied and separate output heads, q/k/v biases, q/k
norms, fused projections, partial rope, rope frequency factors, linear and YaRN rope scaling, Gemma's
sliding window (4 tokens, so a dozen tokens go past it) with its own rope base, Gemma 4's per-layer head
sizes and KV heads, weightless value norms and experts beside a dense MLP. The files are
deterministic (seeded), so llama.cpp's logits for them can be kept as fixtures: `FIXTURE` holds them,
written by tests/fixtures/make_tiny_logits.py, with each file's SHA-256 to prove it is the same model.

The vocabulary is a minimal SentencePiece-style one (unk, bos, eos, 256 byte tokens, filler pieces)
so llama.cpp accepts the files; tests feed token ids directly.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGML_QUANT_SIZES, GGUFWriter, quants

ARCHS = ("llama", "qwen2", "qwen3", "gemma3", "phi3")
# Mixtures of experts ("mixtral": a `llama` file with experts, Mixtral's layout); seeded after the dense ones
MOE_ARCHS = ("qwen2moe", "qwen3moe", "olmoe", "mixtral")
# Gemma 4 (`gemma4` files): dense like its 31B, and a mixture like its 26B-A4B ("gemma4moe"); seeded last
GEMMA4_ARCHS = ("gemma4", "gemma4moe")
ALL_ARCHS = ARCHS + MOE_ARCHS + GEMMA4_ARCHS
QTYPES = (QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q8_0, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.F16, QT.F32)
FIXTURE = Path(__file__).parent / "fixtures" / "tiny_llamacpp_logits.json"

N_EMBD = 256
N_HEADS = 4
N_KV_HEADS = 2
HEAD_DIM = 64
N_FF = 512
N_VOCAB = 320
N_EXPERTS = 8
N_FF_EXPERT = 256            # (a K-quant block: the down projection's rows are this long)
N_FF_SHARED = 256
EXPERTS_USED = {"qwen2moe": 4, "qwen3moe": 4, "olmoe": 3, "mixtral": 2, "gemma4moe": 2}
N_CTX = 64
BOS, EOS, UNK = 1, 2, 0
GEMMA_WINDOW = 4
GEMMA_SWA_LAYERS = (True, True, False)     # two local layers, then one global
GEMMA_SOFTCAP = 3.0
# Gemma 4: sliding layers' heads are half the size of the full layer's, which has one KV head (four, no
# grouping, on the sliding ones: their cache rows are twice the full layer's), no attn_v (its values are
# its keys' projection) and turns a quarter of its rope pairs
GEMMA4_HEAD_DIM = (64, 128)          # (sliding, full)
GEMMA4_KV_HEADS = (4, 1)
EPS = 1e-6
# the id sequence every fixture scores: BOS then 15 seeded ids (longer than Gemma's window)
SEQ_LEN = 16


def test_ids() -> list[int]:
    rng = np.random.default_rng(1234)
    return [BOS] + [int(i) for i in rng.integers(3, N_VOCAB, SEQ_LEN - 1)]


def _vocab(writer: GGUFWriter) -> None:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"\u2581w{i}" for i in range(N_VOCAB - len(tokens))]
    types = [2, 3, 3] + [6] * 256 + [1] * (N_VOCAB - 259)       # unknown, control, byte, normal
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * 259 + [-float(i) for i in range(N_VOCAB - 259)])
    writer.add_token_types(types)
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    writer.add_unk_token_id(UNK)
    writer.add_add_bos_token(True)


# K-quant blocks are written directly (gguf cannot quantize to them): random bytes, then the f16
# super-block scales set so the values are centred and have the wanted spread.
# type -> (byte offset of d, byte offset of dmin or None, dmin/d that centres the values)
_K_LAYOUT = {QT.Q4_K: (0, 2, 7.5), QT.Q5_K: (0, 2, 15.5), QT.Q6_K: (208, None, 0.0)}


def _k_quant(rng: np.random.Generator, rows: int, cols: int, qtype: QT, std: float) -> np.ndarray:
    per_block, block_bytes = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (rows * cols // per_block, block_bytes), dtype=np.uint8)
    d_at, dmin_at, centre = _K_LAYOUT[qtype]

    def set_scales(d: float) -> None:
        blocks[:, d_at:d_at + 2] = np.full(len(blocks), d, dtype=np.float16).view(np.uint8).reshape(-1, 2)
        if dmin_at is not None:
            blocks[:, dmin_at:dmin_at + 2] = np.full(len(blocks), d * centre, dtype=np.float16).view(np.uint8).reshape(-1, 2)

    set_scales(1.0)
    spread = float(quants.dequantize(blocks, qtype).std())
    set_scales(std / spread)
    return blocks.reshape(rows, -1)


def _matrix(rng, rows: int, cols: int, qtype: QT, std: float) -> np.ndarray:
    if qtype in _K_LAYOUT:
        return _k_quant(rng, rows, cols, qtype, std)
    values = (rng.standard_normal((rows, cols)) * std).astype(np.float32)
    if qtype == QT.F32:
        return values
    return quants.quantize(values, qtype)


def _norm(rng, n: int) -> np.ndarray:
    return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)


def _bias(rng, n: int) -> np.ndarray:
    return (0.1 * rng.standard_normal(n)).astype(np.float32)


def _add(writer: GGUFWriter, name: str, data: np.ndarray, qtype: QT) -> None:
    if data.dtype == np.uint8:
        writer.add_tensor(name, data, raw_dtype=qtype)
    else:
        writer.add_tensor(name, data)


def write_tiny_model(directory: str | Path, arch: str, qtype: QT, seed: int = 0, *, name: str | None = None,
                     arch_name: str | None = None, drop: frozenset[str] = frozenset(),
                     retype: dict[str, QT] | None = None, truncate: frozenset[str] = frozenset(), n_ctx: int = N_CTX,
                     keys: dict[str, int] | None = None) -> Path:
    """Write `tiny-{arch}-{type}.gguf` into `directory` and return its path (same bytes for the same args).

    For bad-input tests: `arch_name` writes another general.architecture; `drop` leaves tensors out;
    `retype` stores tensors in other types (raw bytes of the right size); `truncate` stores matrices one row short;
    `keys`: more `{arch}.*` integer keys.
    `n_ctx`: the training context the file declares (a long one lets a cache pass 4 GiB)."""
    path = Path(directory) / (name or f"tiny-{arch}-{qtype.name}.gguf")
    retype = retype or {}
    rng = np.random.default_rng([seed, ALL_ARCHS.index(arch), int(qtype)])
    gemma4 = arch in GEMMA4_ARCHS
    n_layers = len(GEMMA_SWA_LAYERS) if arch == "gemma3" or gemma4 else 2
    n_kv_heads = N_HEADS if arch == "olmoe" else N_KV_HEADS      # (llama.cpp's olmoe has no GQA: k_norm is n_embd wide)
    q_out, kv_out = N_HEADS * HEAD_DIM, n_kv_heads * HEAD_DIM
    moe = arch in MOE_ARCHS or arch == "gemma4moe"
    file_arch = {"mixtral": "llama", "gemma4moe": "gemma4"}.get(arch, arch)

    writer = GGUFWriter(path, arch_name or file_arch)
    writer.add_name("tiny random model")     # (llama.cpp special-cases vocabularies by names like "phi3")
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(n_layers)
    writer.add_feed_forward_length(N_FF_EXPERT if arch in ("olmoe", "mixtral") else N_FF)   # (their expert width)
    if moe:
        writer.add_expert_count(N_EXPERTS)
        writer.add_expert_used_count(EXPERTS_USED[arch])
        if arch in ("qwen2moe", "qwen3moe", "gemma4moe"):
            writer.add_expert_feed_forward_length(N_FF_EXPERT)
        if arch == "qwen2moe":
            writer.add_expert_shared_feed_forward_length(N_FF_SHARED)
    writer.add_head_count(N_HEADS)
    if gemma4:      # per layer: the sliding layers' KV heads, then the full layer's
        writer.add_array(f"{file_arch}.attention.head_count_kv",
                         [GEMMA4_KV_HEADS[not local] for local in GEMMA_SWA_LAYERS])
    else:
        writer.add_head_count_kv(n_kv_heads)
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_rope_freq_base(1_000_000.0 if arch == "gemma3" else 10000.0)
    if arch in ("llama", "mixtral"):
        writer.add_rope_scaling_factor(2.0)          # no type key: llama.cpp reads it as linear
    elif arch == "qwen3":
        from gguf import RopeScalingType
        writer.add_rope_scaling_type(RopeScalingType.YARN)
        writer.add_rope_scaling_factor(4.0)
        writer.add_rope_scaling_orig_ctx_len(16)
    elif arch == "gemma3":
        writer.add_key_length(HEAD_DIM)
        writer.add_value_length(HEAD_DIM)
        writer.add_sliding_window(GEMMA_WINDOW)
        writer.add_array(f"{arch}.attention.sliding_window_pattern", list(GEMMA_SWA_LAYERS))
        writer.add_float32(f"{arch}.final_logit_softcapping", GEMMA_SOFTCAP)
    elif arch == "phi3":
        writer.add_rope_dimension_count(HEAD_DIM // 2)     # rotate only half of each head
    elif gemma4:
        swa_hd, full_hd = GEMMA4_HEAD_DIM
        writer.add_key_length(full_hd)
        writer.add_value_length(full_hd)
        writer.add_uint32(f"{file_arch}.attention.key_length_swa", swa_hd)
        writer.add_uint32(f"{file_arch}.attention.value_length_swa", swa_hd)
        writer.add_rope_dimension_count(full_hd)
        writer.add_uint32(f"{file_arch}.rope.dimension_count_swa", swa_hd)
        writer.add_float32(f"{file_arch}.rope.freq_base_swa", 10000.0)
        writer.add_sliding_window(GEMMA_WINDOW)
        writer.add_array(f"{file_arch}.attention.sliding_window_pattern", list(GEMMA_SWA_LAYERS))
        writer.add_uint32(f"{file_arch}.embedding_length_per_layer_input", 0)
        # (no final_logit_softcapping key: llama.cpp's default, 30, applies)
    for key, value in (keys or {}).items():
        writer.add_uint32(f"{file_arch}.{key}", value)
    _vocab(writer)

    def put(name: str, data: np.ndarray) -> None:
        if name in drop:
            return
        if name in truncate:
            data = data[:-1]
        if name in retype:      # zeros of the right byte size in another type
            per_block, block_bytes = GGML_QUANT_SIZES[retype[name]]
            rows, cols = data.reshape(-1 if data.ndim == 2 else 1, data.shape[-1]).shape
            if data.dtype == np.uint8:          # quant blocks: count the elements they hold
                cols = cols // GGML_QUANT_SIZES[qtype][1] * GGML_QUANT_SIZES[qtype][0]
            writer.add_tensor(name, np.zeros((rows, cols // per_block * block_bytes), np.uint8), raw_dtype=retype[name])
            return
        _add(writer, name, data, qtype)

    def mat(name: str, rows: int, cols: int) -> None:
        put(name, _matrix(rng, rows, cols, qtype, cols ** -0.5))

    if gemma4:
        _gemma4_tensors(rng, put, qtype, arch)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return path
    # gemma3 and qwen3 tie the output head to the embeddings: smaller embeddings keep the logits at
    # unit scale and stop the last input token from always winning through the residual stream
    tied = arch in ("qwen3", "gemma3")
    # (Gemma scales embeddings by sqrt(d) and normalizes each layer's output: smaller still)
    embd_std = (0.2 if arch == "gemma3" else 1.0) * N_EMBD ** -0.5 if tied else 1.0
    put("token_embd.weight", _matrix(rng, N_VOCAB, N_EMBD, qtype, embd_std))
    put("output_norm.weight", _norm(rng, N_EMBD) * (5.0 if arch == "gemma3" else 1.0))
    if not tied:
        mat("output.weight", N_VOCAB, N_EMBD)
    if arch == "llama":
        put("rope_freqs.weight", (1.0 + 3.0 * rng.random(HEAD_DIM // 2)).astype(np.float32))
    for il in range(n_layers):
        p = f"blk.{il}."
        put(p + "attn_norm.weight", _norm(rng, N_EMBD))
        if arch == "phi3":
            mat(p + "attn_qkv.weight", q_out + 2 * kv_out, N_EMBD)
        else:
            mat(p + "attn_q.weight", q_out, N_EMBD)
            mat(p + "attn_k.weight", kv_out, N_EMBD)
            mat(p + "attn_v.weight", kv_out, N_EMBD)
        if arch in ("qwen2", "qwen2moe"):
            put(p + "attn_q.bias", _bias(rng, q_out))
            put(p + "attn_k.bias", _bias(rng, kv_out))
            put(p + "attn_v.bias", _bias(rng, kv_out))
        if arch in ("qwen3", "gemma3", "qwen3moe"):
            put(p + "attn_q_norm.weight", _norm(rng, HEAD_DIM))
            put(p + "attn_k_norm.weight", _norm(rng, HEAD_DIM))
        if arch == "olmoe":                      # normed over the whole projection
            put(p + "attn_q_norm.weight", _norm(rng, q_out))
            put(p + "attn_k_norm.weight", _norm(rng, kv_out))
        mat(p + "attn_output.weight", N_EMBD, q_out)
        put(p + "ffn_norm.weight", _norm(rng, N_EMBD))
        if moe:
            _experts(rng, put, p, arch, qtype)
        elif arch == "phi3":
            mat(p + "ffn_up.weight", 2 * N_FF, N_EMBD)
        else:
            mat(p + "ffn_gate.weight", N_FF, N_EMBD)
            mat(p + "ffn_up.weight", N_FF, N_EMBD)
        if not moe:
            mat(p + "ffn_down.weight", N_EMBD, N_FF)
        if arch == "gemma3":
            put(p + "post_attention_norm.weight", _norm(rng, N_EMBD))
            put(p + "post_ffw_norm.weight", _norm(rng, N_EMBD))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _gemma4_tensors(rng, put, qtype: QT, arch: str) -> None:
    """Gemma 4's tensors: tied embeddings, rope_freqs for the full layer (its first quarter of pairs turn,
    the rest are held by 1e30), per-layer head sizes, and for the mixture every layer's experts beside
    its dense MLP, with the router's input scale and per-expert output scales (F32, as converters keep them)."""
    swa_hd, full_hd = GEMMA4_HEAD_DIM

    def mat(name: str, rows: int, cols: int) -> None:
        put(name, _matrix(rng, rows, cols, qtype, cols ** -0.5))

    put("token_embd.weight", _matrix(rng, N_VOCAB, N_EMBD, qtype, 0.2 * N_EMBD ** -0.5))
    put("output_norm.weight", _norm(rng, N_EMBD) * 5.0)
    quarter = full_hd // 2 // 4
    put("rope_freqs.weight", np.array([1.0] * quarter + [1e30] * (full_hd // 2 - quarter), np.float32))
    for il, local in enumerate(GEMMA_SWA_LAYERS):
        p = f"blk.{il}."
        hd, kv = (swa_hd, GEMMA4_KV_HEADS[0]) if local else (full_hd, GEMMA4_KV_HEADS[1])
        put(p + "attn_norm.weight", _norm(rng, N_EMBD))
        mat(p + "attn_q.weight", N_HEADS * hd, N_EMBD)
        mat(p + "attn_k.weight", kv * hd, N_EMBD)
        if local:                                # the full layer's values are its keys' projection
            mat(p + "attn_v.weight", kv * hd, N_EMBD)
        # (scores are not scaled by 1/sqrt(hd): norm weights of hd^-1/4 keep q.k near unit scale, as trained
        # ones do, instead of a softmax so sharp that any rounding decides it)
        put(p + "attn_q_norm.weight", _norm(rng, hd) * hd ** -0.25)
        put(p + "attn_k_norm.weight", _norm(rng, hd) * hd ** -0.25)
        mat(p + "attn_output.weight", N_EMBD, N_HEADS * hd)
        put(p + "post_attention_norm.weight", _norm(rng, N_EMBD))
        put(p + "ffn_norm.weight", _norm(rng, N_EMBD))
        mat(p + "ffn_gate.weight", N_FF, N_EMBD)
        mat(p + "ffn_up.weight", N_FF, N_EMBD)
        mat(p + "ffn_down.weight", N_EMBD, N_FF)
        put(p + "post_ffw_norm.weight", _norm(rng, N_EMBD))
        if arch == "gemma4moe":
            put(p + "ffn_gate_inp.weight", (rng.standard_normal((N_EXPERTS, N_EMBD)) * 2.0).astype(np.float32))
            put(p + "ffn_gate_inp.scale", _norm(rng, N_EMBD))
            put(p + "pre_ffw_norm_2.weight", _norm(rng, N_EMBD))
            put(p + "post_ffw_norm_1.weight", _norm(rng, N_EMBD))
            put(p + "post_ffw_norm_2.weight", _norm(rng, N_EMBD))
            mat3 = lambda rows, cols: np.stack([_matrix(rng, rows, cols, qtype, cols ** -0.5)   # noqa: E731
                                                for _ in range(N_EXPERTS)])
            put(p + "ffn_gate_up_exps.weight", mat3(2 * N_FF_EXPERT, N_EMBD))     # rows: gate, then up
            put(p + "ffn_down_exps.weight", mat3(N_EMBD, N_FF_EXPERT))
            put(p + "ffn_down_exps.scale", (0.5 + rng.random(N_EXPERTS)).astype(np.float32))
        put(p + "layer_output_scale.weight", np.array([0.5 + rng.random()], np.float32))


def _experts(rng, put, p: str, arch: str, qtype: QT) -> None:
    """A layer's router (F32, as converters keep it; spread so each token prefers a few experts clearly),
    3-D expert tensors [experts, rows, cols] and, for qwen2moe, the gated shared expert."""
    put(p + "ffn_gate_inp.weight", (rng.standard_normal((N_EXPERTS, N_EMBD)) * 2.0 * N_EMBD ** -0.5).astype(np.float32))

    def experts(name: str, rows: int, cols: int) -> None:
        blocks = [_matrix(rng, rows, cols, qtype, cols ** -0.5) for _ in range(N_EXPERTS)]
        put(p + name, np.stack(blocks))

    experts("ffn_gate_exps.weight", N_FF_EXPERT, N_EMBD)
    experts("ffn_up_exps.weight", N_FF_EXPERT, N_EMBD)
    experts("ffn_down_exps.weight", N_EMBD, N_FF_EXPERT)
    if arch == "qwen2moe":
        for name, rows, cols in (("ffn_gate_shexp", N_FF_SHARED, N_EMBD), ("ffn_up_shexp", N_FF_SHARED, N_EMBD),
                                 ("ffn_down_shexp", N_EMBD, N_FF_SHARED)):
            put(p + name + ".weight", _matrix(rng, rows, cols, qtype, cols ** -0.5))
        put(p + "ffn_gate_inp_shexp.weight", (rng.standard_normal(N_EMBD) * N_EMBD ** -0.5).astype(np.float32))


def sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
