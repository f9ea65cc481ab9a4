"""Prompt lookup (`LookupDrafter`), model-free: continues an n-gram of the recent text where
it occurred earlier in the prompt or output; as a tree, the last few places it occurred are its
branches. Deterministic, so q is a point mass.
"""

from __future__ import annotations

from time import perf_counter

import numpy as np

from edgespec.runtime.drafters.tree_draft import merged_paths
from edgespec.runtime.grammar.constraints import Constraint
from edgespec.runtime.round import Plan, Proposal, empty_proposal
from edgespec.runtime.sampling import SamplingParams
from edgespec.runtime.tree import TokenTree


class LookupDrafter:
    """Prompt lookup: the longest recent n-gram (n = max_ngram..min_ngram) that occurred
    before proposes the tokens that followed it. Deterministic, so q is a point mass."""

    drafts_ahead = False
    name = "lookup"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 2, branches: int = 4) -> None:
        self.max_ngram, self.min_ngram, self.branches = max_ngram, min_ngram, branches
        # where each n-gram ended, the last `branches` times (most recent last)
        self.ends: dict[tuple[int, ...], list[int]] = {}
        self.indexed = 0

    def begin(
        self,
        prompt: list[int],
        capacity: int,
        cached: int = 0,
        constraint: Constraint | None = None,
    ) -> None:
        # the index covers the last sequence up to `indexed`: still exact if the prompt
        # shares all of it (a conversation's next turn), else rebuilt (lazily, in propose)
        if cached < self.indexed:
            self.ends, self.indexed = {}, 0

    def source(self, seq: list[int]) -> str | None:
        return self.name if self._match(seq) is not None else None

    def propose(
        self, seq: list[int], plan: Plan, params: SamplingParams, rng: np.random.Generator
    ) -> Proposal:
        start = perf_counter()
        end = self._match(seq)
        if end is not None and plan.length > 0:
            tokens = seq[end + 1 : end + 1 + plan.length]
            return Proposal(tokens, "point", None, perf_counter() - start)
        return empty_proposal(perf_counter() - start)

    def _match(self, seq: list[int]) -> int | None:
        """Where the longest recent n-gram last ended before, or None."""
        ends = self._matches(seq)
        return ends[-1] if ends else None

    def _matches(self, seq: list[int]) -> list[int]:
        """Where the longest recent n-gram ended before, its last few times (oldest first)."""
        self._index(seq, upto=len(seq) - 1)  # n-grams ending before the current last token
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            ends = self.ends.get(tuple(seq[-n:])) if len(seq) > n else None
            if ends:
                return ends
        return []

    def _index(self, seq: list[int], upto: int) -> None:
        for end in range(self.indexed, upto):
            for n in range(self.min_ngram, self.max_ngram + 1):
                if end + 1 >= n:
                    ends = self.ends.setdefault(tuple(seq[end + 1 - n : end + 1]), [])
                    ends.append(end)
                    del ends[: -self.branches]
        self.indexed = max(self.indexed, upto)

    def propose_tree(self, seq: list[int], budget: int, max_depth: int) -> TokenTree:
        """The continuations of the longest n-gram's last few matches, merged where they agree
        (a node's score: the share of matches through it; ties: the most recent first)."""
        ends = self._matches(seq)[::-1]
        return merged_paths([seq[e + 1 : e + 1 + max_depth] for e in ends], budget, max_depth)

    def commit(self, valid: int) -> None:
        pass
