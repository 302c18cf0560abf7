# Runs inside Pyodide (tests/pyodide_tokenizer.mjs): the tokenizer on the real models' corpus fixture and
# on llama.cpp's test vocabularies, as in CPython. The last expression is the JSON result.
import json
import os
import sys
import time

root = sys.path[0]
sys.path.insert(0, root + "/tests")

from pyshim.text.chat import ChatTemplate  # noqa: E402
from pyshim.gguf.header import read_header  # noqa: E402
from pyshim.text.tokenizer import Tokenizer  # noqa: E402

MODES = {"plain": (False, False), "add_special": (True, False), "parse_special": (True, True)}
HEADER_PREFIX = 16_000_000     # bytes: more than any of the three headers
result = {"python": sys.version.split()[0], "models": {}, "vocabs": {}}

fixture = json.load(open(root + "/tests/fixtures/token_llamacpp.json", encoding="utf-8"))
for name, expected in fixture["models"].items():
    path = root + "/" + expected["file"]
    if not os.path.exists(path):
        continue
    with open(path, "rb") as f:
        metadata = read_header(f.read(HEADER_PREFIX)).metadata
    t0 = time.perf_counter()
    tok = Tokenizer.from_metadata(metadata)
    load_s = time.perf_counter() - t0
    wrong = [case["text"] for case in expected["cases"] + expected["random_cases"]
             for mode, (add, parse) in MODES.items() if mode in case
             and tok.encode(case["text"], add_special=add, parse_special=parse) != case[mode]]
    wrong += [case["text"] for case in expected["cases"] if tok.decode_bytes(case["plain"]).hex() != case["decoded_hex"]]
    chat = ChatTemplate.from_metadata(metadata, tok).encode(tok, [{"role": "user", "content": "Hi"}])
    result["models"][name] = {"wrong": wrong, "load_s": round(load_s, 3), "chat_ids": len(chat)}

if os.environ.get("PYSHIM_LLAMACPP_VOCABS"):
    import llamacpp_vocabs  # reads the variable: the cache folder, already filled by the caller

    for name in llamacpp_vocabs.SUPPORTED_VOCABS:
        with open(llamacpp_vocabs.gguf_path(name), "rb") as f:
            tok = Tokenizer.from_metadata(read_header(f.read()).metadata)
        pairs = llamacpp_vocabs.test_pairs(name)
        result["vocabs"][name] = sum(tok.encode(text, add_special=False) != ids for text, ids in pairs)

json.dumps(result)
