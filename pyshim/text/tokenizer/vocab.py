"""The vocabulary as llama.cpp loads it from GGUF metadata: token texts, scores, attributes, special ids
and the tokenizer flags (add BOS/EOS, space prefix, ...), including llama.cpp's defaults and its
text-based fix-ups (end-of-generation tokens, unused control tokens), so that ids match it exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pyshim.errors import GGUFFormatError, UnsupportedError
from pyshim.text.tokenizer.pretokenize import Step, pre_tokenizer

SPM = "spm"   # tokenizer.ggml.model "llama": SentencePiece-style, scores, byte fallback
BPE = "bpe"   # "gpt2" (byte-level) and "gemma4" (SPM-style text, BPE merges)


class Attr:
    """llama.cpp's token attributes (llama_token_attr), as plain int bit flags: a 262k-token vocabulary
    is scanned several times at load, and enum arithmetic would cost a second there."""
    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8


# GGUF tokenizer.ggml.token_type values -> attributes.
_TYPE_ATTR = {1: Attr.NORMAL, 2: Attr.UNKNOWN, 3: Attr.CONTROL, 4: Attr.USER_DEFINED, 5: Attr.UNUSED, 6: Attr.BYTE}

# Token texts llama.cpp treats as end of generation (and forces to CONTROL).
EOG_TEXTS = frozenset([
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
])
EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
             "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>")
FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
_ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")   # gpt-oss

_ID_KEYS = {
    "bos": "tokenizer.ggml.bos_token_id", "eos": "tokenizer.ggml.eos_token_id",
    "eot": "tokenizer.ggml.eot_token_id", "eom": "tokenizer.ggml.eom_token_id",
    "unk": "tokenizer.ggml.unknown_token_id", "sep": "tokenizer.ggml.seperator_token_id",
    "pad": "tokenizer.ggml.padding_token_id", "mask": "tokenizer.ggml.mask_token_id",
    "fim_pre": "tokenizer.ggml.fim_pre_token_id", "fim_suf": "tokenizer.ggml.fim_suf_token_id",
    "fim_mid": "tokenizer.ggml.fim_mid_token_id", "fim_pad": "tokenizer.ggml.fim_pad_token_id",
    "fim_rep": "tokenizer.ggml.fim_rep_token_id", "fim_sep": "tokenizer.ggml.fim_sep_token_id",
}
_DEPRECATED_FIM_KEYS = {"fim_pre": "tokenizer.ggml.prefix_token_id", "fim_suf": "tokenizer.ggml.suffix_token_id",
                        "fim_mid": "tokenizer.ggml.middle_token_id"}


@dataclass
class Vocab:
    kind: str                          # SPM or BPE
    model: str                         # tokenizer.ggml.model
    pre: str                           # tokenizer.ggml.pre (or "default")
    tokens: list[str]
    scores: list[float]
    attrs: list[int]
    token_to_id: dict[str, int]
    merges: dict[str, int]             # "left right" -> rank (BPE only)
    special: dict[str, int | None]     # bos, eos, eot, eom, unk, sep, pad, mask, fim_*
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    escape_whitespaces: bool           # spaces become U+2581 before tokenizing
    byte_encode: bool                  # BPE words use GPT-2's byte alphabet
    clean_spaces: bool                 # decode removes " ." style spaces
    ignore_merges: bool                # a whole pre-token word found in the vocab is emitted as is
    steps: list[Step]                  # BPE pre-tokenizer
    eog_ids: frozenset[int]
    special_cache: list[int] = field(default_factory=list)   # matched in text, longest first

    @property
    def size(self) -> int:
        return len(self.tokens)


def _array(metadata: dict[str, Any], key: str) -> list | None:
    value = metadata.get(key)
    if value is None:
        return None
    return value.tolist() if hasattr(value, "tolist") else list(value)


def build_vocab(metadata: dict[str, Any]) -> Vocab:
    """The vocabulary described by the `tokenizer.*` keys of a GGUF metadata dict."""
    model = metadata.get("tokenizer.ggml.model")
    if model is None:
        raise GGUFFormatError("the model has no tokenizer (tokenizer.ggml.model is missing)")
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not tokens:
        raise GGUFFormatError("the model has no vocabulary (tokenizer.ggml.tokens is missing or empty)")
    if not all(tokens):
        tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
    else:
        tokens = list(tokens)
    n = len(tokens)
    pre_name = metadata.get("tokenizer.ggml.pre") or "default"

    flags = {"add_space_prefix": False, "add_bos": False, "add_eos": False, "ignore_merges": False,
             "clean_spaces": False, "escape_whitespaces": True, "byte_encode": True}
    steps: list[Step] = []
    merges: dict[str, int] = {}
    if model == "llama":
        kind = SPM
        special = {"bos": 1, "eos": 2, "unk": 0}
        pre_name = "default"
        flags.update(add_space_prefix=True, add_bos=True)
    elif model in ("gpt2", "gemma4"):
        kind = BPE
        raw_merges = metadata.get("tokenizer.ggml.merges")
        if raw_merges is None:
            raise GGUFFormatError("a BPE vocabulary without tokenizer.ggml.merges")
        # llama.cpp keeps the first rank of a repeated merge.
        merges = dict(zip(reversed(raw_merges), range(len(raw_merges) - 1, -1, -1)))
        if model == "gemma4":
            pre_name = "gemma4"
            special = {}
        else:
            special = {"bos": 11, "eos": 11}
        flags.update(escape_whitespaces=False, clean_spaces=True)
        steps, pre_flags = pre_tokenizer(pre_name)
        pre_flags = dict(pre_flags)
        if pre_flags.pop("bos_none", False):
            special["bos"] = None
        if pre_flags.get("escape_whitespaces"):
            flags["byte_encode"] = False
        flags.update(pre_flags)
    else:
        raise UnsupportedError(f"tokenizer type {model!r} is not supported",
                               hint="pyshim reads SentencePiece ('llama') and BPE ('gpt2') vocabularies")
    if metadata.get("tokenizer.ggml.add_space_prefix") is not None:
        flags["add_space_prefix"] = bool(metadata["tokenizer.ggml.add_space_prefix"])

    scores = _array(metadata, "tokenizer.ggml.scores")
    scores = list(map(float, scores[:n])) if scores is not None else [0.0] * n
    if len(scores) < n:
        raise GGUFFormatError(f"tokenizer.ggml.scores has {len(scores)} entries for {n} tokens")
    attrs = _attrs(metadata.get("tokenizer.ggml.token_type"), n)
    token_to_id = dict(zip(tokens, range(n)))   # a repeated text maps to its last id, as in llama.cpp

    ids = _special_ids(metadata, special, n)
    _fix_attrs_by_text(tokens, attrs, token_to_id, ids)
    add_bos = flags["add_bos"]
    add_eos = flags["add_eos"]
    if metadata.get("tokenizer.ggml.add_bos_token") is not None:
        add_bos = bool(metadata["tokenizer.ggml.add_bos_token"])
    if metadata.get("tokenizer.ggml.add_eos_token") is not None:
        add_eos = bool(metadata["tokenizer.ggml.add_eos_token"])
    if pre_name == "gemma4":
        add_bos = True   # llama.cpp overrides Gemma 4 files that say otherwise
    eog = _eog_ids(tokens, attrs, token_to_id, ids)

    vocab = Vocab(
        kind=kind, model=model, pre=pre_name, tokens=tokens, scores=scores, attrs=attrs,
        token_to_id=token_to_id, merges=merges, special=ids, add_bos=add_bos, add_eos=add_eos,
        add_space_prefix=flags["add_space_prefix"], escape_whitespaces=flags["escape_whitespaces"],
        byte_encode=flags["byte_encode"], clean_spaces=flags["clean_spaces"],
        ignore_merges=flags["ignore_merges"], steps=steps, eog_ids=eog,
    )
    special_mask = Attr.CONTROL | Attr.USER_DEFINED | Attr.UNKNOWN
    cache = np.flatnonzero(np.asarray(attrs) & special_mask).tolist()
    cache.sort(key=lambda i: -len(tokens[i].encode("utf-8", "surrogateescape")))
    vocab.special_cache = cache
    _model_specific_attrs(metadata, vocab)
    return vocab


def _attrs(types, n: int) -> list[int]:
    """Token types -> attributes, vectorized (this runs over every token of the vocabulary)."""
    if types is None:
        return [Attr.NORMAL] * n
    types = np.asarray(types, dtype=np.int64)
    if len(types) < n:
        raise GGUFFormatError(f"tokenizer.ggml.token_type has {len(types)} entries for {n} tokens")
    lut = np.zeros(len(_TYPE_ATTR) + 2, dtype=np.int64)   # 0 and out-of-range types: UNDEFINED
    for token_type, attr in _TYPE_ATTR.items():
        lut[token_type] = attr
    return lut[np.clip(types[:n], 0, len(lut) - 1)].tolist()


def _special_ids(metadata: dict[str, Any], defaults: dict[str, int], n: int) -> dict[str, int | None]:
    ids: dict[str, int | None] = {}
    for name, key in _ID_KEYS.items():
        default = defaults.get(name)
        if default is not None and default >= n:
            default = None
        value = metadata.get(key)
        if value is None and name in _DEPRECATED_FIM_KEYS:
            value = metadata.get(_DEPRECATED_FIM_KEYS[name])
        ids[name] = int(value) if value is not None and 0 <= int(value) < n else default
    return ids


def _mark_control(attrs: list[int], token_id: int) -> None:
    attrs[token_id] |= Attr.CONTROL


def _fix_attrs_by_text(tokens: list[str], attrs: list[int], token_to_id: dict[str, int],
                       ids: dict[str, int | None]) -> None:
    """llama.cpp's text-based detection of EOT/EOM/FIM tokens (forced to CONTROL) and of unused ones."""
    def find(texts) -> int | None:
        found = [token_to_id[t] for t in texts if t in token_to_id]
        return min(found) if found else None

    for name, texts in (("eot", EOT_TEXTS), ("eom", ("<|eom_id|>",)), *FIM_TEXTS.items()):
        if ids.get(name) is None:
            found = find(texts)
            if found is not None:
                ids[name] = found
                _mark_control(attrs, found)
    for i in np.flatnonzero(np.asarray(attrs) & Attr.CONTROL).tolist():
        if "unused" in tokens[i]:
            attrs[i] |= Attr.UNUSED


def _eog_ids(tokens: list[str], attrs: list[int], token_to_id: dict[str, int],
             ids: dict[str, int | None]) -> frozenset[int]:
    eog = {ids[k] for k in ("fim_pad", "fim_rep", "fim_sep") if ids.get(k) is not None}
    for text in EOG_TEXTS:
        i = token_to_id.get(text)
        if i is not None:
            eog.add(i)
            _mark_control(attrs, i)
    for text in _ALWAYS_RENDERED:
        i = token_to_id.get(text)
        if i is not None:
            attrs[i] = Attr.USER_DEFINED
    eog.update(ids[k] for k in ("eos", "eot", "eom") if ids.get(k) is not None)
    texts = {tokens[i]: i for i in eog}
    # o200k_harmony / solar-open: "<|end|>" ends a message, not the generation.
    if "<|end|>" in texts and (("<|return|>" in texts and ("<|call|>" in texts or "<|calls|>" in texts))
                               or (("<|call|>" in texts or "<|calls|>" in texts) and "<|flush|>" in texts)):
        eog.discard(texts["<|end|>"])
        attrs[texts["<|end|>"]] = Attr.USER_DEFINED
    # Gemma 4 and PLaMo have an ordinary "</s>".
    if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
        eog.discard(texts["</s>"])
        attrs[texts["</s>"]] = Attr.NORMAL
    return frozenset(eog)


def _model_specific_attrs(metadata: dict[str, Any], vocab: Vocab) -> None:
    """Per-model strip attributes llama.cpp sets by name (the GGUF does not carry them)."""
    name = str(metadata.get("general.name") or "").lower()
    if "phi-3" in name or "phi3" in name:
        for i in vocab.special_cache:
            vocab.attrs[i] |= Attr.RSTRIP
        for text, on in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
            i = vocab.token_to_id.get(text)
            if i is not None:
                vocab.attrs[i] = vocab.attrs[i] | Attr.RSTRIP if on else vocab.attrs[i] & ~Attr.RSTRIP


def symbols_to_ids(syms: list[str], nxt: list[int], token_to_id: dict[str, int], byte_ids: list[int | None]) -> list[int]:
    """The ids of a merged symbol chain (linked by `nxt` from 0; merged-away slots are skipped by the
    links): a symbol in the vocabulary is its id, any other falls back to its bytes' tokens."""
    out: list[int] = []
    i = 0
    while i != -1:
        sym = syms[i]
        tid = token_to_id.get(sym)
        if tid is not None:
            out.append(tid)
        else:
            for b in sym.encode("utf-8", "surrogatepass"):
                bid = byte_ids[b]
                if bid is not None:
                    out.append(bid)
        i = nxt[i]
    return out
