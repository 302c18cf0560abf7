"""Unicode helpers shared by the tokenizers: codepoint classes and the GPT-2 byte alphabet.

llama.cpp's pre-tokenizers work on a "collapsed" copy of the text in which every non-ASCII codepoint
is replaced by one byte naming its Unicode class (letter, number, punctuation, ...); the split
patterns are then ordinary regular expressions over that small alphabet. pyshim does the same with the
standard `re` module (Pyodide has no third-party `regex`), so the classes here must match llama.cpp's
tables: general category from `unicodedata`, and llama.cpp's own whitespace set (which, unlike
`str.isspace`, leaves out U+001C..U+001F).
"""

from __future__ import annotations

import unicodedata

# llama.cpp's whitespace codepoints (unicode-data.cpp, `unicode_set_whitespace`).
WHITESPACE = frozenset(
    [0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
     0x2028, 0x2029, 0x202F, 0x205F, 0x3000]
)

# The collapsed alphabet. ASCII stays itself; other codepoints become one of these characters.
# Vertical tab stands for non-ASCII whitespace because C's isspace (std::regex `\s`) accepts it.
C_SPACE = "\x0b"
C_NUMBER = "\xd1"
C_LETTER = "\xd2"
C_PUNCT = "\xd3"
C_MARK = "\xd4"
C_SYMBOL = "\xd5"
C_OTHER = "\xd0"

_CATEGORY_CLASS = {"N": C_NUMBER, "L": C_LETTER, "P": C_PUNCT, "M": C_MARK, "S": C_SYMBOL}

# Character classes for patterns written against the collapsed text (inside [...]).
CLS_SPACE = r"\t\n\x0b\x0c\r "
CLS_LETTER = r"A-Za-z\xd2"
CLS_NUMBER = r"0-9\xd1"
CLS_PUNCT = r"!-#%-*,-/:;?@\[-\]_{}\xd3"
CLS_SYMBOL = r"$+<->^`|~\xd5"
CLS_MARK = r"\xd4"

# Lazily filled str.translate tables: codepoint -> collapsed char / whitespace-normalized char.
_collapse_table: dict[int, str] = {}
_space_table: dict[int, str] = {}


def collapse_char(cp: int) -> str:
    """The collapsed-alphabet character for a non-ASCII codepoint."""
    if cp in WHITESPACE:
        return C_SPACE
    return _CATEGORY_CLASS.get(unicodedata.category(chr(cp))[0], C_OTHER)


def collapse(text: str) -> str:
    """`text` with every non-ASCII codepoint replaced by its class character (same length)."""
    if text.isascii():
        return text
    table = _collapse_table
    for ch in set(text):
        cp = ord(ch)
        if cp >= 128 and cp not in table:
            table[cp] = collapse_char(cp)
    return text.translate(table)


def normalize_spaces(text: str) -> str:
    """`text` with non-ASCII whitespace replaced by a vertical tab, as llama.cpp does before running a
    pattern without Unicode classes (std::wregex's `\\s` is ASCII-only)."""
    if text.isascii():
        return text
    table = _space_table
    for ch in set(text):
        cp = ord(ch)
        if cp >= 128 and cp not in table:
            table[cp] = C_SPACE if cp in WHITESPACE else ch
    return text.translate(table)


def _gpt2_byte_alphabet() -> list[str]:
    """GPT-2's byte -> printable character map: printable Latin-1 bytes map to themselves, the other
    68 bytes to U+0100 onwards, in byte order."""
    keep = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    out = []
    extra = 0
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


BYTE_TO_CHAR: list[str] = _gpt2_byte_alphabet()
CHAR_TO_BYTE: dict[str, int] = {ch: b for b, ch in enumerate(BYTE_TO_CHAR)}
# Latin-1 char (one per byte) -> GPT-2 char: bytes.decode("latin-1").translate(...) byte-encodes a word.
_LATIN1_TO_GPT2 = {b: ch for b, ch in enumerate(BYTE_TO_CHAR)}


def byte_encode(word: str) -> str:
    """A pre-token in GPT-2's byte alphabet: its UTF-8 bytes, each shown as one printable char."""
    return word.encode("utf-8", "surrogatepass").decode("latin-1").translate(_LATIN1_TO_GPT2)
