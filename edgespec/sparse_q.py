"""A draft distribution as the wire carries it: a support of ids with u16 counts.

`SparseQ(ids, counts)`: distinct int32 ids, counts > 0 summing to `SCALE`; q(ids[i]) =
counts[i] / SCALE exactly, zero elsewhere, the same float64 on the device and on the server.
Here (numpy only) so that `edgespec.protocol` stays a leaf: the runtime builds these
(`runtime.draft_q`), the protocol carries and checks them, the server's acceptance reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SCALE = 65535  # counts are u16 on the wire; q(x) = count / SCALE


@dataclass(frozen=True, eq=False)
class SparseQ:
    """A draft distribution over `ids` (distinct int32) with `counts` (> 0, summing to
    SCALE): q(ids[i]) = counts[i] / SCALE, zero elsewhere."""

    ids: np.ndarray
    counts: np.ndarray

    @classmethod
    def point(cls, token: int) -> SparseQ:
        """All of q's mass on `token` (a forced token, a deterministic candidate)."""
        return cls(np.array([token], np.int32), np.array([SCALE], np.int64))

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
