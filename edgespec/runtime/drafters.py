"""Drafters: where proposed tokens come from.

  NoDrafter          proposes nothing: plain autoregressive decoding
  DraftModelDrafter  a separate small model (the bundle's `draft` graph), its own KV cache
  EarlyExitDrafter   the target's own first k layers (`head@k`) with the shared LM head; its
                     KV and hidden states are the target's, so verification runs only
                     `tail@k` and never recomputes layers 0..k-1 (LayerSkip-style reuse)
  LookupDrafter      model-free: continues an n-gram of the recent text where it occurred
                     earlier in the prompt or output (prompt lookup); can fall back to
                     another drafter when nothing matches

A drafter sees the committed sequence (prompt + output so far) and feeds itself whatever it
has not processed yet, so it stays in step however many tokens the last round accepted.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter

import numpy as np

from edgespec.runtime.graph import GraphSession
from edgespec.runtime.policies import DraftLengthPolicy
from edgespec.runtime.sampling import SamplingParams, probabilities, sample
from edgespec.runtime.speculative import Drafter, Proposal
from edgespec.runtime.target import Target


def _pick(
    logits: np.ndarray, params: SamplingParams, rng: np.random.Generator
) -> tuple[int, float, np.ndarray | None]:
    """(draft token, drafter confidence, q row when sampling)."""
    if params.greedy:
        d = int(logits.argmax())
        confidence = 1.0 / float(np.exp(logits.astype(np.float64) - logits[d]).sum())
        return d, confidence, None
    q = probabilities(logits, params)
    d = sample(q, rng)
    return d, float(q.max()), q


def draft_tokens(
    step: Callable[[list[int]], np.ndarray],
    feed: list[int],
    limit: int,
    policy: DraftLengthPolicy,
    params: SamplingParams,
    rng: np.random.Generator,
) -> tuple[list[int], list[np.ndarray], list[int]]:
    """Run a drafting model one token at a time: `step(feed)` processes the new ids and
    returns the next-token logits. Returns (drafts, their q rows if sampling, the last feed,
    which the model has not processed yet)."""
    tokens: list[int] = []
    qs: list[np.ndarray] = []
    while len(tokens) < limit:
        d, confidence, q = _pick(step(feed), params, rng)
        tokens.append(d)
        if q is not None:
            qs.append(q)
        feed = [d]
        if not policy.keep_drafting(len(tokens), confidence):
            break
    return tokens, qs, feed


class NoDrafter:
    """Drafts nothing: the decode loop becomes plain autoregressive decoding."""

    def begin(self, prompt: list[int], capacity: int, cached: int = 0) -> None:
        pass

    def propose(
        self,
        seq: list[int],
        max_len: int,
        policy: DraftLengthPolicy,
        params: SamplingParams,
        rng: np.random.Generator,
    ) -> Proposal:
        return Proposal([], None, 0.0)

    def commit(self, valid: int) -> None:
        pass


class DraftModelDrafter:
    def __init__(self, draft: Target) -> None:
        self.model = draft

    def begin(self, prompt: list[int], capacity: int, cached: int = 0) -> None:
        # the draft cache holds a prefix of the last sequence: keep what the prompt shares
        kept = self.model.resume(min(capacity, self.model.max_positions), cached)
        if kept < len(prompt):
            self.model.forward(np.asarray(prompt[kept:], np.int64), keep=0)

    def propose(
        self,
        seq: list[int],
        max_len: int,
        policy: DraftLengthPolicy,
        params: SamplingParams,
        rng: np.random.Generator,
    ) -> Proposal:
        start = perf_counter()
        limit = min(policy.next_length(), max_len, self.model.max_positions - len(seq))
        feed = seq[self.model.length :]
        catchup = 0.0
        if limit > 0 and len(feed) > 1:  # tokens skipped while the policy drafted nothing
            self.model.forward(np.asarray(feed[:-1], np.int64), keep=0)
            feed, catchup = feed[-1:], perf_counter() - start

        def step(ids: list[int]) -> np.ndarray:
            return self.model.forward(np.asarray(ids, np.int64), keep=1)[-1]

        tokens, qs, _ = draft_tokens(step, feed, limit, policy, params, rng)
        seconds = perf_counter() - start - catchup
        return Proposal(tokens, qs or None, seconds, catchup_seconds=catchup)

    def commit(self, valid: int) -> None:
        self.model.truncate(valid)


class EarlyExitDrafter:
    """Drafts with head@k's exit logits into the target's own cache (layers 0..k-1)."""

    def __init__(
        self,
        target: Target,
        heads: dict[int, GraphSession],
        tails: dict[int, GraphSession],
        exit_layer: int,
    ) -> None:
        self.target, self.heads, self.tails, self.exit_layer = target, heads, tails, exit_layer

    def begin(self, prompt: list[int], capacity: int, cached: int = 0) -> None:
        pass  # the target's prefill (or its kept prefix) already filled the head's layers

    def propose(
        self,
        seq: list[int],
        max_len: int,
        policy: DraftLengthPolicy,
        params: SamplingParams,
        rng: np.random.Generator,
    ) -> Proposal:
        start = perf_counter()
        k = getattr(policy, "exit_layer", None) or self.exit_layer
        head, cache = self.heads[k], self.target.cache
        assert cache is not None
        past = self.target.length
        hidden: list[np.ndarray] = []

        def run_head(ids: list[int], keep: int = 1) -> np.ndarray:
            nonlocal past
            out = head.run(cache, past, input_ids=np.asarray([ids], np.int64), keep=keep)
            hidden.append(out["hidden"][0])
            past += len(ids)
            return out["exit_logits"][0, -1] if keep else out["exit_logits"]

        limit = min(policy.next_length(), max_len)
        tokens, qs, last = draft_tokens(run_head, seq[past:], limit, policy, params, rng)
        run_head(last, keep=0)  # the last token's hidden state: the tail verifies it too
        return Proposal(
            tokens,
            qs or None,
            perf_counter() - start,
            hidden=np.concatenate(hidden),
            tail=self.tails[k],
            exit_layer=k,
        )

    def commit(self, valid: int) -> None:
        pass  # the head's layers live in the target's cache, which the round truncated


class LookupDrafter:
    """Prompt lookup: the longest recent n-gram (n = max_ngram..min_ngram) that occurred
    before proposes the tokens that followed it. Deterministic, so q is a point mass."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 2, fallback: Drafter | None = None):
        self.max_ngram, self.min_ngram, self.fallback = max_ngram, min_ngram, fallback
        self.last_end: dict[tuple[int, ...], int] = {}
        self.indexed = 0

    def begin(self, prompt: list[int], capacity: int, cached: int = 0) -> None:
        # the index covers the last sequence up to `indexed`: still exact if the prompt
        # shares all of it (a conversation's next turn), else rebuilt (lazily, in propose)
        if cached < self.indexed:
            self.last_end, self.indexed = {}, 0
        if self.fallback is not None:
            self.fallback.begin(prompt, capacity, cached)

    def propose(
        self,
        seq: list[int],
        max_len: int,
        policy: DraftLengthPolicy,
        params: SamplingParams,
        rng: np.random.Generator,
    ) -> Proposal:
        start = perf_counter()
        self._index(seq, upto=len(seq) - 1)  # n-grams ending before the current last token
        limit = min(policy.next_length(), max_len)
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            end = self.last_end.get(tuple(seq[-n:])) if len(seq) > n else None
            if end is not None and limit > 0:
                tokens = seq[end + 1 : end + 1 + limit]
                return Proposal(tokens, None, perf_counter() - start)
        if self.fallback is not None:
            return self.fallback.propose(seq, max_len, policy, params, rng)
        return Proposal([], None, perf_counter() - start)

    def _index(self, seq: list[int], upto: int) -> None:
        for end in range(self.indexed, upto):
            for n in range(self.min_ngram, self.max_ngram + 1):
                if end + 1 >= n:
                    self.last_end[tuple(seq[end + 1 - n : end + 1])] = end
        self.indexed = max(self.indexed, upto)

    def commit(self, valid: int) -> None:
        if self.fallback is not None:
            self.fallback.commit(valid)
