"""Full-size synthetic GGUFs: a real model's shape and tokenizer, random quantized weights.

No package here ships multi-GB weights, so size and speed are checked on files with a real model's
hyperparameters, the `tokenizer.*` keys copied from a shipped GGUF or one of llama.cpp's test vocabularies
(a real vocabulary: prompts tokenize as they would) with the family's chat template, and random Q4_0
blocks, or llama.cpp's Q4_K_M mix of K-quants. The weights are kept zero-mean (nibbles 1..15, never 0: nibbles
0..15 give every weight a mean of -d/2, the residual stream grows a common-mode part and every position
predicts the same token) with a scale of ~1/(4.3 sqrt(fan_in)) per weight, so activations stay at unit
scale through the layers. llama.cpp loads such files, so they are checked against it like real ones.

Files are written tensor by tensor (a 4 GB model never sits in memory) and are deterministic per
(shape, seed). Used by `pyshim bench` and the marked full-size tests; cached under models/synthetic/.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from pyshim.paths import MODELS_DIR

SYNTHETIC_DIR = MODELS_DIR / "synthetic"
Q4_0_BLOCK, Q4_0_BYTES = 32, 18
ROUTER_STD = 2.0           # router logits' spread (in units of 1/sqrt(n_embd) per weight): each token prefers a few experts


@dataclass(frozen=True)
class Shape:
    """A model's hyperparameters, as the GGUF keys of its architecture say them."""
    arch: str
    tokenizer_from: str          # whose tokenizer.* keys are copied: a catalog model, or llama.cpp:VOCAB (catalog.tokenizer_file)
    n_layers: int
    n_embd: int
    n_heads: int
    n_kv_heads: int
    n_ff: int                    # dense width (MoE: the expert width, for archs that read it from here)
    context: int
    rope_base: float = 10000.0
    eps: float = 1e-5
    n_experts: int = 0
    n_experts_used: int = 0
    qk_norm: str = ""            # "head" (per head) or "full" (olmoe: over the whole projection)
    tied: bool = False
    keys: dict = field(default_factory=dict)     # more `{arch}.*` keys, as {"rope.scaling.factor": 8.0}
    key_length: int = 0          # heads' size where it is not n_embd / n_heads (Gemma 3: 256), written as keys
    # post_attention_norm / post_ffw_norm after each block (Gemma 3), all weights this value (0: none). At 1 the
    # layers' unit-scale outputs (sum ~sqrt(2 n_layers)) stay below the sqrt(n_embd)-scaled tied embedding's
    # self-similarity and a Gemma-3-4B shape predicts its input token at 93% of positions; at 4 they outweigh it
    post_norms: float = 0.0
    fused: bool = False          # attn_qkv, and ffn_up holding [gate; up] (Phi-3)
    rope_factors: str = ""       # "llama3": a rope_freqs tensor (Llama 3.1+); "longrope": rope_factors_long/short (Phi-3)
    chat_template: str = ""      # a llama.cpp test template (pyshim.setup.llamacpp_vocabs) over the tokenizer's own
    tokenizer_keys: dict = field(default_factory=dict)   # tokenizer.* keys set over the tokenizer's own

    @property
    def head_dim(self) -> int:
        return self.key_length or self.n_embd // self.n_heads


# By the name a test or `pyshim bench --synthetic` asks for.
SHAPES: dict[str, Shape] = {
    # OLMoE-1B-7B: 64 experts, 8 per token, ~1.3B active parameters of 6.9B (its own vocabulary is GPT-NeoX's
    # 50k; SmolLM2's 49k GPT-2-style one stands in for it)
    "olmoe-1b-7b": Shape(arch="olmoe", tokenizer_from="smollm2", n_layers=16, n_embd=2048, n_heads=16, n_kv_heads=16,
                         n_ff=1024, context=4096, n_experts=64, n_experts_used=8, qk_norm="full"),
    # SmolLM2-135M's shape at Q4_0 (the shipped file is Q4_1): the small model, where on a real GPU a decode
    # step's CPU side is most of its time, for machines that cannot take the 98 MB file along
    "smollm2-135m": Shape(arch="llama", tokenizer_from="smollm2", n_layers=30, n_embd=576, n_heads=9, n_kv_heads=3,
                          n_ff=1536, context=8192, rope_base=1e5, tied=True),
    # Qwen2.5-1.5B's dense shape (tied embeddings; without its q/k/v biases): the mid-size dense case
    "qwen2.5-1.5b": Shape(arch="qwen2", tokenizer_from="qwen2.5", n_layers=28, n_embd=1536, n_heads=12, n_kv_heads=2,
                          n_ff=8960, context=32768, rope_base=1e6, eps=1e-6, tied=True),
    # Qwen2.5-7B's dense shape (4.3 GB at Q4_0; without its q/k/v biases), the real Qwen2.5 tokenizer: the
    # model layer streaming is measured on (`pyshim bench --stream --models qwen2.5-7b`)
    "qwen2.5-7b": Shape(arch="qwen2", tokenizer_from="qwen2.5", n_layers=28, n_embd=3584, n_heads=28, n_kv_heads=4,
                        n_ff=18944, context=32768, rope_base=1e6, eps=1e-6),
    # Llama-3.2-1B(-Instruct): Llama 3's 128k BPE vocabulary (llama.cpp's llama-bpe test vocabulary) and 3.2's
    # chat template, whose turns end at <|eot_id|>; rope at 500000 with the Llama 3.1 frequency factors
    # (factor 32, low/high 1/4, original context 8192) as a rope_freqs tensor; tied embeddings. 1.24B parameters.
    "llama3.2-1b": Shape(arch="llama", tokenizer_from="llama.cpp:llama-bpe", n_layers=16, n_embd=2048, n_heads=32,
                         n_kv_heads=8, n_ff=8192, context=131072, rope_base=5e5, tied=True, rope_factors="llama3",
                         chat_template="meta-llama-Llama-3.2-3B-Instruct",
                         tokenizer_keys={"tokenizer.ggml.eos_token_id": 128009}),
    # Gemma-3-4B's text model: the real Gemma 3 vocabulary (262k, the shipped 270M's), 256-wide heads, five
    # 1024-token sliding-window layers to one global, linear rope scaling 8 on the global layers, norms after
    # each block as well as before; tied embeddings. 3.9B parameters.
    "gemma3-4b": Shape(arch="gemma3", tokenizer_from="gemma3", n_layers=34, n_embd=2560, n_heads=8, n_kv_heads=4,
                       n_ff=10240, context=131072, rope_base=1e6, eps=1e-6, key_length=256, qk_norm="head",
                       post_norms=4.0, tied=True,
                       keys={"attention.sliding_window": 1024, "rope.scaling.type": "linear", "rope.scaling.factor": 8.0}),
    # Phi-3.5-mini(-instruct): Phi-3's SentencePiece vocabulary (llama.cpp's phi-3 test vocabulary) and 3.5's
    # chat template, fused q/k/v and gate/up matrices (attn_qkv at Q5_K in the Q4_K_M mix, as llama.cpp gives
    # it), LongRoPE from a 4096 original context (rope_factors_long/short; the factors here are smooth ramps,
    # not Phi-3.5's own). 3.8B parameters.
    "phi3.5-mini": Shape(arch="phi3", tokenizer_from="llama.cpp:phi-3", n_layers=32, n_embd=3072, n_heads=32,
                         n_kv_heads=32, n_ff=8192, context=131072, fused=True, rope_factors="longrope",
                         chat_template="microsoft-Phi-3.5-mini-instruct",
                         keys={"rope.scaling.original_context_length": 4096, "rope.dimension_count": 96,
                               "rope.scaling.attn_factor": float(np.sqrt(1 + np.log(32) / np.log(4096)))}),
}


# The weights' types: all Q4_0, or llama.cpp's Q4_K_M mix (`<shape>-q4_k_m`): Q4_K, with Q6_K for the output
# head (the embedding table when it is tied) and for attn_v and ffn_down in the layers llama.cpp gives more
# bits (the first and last eighth, and every third between); a matrix whose rows are not whole 256-value
# blocks stays Q4_0 (llama.cpp falls back too).
QUANTS = ("q4_0", "q4_k_m")
FILE_TYPE = {"q4_0": 2, "q4_k_m": 15}           # LLAMA_FTYPE_MOSTLY_Q4_0, _Q4_K_M
Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES, QK_K = 144, 176, 210, 256


def split_name(name: str) -> tuple[str, str]:
    """`qwen2.5-7b-q4_k_m` -> ("qwen2.5-7b", "q4_k_m"); a bare shape name is Q4_0."""
    for quant in QUANTS:
        if name.endswith("-" + quant):
            return name[: -len(quant) - 1], quant
    return name, "q4_0"


def is_known(name: str) -> bool:
    return split_name(name)[0] in SHAPES


def path_for(name: str, seed: int = 0) -> Path:
    shape, quant = split_name(name)
    return SYNTHETIC_DIR / f"{shape}-{quant.upper()}-s{seed}.gguf"


def _q4_0(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Random zero-mean Q4_0 blocks for a [rows, cols] matrix: uint8 [rows, cols / 32 * 18]."""
    nb = cols // Q4_0_BLOCK
    blocks = np.empty((rows, nb, Q4_0_BYTES), np.uint8)
    d = np.float16(1.0 / (4.3 * np.sqrt(cols)))
    blocks[:, :, 0:2] = np.frombuffer(d.tobytes(), np.uint8)
    lo = rng.integers(1, 16, (rows, nb, 16), dtype=np.uint8)
    hi = rng.integers(1, 16, (rows, nb, 16), dtype=np.uint8)
    blocks[:, :, 2:] = lo | (hi << 4)
    return blocks.reshape(rows, nb * Q4_0_BYTES)


def _q4_k(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Random zero-mean Q4_K blocks: every sub-block's 6-bit scale 32 and min 60 with dmin = 4 d, so that
    d*32*q - dmin*60 has mean 0 over nibbles 0..15, at Q4_0's spread per weight."""
    nb = cols // QK_K
    blocks = np.empty((rows, nb, Q4_K_BYTES), np.uint8)
    d = 1.0 / (4.3 * np.sqrt(cols)) * np.sqrt(56 / 3) / (32 * np.sqrt(255 / 12))
    _k_head(blocks, d, 4 * d, 60)
    blocks[:, :, 16:] = rng.integers(0, 256, (rows, nb, 128), dtype=np.uint8)
    return blocks.reshape(rows, nb * Q4_K_BYTES)


def _k_head(blocks: np.ndarray, d: float, dmin: float, m: int) -> None:
    """Q4_K's and Q5_K's first 16 bytes in every block: d, dmin (f16), every sub-block's scale 32 and min `m`
    in 6 bits each (ggml's get_scale_min_k4 layout, written the other way)."""
    blocks[:, :, 0:2] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
    blocks[:, :, 2:4] = np.frombuffer(np.float16(dmin).tobytes(), np.uint8)
    sc, mins = np.full(8, 32, np.uint8), np.full(8, m, np.uint8)
    packed = np.empty(12, np.uint8)
    packed[0:4] = (sc[:4] & 63) | ((sc[4:] >> 4) << 6)
    packed[4:8] = (mins[:4] & 63) | ((mins[4:] >> 4) << 6)
    packed[8:12] = (sc[4:] & 0xF) | ((mins[4:] & 0xF) << 4)
    blocks[:, :, 4:16] = packed


def _q6_k(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Random zero-mean Q6_K blocks: 6-bit values 1..63 (never 0: centred on 32), every scale 64."""
    nb = cols // QK_K
    q = rng.integers(1, 64, (4, rows, nb, 64), dtype=np.uint8)      # the four values each (ql, qh) byte pair holds
    blocks = np.empty((rows, nb, Q6_K_BYTES), np.uint8)
    blocks[:, :, 0:64] = (q[0] & 0xF) | ((q[2] & 0xF) << 4)                  # ql: low nibbles
    blocks[:, :, 64:128] = (q[1] & 0xF) | ((q[3] & 0xF) << 4)
    qh = (q[0] >> 4) | ((q[1] >> 4) << 2) | ((q[2] >> 4) << 4) | ((q[3] >> 4) << 6)
    blocks[:, :, 128:192] = qh[:, :, :64]                                     # qh: the high 2 bits, 4 a byte
    blocks[:, :, 192:208] = 64                                                # int8 scales
    d = 1.0 / (4.3 * np.sqrt(cols)) * np.sqrt(56 / 3) / (64 * np.sqrt((63 ** 2 - 1) / 12))
    blocks[:, :, 208:210] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
    return blocks.reshape(rows, nb * Q6_K_BYTES)


def _q5_k(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Random zero-mean Q5_K blocks (llama.cpp gives Phi-3's attn_qkv Q5_K in the Q4_K_M mix): 5-bit values
    0..31 from random bytes, every sub-block's scale 32 and min 62 with dmin = 8 d (d*32*q - dmin*62 has mean 0),
    at Q4_0's spread per weight."""
    nb = cols // QK_K
    blocks = np.empty((rows, nb, Q5_K_BYTES), np.uint8)
    d = 1.0 / (4.3 * np.sqrt(cols)) * np.sqrt(56 / 3) / (32 * np.sqrt(1023 / 12))
    _k_head(blocks, d, 8 * d, 62)
    blocks[:, :, 16:] = rng.integers(0, 256, (rows, nb, Q5_K_BYTES - 16), dtype=np.uint8)   # qh (32), qs (128)
    return blocks.reshape(rows, nb * Q5_K_BYTES)


def _rope_factors(s: Shape) -> dict[str, np.ndarray]:
    """The rope frequency-factor tensors of `s` (f32, one per rotated pair): Llama 3.1's from its scaling
    rule (factor 32, low/high frequency factors 1 and 4, original context 8192), as converters write them;
    LongRoPE's as smooth ramps (short 1 -> 1.1, long 1 -> 40), Phi-3.5's kind of curve but not its values."""
    pairs = s.head_dim // 2
    if s.rope_factors == "llama3":
        factor, low, high, old_ctx = 32.0, 1.0, 4.0, 8192
        freqs = s.rope_base ** (-np.arange(0, s.head_dim, 2, dtype=np.float64) / s.head_dim)
        wavelen = 2 * np.pi / freqs
        smooth = (old_ctx / wavelen - low) / (high - low)
        out = np.where(wavelen < old_ctx / high, 1.0,
                       np.where(wavelen > old_ctx / low, factor, 1 / ((1 - smooth) / factor + smooth)))
        return {"rope_freqs.weight": out.astype(np.float32)}
    if s.rope_factors == "longrope":
        ramp = np.linspace(0.0, 1.0, pairs)
        return {"rope_factors_long.weight": (40.0 ** ramp).astype(np.float32),
                "rope_factors_short.weight": (1.0 + 0.1 * ramp ** 2).astype(np.float32)}
    return {}


def _more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth of the layers, and every third between."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def _type_of(tname: str, kind: str, cols: int, quant: str, n_layers: int, tied: bool) -> str:
    """A matrix's type under `quant`: "q4_0", "q4_k", "q5_k" or "q6_k" (norms, router and rope factors stay f32)."""
    if kind not in ("q4", "q4e") or quant == "q4_0" or cols % QK_K:
        return "q4_0" if kind in ("q4", "q4e") else kind
    if tname.endswith(".attn_qkv.weight"):
        return "q5_k"
    head = tname == "output.weight" or (tied and tname == "token_embd.weight")
    more = tname.startswith("blk.") and tname.split(".")[2] in ("attn_v", "ffn_down", "ffn_down_exps") \
        and _more_bits(int(tname.split(".")[1]), n_layers)
    return "q6_k" if head or more else "q4_k"


def _tensors(s: Shape, n_vocab: int) -> Iterator[tuple[str, tuple[int, ...], str]]:
    """(name, NumPy-order shape, kind) of every tensor, in file order; kind: q4 (a matrix), q4e (experts), norm,
    post_norm, router, factors (a rope factor tensor)."""
    d, hd = s.n_embd, s.head_dim
    q_out, kv_out = s.n_heads * hd, s.n_kv_heads * hd
    yield "token_embd.weight", (n_vocab, d), "q4"
    yield "output_norm.weight", (d,), "norm"
    if not s.tied:
        yield "output.weight", (n_vocab, d), "q4"
    for name, values in _rope_factors(s).items():
        yield name, values.shape, "factors"
    for il in range(s.n_layers):
        p = f"blk.{il}."
        yield p + "attn_norm.weight", (d,), "norm"
        if s.fused:
            yield p + "attn_qkv.weight", (q_out + 2 * kv_out, d), "q4"
        else:
            yield p + "attn_q.weight", (q_out, d), "q4"
            yield p + "attn_k.weight", (kv_out, d), "q4"
            yield p + "attn_v.weight", (kv_out, d), "q4"
        if s.qk_norm:
            yield p + "attn_q_norm.weight", ((q_out if s.qk_norm == "full" else hd),), "norm"
            yield p + "attn_k_norm.weight", ((kv_out if s.qk_norm == "full" else hd),), "norm"
        yield p + "attn_output.weight", (d, q_out), "q4"
        if s.post_norms:
            yield p + "post_attention_norm.weight", (d,), "post_norm"
        yield p + "ffn_norm.weight", (d,), "norm"
        if s.fused:
            yield p + "ffn_up.weight", (2 * s.n_ff, d), "q4"
            yield p + "ffn_down.weight", (d, s.n_ff), "q4"
        elif s.n_experts:
            yield p + "ffn_gate_inp.weight", (s.n_experts, d), "router"
            yield p + "ffn_gate_exps.weight", (s.n_experts, s.n_ff, d), "q4e"
            yield p + "ffn_up_exps.weight", (s.n_experts, s.n_ff, d), "q4e"
            yield p + "ffn_down_exps.weight", (s.n_experts, d, s.n_ff), "q4e"
        else:
            yield p + "ffn_gate.weight", (s.n_ff, d), "q4"
            yield p + "ffn_up.weight", (s.n_ff, d), "q4"
            yield p + "ffn_down.weight", (d, s.n_ff), "q4"
        if s.post_norms:
            yield p + "post_ffw_norm.weight", (d,), "post_norm"


_VOCAB: dict[str, list] = {}


def _tokenizer_fields(path: Path) -> list:
    """The `tokenizer.*` fields of a shipped GGUF, as (key, value, type, sub_type) for GGUFWriter."""
    name = str(path)
    if name not in _VOCAB:
        from gguf import GGUFReader, GGUFValueType

        reader = GGUFReader(path)
        fields = []
        for key, f in reader.fields.items():
            if not key.startswith("tokenizer."):
                continue
            vtype = GGUFValueType(f.types[0])
            sub = GGUFValueType(f.types[1]) if vtype == GGUFValueType.ARRAY else None
            fields.append((key, f.contents(), vtype, sub))
        _VOCAB[name] = fields
    return _VOCAB[name]


def _value_type(value):
    from gguf import GGUFValueType

    if isinstance(value, bool):
        return GGUFValueType.BOOL
    if isinstance(value, int):
        return GGUFValueType.UINT32
    if isinstance(value, float):
        return GGUFValueType.FLOAT32
    return GGUFValueType.STRING


def _tokenizer_overrides(s: Shape) -> dict:
    """The tokenizer.* keys `s` sets over its tokenizer's: its chat template's text and `tokenizer_keys`."""
    out = dict(s.tokenizer_keys)
    if s.chat_template:
        from pyshim.setup.llamacpp_vocabs import template_path

        out["tokenizer.chat_template"] = template_path(s.chat_template).read_text("utf-8")
    return out


def write_tokenizer(source_gguf: Path, path: Path) -> Path:
    """A GGUF that holds only `source_gguf`'s `tokenizer.*` keys (a few MB, no tensors): enough for `write`
    on a machine that has no room or no network for the shipped model (a lent GPU machine)."""
    from gguf import GGUFWriter

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(str(path), "tokenizer")
    for key, value, vtype, sub in _tokenizer_fields(Path(source_gguf)):
        writer.add_key_value(key, value, vtype, sub)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


def write(name: str | Shape, tokenizer_gguf: Path, seed: int = 0, path: Path | None = None, *, progress=None,
          quant: str | None = None) -> Path:
    """Write synthetic model `name` (SHAPES, with an optional `-q4_k_m` suffix; or a Shape: then `path` is
    needed, and `quant` picks the mix) with the tokenizer of `tokenizer_gguf` (the catalog model its shape
    names: pyshim.setup.catalog.resolve_model passes it) and return its path; an existing file is kept
    (deterministic: the same bytes for the same shape, quant mix, tokenizer and seed)."""
    from gguf import GGUFWriter

    path = None if path is None else Path(path)
    if isinstance(name, Shape):
        s, quant = name, quant or "q4_0"
        name = path.stem
    else:
        shape_name, named_quant = split_name(name)
        s, quant = SHAPES[shape_name], quant or named_quant
    if quant not in QUANTS:
        raise ValueError(f"unknown synthetic quant mix {quant!r}; one of {QUANTS}")
    overrides = _tokenizer_overrides(s)
    vocab = [f for f in _tokenizer_fields(Path(tokenizer_gguf)) if f[0] not in overrides]
    vocab += [(key, value, _value_type(value), None) for key, value in overrides.items()]
    n_vocab = len(next(v for k, v, _, _ in vocab if k == "tokenizer.ggml.tokens"))
    path = path or path_for(name, seed)
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = _partial_for(path)
    try:
        _write_gguf(GGUFWriter(str(partial), s.arch), s, name, quant, vocab, n_vocab, seed, progress)
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
    return path


def _partial_for(path: Path) -> Path:
    """This writer's own temporary file beside `path` (processes writing one model at once, a benchmark
    beside the test workers, each write theirs and replace `path` whole); those of writers that died
    first (killed: gigabytes otherwise left behind) are removed."""
    for stale in path.parent.glob(f".{path.name}.*.partial"):
        pid = stale.name[len(path.name) + 2:].split(".")[0]
        if pid.isdigit() and not _alive(int(pid)):
            stale.unlink(missing_ok=True)
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.partial")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:         # (someone else's process)
        return True
    return True


def _write_gguf(writer, s: Shape, name: str, quant: str, vocab: list, n_vocab: int, seed: int, progress) -> None:
    """The model's header, tokenizer and random weights through `writer` (closed at the end)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    writer.add_name(f"synthetic {name} (random weights)")
    writer.add_context_length(s.context)
    writer.add_embedding_length(s.n_embd)
    writer.add_block_count(s.n_layers)
    writer.add_feed_forward_length(s.n_ff)
    writer.add_head_count(s.n_heads)
    writer.add_head_count_kv(s.n_kv_heads)
    writer.add_layer_norm_rms_eps(s.eps)
    writer.add_rope_freq_base(s.rope_base)
    writer.add_file_type(FILE_TYPE[quant])
    if s.n_experts:
        writer.add_expert_count(s.n_experts)
        writer.add_expert_used_count(s.n_experts_used)
    if s.key_length:
        writer.add_key_length(s.key_length)
        writer.add_value_length(s.key_length)
    for key, value in s.keys.items():
        writer.add_key_value(f"{s.arch}.{key}", value, _value_type(value))
    for key, value, vtype, sub in vocab:
        writer.add_key_value(key, value, vtype, sub)
    tensors = list(_tensors(s, n_vocab))
    types = {t: _type_of(t, kind, shape[-1], quant, s.n_layers, s.tied) for t, shape, kind in tensors}
    blocks = {"q4_0": (GGMLQuantizationType.Q4_0, _q4_0), "q4_k": (GGMLQuantizationType.Q4_K, _q4_k),
              "q5_k": (GGMLQuantizationType.Q5_K, _q5_k), "q6_k": (GGMLQuantizationType.Q6_K, _q6_k)}
    factors = _rope_factors(s)
    for tname, shape, kind in tensors:
        if types[tname] in blocks:
            qtype = blocks[types[tname]][0]
            per, nbytes = GGML_QUANT_SIZES[qtype]
            byte_shape = (*shape[:-1], shape[-1] // per * nbytes)    # (gguf takes quant shapes in bytes)
            writer.add_tensor_info(tname, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=qtype)
        else:
            writer.add_tensor_info(tname, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng([seed, len(tensors)])
    for i, (tname, shape, kind) in enumerate(tensors):
        if kind == "norm":
            data = np.ones(shape, np.float32)
        elif kind == "post_norm":
            data = np.full(shape, s.post_norms, np.float32)
        elif kind == "factors":
            data = factors[tname]
        elif kind == "router":
            data = (rng.standard_normal(shape) * ROUTER_STD / np.sqrt(shape[-1])).astype(np.float32)
        elif kind == "q4e":
            make = blocks[types[tname]][1]
            data = np.stack([make(rng, shape[1], shape[2]) for _ in range(shape[0])])
        else:
            data = blocks[types[tname]][1](rng, shape[0], shape[1])
        writer.write_tensor_data(data)
        if progress is not None:
            progress(i + 1, len(tensors))
    writer.close()
