"""Ids back to text: per-token byte pieces, whole-sequence decoding as llama.cpp's llama_detokenize does
it, and a streaming decoder for generation that only ever emits complete characters.
"""

from __future__ import annotations

import codecs

from pyshim.errors import BadRequestError
from pyshim.text.tokenizer.unicode import CHAR_TO_BYTE
from pyshim.text.tokenizer.vocab import BPE, Attr, Vocab

SPACE = "\u2581"
_HIDDEN_UNLESS_SPECIAL = Attr.UNKNOWN | Attr.CONTROL


class Pieces:
    """token id -> the bytes it stands for (llama.cpp's token_to_piece), computed lazily and cached
    (a 262k vocabulary is not worth converting up front, least of all in the browser)."""

    def __init__(self, vocab: Vocab):
        self.vocab = vocab
        self._cache: dict[int, bytes] = {}

    def get(self, token_id: int, special: bool = False) -> bytes:
        attrs = self.vocab.attrs
        if not 0 <= token_id < len(attrs):
            raise BadRequestError(f"token id {token_id} is outside the vocabulary (0..{len(attrs) - 1})")
        attr = attrs[token_id]
        if not special and attr & _HIDDEN_UNLESS_SPECIAL:
            return b""
        piece = self._cache.get(token_id)
        if piece is None:
            piece = self._cache[token_id] = self._piece(token_id, attr)
        return piece

    def _piece(self, token_id: int, attr: int) -> bytes:
        vocab = self.vocab
        text = vocab.tokens[token_id]
        if attr & (_HIDDEN_UNLESS_SPECIAL | Attr.USER_DEFINED):
            return _raw(text)
        if attr & Attr.NORMAL:
            if vocab.kind == BPE and not vocab.escape_whitespaces:
                return _gpt2_bytes(text)
            return _raw(text.replace(SPACE, " "))
        if attr & Attr.BYTE:
            return bytes([int(text[3:5], 16)])
        return b""   # unused / undefined tokens render as nothing


def _raw(text: str) -> bytes:
    # Token texts come from the GGUF reader decoded with surrogateescape; this restores their bytes.
    return text.encode("utf-8", "surrogateescape")


def _gpt2_bytes(text: str) -> bytes:
    """Undo GPT-2's byte alphabet; a character outside it is kept visible, as llama.cpp does."""
    out = bytearray()
    for ch in text:
        b = CHAR_TO_BYTE.get(ch)
        if b is not None:
            out.append(b)
        else:
            raw = _raw(ch)
            out += b"[UNK_BYTE_0x" + raw.hex().encode() + _raw(text) + b"]"
    return bytes(out)


def clean_up_spaces(data: bytes) -> bytes:
    """llama.cpp's clean_up_tokenization_spaces: " ?", " !", " .", " ," lose the space; " ' " loses
    both; " 's", " 'm", " 're", " 've" lose the space."""
    text = bytearray(data)
    # pass 1: space before ? ! . ,
    out = bytearray(text[:1])
    for i in range(1, len(text)):
        x = text[i]
        if text[i - 1] == 0x20 and x in b"?!.,":
            out.pop()
        out.append(x)
    text = out
    # pass 2: a lone apostrophe between spaces; the dropped space is zeroed in place as llama.cpp does,
    # so it no longer counts as "a space before" for the next character
    out = bytearray(text[:1])
    i = 1
    while i < len(text):
        x = text[i]
        if x == 0x27 and i + 1 < len(text) and text[i - 1] == 0x20 and text[i + 1] == 0x20:
            out.pop()
            out.append(x)
            text[i + 1] = 0
            i += 2
            continue
        out.append(x)
        i += 1
    text = out
    # pass 3: contractions
    out = bytearray(text[:1])
    n = len(text)
    for i in range(1, n):
        x = text[i]
        if text[i - 1] == 0x20 and x == 0x27 and i + 1 < n:
            x1 = text[i + 1]
            if x1 in b"sm" or (i + 2 < n and (text[i + 1:i + 3] in (b"re", b"ve"))):
                out.pop()
        out.append(x)
    return bytes(out)


def detokenize(vocab: Vocab, pieces: Pieces, ids: list[int], *, special: bool = False,
               remove_special: bool = False) -> bytes:
    """llama_detokenize(ids, remove_special, unparse_special=special), as bytes."""
    ids = list(ids)
    remove_space = vocab.add_space_prefix
    bos, eos = vocab.special.get("bos"), vocab.special.get("eos")
    if remove_special and vocab.add_bos and ids and ids[0] == bos:
        remove_space = False
        ids = ids[1:]
    if remove_special and vocab.add_eos and ids and ids[-1] == eos:
        ids = ids[:-1]
    parts = []
    for tid in ids:
        piece = pieces.get(tid, special)
        if remove_space and piece.startswith(b" "):
            piece = piece[1:]
        remove_space = False
        parts.append(piece)
    data = b"".join(parts)
    if vocab.clean_spaces:
        data = clean_up_spaces(data)
    return data


class StreamingDecoder:
    """Turns generated ids into text incrementally. `add(id)` returns the newly completed text: bytes of
    a character split across tokens (byte-fallback tokens, byte-level BPE) are held back until the
    character is complete, and invalid sequences become U+FFFD, so the stream never carries broken
    UTF-8. `finish()` returns whatever is still held.

    `strip_leading_space` drops the space SentencePiece vocabularies put in front of the first word
    (use it when decoding from the start of a text, not when continuing a prompt)."""

    def __init__(self, pieces: Pieces, *, special: bool = False, strip_leading_space: bool = False):
        self._pieces = pieces
        self._special = special
        self._strip = strip_leading_space
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def add(self, token_id: int) -> str:
        piece = self._pieces.get(token_id, self._special)
        if self._strip and piece:
            self._strip = False
            if piece.startswith(b" "):
                piece = piece[1:]
        return self._decoder.decode(piece)

    def finish(self) -> str:
        return self._decoder.decode(b"", final=True)
