"""Token Recycling: drafts from the candidates the target itself ranked in earlier verifies.

  RecycleTable     an adjacency table: for each token id, the top-k tokens the target scored
                   after it the last time it verified a row whose input was that id, with their
                   probabilities (the verify's softmax). Bounded: vocab × k entries, allocated
                   at the first update; shared by every generation on one bundle, thread-safe
  RecyclingDrafter the most likely path through the table from the sequence's last token (a
                   chain, cut after a token under the plan's confidence stop), or the
                   `budget` most likely nodes within a depth (a tree, grown breadth by score
                   from the table each round, see `tree_draft.best_first`; a node's score is
                   its rank's measured acceptance, `RecycleConfig.rank_scores`)

The decode loop feeds the table: a drafter that `LearnsFromVerify` gets the ids of each
verified row ([last, d_1..d_g]) and the target's logits there, when the verifier has them
(local graphs; a server's verdict carries none, so in split mode the table stays as it was).
Deterministic: q is a point mass, like lookup's.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from time import perf_counter

import numpy as np

from edgespec.runtime.drafters.tree_draft import best_first, greedy_chain
from edgespec.runtime.grammar.constraints import Constraint
from edgespec.runtime.round import Plan, Proposal, empty_proposal
from edgespec.runtime.sampling import SamplingParams
from edgespec.runtime.tree import TokenTree


@dataclass(frozen=True)
class RecycleConfig:
    # successors kept per token: the Token Recycling paper keeps 8; the tree's width per node
    top_k: int = 8
    # a tree's node scores by rank among its siblings, not by the recorded softmax: greedy
    # verification takes the argmax, which a recycled top-1 is far more often than its
    # probability says. Measured (benchmarks.trees replay, the trained code model and
    # SmolLM2-135M): rank 0 accepted 0.6-0.9 of the rounds that reach it, rank 1 0.04-0.12,
    # later ranks 0.02-0.05. Empty: score by the softmax
    rank_scores: tuple[float, ...] = (0.7, 0.08, 0.04, 0.03, 0.02, 0.02, 0.02, 0.02)


RECYCLE = RecycleConfig()


class RecycleTable:
    def __init__(self, top_k: int = RECYCLE.top_k) -> None:
        if top_k < 1:
            raise ValueError(f"a recycle table keeps at least one successor, not {top_k}")
        self.top_k = top_k
        self.ids: np.ndarray | None = None  # (vocab, k) int32, -1 where nothing is known
        self.probs: np.ndarray | None = None  # (vocab, k) float32, best first
        self.lock = threading.Lock()

    def update(self, inputs: list[int], logits: np.ndarray) -> None:
        """Row i of `logits` scored the token after `inputs[i]`: keep its top-k."""
        rows = np.asarray(logits, np.float32)[: len(inputs)]
        if rows.ndim != 2 or rows.shape[0] == 0:
            return
        vocab, k = rows.shape[1], min(self.top_k, rows.shape[1])
        top = np.argpartition(-rows, k - 1, axis=1)[:, :k]
        picked = np.take_along_axis(rows, top, axis=1)
        order = np.argsort(-picked, axis=1)
        top, picked = np.take_along_axis(top, order, 1), np.take_along_axis(picked, order, 1)
        finite = np.isfinite(rows)
        peak = np.where(finite, rows, -np.inf).max(axis=1, keepdims=True)
        norm = np.where(finite, np.exp(rows - peak), 0.0).sum(axis=1, keepdims=True)
        probs = np.exp(picked - peak) / norm
        with self.lock:
            if self.ids is None or self.ids.shape[0] != vocab:
                self.ids = np.full((vocab, self.top_k), -1, np.int32)
                self.probs = np.zeros((vocab, self.top_k), np.float32)
            assert self.probs is not None
            for token, ids, p in zip(inputs, top, probs, strict=True):
                if 0 <= token < vocab:
                    self.ids[token, :k] = ids
                    self.probs[token, :k] = np.where(np.isfinite(p), p, 0.0)

    def successors(self, token: object) -> list[tuple[int, float, object]]:
        """(id, probability, id) for each kept successor of `token`, best first."""
        if self.ids is None or self.probs is None:
            return []
        t = int(token)  # type: ignore[call-overload]
        if not 0 <= t < self.ids.shape[0]:
            return []
        return [
            (int(i), float(p), int(i))
            for i, p in zip(self.ids[t], self.probs[t], strict=True)
            if i >= 0
        ]


class RecyclingDrafter:
    """Token Recycling over a (shared) adjacency table of the target's earlier top-k."""

    drafts_ahead = False  # the table learns from the verdict it would draft past
    name = "recycle"

    def __init__(self, table: RecycleTable | None = None, config: RecycleConfig = RECYCLE):
        self.table = table if table is not None else RecycleTable(config.top_k)
        self.config = config

    def begin(
        self,
        prompt: list[int],
        capacity: int,
        cached: int = 0,
        constraint: Constraint | None = None,
    ) -> None:
        pass  # the table outlives generations: what the target ranked once is kept

    def source(self, seq: list[int]) -> str | None:
        return self.name if seq and self.table.successors(seq[-1]) else None

    def observe_verify(self, inputs: list[int], logits: np.ndarray) -> None:
        self.table.update(inputs, logits)

    def propose(
        self, seq: list[int], plan: Plan, params: SamplingParams, rng: np.random.Generator
    ) -> Proposal:
        start = perf_counter()
        tokens: list[int] = []
        if seq and plan.length > 0:
            with self.table.lock:
                tokens = greedy_chain(seq[-1], self.table.successors, plan)[0]
        if not tokens:
            return empty_proposal(perf_counter() - start)
        return Proposal(tokens, "point", None, perf_counter() - start)

    def propose_tree(self, seq: list[int], budget: int, max_depth: int) -> TokenTree:
        if not seq:
            return TokenTree((), ())
        scores = self.config.rank_scores
        with self.table.lock:
            if not scores:
                return best_first(seq[-1], self.table.successors, budget, max_depth)[0]

            def ranked(token: object) -> list[tuple[int, float, object]]:
                kept = self.table.successors(token)[: len(scores)]
                return [(t, scores[r], t) for r, (t, _, _) in enumerate(kept)]

            return best_first(seq[-1], ranked, budget, max_depth)[0]

    def commit(self, valid: int) -> None:
        pass
