"""A slow, obviously-correct speculative sampling step: the oracle for the fast path.

Written straight from Leviathan et al. 2023, Algorithm 1, one token at a time, with
explicit divisions and no shortcuts.
"""

from __future__ import annotations

import numpy as np


def reference_speculative_step(
    p_rows: np.ndarray,
    q_rows: list[np.ndarray] | None,
    drafts: list[int],
    rng: np.random.Generator,
) -> list[int]:
    """p_rows: target distributions [γ+1, V]; q_rows: draft distributions (None: point
    masses on the drafts). Returns the accepted drafts followed by one sampled token."""
    out = []
    for i, d in enumerate(drafts):
        p = p_rows[i]
        q = q_rows[i] if q_rows is not None else np.eye(len(p))[d]
        r = rng.random()
        if r < min(1.0, p[d] / q[d]):
            out.append(d)
            continue
        residual = np.maximum(p - q, 0.0)
        residual = residual / residual.sum()
        out.append(int(np.searchsorted(np.cumsum(residual), rng.random() * 1.0, side="right")))
        return out
    p = p_rows[len(drafts)]
    out.append(int(np.searchsorted(np.cumsum(p), rng.random(), side="right")))
    return out
