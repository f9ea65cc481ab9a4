"""Acceptance on a token tree: which root path the target keeps, and its next token.

Takes a `TokenTree` and the target's logits rows for [root, node 0, node 1, ...] (row 0 the
root's: it scores the children of the root; row i + 1 node i's: it scores node i's children).
Returns (the accepted nodes, a root path; the target's token after them).

  greedy    from the root, step to the child whose token is the target's argmax while there
            is one; then the argmax. The longest root path the target agrees with, so the
            output equals the target's own greedy output.
  sampling  recursive rejection sampling at each node over its children in node order
            (SpecInfer; SpecTr's k-sequential): child c with token x is kept with
            probability min(1, r(x) / q(x)), r the residual so far (first the target's p);
            on rejection r <- norm(max(0, r - q)) and the next child is tried; a node none
            of whose children is kept yields a token from r. q is a point mass on x for
            deterministic candidates (`q` None: lookup and suffix-tree drafters, whose
            siblings carry distinct tokens), or the `SparseQ` each child was drawn from
            (siblings drawn independently from one distribution). Either way every token
            emitted follows the target's distribution exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgespec.runtime.draft_q import SparseQ
from edgespec.runtime.sampling import SamplingParams, probabilities, sample
from edgespec.runtime.tree import TokenTree


def _children(tree: TokenTree) -> list[list[int]]:
    """children[node + 1]: the children of node (-1: the root), in node order."""
    out: list[list[int]] = [[] for _ in range(len(tree) + 1)]
    for i, p in enumerate(tree.parents):
        out[p + 1].append(i)
    return out


def accept_tree_greedy(tree: TokenTree, logits: np.ndarray) -> tuple[list[int], int]:
    best = logits.argmax(axis=-1)
    children = _children(tree)
    node, path = -1, []
    while True:
        want = int(best[node + 1])
        nxt = next((c for c in children[node + 1] if tree.tokens[c] == want), None)
        if nxt is None:
            return path, want
        path.append(nxt)
        node = nxt


def accept_tree(
    tree: TokenTree,
    q: Sequence[SparseQ] | None,
    logits: np.ndarray,
    params: SamplingParams,
    rng: np.random.Generator,
) -> tuple[list[int], int]:
    """The rule `params` call for: greedy, or multi-candidate speculative sampling."""
    if params.greedy:
        return accept_tree_greedy(tree, logits)
    children = _children(tree)
    node, path = -1, []
    while True:
        r = probabilities(logits[node + 1], params)  # the residual, normalised before each try
        for c in children[node + 1]:
            x = tree.tokens[c]
            q_x = 1.0 if q is None else q[c].prob(x)
            if rng.random() * q_x < r[x]:  # u < r/q without dividing by a zero q
                path.append(c)
                node = c
                break
            if q is None:
                r[x] = 0.0
            else:
                r[q[c].ids] = np.maximum(r[q[c].ids] - q[c].probs, 0.0)
            total = r.sum()
            if total <= 0.0:  # r = q, yet a draft of q was rejected: x was off q's support
                raise ValueError(f"node {c}'s token {x} has probability 0 under its q")
            r /= total
        else:
            return path, sample(r, rng)
