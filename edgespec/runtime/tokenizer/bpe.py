"""The BPE model of tokenizer.json: a word -> token ids, merged like the Rust library.

Takes the "model" object (vocab, merges as "a b" strings or [a, b] pairs, byte_fallback,
unk/fuse_unk, continuing_subword_prefix, end_of_word_suffix, ignore_merges); merges apply in
rank order through a heap, so the ids equal `tokenizers`' for every word. Dropout (random) is
refused.
"""

from __future__ import annotations

import heapq
from typing import Any

from edgespec.runtime.tokenizer.errors import TokenizerError


class _BPE:
    """The BPE model: per-word cache + the Rust library's heap-ordered merge loop."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        if cfg.get("dropout") not in (None, 0, 0.0):
            raise TokenizerError(f"BPE dropout={cfg['dropout']} is not supported (random)")
        self.vocab: dict[str, int] = dict(cfg.get("vocab") or {})
        self.prefix: str = cfg.get("continuing_subword_prefix") or ""
        self.suffix: str = cfg.get("end_of_word_suffix") or ""
        self.byte_fallback = bool(cfg.get("byte_fallback"))
        self.fuse_unk = bool(cfg.get("fuse_unk"))
        self.ignore_merges = bool(cfg.get("ignore_merges"))
        self.unk_token: str | None = cfg.get("unk_token")
        self.merges: dict[tuple[int, int], tuple[int, int]] = {}
        for rank, merge in enumerate(cfg.get("merges") or []):
            pair = merge.split(" ") if isinstance(merge, str) else merge
            if len(pair) != 2:
                raise TokenizerError(f"bad BPE merge #{rank}: {merge!r}")
            a, b = pair
            new = a + b[len(self.prefix) :]
            if a not in self.vocab or b not in self.vocab or new not in self.vocab:
                raise TokenizerError(f"BPE merge #{rank} {merge!r} uses a token not in the vocab")
            self.merges[(self.vocab[a], self.vocab[b])] = (rank, self.vocab[new])
        self.cache: dict[str, list[int]] = {}

    def tokenize(self, word: str) -> list[int]:
        if not word:
            return []
        if self.ignore_merges and word in self.vocab:
            return [self.vocab[word]]
        hit = self.cache.get(word)
        if hit is not None:
            return hit
        ids = self._merge(self._symbols(word))
        if len(word) < 256:
            if len(self.cache) > 100_000:
                self.cache.clear()
            self.cache[word] = ids
        return ids

    def _symbols(self, word: str) -> list[int]:
        vocab = self.vocab
        if not (self.prefix or self.suffix):
            try:
                return [vocab[c] for c in word]
            except KeyError:
                pass
        ids: list[int] = []
        unk_pending = False
        last = len(word) - 1
        for i, ch in enumerate(word):
            s = (self.prefix if i and self.prefix else "") + ch + (self.suffix if i == last else "")
            tid = vocab.get(s)
            if tid is not None:
                if unk_pending:
                    ids.append(self._unk_id())
                    unk_pending = False
                ids.append(tid)
                continue
            if self.byte_fallback:
                byte_ids = [vocab.get(f"<0x{b:02X}>") for b in s.encode()]
                known = [i for i in byte_ids if i is not None]
                if len(known) == len(byte_ids):
                    ids += known
                    continue
            if self.unk_token is not None:
                if unk_pending and not self.fuse_unk:
                    ids.append(self._unk_id())
                unk_pending = True
        if unk_pending:
            ids.append(self._unk_id())
        return ids

    def _unk_id(self) -> int:
        unk = self.unk_token
        if unk is None or unk not in self.vocab:
            raise TokenizerError(f"unk_token {unk!r} is not in the vocab")
        return self.vocab[unk]

    def _merge(self, ids: list[int]) -> list[int]:
        n = len(ids)
        if n < 2:
            return ids
        merges = self.merges
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prev = list(range(-1, n - 1))
        alive = [True] * n
        heap = [
            (m[0], i, m[1])
            for i in range(n - 1)
            if (m := merges.get((ids[i], ids[i + 1]))) is not None
        ]
        heapq.heapify(heap)
        while heap:
            _, pos, new_id = heapq.heappop(heap)
            j = nxt[pos]
            if not alive[pos] or j == -1:
                continue
            m = merges.get((ids[pos], ids[j]))
            if m is None or m[1] != new_id:
                continue
            ids[pos], alive[j] = new_id, False
            k = nxt[pos] = nxt[j]
            if k != -1:
                prev[k] = pos
            p = prev[pos]
            if p != -1 and (m := merges.get((ids[p], new_id))) is not None:
                heapq.heappush(heap, (m[0], p, m[1]))
            if k != -1 and (m := merges.get((new_id, ids[k]))) is not None:
                heapq.heappush(heap, (m[0], pos, m[1]))
        return [t for t, a in zip(ids, alive, strict=True) if a]
