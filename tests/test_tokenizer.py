"""Tokenizer unit tests on tiny hand-made vocabularies (no downloads, no model files)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from pyshim.errors import BadRequestError, GGUFFormatError, UnsupportedError
from pyshim.text.tokenizer import Tokenizer
from pyshim.text.tokenizer.detokenize import clean_up_spaces
from pyshim.text.tokenizer.pretokenize import DEFAULT, GPT2, GPT4O, LLAMA3, QWEN2, STARCODER, split
from pyshim.text.tokenizer.unicode import BYTE_TO_CHAR, byte_encode, collapse

CONTROL, NORMAL, USER_DEFINED, BYTE = 3, 1, 4, 6


# ---- pre-tokenizers -----------------------------------------------------------------------------

@pytest.mark.parametrize("steps, text, pieces", [
    ([GPT2], "Hello world's  123!!\n\n  x ", ["Hello", " world", "'s", " ", " 123", "!!", "\n\n ", " x", " "]),
    ([LLAMA3], "Hello WORLD'S 1234567 ab\r\n\n  x",
     ["Hello", " WORLD", "'S", " ", "123", "456", "7", " ab", "\r\n\n", " ", " x"]),
    (STARCODER, "abc123 def", ["abc", "1", "2", "3", " def"]),
    ([QWEN2], "x 1234 ü", ["x", " ", "1", "2", "3", "4", " ü"]),
    (DEFAULT, "a,b 12345", ["a", ",", "b", " ", "123", "45"]),
    ([GPT4O], "HelloWorld CamelCase ABC", ["Hello", "World", " Camel", "Case", " ABC"]),
    # non-ASCII letters, numbers and spaces are classified like llama.cpp's tables
    ([GPT2], "naïve Ⅻ٣\u3000日本", ["naïve", " Ⅻ٣", "\u3000", "日本"]),
])
def test_split(steps, text, pieces):
    assert split(text, steps) == pieces
    assert "".join(pieces) == text


def test_collapse_keeps_length_and_classes():
    text = "aé1٣!«\u00a0\u0301😀\x1c"
    view = collapse(text)
    assert len(view) == len(text)
    assert view == "a\xd21\xd1!\xd3\x0b\xd4\xd5\x1c"   # \x1c stays: not whitespace for llama.cpp


def test_no_third_party_regex():
    # Pyodide has no `regex`: the tokenizer must only use the standard library's `re`.
    for path in (Path(__file__).parent.parent / "pyshim" / "tokenizer").glob("*.py"):
        tree = ast.parse(path.read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        assert "regex" not in imported, path


# ---- SentencePiece ------------------------------------------------------------------------------

def spm_metadata(**extra) -> dict:
    tokens = ["<unk>", "<s>", "</s>", "<|turn|>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, CONTROL, CONTROL, CONTROL] + [BYTE] * 256
    scores = [0.0] * len(tokens)
    for text, score in [("▁", -1.0), ("a", -2.0), ("b", -2.0), ("c", -3.0), ("ab", -1.5), ("▁ab", -0.5),
                        ("▁c", -2.5), ("bc", -0.1), ("▁▁", -4.0)]:
        tokens.append(text)
        types.append(NORMAL)
        scores.append(score)
    return {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": scores, "tokenizer.ggml.token_type": types, **extra}


@pytest.fixture
def spm():
    return Tokenizer.from_metadata(spm_metadata())


def test_spm_merges_by_score(spm):
    t = spm.token_id
    # "▁abc": "bc" (-0.1) beats "▁" + "a"... so "▁", "a", "bc" then "▁a" is no token: stays split.
    assert spm.encode("abc", add_special=False) == [t("▁"), t("a"), t("bc")]
    assert spm.encode("ab", add_special=False) == [t("▁ab")]
    assert spm.encode("ab c", add_special=False) == [t("▁ab"), t("▁c")]


def test_spm_bos_default_and_space_prefix(spm):
    assert spm.encode("ab")[0] == 1                       # llama.cpp adds BOS for SPM by default
    assert spm.encode("ab", add_special=False)[0] == spm.token_id("▁ab")   # space prefix added
    no_prefix = Tokenizer.from_metadata(spm_metadata(**{"tokenizer.ggml.add_space_prefix": False,
                                                        "tokenizer.ggml.add_bos_token": False}))
    assert no_prefix.encode("ab") == [no_prefix.token_id("ab")]


def test_spm_byte_fallback_and_decode(spm):
    ids = spm.encode("é", add_special=False)
    assert ids == [spm.token_id("▁"), spm.token_id("<0xC3>"), spm.token_id("<0xA9>")]
    assert spm.decode(ids) == "é"                         # leading space of the first word dropped
    assert spm.decode(spm.encode("ab c", add_special=False)) == "ab c"
    assert spm.decode(spm.encode("ab c")) == " ab c"     # after a BOS llama.cpp keeps the space


def test_spm_special_tokens_only_when_parsed(spm):
    turn = spm.token_id("<|turn|>")
    assert turn not in spm.encode("ab<|turn|>c", add_special=False)
    ids = spm.encode("ab<|turn|>c", add_special=False, parse_special=True)
    assert ids == [spm.token_id("▁ab"), turn, spm.token_id("▁c")]   # text after a special gets a prefix
    assert spm.decode(ids) == "ab c"
    assert spm.decode(ids, special=True) == "ab<|turn|> c"


def test_spm_streaming_holds_partial_characters(spm):
    ids = spm.encode("é ab", add_special=False)
    stream = spm.stream(strip_leading_space=True)
    chunks = [stream.add(i) for i in ids]
    assert chunks[:3] == ["", "", "é"]                   # "▁" stripped, then the two bytes of é
    assert "".join(chunks) + stream.finish() == "é ab"


def test_streaming_replaces_invalid_bytes(spm):
    stream = spm.stream()
    assert stream.add(spm.token_id("<0xC3>")) == ""
    assert stream.add(spm.token_id("a")) == "\ufffda"     # a lead byte without its continuation
    assert stream.add(spm.token_id("<0xE2>")) == ""
    assert stream.finish() == "\ufffd"


# ---- byte-level BPE -----------------------------------------------------------------------------

def bpe_metadata(pre: str = "gpt-2", **extra) -> dict:
    merges = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġwor ld", "l d"]
    tokens = list(BYTE_TO_CHAR)
    for m in merges:
        a, b = m.split(" ")
        if a + b not in tokens:
            tokens.append(a + b)
    tokens += ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool>"]
    types = [NORMAL] * (len(tokens) - 4) + [CONTROL, CONTROL, CONTROL, USER_DEFINED]
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges, **extra}


@pytest.fixture
def bpe():
    return Tokenizer.from_metadata(bpe_metadata())


def test_bpe_merges(bpe):
    t = bpe.token_id
    assert bpe.encode("hello world") == [t("hello"), t("Ġworld")]
    assert bpe.encode("hello", add_special=False) == [t("hello")]   # gpt-2 adds no BOS
    assert bpe.encode("ü") == [t(byte_encode("ü")[0]), t(byte_encode("ü")[1])]
    assert bpe.decode(bpe.encode("hello world ü!")) == "hello world ü!"


def test_bpe_special_partition(bpe):
    t = bpe.token_id
    text = "<|im_start|>hello<|im_end|><tool>"
    assert bpe.encode(text, parse_special=True) == [t("<|im_start|>"), t("hello"), t("<|im_end|>"), t("<tool>")]
    plain = bpe.encode(text)
    assert t("<|im_start|>") not in plain and t("<tool>") in plain   # user-defined tokens always match
    assert bpe.is_eog(t("<|im_end|>")) and bpe.is_eog(t("<|endoftext|>"))


def test_bpe_streaming_multibyte(bpe):
    ids = bpe.encode("a😀b")
    assert len(ids) == 6                                  # 1 + four bytes + 1
    stream = bpe.stream()
    out = [stream.add(i) for i in ids]
    assert out == ["a", "", "", "", "😀", "b"]
    assert stream.finish() == ""


def test_bpe_add_bos_flag():
    tok = Tokenizer.from_metadata(bpe_metadata(**{"tokenizer.ggml.bos_token_id": 256,
                                                  "tokenizer.ggml.add_bos_token": True}))
    assert tok.encode("hello")[0] == 256
    assert tok.encode("hello", add_special=False)[0] != 256


def test_decode_refuses_ids_outside_the_vocabulary(bpe):
    with pytest.raises(BadRequestError, match="outside the vocabulary"):
        bpe.decode([0, bpe.vocab_size])
    with pytest.raises(BadRequestError):
        bpe.stream().add(-1)


def test_clean_up_spaces():
    assert clean_up_spaces(b"Hi , there . I 'm ok ' ' it 's") == b"Hi, there. I'm ok'' it's"


def test_unknown_pre_tokenizer_and_model():
    with pytest.raises(UnsupportedError, match="no-such-pre"):
        Tokenizer.from_metadata(bpe_metadata(pre="no-such-pre"))
    with pytest.raises(UnsupportedError, match="bert"):
        Tokenizer.from_metadata({"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["a"]})
    with pytest.raises(GGUFFormatError):
        Tokenizer.from_metadata({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a"]})


# ---- the command line -----------------------------------------------------------------------------

def _write_vocab_gguf(path: Path, metadata: dict) -> Path:
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model(metadata["tokenizer.ggml.model"])
    writer.add_tokenizer_pre(metadata["tokenizer.ggml.pre"])
    writer.add_token_list(metadata["tokenizer.ggml.tokens"])
    writer.add_token_types(metadata["tokenizer.ggml.token_type"])
    writer.add_token_merges(metadata["tokenizer.ggml.merges"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_tokenize_command(tmp_path, capsys, monkeypatch):
    import io
    import json

    from pyshim.cli import main

    model = _write_vocab_gguf(tmp_path / "vocab.gguf", bpe_metadata())
    tok = Tokenizer.from_metadata(bpe_metadata())
    assert main(["tokenize", str(model), "--text", "<|im_start|>hello world", "--parse-special", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"ids": tok.encode("<|im_start|>hello world", parse_special=True)}
    (tmp_path / "in.txt").write_text("hello\n", "utf-8")
    assert main(["tokenize", str(model), "--file", str(tmp_path / "in.txt"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"ids": tok.encode("hello\n")}
    monkeypatch.setattr("sys.stdin", io.StringIO("hello"))
    assert main(["tokenize", str(model), "--file", "-"]) == 0
    out = capsys.readouterr().out
    assert f"{tok.token_id('hello'):>8}  'hello'" in out and out.strip().endswith("1 token")
