"""The local verifier: the bundle's own target graphs (`full`, or `head@k` + `tail@k`).

Scores [last, d_1..d_γ] in one forward of the target `Stack` (or, for drafts an early-exit
head made, only `tail@k` over the hidden states it computed), then applies the acceptance
rule (`accept.py`). The verdict is ready when `submit` returns; the decode loop truncates
the cache to the accepted prefix through `truncate`. Under a grammar every row it scores has
the grammar's forbidden tokens at -inf before the rule sees it.
"""

from __future__ import annotations

from time import perf_counter

import numpy as np

from edgespec.runtime.grammar.constraints import Constraint
from edgespec.runtime.graphs.stack import Stack
from edgespec.runtime.graphs.tree_verify import tree_feed
from edgespec.runtime.round import Done, Proposal, ScoredRows, Start, Verdict
from edgespec.runtime.sampling import SamplingParams, next_token
from edgespec.runtime.stats import RoundStats
from edgespec.runtime.verify.accept import accept
from edgespec.runtime.verify.tree_accept import accept_tree


class LocalVerifier:
    def __init__(self, target: Stack, trees: bool = True) -> None:
        """trees=False: verify a tree proposal's main path (split mode's fallback on a device
        bundle without tree graphs, whose drafter proposes trees for the server)."""
        self.target, self.trees = target, trees
        self.max_positions = target.max_positions
        self.constraint: Constraint | None = None

    def prefill(self, start: Start) -> tuple[int, RoundStats]:
        began = perf_counter()
        prompt, self.constraint = start.prompt, start.constraint
        # keep the cached prefix (a conversation's earlier turns), at least the last prompt
        # token is processed: its logits start decoding
        kept = self.target.resume(start.capacity, min(start.cached, len(prompt) - 1))
        logits = self.target.forward(np.asarray(prompt[kept:], dtype=np.int64), keep=1)
        if start.constraint is not None:
            logits = start.constraint.mask_rows(logits, prompt, [])
        token = next_token(logits[-1], start.params, start.rng)
        seconds = perf_counter() - began
        stats = RoundStats(
            "prefill", 1, len(prompt) - kept, seconds, verify_seconds=seconds, cached_tokens=kept
        )
        return token, stats

    def max_drafts(self, seq: list[int]) -> int:
        return self.target.max_positions - len(seq)

    def submit(
        self, seq: list[int], proposal: Proposal, params: SamplingParams, rng: np.random.Generator
    ) -> Done:
        start = perf_counter()
        g = len(proposal.tokens)
        trees = self.trees and self.target.verifies_trees
        if proposal.tree is not None and proposal.tail is None and trees:
            return self._submit_tree(seq, proposal, params, rng, start)
        if proposal.tail is not None:
            logits = self.target.forward_tail(proposal.tail.tail, proposal.tail.hidden, g + 1)
        else:
            ids = np.array([seq[-1], *proposal.tokens], np.int64)
            logits = self.target.forward(ids, keep=g + 1)
        if self.constraint is not None:
            logits = self.constraint.mask_rows(logits, seq, proposal.tokens)
        n, token = accept(proposal.tokens, proposal.q, logits, params, rng)
        head = proposal.tail.head_seconds if proposal.tail is not None else 0.0
        rows = ScoredRows([seq[-1], *proposal.tokens], logits)
        tokens = [*proposal.tokens[:n], token]
        return Done(Verdict(n, tokens, perf_counter() - start + head, rows=rows), g)

    def _submit_tree(
        self,
        seq: list[int],
        proposal: Proposal,
        params: SamplingParams,
        rng: np.random.Generator,
        start: float,
    ) -> Done:
        """Score every node of the proposal's tree in one forward, accept a root path, and
        leave the cache holding seq + that path (its rows gathered into place)."""
        tree = proposal.tree
        assert tree is not None
        ids, positions, mask = tree_feed(seq[-1], tree, len(seq))
        logits = self.target.forward_tree(ids, positions, mask, keep=len(ids))
        q = proposal.tree_q if proposal.kind == "sampled" else None
        path, token = accept_tree(tree, q, logits, params, rng)
        assert self.target.cache is not None
        self.target.cache.keep_rows(len(seq), path)  # node i's row is len(seq) + i
        tokens = [*(tree.tokens[i] for i in path), token]
        # each row scores what follows its own token: Token Recycling learns from every node
        rows = ScoredRows([seq[-1], *tree.tokens], logits)
        verdict = Verdict(len(path), tokens, perf_counter() - start, rows=rows, tree=True)
        return Done(verdict, len(tree))

    def catch_up(self, seq: list[int], capacity: int, synced: int) -> int:
        """Bring the cache to hold seq[:-1] from its first `synced` tokens (-1: a new cache);
        used when verification moves here mid-generation. Returns the tokens it now holds."""
        kept = self.target.resume(capacity, synced)  # synced <= 0: a fresh cache
        if kept < len(seq) - 1:
            self.target.forward(np.asarray(seq[kept : len(seq) - 1], np.int64), keep=0)
        return len(seq) - 1

    def truncate(self, length: int) -> None:
        self.target.truncate(length)

    def close(self) -> None:
        pass
