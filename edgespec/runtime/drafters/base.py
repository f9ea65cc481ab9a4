"""Drafters: where proposed tokens come from. Each is told how many tokens to propose.

  NoDrafter          proposes nothing: plain autoregressive decoding
  ModelDrafter       a drafting model on its own KV cache: the bundle's `draft` graph, or
                     `head@k` run alone (its exit logits) where the target is elsewhere
  EarlyExitDrafter   the target's own first k layers (`head@k`) with the shared LM head; its
                     KV and hidden states are the target's, so verification runs only
                     `tail@k` and never recomputes layers 0..k-1 (LayerSkip-style reuse)
  LookupDrafter      (`runtime/drafters/lookup.py`) prompt lookup, model-free like `suffix.py` and
                     `recycling.py`
  Chain              drafters tried in order (`lookup+draft`): the first that proposes wins

A drafter sees the committed sequence (prompt + output so far) and feeds itself whatever it
has not processed yet, so it stays in step however many tokens the last round accepted.
Under a grammar (`begin(..., constraint)`) a model drafter draws each draft from its logits
with the grammar's forbidden tokens at -inf, the same mask the verifier applies to the
target's row there; `Forced` (`runtime/drafters/forced.py`) cuts a lookup's drafts at the
first one it forbids.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from time import perf_counter

import numpy as np

from edgespec.runtime.draft_q import (
    DEFAULT_SUPPORT,
    DraftSupport,
    SparseQ,
    from_logits,
)
from edgespec.runtime.grammar.constraints import Constraint
from edgespec.runtime.graphs.protocol import Feed, Graph
from edgespec.runtime.graphs.stack import Stack, pad_call
from edgespec.runtime.round import (
    Drafter,
    LearnsFromVerify,
    Plan,
    Proposal,
    TailInput,
    empty_proposal,
)
from edgespec.runtime.sampling import SamplingParams


def _pick(
    logits: np.ndarray,
    params: SamplingParams,
    rng: np.random.Generator,
    support: DraftSupport,
    confidence_stop: bool = True,
) -> tuple[int, float, SparseQ | None]:
    """(draft token, drafter confidence, when sampling the distribution it was drawn from:
    the tempered distribution cut to `support`, see draft_q). Greedy without a confidence
    stop skips the confidence (reported as 1): a softmax over the vocabulary costs 8 µs at
    4,096 ids, 66 µs at 49,152 and 0.8 ms at 151,936 (Qwen2.5's), where argmax costs 0.4-8 µs,
    and a draft step of the trained int4 draft costs ~230 µs."""
    if params.greedy:
        d = int(logits.argmax())
        if not confidence_stop:
            return d, 1.0, None
        confidence = 1.0 / float(np.exp(logits.astype(np.float64) - logits[d]).sum())
        return d, confidence, None
    q, confidence = from_logits(logits, params, support)
    return q.sample(rng), confidence, q


def draft_tokens(
    step: Callable[[list[int]], np.ndarray],
    feed: list[int],
    plan: Plan,
    params: SamplingParams,
    rng: np.random.Generator,
    support: DraftSupport = DEFAULT_SUPPORT,
    allowed: Callable[[list[int]], np.ndarray] | None = None,
) -> tuple[list[int], list[SparseQ], list[int]]:
    """Run a drafting model one token at a time: `step(feed)` processes the new ids and
    returns the next-token logits; `allowed(drafts)`, under a grammar, the tokens it allows
    after the drafts so far. Returns (drafts, their q if sampling, the last feed, which the
    model has not processed yet). Where the grammar allows one token only, that token is
    the draft (its masked distribution is a point mass there) and the model does not step:
    it takes the token with the next step's feed, one forward for the whole run."""
    tokens: list[int] = []
    qs: list[SparseQ] = []
    while len(tokens) < plan.length:
        if allowed is not None:
            mask = allowed(tokens)
            if np.count_nonzero(mask) == 1:
                only = int(mask.argmax())
                tokens.append(only)
                if not params.greedy:
                    qs.append(SparseQ.point(only))
                feed = [*feed, only]
                continue
        logits = step(feed)
        if allowed is not None:
            logits = np.where(allowed(tokens)[: logits.shape[-1]], logits, -np.inf)
        d, confidence, q = _pick(logits, params, rng, support, plan.min_confidence > 0)
        tokens.append(d)
        if q is not None:
            qs.append(q)
        feed = [d]
        if not plan.keep_drafting(confidence):
            break
    return tokens, qs, feed


def _proposal(tokens: list[int], qs: list[SparseQ], params: SamplingParams, **kw) -> Proposal:
    if params.greedy:
        return Proposal(tokens, "greedy", None, **kw)
    return Proposal(tokens, "sampled", qs, **kw)


def _allowed(
    constraint: Constraint | None, seq: list[int]
) -> Callable[[list[int]], np.ndarray] | None:
    if constraint is None:
        return None
    return lambda drafts: constraint.allowed([*seq, *drafts])


class NoDrafter:
    """Drafts nothing: the decode loop becomes plain autoregressive decoding."""

    drafts_ahead = False
    name = "none"

    def begin(
        self,
        prompt: list[int],
        capacity: int,
        cached: int = 0,
        constraint: Constraint | None = None,
    ) -> None:
        pass

    def source(self, seq: list[int]) -> str | None:
        return None

    def propose(
        self, seq: list[int], plan: Plan, params: SamplingParams, rng: np.random.Generator
    ) -> Proposal:
        return empty_proposal()

    def commit(self, valid: int) -> None:
        pass


class OwnCache:
    """A drafter with a cache of its own that drafts every round (`source`: its name) under
    the generation's grammar: `begin` keeps the grammar and has `resume_cache` keep what the
    prompt shares with the last sequence (`cached` positions) and make room for `capacity`."""

    name: str
    constraint: Constraint | None = None

    def source(self, seq: list[int]) -> str | None:
        return self.name

    def begin(
        self,
        prompt: list[int],
        capacity: int,
        cached: int = 0,
        constraint: Constraint | None = None,
    ) -> None:
        self.constraint = constraint
        self.resume_cache(prompt, capacity, cached)

    def resume_cache(self, prompt: list[int], capacity: int, cached: int) -> None:
        raise NotImplementedError


class ModelDrafter(OwnCache):
    """A drafting model with its own cache: the `draft` graph, or head@k alone."""

    drafts_ahead = True
    name = "draft"

    def __init__(self, model: Stack, support: DraftSupport = DEFAULT_SUPPORT) -> None:
        self.model, self.support = model, support
        self.constraint: Constraint | None = None

    def resume_cache(self, prompt: list[int], capacity: int, cached: int) -> None:
        # the cache holds a prefix of the last sequence: keep what the prompt shares with it
        kept = self.model.resume(min(capacity, self.model.max_positions), cached)
        if kept < len(prompt):
            self.model.forward(np.asarray(prompt[kept:], np.int64), keep=0)

    def propose(
        self,
        seq: list[int],
        plan: Plan,
        params: SamplingParams,
        rng: np.random.Generator,
        rows: list[np.ndarray] | None = None,
    ) -> Proposal:
        """rows: if given, receives the logits row each draft was drawn from (dynamic trees
        read their runner-ups there, `runtime/drafters/model_tree.py`)."""
        start = perf_counter()
        plan = plan.capped(self.model.max_positions - len(seq))
        feed, catchup = self.catch_up(seq, plan)

        def step(ids: list[int]) -> np.ndarray:
            row = self.model.forward(np.asarray(ids, np.int64), keep=1)[-1]
            if rows is not None:
                rows.append(row)
            return row

        allowed = _allowed(self.constraint, seq)
        tokens, qs, _ = draft_tokens(step, feed, plan, params, rng, self.support, allowed)
        seconds = perf_counter() - start - catchup
        return _proposal(tokens, qs, params, seconds=seconds, catchup_seconds=catchup)

    def catch_up(self, seq: list[int], plan: Plan) -> tuple[list[int], float]:
        """The ids the first draft step feeds, and the seconds spent feeding the model tokens
        it skipped while nothing was drafted. After a round that accepted all its drafts the
        model has seen neither d_γ nor the target's token: both go into the first step, one
        call (a separate call for d_γ cost a whole draft step in most rounds at high
        acceptance). A longer feed is a stretch of plain steps: fed in a call of its own and
        timed apart, a one-off the policies must not price as drafting."""
        feed = seq[self.model.length :]
        if plan.length == 0 or len(feed) <= 2:
            return feed, 0.0
        start = perf_counter()
        self.model.forward(np.asarray(feed[:-1], np.int64), keep=0)
        return feed[-1:], perf_counter() - start

    def commit(self, valid: int) -> None:
        self.model.truncate(valid)


@dataclass
class HeadDrafts:
    """An exit head's drafts (`EarlyExitDrafter.spine`): the tokens, the q each was drawn
    from (sampling), the exit logits row each came from, the seconds drafting took, and
    `tail()`, which runs the head on the last token and returns the tail's input."""

    tokens: list[int]
    qs: list[SparseQ]
    rows: list[np.ndarray]
    seconds: float
    tail: Callable[[], TailInput]


class EarlyExitDrafter:
    """Drafts with head@k's exit logits into the target's own cache (layers 0..k-1)."""

    drafts_ahead = False  # it writes into the verifier's own cache
    name = "exit"

    def __init__(
        self,
        target: Stack,
        heads: dict[int, Graph],
        tails: dict[int, Graph],
        exit_layer: int,
        support: DraftSupport = DEFAULT_SUPPORT,
    ) -> None:
        self.target, self.heads, self.tails, self.exit_layer = target, heads, tails, exit_layer
        self.support = support
        self.constraint: Constraint | None = None

    def begin(
        self,
        prompt: list[int],
        capacity: int,
        cached: int = 0,
        constraint: Constraint | None = None,
    ) -> None:
        self.constraint = constraint  # the target's prefill already filled the head's layers

    def source(self, seq: list[int]) -> str | None:
        return self.name

    def propose(
        self, seq: list[int], plan: Plan, params: SamplingParams, rng: np.random.Generator
    ) -> Proposal:
        spine = self.spine(seq, plan, params, rng)
        return _proposal(spine.tokens, spine.qs, params, seconds=spine.seconds, tail=spine.tail())

    def spine(
        self, seq: list[int], plan: Plan, params: SamplingParams, rng: np.random.Generator
    ) -> HeadDrafts:
        """The head's drafts into the target's cache, before the tail's input is made (a
        dynamic tree's round makes none: `runtime/drafters/model_tree.py`)."""
        start = perf_counter()
        k = plan.exit_layer or self.exit_layer
        head, cache = self.heads[k], self.target.cache
        assert cache is not None
        past = self.target.length
        hidden: list[np.ndarray] = []
        rows: list[np.ndarray] = []
        step = self.target.step_width  # the head's calls padded as the target's (stack.py)

        def run_head(ids: list[int], keep: int = 1) -> np.ndarray:
            nonlocal past
            pad, width, wanted = pad_call(len(ids), keep, step)
            feed = np.asarray([[*ids, *ids[-1:] * pad]], np.int64)
            out = head.run(cache, past, Feed(input_ids=feed, keep=width))
            hidden.append(out["hidden"][0][: len(ids)])
            past += len(ids)
            if not keep:
                return out["exit_logits"]
            rows.append(out["exit_logits"][0][wanted][-1])
            return rows[-1]

        allowed = _allowed(self.constraint, seq)
        tokens, qs, last = draft_tokens(
            run_head, seq[past:], plan, params, rng, self.support, allowed
        )
        drafting = perf_counter() - start

        def tail() -> TailInput:
            # the last token's hidden state: the tail verifies it too. One call a round,
            # whatever γ: it is the verify's input, not drafting (counted as drafting it
            # priced every draft token at twice a head step when γ is 1, which kept `auto`
            # from longer drafts)
            head_start = perf_counter()
            run_head(last, keep=0)
            head_seconds = perf_counter() - head_start
            return TailInput(np.concatenate(hidden), self.tails[k], k, head_seconds)

        return HeadDrafts(tokens, qs, rows, drafting, tail)

    def commit(self, valid: int) -> None:
        pass  # the head's layers live in the target's cache, which the round truncated


class Chain:
    """Drafters in order: the first non-empty proposal is the round's (`lookup+draft`)."""

    def __init__(self, drafters: Sequence[Drafter]) -> None:
        self.drafters = list(drafters)
        self.drafts_ahead = all(d.drafts_ahead for d in self.drafters)
        self.name = "+".join(d.name for d in self.drafters)

    def source(self, seq: list[int]) -> str | None:
        return next((s for d in self.drafters if (s := d.source(seq)) is not None), None)

    def begin(
        self,
        prompt: list[int],
        capacity: int,
        cached: int = 0,
        constraint: Constraint | None = None,
    ) -> None:
        for d in self.drafters:
            d.begin(prompt, capacity, cached, constraint)

    def propose(
        self, seq: list[int], plan: Plan, params: SamplingParams, rng: np.random.Generator
    ) -> Proposal:
        seconds = 0.0
        proposal = empty_proposal()
        for d in self.drafters:
            proposal = d.propose(seq, plan, params, rng)
            proposal.seconds += seconds  # the drafters that found nothing cost time too
            if proposal.tokens:
                break
            seconds = proposal.seconds
        return proposal

    def observe_verify(self, inputs: list[int], logits: np.ndarray) -> None:
        for d in self.drafters:
            if isinstance(d, LearnsFromVerify):
                d.observe_verify(inputs, logits)

    def commit(self, valid: int) -> None:
        for d in self.drafters:
            d.commit(valid)
