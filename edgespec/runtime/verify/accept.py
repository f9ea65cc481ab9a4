"""The acceptance rules of speculative decoding, shared by the device and the server.

Given the drafts d_1..d_γ and the target's logits rows for [last, d_1..d_γ] (γ + 1 rows):
  greedy    the longest prefix the target's argmax agrees with, then its argmax;
  sampling  d_i kept with probability min(1, p(d_i)/q(d_i)); on the first rejection a token
            from norm(max(0, p - q)); all kept: a bonus token from p.
q is the distribution each draft was drawn from (`SparseQ`: a support and exact
probabilities, zero elsewhere; see draft_q), or None for a deterministic drafter (prompt
lookup: q is a point mass on d_i). So greedy output equals the target's own
greedy output, and sampled output follows the target's distribution (Leviathan et al. 2023;
Chen et al. 2023).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgespec.runtime.draft_q import SparseQ
from edgespec.runtime.sampling import SamplingParams, probabilities, sample


def accept_greedy(tokens: Sequence[int], logits: np.ndarray) -> tuple[int, int]:
    """(accepted count n, the target's token after d_1..d_n)."""
    best = logits.argmax(axis=-1)
    n = 0
    while n < len(tokens) and best[n] == tokens[n]:
        n += 1
    return n, int(best[n])


def accept(
    tokens: Sequence[int],
    q: Sequence[SparseQ] | None,
    logits: np.ndarray,
    params: SamplingParams,
    rng: np.random.Generator,
) -> tuple[int, int]:
    """The rule `params` call for over target logits rows [γ + 1, V]: greedy, or speculative
    sampling of drafts `tokens` (drawn from the sparse distributions `q`)."""
    if params.greedy:
        return accept_greedy(tokens, logits)
    for i, d in enumerate(tokens):
        p = probabilities(logits[i], params)
        q_d = 1.0 if q is None else q[i].prob(d)
        if rng.random() * q_d < p[d]:  # u < p/q without dividing by a zero q
            continue
        residual = p  # max(0, p - q): p itself off q's support (p is ours to change)
        if q is None:
            residual[d] = 0.0
        else:
            residual[q[i].ids] = np.maximum(p[q[i].ids] - q[i].probs, 0.0)
        return i, sample(residual, rng)
    return len(tokens), sample(probabilities(logits[-1], params), rng)
