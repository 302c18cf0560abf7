"""SentencePiece-style tokenization (`tokenizer.ggml.model == "llama"`): Llama 2, TinyLlama, Gemma, Phi-3.

llama.cpp's algorithm: start from single characters, repeatedly merge the adjacent pair whose
concatenation is a vocabulary token with the highest score (ties: leftmost), and spell characters
that never became a token as byte tokens <0xNN>. A heap of candidate pairs with lazy invalidation
makes this O(n log n).

Speed: the input is cut into words before a run of U+2581 ("▁", the escaped space) wherever no
vocabulary token could span the cut; such words merge independently (no candidate pair crosses the
cut, and the heap order inside each word is unchanged), so each distinct word is tokenized once and
cached. Gemma's vocabulary has a token ">▁</", so for it no cut is made after ">".
"""

from __future__ import annotations

import heapq
import re

from pyshim.text.tokenizer.vocab import Vocab, symbols_to_ids

SPACE = "\u2581"
WORD_CACHE_LIMIT = 200_000   # entries; the cache is dropped when it grows past this


class SpmTokenizer:
    def __init__(self, vocab: Vocab):
        self.vocab = vocab
        self.token_to_id = vocab.token_to_id
        self.scores = vocab.scores
        # Characters some token has right before a "▁" (one regex pass over all texts at C speed; the
        # NUL separator may add itself to the set, which only means fewer cuts).
        glue = sorted(set(re.findall(f"([^{SPACE}]){SPACE}", "\0".join(vocab.tokens))))
        not_glue = "".join(re.escape(c) for c in [SPACE, *glue])
        self._cut = re.compile(rf"(?<=[^{not_glue}])(?={SPACE})")
        self._cache: dict[str, list[int]] = {}
        self._byte_ids = [self._byte_token(b) for b in range(256)]

    def _byte_token(self, b: int) -> int | None:
        found = self.token_to_id.get(f"<0x{b:02X}>")
        if found is None:
            found = self.token_to_id.get(bytes([b]).decode("utf-8", "surrogateescape"))
        return found if found is not None else self.vocab.special.get("unk")

    def tokenize(self, text: str, out: list[int]) -> None:
        """Append the ids of `text` (already escaped: spaces are U+2581) to `out`."""
        cache = self._cache
        if len(cache) > WORD_CACHE_LIMIT:
            cache.clear()
        for word in self._cut.split(text):
            ids = cache.get(word)
            if ids is None:
                ids = cache[word] = self._tokenize_word(word)
            out.extend(ids)

    def _tokenize_word(self, word: str) -> list[int]:
        token_to_id = self.token_to_id
        scores = self.scores
        n = len(word)
        if n == 0:
            return []
        syms = list(word)                    # symbol text; "" once merged into its left neighbour
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap: list[tuple[float, int, int, int]] = []   # (-score, left, right, merged length)

        def push(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            text = syms[left] + syms[right]
            tid = token_to_id.get(text)
            if tid is not None:
                heapq.heappush(heap, (-scores[tid], left, right, len(text)))

        for i in range(n - 1):
            push(i, i + 1)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            ls, rs = syms[left], syms[right]
            if not ls or not rs or len(ls) + len(rs) != size:
                continue   # one side changed since this pair was queued
            syms[left] = ls + rs
            syms[right] = ""
            after = nxt[right]
            nxt[left] = after
            if after >= 0:
                prv[after] = left
            push(prv[left], left)
            push(left, after)

        return symbols_to_ids(syms, nxt, token_to_id, self._byte_ids)

