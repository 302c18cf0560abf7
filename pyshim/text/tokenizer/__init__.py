"""Tokenizers built from a GGUF vocabulary, giving the same ids as llama.cpp.

    tok = Tokenizer.from_metadata(header.metadata)
    ids = tok.encode("Hello", add_special=True, parse_special=False)   # BOS/EOS per the GGUF flags
    text = tok.decode(ids)                                              # control tokens hidden
    stream = tok.stream()                                               # for generation
    for i in new_ids: print(stream.add(i), end="")
    print(stream.finish())

Modules: vocab (metadata -> Vocab, llama.cpp's defaults and fix-ups), pretokenize (BPE word splitting
without the `regex` package), spm / bpe (the two merge algorithms), detokenize (pieces, decode,
streaming), unicode (classes and the GPT-2 byte alphabet).
"""

from __future__ import annotations

from typing import Any

from pyshim.text.tokenizer.bpe import BpeTokenizer
from pyshim.text.tokenizer.detokenize import Pieces, StreamingDecoder, detokenize
from pyshim.text.tokenizer.spm import SpmTokenizer
from pyshim.text.tokenizer.vocab import SPM, Attr, Vocab, build_vocab

__all__ = ["Tokenizer", "StreamingDecoder", "Vocab"]

SPACE = "\u2581"
_C_SPACES = " \t\n\v\f\r"   # C isspace: what llama.cpp strips next to LSTRIP/RSTRIP tokens


class Tokenizer:
    def __init__(self, vocab: Vocab):
        self.vocab = vocab
        self._impl = SpmTokenizer(vocab) if vocab.kind == SPM else BpeTokenizer(vocab)
        self._pieces = Pieces(vocab)

    @classmethod
    def from_metadata(cls, metadata: dict[str, Any]) -> "Tokenizer":
        return cls(build_vocab(metadata))

    # ---- facts -------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self.vocab.size

    @property
    def bos_id(self) -> int | None:
        return self.vocab.special.get("bos")

    @property
    def eos_id(self) -> int | None:
        return self.vocab.special.get("eos")

    @property
    def eot_id(self) -> int | None:
        return self.vocab.special.get("eot")

    @property
    def eog_ids(self) -> frozenset[int]:
        """Every id that ends generation (EOS, EOT, <|im_end|>, <end_of_turn>, ...)."""
        return self.vocab.eog_ids

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.vocab.eog_ids

    def token_id(self, text: str) -> int | None:
        """The id of a token by its exact vocabulary text (e.g. "<|im_end|>"), or None."""
        return self.vocab.token_to_id.get(text)

    def token_text(self, token_id: int) -> str:
        """The raw vocabulary text of a token (with ▁ or GPT-2 byte characters)."""
        return self.vocab.tokens[token_id]

    # ---- text -> ids -------------------------------------------------------------------------

    def encode(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """llama_tokenize(text, add_special, parse_special): BOS/EOS are added when `add_special` and the
        vocabulary asks for them; control tokens written in the text (`<|im_start|>`) become single
        tokens only with `parse_special` (user-defined tokens always do, as in llama.cpp)."""
        vocab = self.vocab
        fragments = self._partition(text, parse_special) if text else []
        out: list[int] = []
        bos, eos = self.bos_id, self.eos_id
        if vocab.kind == SPM:
            if add_special and vocab.add_bos and bos is not None:
                out.append(bos)
            prev_special = True
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                    prev_special = True
                    continue
                if vocab.add_space_prefix and prev_special:
                    frag = " " + frag
                self._impl.tokenize(frag.replace(" ", SPACE), out)
                prev_special = False
            if add_special and vocab.add_eos and eos is not None:
                out.append(eos)
            return out
        if add_special and vocab.add_bos and bos is not None:
            out.append(bos)
        for frag in fragments:
            if isinstance(frag, int):
                out.append(frag)
            else:
                self._impl.tokenize(frag.replace(" ", SPACE) if vocab.escape_whitespaces else frag, out)
        if add_special and vocab.add_eos and eos is not None:
            out.append(eos)
        return out

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Split `text` around special-token texts (llama.cpp's tokenizer_st_partition): longest tokens
        first, each one cutting every remaining text fragment at all its occurrences."""
        vocab = self.vocab
        fragments: list[str | int] = [text]
        skip = 0 if parse_special else (Attr.CONTROL | Attr.UNKNOWN)
        for tid in vocab.special_cache:
            attr = vocab.attrs[tid]
            if attr & skip:
                continue
            tok = vocab.tokens[tid]
            if tok not in text:
                continue
            new: list[str | int] = []
            for frag in fragments:
                if isinstance(frag, int) or tok not in frag:
                    new.append(frag)
                    continue
                pos = 0
                while True:
                    at = frag.find(tok, pos)
                    if at < 0:
                        break
                    left = frag[pos:at]
                    if attr & Attr.LSTRIP:
                        left = left.rstrip(_C_SPACES)
                    if left:
                        new.append(left)
                    new.append(tid)
                    pos = at + len(tok)
                    if attr & Attr.RSTRIP:
                        while pos < len(frag) and frag[pos] in _C_SPACES:
                            pos += 1
                if pos < len(frag):
                    new.append(frag[pos:])
            fragments = new
        return fragments

    # ---- ids -> text -------------------------------------------------------------------------

    def piece_bytes(self, token_id: int, *, special: bool = False) -> bytes:
        """The bytes one token stands for (may be part of a multi-byte character)."""
        return self._pieces.get(token_id, special)

    def token_to_piece(self, token_id: int, *, special: bool = False) -> str:
        return self._pieces.get(token_id, special).decode("utf-8", "replace")

    def decode(self, ids, *, special: bool = False, remove_special: bool = False) -> str:
        """llama_detokenize(ids, remove_special, unparse_special=special): control tokens are shown only
        with `special`; the SentencePiece leading space of the first word is dropped; BPE vocabularies
        that ask for it get llama.cpp's clean-up of spaces before punctuation."""
        return self.decode_bytes(ids, special=special, remove_special=remove_special).decode("utf-8", "replace")

    def decode_bytes(self, ids, *, special: bool = False, remove_special: bool = False) -> bytes:
        return detokenize(self.vocab, self._pieces, ids, special=special, remove_special=remove_special)

    def stream(self, *, special: bool = False, strip_leading_space: bool = False) -> StreamingDecoder:
        """An incremental decoder for generated ids (see StreamingDecoder)."""
        return StreamingDecoder(self._pieces, special=special, strip_leading_space=strip_leading_space)

