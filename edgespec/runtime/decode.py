"""The decode loop: prefill once, then draft-verify rounds until a stop, as a generator.

Every mode is this loop (`decode_rounds`; `decode` prefills, then runs it). Plain
autoregressive decoding is a drafter that proposes nothing (γ = 0: one verifier call per
token); split decoding is the loop with a remote verifier; a server's stream
(`serve.streaming`) runs it on from a session's committed tokens, verifying on the server's
worker; calibration times its rounds at fixed γ.
One round (`speculative_round`), in order:
  1. plan     the caller has asked the policy once, for the drafter that will propose (a
              chain's member): γ, exit layer, confidence stop, within the round's room
              (the token budget, the caches, what the verifier takes at once: `Plan.within`)
  2. draft    take the tokens drafted ahead during the last round (if they still follow),
              and have the drafter top them up to γ
  3. submit   the verifier scores [last, d_1..d_γ] (locally: at once; remotely: sent, all
              of them or the prefix that fits the server's request, `Pending.sent`)
  4. ahead    while a remote answer is in flight, keep drafting as if every draft were
              accepted (PEARL / SpecEdge style): d_{γ+1} guesses the verifier's next token
  5. accept   the verdict gives the tokens to append (`Verdict.tokens`): d_1..d_n accepted
              (a token tree: the root path it kept), the tokens a server streamed, then
              the target's token t
  6. truncate verifier and drafter caches to the accepted prefix (a length change, in
              `finally`, so a failing round leaves them as they were; the round's one
              `Drafter.commit`, which also forgets drafts that were never sent); drafts made
              ahead are kept only if n = γ and t = d_{γ+1}
  stats       built once from the proposal and the verdict (`round.round_stats`)
With a grammar (`constraint`, runtime/grammar/constraints.py) the drafter and the verifier mask
every position alike, and the loop drafts through `Forced` (runtime/drafters/forced.py): each
proposal starts with the tokens the grammar alone decides (each the only one it allows),
drafts that need no drafter and that acceptance cannot refuse, and drafts the grammar
forbids (a lookup's) are cut before they are submitted; a run of forced tokens that ends the
output (the grammar's end-of-sequence) ends it with no verifier call.
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
from edgespec.runtime.drafters.forced import Forced
from edgespec.runtime.grammar.constraints import Constraint
from edgespec.runtime.round import (
    Drafter,
    DraftLengthPolicy,
    LearnsFromVerify,
    Pending,
    Plan,
    Proposal,
    Start,
    Verdict,
    Verifier,
    round_stats,
)
from edgespec.runtime.sampling import SamplingParams
from edgespec.runtime.stats import RoundStats, Step

GREEDY_RNG = np.random.default_rng(0)


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
    # with a grammar, the tokens it alone decides lead every proposal
    grammar = Forced(drafter, constraint) if constraint is not None else None
    drafter = grammar or drafter
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
        room = min(budget.max_new - produced - 1, capacity - len(seq), most)
        source = drafter.source(seq)
        if grammar is not None and (end := _grammar_end(grammar, seq, room, stop_ids)):
            step = end  # the grammar alone ends the output: no round, no verifier call
            seq += end.tokens
            produced += len(end.tokens)
            continue
        plan = policy.plan(source).within(room)
        new, stats, ahead = speculative_round(verifier, drafter, plan, seq, ahead, params, rng)
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
    params: SamplingParams,
    rng: np.random.Generator,
) -> tuple[list[int], RoundStats, Ahead]:
    """One draft-verify round after `seq` (the caches hold seq[:-1]); returns the tokens it
    appends (the verdict's: accepted drafts, any a server streamed, the target's token), its
    stats and the drafts made ahead that follow them."""
    start, valid, kept = perf_counter(), len(seq) - 1, Ahead()
    try:
        # 2. draft: the tokens drafted ahead last round, topped up by the drafter
        proposal = _draft(drafter, plan, seq, ahead, params, rng)
        proposal.where = plan.where
        # 3. submit: the verifier verifies all the drafts, or a prefix that fits a server
        pending = verifier.submit(seq, proposal, params, rng)
        sent = proposal.tokens[: pending.sent]
        # 4. draft ahead while the verdict is in flight
        nxt = _draft_ahead(drafter, plan, seq, sent, pending, params, rng)
        # 5. accept
        verdict = pending.result()
        valid = len(seq) + verdict.accepted
        if nxt.follows(verdict, len(sent)):
            kept = nxt.after_first()
        if verdict.rows is not None and isinstance(drafter, LearnsFromVerify):
            drafter.observe_verify(verdict.rows.inputs, verdict.rows.logits)
    finally:
        # 6. truncate the caches to seq + d_1..d_n (a length change, never a copy); the
        # drafter's keeps the drafts made ahead that follow them
        verifier.truncate(valid)
        if not kept.tokens:
            drafter.commit(valid)
    stats = round_stats(proposal, verdict, len(sent), perf_counter() - start, len(seq))
    return verdict.tokens, stats, kept


@dataclass
class Ahead:
    """Tokens drafted after the last submitted drafts, not yet submitted; `forced[i]`: token i
    is a grammar's (`Proposal.forced`), not counted in γ when it leads a proposal."""

    tokens: list[int] = field(default_factory=list)
    q: list[SparseQ] = field(default_factory=list)
    seconds: float = 0.0
    forced: list[bool] = field(default_factory=list)

    def add(self, p: Proposal) -> None:
        self.tokens += p.tokens
        self.q += p.q or []
        self.seconds += p.seconds
        self.forced += [i < p.forced for i in range(len(p.tokens))]

    def follows(self, verdict: Verdict, sent: int) -> bool:
        """Whether these drafts follow the verdict: it accepted all `sent` drafts and its
        token is the first of them (a streamed round's tokens are the server's own)."""
        accepted = verdict.accepted == sent and not verdict.streamed
        return accepted and self.tokens[:1] == [verdict.token]

    def after_first(self) -> Ahead:
        share = (len(self.tokens) - 1) / len(self.tokens)
        return Ahead(self.tokens[1:], self.q[1:], self.seconds * share, self.forced[1:])


def _draft(
    drafter: Drafter,
    plan: Plan,
    seq: list[int],
    ahead: Ahead,
    params: SamplingParams,
    rng: np.random.Generator,
) -> Proposal:
    """Up to plan.length drafts (after any tokens a grammar forces, within plan.most): those
    drafted ahead last round, topped up by the drafter. The drafter's cache may hold drafts
    made ahead beyond them: the round forgets them when it commits."""
    if not ahead.tokens:
        return drafter.propose(seq, plan, params, rng)
    lead = ahead.forced.index(False) if False in ahead.forced else len(ahead.forced)
    n = min(len(ahead.tokens), lead + plan.length, plan.most)
    tokens, qs, forced = ahead.tokens[:n], ahead.q[:n], min(lead, n)
    seconds = ahead.seconds * n / len(ahead.tokens)
    catchup, drafted = 0.0, n - forced
    if n == len(ahead.tokens) and (drafted < plan.length or forced == n):
        # all forced: the grammar may force more, then γ drafts; else the drafts γ lacks
        room = plan.most - n if forced == n else min(plan.length - drafted, plan.most - n)
        rest = replace(plan, length=plan.length - drafted).within(room)
        more = drafter.propose([*seq, *tokens], rest, params, rng)
        tokens, qs = tokens + more.tokens, qs + (more.q or [])
        seconds += more.seconds
        catchup = more.catchup_seconds
        forced += more.forced if forced == n else 0
    kind = "sampled" if not params.greedy else "greedy"
    q = qs if kind == "sampled" else None
    return Proposal(tokens, kind, q, seconds, catchup_seconds=catchup, forced=forced)


def _draft_ahead(
    drafter: Drafter,
    plan: Plan,
    seq: list[int],
    sent: list[int],
    pending: Pending,
    params: SamplingParams,
    rng: np.random.Generator,
) -> Ahead:
    """While the verdict is in flight (a remote verifier), keep drafting after seq + the
    drafts sent as if every one were accepted (PEARL / SpecEdge style): the first guesses
    the verifier's token; at most one more than were sent, within the round's room."""
    ahead = Ahead()
    limit = min(len(sent) + 1, plan.most - len(sent)) if sent and drafter.drafts_ahead else 0
    if limit <= 0:
        return ahead
    drafter.commit(len(seq) + len(sent) - 1)  # forget drafts that were not sent
    step = Plan(1, plan.exit_layer, plan.min_confidence)
    while len(ahead.tokens) < limit and not pending.done():
        p = drafter.propose([*seq, *sent, *ahead.tokens], step, params, rng)
        if not p.tokens:
            break
        ahead.add(p)
    return ahead


def _grammar_end(
    grammar: Forced, seq: list[int], room: int, stop_ids: frozenset[int]
) -> Step | None:
    """The tokens the grammar alone decides after seq, as a Step, if they end the output
    (else the round's proposal starts with them: `Forced.forced` walks the grammar once)."""
    forced = grammar.forced(seq, room)
    if not forced or forced[-1] not in stop_ids:
        return None
    stats = RoundStats("decode", len(forced), 0, 0.0, forced=len(forced), verifier="none")
    return Step(forced, stats)


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
