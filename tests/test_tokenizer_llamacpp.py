"""Token ids identical to llama.cpp's.

1. llama.cpp's own test vocabularies (vocab-only GGUFs with .inp/.out pairs, fetched once from the
   llama-cpp-python sdist by tests/llamacpp_vocabs.py): every vocabulary of a supported type.
2. The three real models on tests/fixtures/tokenizer_corpus.txt, against ids recorded with llama.cpp
   (tests/fixtures/make_token_fixtures.py): three tokenize modes, detokenized text, pieces, EOG ids,
   and the ≈100 KB English benchmark text (as a hash).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pyshim.gguf.header import read_header_from_file
from pyshim.text.tokenizer import Tokenizer

HERE = Path(__file__).parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import llamacpp_vocabs  # noqa: E402

SUPPORTED_VOCABS = llamacpp_vocabs.SUPPORTED_VOCABS
MODES = {"plain": (False, False), "add_special": (True, False), "parse_special": (True, True)}
FIXTURE = HERE / "fixtures" / "token_llamacpp.json"


@pytest.mark.slow
@pytest.mark.parametrize("name", SUPPORTED_VOCABS)
def test_llamacpp_vocab_pairs(name):
    tok = Tokenizer.from_metadata(read_header_from_file(llamacpp_vocabs.gguf_path(name)).metadata)
    pairs = llamacpp_vocabs.test_pairs(name)
    assert len(pairs) >= 40
    wrong = [(text, want, got) for text, want in pairs
             if (got := tok.encode(text, add_special=False, parse_special=False)) != want]
    assert not wrong, f"{len(wrong)} of {len(pairs)} differ, first: {wrong[0]}"


@pytest.mark.slow
def test_every_llamacpp_vocab_is_listed():
    # A new vocabulary in a newer sdist must be either supported or knowingly left out.
    assert set(llamacpp_vocabs.vocab_names()) - set(SUPPORTED_VOCABS) == {"bert-bge"}


@pytest.mark.slow
def test_every_pre_tokenizer_matches_llamacpp():
    # llama.cpp's Qwen 2 test vocabulary with each `tokenizer.ggml.pre` value pyshim knows, on seeded
    # random texts (tests/fixtures/make_pretokenizer_fixtures.py stores llama.cpp's ids as digests)
    from pyshim.text.tokenizer.pretokenize import supported_pre_tokenizers

    expected = json.loads((HERE / "fixtures" / "pretokenizer_llamacpp.json").read_text("utf-8"))
    assert set(expected["digests"]) == set(supported_pre_tokenizers()) - {"gemma4"}
    metadata = read_header_from_file(llamacpp_vocabs.gguf_path(expected["base_vocab"])).metadata
    wrong = []
    for name, digests in sorted(expected["digests"].items()):
        tok = Tokenizer.from_metadata(dict(metadata, **{"tokenizer.ggml.pre": name}))
        plain = [tok.encode(t, add_special=False) for t in expected["texts"]]
        special = [tok.encode(t, add_special=True, parse_special=True) for t in expected["texts"]]
        if hashlib.sha256(json.dumps(plain).encode()).hexdigest() != digests["plain"]:
            wrong.append((name, "plain"))
        if hashlib.sha256(json.dumps(special).encode()).hexdigest() != digests["parse_special"]:
            wrong.append((name, "parse_special"))
    assert not wrong


def _fixture() -> dict:
    return json.loads(FIXTURE.read_text("utf-8"))


def _tokenizer(rel: str) -> Tokenizer:
    path = ROOT / rel
    if not path.is_file():
        pytest.skip(f"{rel} not placed (run `pyshim setup --test-models`)")
    return Tokenizer.from_metadata(read_header_from_file(path).metadata)


def test_fixture_matches_corpus():
    fixture = _fixture()
    corpus = HERE / "fixtures" / "tokenizer_corpus.txt"
    assert fixture["corpus_sha256"] == hashlib.sha256(corpus.read_bytes()).hexdigest(), \
        "corpus changed: regenerate with tests/fixtures/make_token_fixtures.py"


@pytest.mark.models
@pytest.mark.parametrize("model", ["smollm2", "gemma3", "qwen2.5"])
def test_real_model_ids_match_llamacpp(model):
    expected = _fixture()["models"][model]
    tok = _tokenizer(expected["file"])
    for case in expected["cases"]:
        for mode, (add_special, parse_special) in MODES.items():
            got = tok.encode(case["text"], add_special=add_special, parse_special=parse_special)
            assert got == case[mode], (mode, case["text"])
    assert (tok.bos_id, tok.eos_id) == (expected["bos"], expected["eos"])
    assert set(expected["eog"]) <= tok.eog_ids


@pytest.mark.models
@pytest.mark.parametrize("model", ["smollm2", "gemma3", "qwen2.5"])
def test_real_model_decode_matches_llamacpp(model):
    expected = _fixture()["models"][model]
    tok = _tokenizer(expected["file"])
    round_trips = 0
    for case in expected["cases"]:
        assert tok.decode_bytes(case["plain"]).hex() == case["decoded_hex"], case["text"]
        assert tok.decode_bytes(case["parse_special"], special=True).hex() == case["decoded_special_hex"], case["text"]
        if bytes.fromhex(case["decoded_hex"]) == case["text"].encode("utf-8"):   # llama.cpp round-trips it
            assert tok.decode(tok.encode(case["text"], add_special=False)) == case["text"]
            round_trips += 1
    assert round_trips >= len(expected["cases"]) // 2
    for token_id, (plain, special) in expected["pieces"].items():
        assert tok.piece_bytes(int(token_id)).hex() == plain
        assert tok.piece_bytes(int(token_id), special=True).hex() == special


@pytest.mark.models
@pytest.mark.parametrize("model", ["smollm2", "gemma3", "qwen2.5"])
def test_real_model_random_texts_and_ids(model):
    # seeded random mixes of tricky fragments (spaces, digits, contractions, scripts, emoji, special-token
    # texts), and random id sequences detokenized in llama_detokenize's four modes
    expected = _fixture()["models"][model]
    tok = _tokenizer(expected["file"])
    for case in expected["random_cases"]:
        assert tok.encode(case["text"], add_special=False) == case["plain"], case["text"]
        assert tok.encode(case["text"], add_special=True, parse_special=True) == case["parse_special"], case["text"]
    modes = [(remove, special) for remove in (False, True) for special in (False, True)]
    for case in expected["random_decodes"]:
        for (remove, special), want in zip(modes, case["decoded_hex"]):
            assert tok.decode_bytes(case["ids"], special=special, remove_special=remove).hex() == want, case["ids"]


@pytest.mark.models
@pytest.mark.parametrize("model", ["smollm2", "gemma3", "qwen2.5"])
def test_real_model_stream_equals_decode(model):
    expected = _fixture()["models"][model]
    tok = _tokenizer(expected["file"])
    for case in expected["cases"]:
        stream = tok.stream()
        chunks = [stream.add(i) for i in case["plain"]]
        text = "".join(chunks) + stream.finish()
        pieces = b"".join(tok.piece_bytes(i) for i in case["plain"])
        assert text == pieces.decode("utf-8", "replace"), case["text"]
        if "\ufffd" not in text:
            assert all("\ufffd" not in c for c in chunks)


@pytest.mark.models
@pytest.mark.parametrize("model", ["smollm2", "gemma3", "qwen2.5"])
def test_real_model_long_english_text(model):
    from english_text import long_english_text, text_sha256

    expected = _fixture()["models"][model]
    text = long_english_text()
    if text_sha256(text) != expected["long_text"]["text_sha256"]:
        pytest.skip("this Python's pydoc text differs from the one recorded (another Python version)")
    tok = _tokenizer(expected["file"])
    ids = tok.encode(text, add_special=False)
    assert len(ids) == expected["long_text"]["n_ids"]
    assert hashlib.sha256(json.dumps(ids).encode()).hexdigest() == expected["long_text"]["sha256"]


@pytest.mark.models
def test_tokenize_command():
    if not (ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf").is_file():
        pytest.skip("smollm2 not placed")
    out = subprocess.run([sys.executable, "-m", "pyshim.cli", "tokenize", "smollm2", "--text",
                          "<|im_start|>Hi", "--parse-special", "--json"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert json.loads(out) == {"ids": [1, 26843]}   # llama.cpp: <|im_start|>, "Hi"


@pytest.mark.models
@pytest.mark.parametrize("model", ["smollm2", "qwen2.5"])
def test_tokenize_file_reads_bytes_verbatim(model, tmp_path):
    """`tokenize --file` and `score --file` read a file's bytes as llama.cpp does: a CRLF text gives
    llama.cpp's ids for the CRLF text (recorded by llama.cpp), not those of the text with the CRs gone."""
    expected = _fixture()["models"][model]
    _tokenizer(expected["file"])
    cases = [c for c in expected["random_cases"] if "\r\n" in c["text"]][:8]
    assert len(cases) == 8
    text = "".join(c["text"] for c in cases)
    want = _tokenizer(expected["file"]).encode(text, add_special=False)
    # the ids of each recorded piece are llama.cpp's; their concatenation is checked against the whole too
    assert all(_tokenizer(expected["file"]).encode(c["text"], add_special=False) == c["plain"] for c in cases)
    path = tmp_path / "crlf.txt"
    path.write_bytes(text.encode("utf-8"))
    assert path.read_text("utf-8") != text                        # text mode would drop the CRs
    out = subprocess.run([sys.executable, "-m", "pyshim.cli", "tokenize", model, "--file", str(path), "--json"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert json.loads(out)["ids"] == want
    one = cases[0]
    path.write_bytes(one["text"].encode("utf-8"))
    out = subprocess.run([sys.executable, "-m", "pyshim.cli", "tokenize", model, "--file", str(path), "--json"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert json.loads(out)["ids"] == one["plain"]                  # exactly llama.cpp's ids
    assert json.loads(out)["ids"] != _tokenizer(expected["file"]).encode(one["text"].replace("\r\n", "\n"), add_special=False)
    scored = subprocess.run([sys.executable, "-m", "pyshim.cli", "score", model, "--file", str(path), "--top-k", "1", "--json"],
                            capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert json.loads(scored)["ids"] == _tokenizer(expected["file"]).encode(one["text"], add_special=True)
