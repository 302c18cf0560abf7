"""Byte-level BPE (`tokenizer.ggml.model == "gpt2"`: GPT-2, Llama 3, Qwen 2, SmolLM, StarCoder, ...) and
Gemma 4's SPM-style BPE.

Per pre-token word (see pretokenize.py): spell the word in GPT-2's byte alphabet, then repeatedly merge
the adjacent pair with the lowest merge rank (ties: leftmost) — llama.cpp's priority-queue order.
Words repeat a lot in real text, so each distinct word's ids are cached.
"""

from __future__ import annotations

import heapq

from pyshim.text.tokenizer.pretokenize import split
from pyshim.text.tokenizer.unicode import byte_encode
from pyshim.text.tokenizer.vocab import Vocab, symbols_to_ids

WORD_CACHE_LIMIT = 200_000   # entries; the cache is dropped when it grows past this


class BpeTokenizer:
    def __init__(self, vocab: Vocab):
        self.vocab = vocab
        self.token_to_id = vocab.token_to_id
        self.ranks = vocab.merges
        self.steps = vocab.steps
        self._cache: dict[str, list[int]] = {}
        if vocab.byte_encode:
            # A symbol missing from the vocabulary falls back to its UTF-8 bytes as one-byte texts.
            self._byte_ids = [self.token_to_id.get(bytes([b]).decode("utf-8", "surrogateescape")) for b in range(256)]
        else:
            self._byte_ids = [self.token_to_id.get(f"<0x{b:02X}>") for b in range(256)]

    def tokenize(self, text: str, out: list[int]) -> None:
        cache = self._cache
        if len(cache) > WORD_CACHE_LIMIT:
            cache.clear()
        for word in split(text, self.steps):
            ids = cache.get(word)
            if ids is None:
                ids = cache[word] = self._tokenize_word(word)
            out.extend(ids)

    def _tokenize_word(self, word: str) -> list[int]:
        vocab = self.vocab
        token_to_id = self.token_to_id
        text = byte_encode(word) if vocab.byte_encode else word
        whole = token_to_id.get(text)
        if whole is not None and (vocab.ignore_merges or (vocab.pre == "gemma4" and not text.strip("\n"))):
            return [whole]
        ranks = self.ranks
        n = len(text)
        syms = list(text)
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap: list[tuple[int, int, int, str]] = []   # (rank, left, right, merged text)

        def push(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            a, b = syms[left], syms[right]
            rank = ranks.get(a + " " + b)
            if rank is not None:
                heapq.heappush(heap, (rank, left, right, a + b))

        for i in range(n - 1):
            push(i, i + 1)
        while heap:
            _, left, right, merged = heapq.heappop(heap)
            ls, rs = syms[left], syms[right]
            if not ls or not rs or ls + rs != merged:
                continue   # outdated pair
            syms[left] = merged
            syms[right] = ""
            after = nxt[right]
            nxt[left] = after
            if after >= 0:
                prv[after] = left
            push(prv[left], left)
            push(left, after)

        return symbols_to_ids(syms, nxt, token_to_id, self._byte_ids)
