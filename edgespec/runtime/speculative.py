"""Speculative decoding: draft, verify, accept — losslessly.

One round (`speculative_round`), in order:
  1. draft    the drafter proposes up to γ tokens (γ and early stops from the policy)
  2. verify   the target scores [last, d_1..d_γ] in one call: γ + 1 logit rows
  3. accept   greedy: the longest prefix the target's argmax agrees with, then its argmax;
              sampling: d_i kept with probability min(1, p(d_i)/q(d_i)); on the first
              rejection a token from norm(max(0, p - q)); all kept: a bonus token from p
  4. truncate target and drafter caches to the accepted prefix (a length change)
  5. observe  the policy learns from the round's acceptance and timings
So greedy output equals the target's own greedy output, and sampled output follows the
target's distribution (Leviathan et al. 2023; Chen et al. 2023).
"""

from __future__ import annotations

from dataclasses import dataclass
from time import perf_counter
from typing import Protocol

import numpy as np

from edgespec.runtime.graph import GraphSession
from edgespec.runtime.policies import DraftLengthPolicy
from edgespec.runtime.sampling import SamplingParams, probabilities, sample
from edgespec.runtime.stats import RoundStats
from edgespec.runtime.target import Target


@dataclass
class Proposal:
    tokens: list[int]  # d_1..d_γ
    q: list[np.ndarray] | None  # draft distribution of each d_i; None: deterministic drafter
    seconds: float
    hidden: np.ndarray | None = None  # self-spec: head hidden states of [last, d_1..d_γ]
    tail: GraphSession | None = None  # self-spec: the tail graph that verifies `hidden`
    exit_layer: int | None = None
    catchup_seconds: float = 0.0  # of `seconds`: feeding tokens the drafter had skipped


class Drafter(Protocol):
    def begin(self, prompt: list[int], capacity: int, cached: int = 0) -> None:
        """Start a generation (prefill any state of its own). `cached`: the first `cached`
        prompt tokens equal the start of the sequence the last generation ran on (a
        conversation's earlier turns), so state built on them may be kept."""

    def propose(
        self,
        seq: list[int],
        max_len: int,
        policy: DraftLengthPolicy,
        params: SamplingParams,
        rng: np.random.Generator,
    ) -> Proposal:
        """Propose up to max_len tokens to follow seq (prompt + output so far)."""

    def commit(self, valid: int) -> None:
        """Only the first `valid` tokens of the sequence remain valid in the drafter's cache."""


def accept_greedy(tokens: list[int], logits: np.ndarray) -> tuple[int, int]:
    """(accepted count n, the target's token after d_1..d_n)."""
    best = logits.argmax(axis=-1)
    n = 0
    while n < len(tokens) and best[n] == tokens[n]:
        n += 1
    return n, int(best[n])


def accept_sampled(
    proposal: Proposal, logits: np.ndarray, params: SamplingParams, rng: np.random.Generator
) -> tuple[int, int]:
    """Speculative sampling over target logits rows [γ + 1, V]."""
    for i, d in enumerate(proposal.tokens):
        p = probabilities(logits[i], params)
        q_d = 1.0 if proposal.q is None else float(proposal.q[i][d])
        if rng.random() * q_d < p[d]:  # u < p/q without dividing by a zero q
            continue
        residual = p.copy()
        if proposal.q is None:
            residual[d] = 0.0
        else:
            residual = np.maximum(p - proposal.q[i], 0.0)
        return i, sample(residual, rng)
    return len(proposal.tokens), sample(probabilities(logits[-1], params), rng)


def speculative_round(
    target: Target,
    drafter: Drafter,
    policy: DraftLengthPolicy,
    seq: list[int],
    max_len: int,
    params: SamplingParams,
    rng: np.random.Generator,
) -> tuple[list[int], RoundStats]:
    """One draft-verify round after `seq`; returns the new tokens (accepted drafts + one)."""
    start = perf_counter()
    base = len(seq)  # the target cache holds seq[:-1]; this round appends from seq[-1]
    valid = base - 1  # what stays valid in the caches if anything below raises
    try:
        # 1. draft
        proposal = drafter.propose(seq, max_len, policy, params, rng)
        g = len(proposal.tokens)
        # 2. verify
        t_verify = perf_counter()
        if proposal.hidden is not None:
            logits = target.forward_tail(proposal.tail, proposal.hidden, keep=g + 1)
        else:
            logits = target.forward(np.array([seq[-1], *proposal.tokens], np.int64), keep=g + 1)
        verify_seconds = perf_counter() - t_verify
        # 3. accept / resample
        if params.greedy:
            n, token = accept_greedy(proposal.tokens, logits)
        else:
            n, token = accept_sampled(proposal, logits, params, rng)
        valid = base + n
    finally:
        # 4. truncate both caches to seq + d_1..d_n (a length change, never a copy)
        target.truncate(valid)
        drafter.commit(valid)
    stats = RoundStats(
        "decode",
        n + 1,
        g + 1,
        perf_counter() - start,
        drafted=g,
        accepted=n,
        draft_seconds=proposal.seconds,
        verify_seconds=verify_seconds,
        exit_layer=proposal.exit_layer,
        catchup_seconds=proposal.catchup_seconds,
    )
    # 5. update the draft-length policy
    policy.observe(stats)
    return [*proposal.tokens[:n], token], stats
