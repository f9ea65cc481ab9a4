"""A drafter under a grammar: the tokens the grammar alone decides come first.

`Forced(drafter, constraint)` wraps a generation's drafter when its output follows a grammar
(`runtime/grammar/constraints.py`); the decode loop drafts through it. A proposal after
`seq` is, in order:
  1. the tokens the grammar forces there (each the only one it allows: `"}`, a schema's
     keys), at most `plan.most`, drawn from a point mass: no drafter proposes them and
     acceptance cannot refuse them (`Proposal.forced` counts them; RoundStats.forced)
  2. the drafter's γ drafts after them, within the round's room, cut before the first one
     the grammar forbids (a model drafter masks its logits as it draws; a lookup's drafts
     are not masked)
A tree proposal goes as its main path: trees are not masked. The drafter's cache may hold
drafts cut here: the round forgets them when it commits (`Drafter.commit`).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from edgespec.runtime.draft_q import SparseQ
from edgespec.runtime.grammar.constraints import Constraint
from edgespec.runtime.round import Drafter, LearnsFromVerify, Plan, Proposal
from edgespec.runtime.sampling import SamplingParams


class Forced:
    """`drafter`'s proposals after the tokens `constraint` forces, within its grammar."""

    def __init__(self, drafter: Drafter, constraint: Constraint) -> None:
        self.drafter, self.constraint = drafter, constraint
        self.drafts_ahead, self.name = drafter.drafts_ahead, drafter.name
        # the last `forced` answer: (where: len(seq) and its last token, limit, tokens)
        self._last: tuple[tuple[int, int | None], int, list[int]] | None = None

    def forced(self, seq: list[int], limit: int) -> list[int]:
        """At most `limit` tokens the grammar alone decides after seq (`Constraint.forced`,
        which masks each position). The last answer is kept: the loop asks whether they end
        the output, then the round's proposal takes them, after the same seq. A walk is
        position by position, so a shorter limit's answer is a prefix of a longer one's."""
        where = (len(seq), seq[-1] if seq else None)
        if self._last is not None:
            at, most, tokens = self._last
            if at == where and (limit <= most or len(tokens) < most):
                return tokens[:limit]
        tokens = self.constraint.forced(seq, limit)
        self._last = (where, limit, tokens)
        return tokens

    def begin(
        self,
        prompt: list[int],
        capacity: int,
        cached: int = 0,
        constraint: Constraint | None = None,
    ) -> None:
        self._last = None
        self.drafter.begin(prompt, capacity, cached, constraint or self.constraint)

    def source(self, seq: list[int]) -> str | None:
        return self.drafter.source(seq)

    def propose(
        self, seq: list[int], plan: Plan, params: SamplingParams, rng: np.random.Generator
    ) -> Proposal:
        forced = self.forced(seq, plan.most)
        after = [*seq, *forced]
        proposal = self.drafter.propose(after, plan.capped(plan.most - len(forced)), params, rng)
        if proposal.tree is not None:
            proposal = replace(proposal, tree=None, tree_q=None)  # its main path, masked
        return _with_forced(forced, self._within_grammar(after, proposal))

    def _within_grammar(self, seq: list[int], proposal: Proposal) -> Proposal:
        """The proposal cut before its first draft the grammar forbids."""
        n = self.constraint.allowed_prefix(seq, proposal.tokens)
        if n == len(proposal.tokens):
            return proposal
        assert proposal.tail is None, "an early-exit head drafts from masked logits"
        q = proposal.q[:n] if proposal.q is not None else None
        return replace(proposal, tokens=proposal.tokens[:n], q=q)

    def observe_verify(self, inputs: list[int], logits: np.ndarray) -> None:
        if isinstance(self.drafter, LearnsFromVerify):
            self.drafter.observe_verify(inputs, logits)

    def commit(self, valid: int) -> None:
        self.drafter.commit(valid)


def _with_forced(forced: list[int], proposal: Proposal) -> Proposal:
    """`forced` + the proposal: forced tokens are drawn from a point mass (sampling's q)."""
    if not forced:
        return proposal
    q = None
    if proposal.kind == "sampled":
        q = [SparseQ.point(t) for t in forced]
        q += proposal.q or []
    kind = proposal.kind if proposal.tokens else "point"
    tokens = [*forced, *proposal.tokens]
    return replace(proposal, tokens=tokens, kind=kind, q=q, forced=len(forced))
