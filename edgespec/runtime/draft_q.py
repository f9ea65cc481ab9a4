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

`SparseQ` and `SCALE` live in `edgespec.sparse_q` (the wire format's type, shared with the
server; re-exported here). On the wire a support costs 6 bytes an id (int32 id + u16 count),
so `top_k` bounds a drafted token's size (`protocol.max_drafts` sizes rounds by it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgespec.runtime.errors import InputError
from edgespec.runtime.sampling import SamplingParams
from edgespec.sparse_q import SCALE, SparseQ

__all__ = [
    "DEFAULT_SUPPORT",
    "SCALE",
    "DraftSupport",
    "SparseQ",
    "from_logits",
    "quantize",
    "top_ids",
    "truncate",
]


@dataclass(frozen=True)
class DraftSupport:
    """How a sampling drafter truncates its distribution: at most `top_k` ids (0: no cap),
    then the smallest most-likely prefix holding `top_p` of their mass."""

    top_k: int = 128
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.top_k < 0 or self.top_k > SCALE:
            raise InputError(f"draft top-k {self.top_k}: choose 1..{SCALE} (0 = no cap)")
        if not 0 < self.top_p <= 1:
            raise InputError(f"draft top-p {self.top_p}: choose a value in (0, 1]")

    def max_ids(self, vocab: int) -> int:
        return min(self.top_k or vocab, vocab, SCALE)


DEFAULT_SUPPORT = DraftSupport()


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


def top_ids(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values, largest first. Exact: a threshold from a strided
    sample picks candidates (all k largest are among them whenever at least k are), and a
    full argpartition runs only when it picked too few — at a 150k vocabulary a full
    argpartition is ~10x the cost."""
    n = len(values)
    if k >= n:
        return np.argsort(-values, kind="stable")
    stride = max(1, n // (16 * k))
    if stride > 1:
        sample = values[::stride]
        j = min(len(sample), -(-2 * k // stride) + 1)
        candidates = np.flatnonzero(values >= np.partition(sample, -j)[-j])
    else:
        candidates = np.arange(n)
    if len(candidates) < k:
        candidates = np.arange(n)
    top = candidates[np.argpartition(-values[candidates], k - 1)[:k]]
    return top[np.argsort(-values[top], kind="stable")]


def truncate(q: np.ndarray, support: DraftSupport) -> SparseQ:
    """The draft distribution to sample from: q [V] cut to `support`, quantized."""
    ids = top_ids(q, support.max_ids(len(q)))
    ids = ids[q[ids] > 0]
    return _cut(ids, q[ids], support.top_p)


def from_logits(
    logits: np.ndarray, params: SamplingParams, support: DraftSupport
) -> tuple[SparseQ, float]:
    """(truncate(probabilities(logits, params), support), the drafter's confidence: its top
    probability before any top-p), with no pass over the vocabulary beyond a top-k and one
    exp: q's top ids are the top logits. (Ties may order differently; any q is lossless.)"""
    z = np.asarray(logits, np.float32)
    k = support.max_ids(len(z))
    if params.top_k:
        k = min(k, params.top_k)
    ids = top_ids(z, k)
    top = z[ids[0]]
    w = np.exp((z[ids].astype(np.float64) - top) / params.temperature)
    if params.top_k and params.top_k <= k:
        total = float(w.sum())  # the user's top-k is the whole support
    else:
        kept = z if not params.top_k else np.partition(z, -params.top_k)[-params.top_k :]
        e = kept - top
        e *= np.float32(1 / params.temperature)
        total = float(np.exp(e, out=e).sum(dtype=np.float64))
    confidence = float(w[0] / total)
    if params.top_p < 1.0:  # the user's top-p, over the user's distribution
        cut = int(np.searchsorted(np.cumsum(w) / total, params.top_p)) + 1
        ids, w = ids[:cut], w[:cut]
    return _cut(ids, w, support.top_p), confidence


def _cut(ids: np.ndarray, w: np.ndarray, top_p: float) -> SparseQ:
    """The smallest prefix of ids (most likely first) holding top_p of w's mass, quantized."""
    if top_p < 1.0:
        cut = int(np.searchsorted(np.cumsum(w) / w.sum(), top_p)) + 1
        ids, w = ids[:cut], w[:cut]
    return quantize(ids, w)
