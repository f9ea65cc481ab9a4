"""Draft distributions a drafter can send: a truncated support with quantized probabilities.

A sampling drafter does not sample from its full tempered distribution: `truncate(q, support)`
keeps the `top_k` most likely ids, then the smallest prefix of them that holds `top_p` of
their mass, and quantizes the kept probabilities to integer counts that sum to exactly
`SCALE` (largest remainder; an id whose count rounds to zero is dropped). The result, a
`SparseQ`, IS the distribution: q(x) = count(x) / SCALE, the same float64 on the device and
on the server, and `SparseQ.sample` draws from exactly it (one integer uniform over SCALE).

Why this stays lossless: speculative sampling (accept d with min(1, p(d)/q(d)), on rejection
draw from norm(max(0, p - q))) yields exactly the target's p for ANY q the draft was truly
sampled from; it never needs q to be the draft model's own softmax. So truncating and
quantizing change only how often drafts are accepted, never what is emitted — provided the
q that is sampled from is the q that is checked, which holding it as counts guarantees.

On the wire a support costs 6 bytes an id (int32 id + u16 count), so `top_k` bounds a
drafted token's size: `max_row_bytes(support, vocab)`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SCALE = 65535  # counts are u16 on the wire; q(x) = count / SCALE
ROW_HEADER_BYTES = 4  # u32 support size per row


@dataclass(frozen=True)
class DraftSupport:
    """How a sampling drafter truncates its distribution: at most `top_k` ids (0: no cap),
    then the smallest most-likely prefix holding `top_p` of their mass."""

    top_k: int = 64
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.top_k < 0 or self.top_k > SCALE:
            raise ValueError(f"draft top-k {self.top_k}: choose 1..{SCALE} (0 = no cap)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"draft top-p {self.top_p}: choose a value in (0, 1]")

    def max_ids(self, vocab: int) -> int:
        return min(self.top_k or vocab, vocab, SCALE)


DEFAULT_SUPPORT = DraftSupport()


def max_row_bytes(support: DraftSupport, vocab: int) -> int:
    """The most bytes one drafted token's q row can take on the wire."""
    return ROW_HEADER_BYTES + 6 * support.max_ids(vocab)


@dataclass(frozen=True, eq=False)
class SparseQ:
    """A draft distribution over `ids` (distinct int32) with `counts` (> 0, summing to
    SCALE): q(ids[i]) = counts[i] / SCALE, zero elsewhere."""

    ids: np.ndarray
    counts: np.ndarray

    @property
    def probs(self) -> np.ndarray:
        return self.counts.astype(np.float64) / SCALE

    def prob(self, token: int) -> float:
        hit = np.flatnonzero(self.ids == token)
        return float(self.counts[hit[0]]) / SCALE if len(hit) else 0.0

    def sample(self, rng: np.random.Generator) -> int:
        """A draw from exactly this distribution."""
        u = int(rng.integers(SCALE))
        return int(self.ids[np.searchsorted(np.cumsum(self.counts), u, side="right")])

    def dense(self, vocab: int) -> np.ndarray:
        row = np.zeros(vocab)
        row[self.ids] = self.probs
        return row

    def check(self, vocab: int) -> str | None:
        """What is wrong with it as a distribution over `vocab` ids, or None."""
        if len(self.ids) == 0:
            return "its support is empty"
        if self.ids.min() < 0 or self.ids.max() >= vocab:
            return f"it names ids outside the vocabulary (0..{vocab - 1})"
        if len(np.unique(self.ids)) != len(self.ids):
            return "it names an id twice"
        if self.counts.min() <= 0 or int(self.counts.sum()) != SCALE:
            return f"its counts are not positive or do not sum to {SCALE}"
        return None


def quantize(ids: np.ndarray, p: np.ndarray) -> SparseQ:
    """Counts summing to SCALE, proportional to p over ids (largest remainder); ids whose
    count is 0 are dropped."""
    p = p / p.sum()
    exact = p * SCALE
    counts = np.floor(exact).astype(np.int64)
    short = SCALE - int(counts.sum())
    if short:
        counts[np.argsort(counts - exact, kind="stable")[:short]] += 1
    keep = counts > 0
    return SparseQ(ids[keep].astype(np.int32), counts[keep])


def truncate(q: np.ndarray, support: DraftSupport) -> SparseQ:
    """The draft distribution to sample from: q [V] cut to `support`, quantized."""
    k = support.max_ids(len(q))
    ids = np.argpartition(-q, k - 1)[:k] if k < len(q) else np.arange(len(q))
    ids = ids[np.argsort(-q[ids], kind="stable")]
    ids = ids[q[ids] > 0]
    p = q[ids]
    if support.top_p < 1.0:
        cut = int(np.searchsorted(np.cumsum(p) / p.sum(), support.top_p)) + 1
        ids, p = ids[:cut], p[:cut]
    return quantize(ids, p)
