"""Pre-tokenizers for byte-level BPE: split text into words before merges, chosen by `tokenizer.ggml.pre`.

Each pre-tokenizer is a list of steps, as in llama.cpp: every step runs one pattern over each piece the
previous steps produced, and both the matches and the text between them become pieces ("isolated").
Patterns run with the standard `re` module over a same-length *view* of the text:
- COLLAPSED: non-ASCII codepoints replaced by their Unicode class (see unicode.py), so `\\p{L}` is
  `[A-Za-z\\xd2]` — this is how llama.cpp evaluates every pattern that uses Unicode classes;
- SPACES: the raw text with non-ASCII whitespace turned into \\x0b, for patterns that spell out
  literal non-ASCII ranges (DeepSeek's CJK ranges) and so cannot use the collapsed view.
Whitespace is always the explicit class [\\t\\n\\v\\f\\r ] (C's isspace), never `\\s`, whose Python
meaning is wider.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pyshim.errors import UnsupportedError
from pyshim.text.tokenizer.unicode import (
    CLS_LETTER as L, CLS_MARK as M, CLS_NUMBER as N, CLS_PUNCT as P, CLS_SPACE as S, CLS_SYMBOL as SYM,
    collapse, normalize_spaces,
)

COLLAPSED = "collapsed"
SPACES = "spaces"


@dataclass(frozen=True)
class Step:
    pattern: re.Pattern
    view: str = COLLAPSED


def _step(pattern: str, view: str = COLLAPSED) -> Step:
    return Step(re.compile(pattern), view)


# Building blocks (regex source over the collapsed view).
_CONTRACTIONS_LOWER = r"'s|'t|'re|'ve|'m|'ll|'d"
_CONTRACTIONS_ANY_CASE = r"'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]"
_TAIL_SPACES = rf"[{S}]+(?![^{S}])|[{S}]+"

# GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
GPT2 = _step(rf"{_CONTRACTIONS_LOWER}| ?[{L}]+| ?[{N}]+| ?[^{S}{L}{N}]+|{_TAIL_SPACES}")


def _llama3_like(digits: str, letters: str = L, not_other: str = f"{S}{L}{N}") -> Step:
    """Llama 3 / Qwen 2 family: (?i:contractions)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{..}|
    ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"""
    return _step(
        rf"(?:{_CONTRACTIONS_ANY_CASE})|[^\r\n{L}{N}]?[{letters}]+|[{N}]{digits}"
        rf"| ?[^{not_other}]+[\r\n]*|[{S}]*[\r\n]+|{_TAIL_SPACES}"
    )


LLAMA3 = _llama3_like("{1,3}")
QWEN2 = _llama3_like("")
QWEN35 = _llama3_like("", letters=f"{L}{M}", not_other=f"{S}{L}{M}{N}")

# GPT-4o / Tekken: case-aware words. In the collapsed view a non-ASCII letter counts as both cases,
# exactly as llama.cpp's `(?=[\p{L}])[^a-z]` rewrite does.
_UPPERISH = r"A-Z\xd2"
_LOWERISH = r"a-z\xd2"
GPT4O = _step(
    rf"[^\r\n{L}{N}]?[{_UPPERISH}]*[{_LOWERISH}]+(?:{_CONTRACTIONS_ANY_CASE})?"
    rf"|[^\r\n{L}{N}]?[{_UPPERISH}]+[{_LOWERISH}]*(?:{_CONTRACTIONS_ANY_CASE})?"
    rf"|[{N}]{{1,3}}| ?[^{S}{L}{N}]+[\r\n/]*|[{S}]*[\r\n]+|{_TAIL_SPACES}"
)
TEKKEN = _step(
    rf"[^\r\n{L}{N}]?[{_UPPERISH}]*[{_LOWERISH}]+|[^\r\n{L}{N}]?[{_UPPERISH}]+[{_LOWERISH}]*"
    rf"|[{N}]| ?[^{S}{L}{N}]+[\r\n/]*|[{S}]*[\r\n]+|{_TAIL_SPACES}"
)

# Variants of the Qwen 2 pattern.
UFAKZEKA = _step(rf"[^\r\n{L}{N}]?[{L}]+|[{N}]| ?[^{S}{L}{N}]+[\r\n]*|[{S}]*[\r\n]+|{_TAIL_SPACES}")
BAILINGMOE = _step(
    rf"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n{L}{N}]?[{L}]+|[{N}]| ?[^{S}{L}{N}]+[\r\n]*"
    rf"|[{S}]*[\r\n]|{_TAIL_SPACES}"
)
SEED_CODER = _step(
    rf"(?:{_CONTRACTIONS_ANY_CASE})|[^\r\n{L}{N}]?[{L}]+|[{N}]| ?[^{S}{L}{N}\r\n]+|[{S}]*[\r\n]+|{_TAIL_SPACES}"
)
MINICPM5_WORDS = _step(
    rf"(?:{_CONTRACTIONS_ANY_CASE})|[^\r\n{L}{N}]?[{L}]+|[{N}]+| ?[^{S}{L}{N}]+[\r\n]*|[{S}]*[\r\n]+|{_TAIL_SPACES}"
)
# DeepSeek V3 family: an ASCII punctuation mark may lead an ASCII word; marks join letters.
DEEPSEEK3_WORDS = _step(
    rf"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{{|}}~][A-Za-z]+|[^\r\n{L}{P}{SYM}]?[{L}{M}]+| ?[{P}{SYM}]+[\r\n]*"
    rf"|[{S}]*[\r\n]+|{_TAIL_SPACES}"
)
KANA_HAN = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"

SINGLE_DIGIT = _step(rf"[{N}]")
DIGITS = _step(rf"[{N}]+")
THREE_ASCII_DIGITS = _step(r"[0-9][0-9][0-9]")

# DeepSeek LLM: literal letter ranges from its tokenizer.json (SPACES view), written as escapes so that
# no editor can normalize them.
_DEEPSEEK_LETTERS = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
    "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
    "\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
    "\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
    "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc"
    "\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134"
    "\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee"
    "\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf"
    "\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
    "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    "\U0001e900-\U0001e943"
)
_DEEPSEEK_PUNCT = "!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002"
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
DEEPSEEK_LLM = [
    _step(r"[\r\n]", SPACES),
    _step(rf"[{S}]?[{_DEEPSEEK_LETTERS}]+", SPACES),
    _step(rf"[{S}]?[{_DEEPSEEK_PUNCT}]+", SPACES),
    _step(rf"[{S}]+\Z", SPACES),
    _step(_CJK, SPACES),
    DIGITS,
]
DEEPSEEK_CODER = [
    _step(r"[\r\n]", SPACES),
    _step(rf"[{S}]?[{L}]+"),
    _step(rf"[{S}]?[{P}]+"),
    _step(_CJK, SPACES),
    SINGLE_DIGIT,
]

# Falcon and the default: punctuation runs first. Note Falcon's class also takes '`'.
FALCON = [_step(rf"[{P}$+<=>^~|`]+"), GPT2, THREE_ASCII_DIGITS]
DEFAULT = [_step(rf"[{P}$+<=>^~|]+"), GPT2, DIGITS, THREE_ASCII_DIGITS]
STARCODER = [SINGLE_DIGIT, GPT2]
BLOOM = [_step(" ?[^(\t\n\x0b\x0c\r |.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+", SPACES)]

UP_TO_THREE_DIGITS = _step(rf"[{N}]{{1,3}}")
DEEPSEEK3 = [UP_TO_THREE_DIGITS, _step(KANA_HAN, SPACES), DEEPSEEK3_WORDS]
NEWLINE_RUNS = [_step(r"[^\n]+|\n+")]

# tokenizer.ggml.pre -> (steps, flags). Flags mirror llama.cpp's per-vocabulary settings.
_PRE: dict[str, tuple[list[Step], dict]] = {}


def _register(names: tuple[str, ...], steps: list[Step], **flags) -> None:
    for name in names:
        _PRE[name] = (steps, flags)


_register(("default",), DEFAULT)
_register(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"),
          [LLAMA3], ignore_merges=True, add_bos=True)
_register(("dbrx", "smaug-bpe"), [LLAMA3])
_register(("chatglm-bpe",), [LLAMA3], bos_none=True)
_register(("glm4", "glm5"), [LLAMA3], bos_none=True, ignore_merges=True)
_register(("deepseek-llm",), DEEPSEEK_LLM, clean_spaces=False)
_register(("deepseek-coder",), DEEPSEEK_CODER, clean_spaces=False)
_register(("falcon",), FALCON)
_register(("mpt", "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de",
           "a.x-4.0", "mellum", "olmo", "jais", "exaone4"), [GPT2])
_register(("trillion", "granite-docling"), [GPT2], clean_spaces=False)
_register(("starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"), STARCODER)
_register(("command-r", "smollm"), STARCODER, clean_spaces=False)
_register(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2"), [QWEN2], clean_spaces=False)
_register(("stablelm2", "megrez"), [QWEN2])
_register(("hunyuan", "solar-open", "grok-2"), [QWEN2], clean_spaces=False)
_register(("qwen35",), [QWEN35], clean_spaces=False)
_register(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), [GPT4O], clean_spaces=False)
_register(("tekken",), [TEKKEN], clean_spaces=False, ignore_merges=True, add_bos=True)
_register(("bloom", "gpt3-finnish"), BLOOM)
_register(("poro-chat",), BLOOM, clean_spaces=False)
_register(("viking",), BLOOM + [SINGLE_DIGIT], clean_spaces=False)
_register(("deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"), DEEPSEEK3, clean_spaces=False)
_register(("ufakzeka",), [UFAKZEKA], clean_spaces=False)
_register(("bailingmoe", "bailingmoe2", "llada-moe"), [BAILINGMOE], clean_spaces=False)
_register(("seed-coder",), [SEED_CODER], clean_spaces=False)
_register(("minicpm5",), [UP_TO_THREE_DIGITS, MINICPM5_WORDS], ignore_merges=True)
_register(("laguna",), NEWLINE_RUNS + [QWEN2], clean_spaces=False)
# Gemma 4 style BPE (no byte alphabet, spaces as U+2581): only newline runs are split off.
_register(("gemma4",), NEWLINE_RUNS, escape_whitespaces=True)


def pre_tokenizer(name: str | None) -> tuple[list[Step], dict]:
    """Steps and vocabulary flags for a `tokenizer.ggml.pre` value (missing -> llama.cpp's default)."""
    key = name or "default"
    try:
        return _PRE[key]
    except KeyError:
        raise UnsupportedError(
            f"unknown BPE pre-tokenizer {key!r} (tokenizer.ggml.pre)",
            hint=f"pyshim knows: {', '.join(sorted(_PRE))}",
        ) from None


def supported_pre_tokenizers() -> list[str]:
    return sorted(_PRE)


def split(text: str, steps: list[Step]) -> list[str]:
    """Apply the steps in order; return the pieces (they concatenate back to `text`)."""
    views: dict[str, str] = {}
    spans = [(0, len(text))]
    for step in steps:
        view = views.get(step.view)
        if view is None:
            view = views[step.view] = collapse(text) if step.view == COLLAPSED else normalize_spaces(text)
        finditer = step.pattern.finditer
        out = []
        for start, end in spans:
            pos = start
            for m in finditer(view, start, end):
                a, b = m.span()
                if a == b:
                    continue
                if a > pos:
                    out.append((pos, a))
                out.append((a, b))
                pos = b
            if pos < end:
                out.append((pos, end))
        spans = out
    return [text[a:b] for a, b in spans]
