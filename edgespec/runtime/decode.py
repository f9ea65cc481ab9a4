"""The decode loop: prefill once, then draft-verify rounds until a stop, as a generator.

Every mode is this loop (`decode_rounds`; `decode` prefills, then runs it). Plain
autoregressive decoding is a drafter that proposes nothing (γ = 0: one verifier call per
token); split decoding is the loop with a remote verifier; a server's stream
(`serve.streaming`) runs it on from a session's committed tokens, verifying on the server's
worker; calibration times its rounds at fixed γ.
One round (`speculative_round`), in order:
  1. plan     the caller has asked the policy once, for the drafter that will propose (a
              chain's member): γ, exit layer, confidence stop
  2. draft    take the tokens drafted ahead during the last round (if they still follow),
              and have the drafter top them up to γ
  3. submit   the verifier scores [last, d_1..d_γ] (locally: at once; remotely: sent)
  4. ahead    while a remote answer is in flight, keep drafting as if every draft were
              accepted (PEARL / SpecEdge style): d_{γ+1} guesses the verifier's next token
  5. accept   the verdict: d_1..d_n accepted, then the target's token t (a token tree:
              d_1..d_n the root path it kept, `Verdict.tree_path`)
  6. truncate verifier and drafter caches to the accepted prefix (a length change, in
              `finally`, so a failing round leaves them as they were); drafts made ahead are
              kept only if n = γ and t = d_{γ+1}
With a grammar (`constraint`, runtime/grammar/constraints.py) the drafter and the verifier mask
every position alike; before step 2 the tokens the grammar alone decides (each the only one it
allows) are taken as drafts that need no drafter and that acceptance cannot refuse, and a run
of them that ends the output (the grammar's end-of-sequence) ends it with no verifier call;
drafts the grammar forbids (a lookup's) are cut before they are submitted.
Each yielded `Step` carries the tokens a round produced and its `RoundStats`; the caller
feeds the stats back to the policy. A drafter that learns from the target's logits (Token
Recycling) is shown the rows a local verifier scored once the verdict is in. Greedy output
equals the target's own greedy output, and sampled output follows the target's
distribution, whatever the drafter proposes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from time import perf_counter

import numpy as np

from edgespec.runtime.draft_q import SparseQ
from edgespec.runtime.grammar.constraints import Constraint
from edgespec.runtime.round import (
    Drafter,
    DraftLengthPolicy,
    LearnsFromVerify,
    Plan,
    Proposal,
    Start,
    Verifier,
)
from edgespec.runtime.sampling import SamplingParams
from edgespec.runtime.stats import RoundStats, Step

GREEDY_RNG = np.random.default_rng(0)


@dataclass
class Ahead:
    """Tokens drafted after the last submitted drafts, not yet submitted."""

    tokens: list[int] = field(default_factory=list)
    q: list[SparseQ] = field(default_factory=list)
    seconds: float = 0.0


def decode(
    verifier: Verifier,
    drafter: Drafter,
    policy: DraftLengthPolicy,
    prompt: list[int],
    params: SamplingParams,
    max_new_tokens: int,
    stop_ids: frozenset[int],
    cached: int = 0,
    constraint: Constraint | None = None,
) -> Iterator[Step]:
    """Yield one Step per round: the prefill's first token, then each round's tokens.

    cached: the first `cached` prompt tokens equal the start of the sequence the caches last
    held (a conversation's earlier turns, see `runtime.chat.session`): the verifier and the drafter
    may keep those positions and prefill only the rest. constraint: a grammar every output
    token must follow (started at len(prompt)).
    """
    # greedy decoding draws nothing: a new generator costs ~0.3 ms after onnxruntime's calls
    # have left the CPU caches cold (its seed sequence), every generation
    rng = np.random.default_rng(params.seed) if not params.greedy else GREEDY_RNG
    # drafts are capped below so that the last verify writes position P + max_new - 1
    capacity = min(len(prompt) + max_new_tokens, verifier.max_positions)
    try:
        cached = min(cached, len(prompt) - 1)
        token, stats = verifier.prefill(Start(prompt, capacity, params, rng, cached, constraint))
        drafter.begin(prompt, capacity, cached, constraint)
        budget = Budget(max_new_tokens, stop_ids, capacity)
        first = Step([token], stats)
        parts = (verifier, drafter, policy)
        yield from decode_rounds(*parts, [*prompt, token], params, rng, budget, constraint, first)
    finally:
        verifier.close()


@dataclass(frozen=True)
class Budget:
    """Where the loop stops: `max_new` tokens produced (the prefill's first one included), a
    token in `stop_ids` (kept, and the round's tokens after it dropped), or the sequence
    filling `capacity` positions of the caches."""

    max_new: int
    stop_ids: frozenset[int]
    capacity: int


def decode_rounds(
    verifier: Verifier,
    drafter: Drafter,
    policy: DraftLengthPolicy,
    seq: list[int],
    params: SamplingParams,
    rng: np.random.Generator,
    budget: Budget,
    constraint: Constraint | None = None,
    first: Step | None = None,
) -> Iterator[Step]:
    """The loop: one Step per round after `seq`, until the budget ends it or the verifier can
    go no further; the last Step says why (`finish_reason`). The verifier's and the drafter's
    caches hold seq[:-1] (a prefill, or a server's session that streams on from its committed
    tokens). `first`: the Step that produced seq's last token (the prefill's), yielded first
    and counted in the budget. `seq` is not changed: the loop extends its own copy."""
    seq = list(seq)
    step, produced, ahead, rounds = first, len(first.tokens) if first else 0, Ahead(), 0
    stop_ids, capacity = budget.stop_ids, budget.capacity
    while True:
        last = step.tokens[-1] if step is not None else None
        reason = finish_reason(last, produced, budget.max_new, stop_ids, len(seq) - 1, capacity)
        most = 0 if reason else verifier.max_drafts(seq)
        if most < 0:  # the verifier can go no further (a full server, no local graphs)
            reason = "server_context"
        if step is not None:
            step.finish_reason = reason
            yield step
        if reason:
            return
        # never draft past the token budget, the cache (verify writes γ + 1 positions)
        # or what the verifier takes in one round
        room = min(budget.max_new - produced - 1, capacity - len(seq))
        source = drafter.source(seq)
        forced = constraint.forced(seq, min(room, most)) if constraint else []
        if forced and forced[-1] in stop_ids:  # the grammar alone ends the output
            stats = RoundStats("decode", len(forced), 0, 0.0, forced=len(forced))
            stats.verifier = "none"
            step = Step(forced, stats)
            seq += forced
            produced += len(forced)
            continue
        plan = policy.plan(source).capped(min(room, most) - len(forced))
        new, stats, ahead = speculative_round(
            verifier, drafter, plan, seq, ahead, room, params, rng, forced, constraint
        )
        rounds += 1
        stats.source, stats.index = source, rounds
        policy.observe(stats)
        stats.rtt_estimate, stats.bandwidth_estimate = policy.channel_estimates()
        new = _cut_at_stop(new, stop_ids)
        seq += new
        produced += len(new)
        step = Step(new, stats)


def speculative_round(
    verifier: Verifier,
    drafter: Drafter,
    plan: Plan,
    seq: list[int],
    ahead: Ahead,
    room: int,
    params: SamplingParams,
    rng: np.random.Generator,
    forced: list[int] | None = None,
    constraint: Constraint | None = None,
) -> tuple[list[int], RoundStats, Ahead]:
    """One draft-verify round after `seq`; returns the new tokens (accepted drafts + one),
    the round's stats and the drafts made ahead that follow them. `forced`: tokens the
    grammar alone decides after seq, verified as the first drafts (acceptance takes them:
    each is the only token its masked row allows)."""
    start = perf_counter()
    base = len(seq)  # the caches hold seq[:-1]; this round appends from seq[-1]
    valid = base - 1  # what stays valid in the caches if anything below raises
    kept = Ahead()
    forced = forced or []
    try:
        # 2. draft (after the forced tokens: the drafter never proposes those)
        if forced:
            if ahead.tokens[: len(forced)] != forced[: len(ahead.tokens)]:
                drafter.commit(base - 1)
                ahead = Ahead()
            else:
                ahead = Ahead(ahead.tokens[len(forced) :], ahead.q[len(forced) :], ahead.seconds)
        proposal = _draft(drafter, plan, [*seq, *forced], ahead, params, rng)
        if proposal.tree is not None and (constraint is not None or forced):
            proposal = replace(proposal, tree=None, tree_q=None)  # its main path, masked
        if constraint is not None:
            proposal = _within_grammar(constraint, drafter, [*seq, *forced], proposal)
        proposal = _with_forced(forced, proposal)
        proposal.where = plan.where
        g = len(proposal.tokens)
        # 3. submit
        pending = verifier.submit(seq, proposal, params, rng)
        if pending.sent < g:  # a prefix, to fit the server's request limit
            g = pending.sent
            drafter.commit(base + g - 1)
        # 4. draft ahead while the verdict is in flight
        nxt = Ahead()
        limit = min(g + 1, room - g) if g and drafter.drafts_ahead else 0
        while len(nxt.tokens) < limit and not pending.done():
            more = [*seq, *proposal.tokens[:g], *nxt.tokens]
            p = drafter.propose(more, Plan(1, plan.exit_layer, plan.min_confidence), params, rng)
            if not p.tokens:
                break
            nxt.tokens += p.tokens
            nxt.q += p.q or []
            nxt.seconds += p.seconds
        # 5. accept
        verdict = pending.result()
        n, token = verdict.accepted, verdict.token
        drafts = proposal.tokens[:n] if verdict.tree_path is None else verdict.tree_path
        tree = proposal.tree if verdict.tree_path is not None else None
        if tree is not None:  # drafted: the positions it offered (its depth), not its nodes
            g = tree.max_depth
        valid = base + n
        if n == g and nxt.tokens and nxt.tokens[0] == token and not verdict.streamed:
            share = (len(nxt.tokens) - 1) / len(nxt.tokens)
            kept = Ahead(nxt.tokens[1:], nxt.q[1:], nxt.seconds * share)
        if verdict.rows is not None and isinstance(drafter, LearnsFromVerify):
            drafter.observe_verify(verdict.rows.inputs, verdict.rows.logits)
    finally:
        # 6. truncate the caches to seq + d_1..d_n (a length change, never a copy)
        verifier.truncate(valid)
        if not kept.tokens:
            drafter.commit(valid)
    if verdict.resync:  # the verifier rebuilt its session from seq: no draft was verified
        g = 0
    f = min(len(forced), n)  # acceptance takes every forced token (unless resynced)
    streamed = list(verdict.streamed)  # the server's own tokens (caches catch up later)
    stats = RoundStats(
        "decode",
        n + 1 + len(streamed),
        len(seq) if verdict.resync else (len(tree) if tree is not None else g) + 1,
        perf_counter() - start,
        drafted=max(g - len(forced), 0),
        accepted=n - f,
        draft_seconds=proposal.seconds,
        verify_seconds=verdict.verify_seconds,
        exit_layer=proposal.exit_layer,
        catchup_seconds=proposal.catchup_seconds,
        forced=f,
    )
    if tree is not None:
        stats.tree_nodes, stats.tree_offers = len(tree), tree.offers(drafts)
    elif proposal.shadow is not None and not forced and not verdict.resync:
        # the tree not sent, against what the target produced: its drafts kept and its token
        stats.tree_offers = proposal.shadow.shadow_offers([*drafts, token])
    return [*drafts, *streamed, token], verdict.fill(stats), kept


def _within_grammar(
    constraint: Constraint, drafter: Drafter, seq: list[int], proposal: Proposal
) -> Proposal:
    """The proposal cut before its first draft the grammar forbids (a model drafter's drafts
    are masked as they are drawn; a lookup's are not)."""
    n = constraint.allowed_prefix(seq, proposal.tokens)
    if n == len(proposal.tokens):
        return proposal
    assert proposal.tail is None, "an early-exit head drafts from masked logits"
    drafter.commit(len(seq) + n - 1)
    q = proposal.q[:n] if proposal.q is not None else None
    return replace(proposal, tokens=proposal.tokens[:n], q=q)


def _with_forced(forced: list[int], proposal: Proposal) -> Proposal:
    """`forced` + the proposal: forced tokens are drawn from a point mass (sampling's q)."""
    if not forced:
        return proposal
    q = None
    if proposal.kind == "sampled":
        q = [SparseQ.point(t) for t in forced]
        q += proposal.q or []
    kind = proposal.kind if proposal.tokens else "point"
    return replace(proposal, tokens=[*forced, *proposal.tokens], kind=kind, q=q)


def _draft(
    drafter: Drafter,
    plan: Plan,
    seq: list[int],
    ahead: Ahead,
    params: SamplingParams,
    rng: np.random.Generator,
) -> Proposal:
    """Up to plan.length drafts: those drafted ahead last round, topped up by the drafter."""
    if not ahead.tokens:
        return drafter.propose(seq, plan, params, rng)
    tokens, qs = ahead.tokens[: plan.length], ahead.q[: plan.length]
    seconds = ahead.seconds * len(tokens) / len(ahead.tokens)
    # forget what was drafted ahead beyond γ (a drafter's cache never holds the last token
    # of the sequence it continues: it feeds that token when it drafts)
    drafter.commit(len(seq) + len(tokens) - 1)
    catchup = 0.0
    if len(tokens) < plan.length:
        more = drafter.propose([*seq, *tokens], plan.capped(plan.length - len(tokens)), params, rng)
        tokens, qs = tokens + more.tokens, qs + (more.q or [])
        seconds += more.seconds
        catchup = more.catchup_seconds
    kind = "sampled" if not params.greedy else "greedy"
    return Proposal(tokens, kind, qs if kind == "sampled" else None, seconds, None, catchup)


def _cut_at_stop(tokens: list[int], stop_ids: frozenset[int]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in stop_ids:
            return tokens[: i + 1]
    return tokens


def finish_reason(
    token: int | None,
    produced: int,
    max_new: int,
    stop_ids: frozenset[int],
    length: int,
    capacity: int,
) -> str | None:
    """Why the loop ends after `token`, the last token produced (None: none yet)."""
    if token is not None and token in stop_ids:
        return "eos"
    if produced >= max_new:
        return "length"
    if length >= capacity:
        return "context"
    return None
