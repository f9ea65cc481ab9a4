"""The contracts of one speculative round: what the policy plans, what a drafter proposes,
what a verifier answers, and the stats a round reports.

  Plan      the policy's decision for a round: γ (at most this many drafts), the exit layer
            (dynamic exit), the confidence under which drafting stops early, and where
            decoding happens (split mode: "split", "stream" from the server, or "local");
            the loop fits it `within` the round's room (`Plan.most`)
  Proposal  the drafts and how they were made: `kind` says whether they are the drafter's
            argmax ("greedy"), samples from the rows in `q` ("sampled"), or a deterministic
            guess with no distribution ("point", prompt lookup); `tail` carries the hidden
            states an early-exit head computed, for a verifier that runs only `tail@k`;
            `tree` a token tree (`Proposal.of_tree`) whose main path (first children) is
            `tokens`: a verifier that verifies trees scores every node, any other the path;
            `forced` how many leading tokens a grammar decided (`drafters/forced.py`)
  DraftLengthPolicy  plan(source) -> Plan / observe(stats): how many tokens a round drafts
  Drafter   begin / source(seq) / propose(seq, plan) / commit: it is told how many tokens
            to propose; `source` names who will propose them (a chain's member), so the
            policy can price each member apart
  Verifier  prefill(Start) / submit -> Pending / truncate: local graphs, a server, or both
  Pending   a submitted round: how many of the proposal's drafts it verifies (`sent`: all,
            or a prefix when a server's request limit left the rest out), then the verdict
  Verdict   the verifier's answer: the tokens the round appends (the drafts it accepted,
            any a server decoded on its own, then the target's token), timings (and, from
            a server, the channel as the round saw it); a local one the rows of logits it
            scored, which a drafter that `LearnsFromVerify` is shown (Token Recycling)
  round_stats  a decode round's `RoundStats`, built once from the proposal and the verdict

Drafters and verifiers never consult the policy: the decode loop asks it once per round.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, Protocol, runtime_checkable

import numpy as np

from edgespec.runtime.draft_q import SparseQ
from edgespec.runtime.grammar.constraints import Constraint
from edgespec.runtime.graphs.protocol import Graph
from edgespec.runtime.sampling import SamplingParams
from edgespec.runtime.stats import ChannelStats, RoundStats
from edgespec.runtime.tree import TokenTree

# where a round's tokens are decoded (split mode; a local verifier is always "local"):
# "split" the device drafts, the server verifies; "stream" the server decodes on its own
# and streams; "local" the device's own graphs verify
Where = Literal["split", "stream", "local"]


@dataclass(frozen=True)
class Plan:
    length: int  # γ: the most tokens to draft this round
    exit_layer: int | None = None  # the exit to draft from (dynamic exit); None: the default
    min_confidence: float = 0.0  # stop drafting after a token drafted below this probability
    where: Where = "split"
    # a tree drafter (`AsTree`): 0 propose a chain; k a tree of at most `length` nodes, k
    # deep; None its own default tree
    tree_depth: int | None = None
    # a chain round whose tree drafter also builds, unverified, the tree it would have sent
    # (`Proposal.shadow`): the verdict prices its side candidates without a tree forward
    shadow: bool = False
    # the most tokens the round can take (the token budget, the caches, what the verifier
    # takes at once; `within`); tokens a grammar forces come before γ's drafts, within it.
    # None: `length`
    room: int | None = None

    @property
    def most(self) -> int:
        """The most tokens this round's proposal may hold."""
        return self.length if self.room is None else self.room

    def keep_drafting(self, confidence: float) -> bool:
        return confidence >= self.min_confidence

    def capped(self, length: int) -> Plan:
        """γ (and the room) at most `length`."""
        n = max(0, length)
        room = None if self.room is None else min(self.room, n)
        return replace(self, length=min(self.length, n), room=room)

    def within(self, room: int) -> Plan:
        """The plan for a round that can take at most `room` tokens: γ capped by it."""
        room = max(0, room)
        return replace(self, length=min(self.length, room), room=room)


class DraftLengthPolicy(Protocol):
    """How many tokens to draft each round (`policies/`): `plan` this round for the drafter
    `source` names, `observe` the finished round."""

    max_length: int

    def plan(self, source: str | None = None) -> Plan: ...

    def observe(self, stats: RoundStats) -> None: ...

    def channel_estimates(self) -> tuple[float | None, float | None]:
        """(round trip in seconds, uplink in bytes/s) as learned so far; (None, None) when
        the policy does not model the channel (local decoding)."""
        ...


@dataclass
class TailInput:
    """Self-speculation: the head's hidden states of [last, d_1..d_γ] and the tail graph that
    turns them into target logits (the head's KV is already in the target's cache)."""

    hidden: np.ndarray
    tail: Graph
    exit_layer: int
    # the head call on d_γ that computed its hidden state: part of verifying (the tail needs
    # it; at γ = 0 head + tail is one plain target step), so the verdict counts it
    head_seconds: float = 0.0


@dataclass
class Proposal:
    tokens: list[int]  # d_1..d_γ
    kind: Literal["greedy", "sampled", "point"]
    q: list[SparseQ] | None = None  # kind "sampled": the distribution each d_i was drawn from
    seconds: float = 0.0
    tail: TailInput | None = None
    catchup_seconds: float = 0.0  # feeding tokens the drafter had skipped (not in `seconds`)
    where: Where = "split"  # where the policy placed this round (the decode loop sets it)
    tree: TokenTree | None = None  # several candidates per position; `tokens` its main path
    tree_q: list[SparseQ] | None = None  # kind "sampled": each node's q (siblings' alike)
    shadow: TokenTree | None = None  # a chain round's unverified tree (`Plan.shadow`)
    # the first `forced` tokens are a grammar's, drafted by no drafter (`drafters/forced.py`):
    # acceptance cannot refuse them (RoundStats.forced, not `drafted`)
    forced: int = 0

    @property
    def exit_layer(self) -> int | None:
        return self.tail.exit_layer if self.tail is not None else None

    @classmethod
    def of_tree(
        cls,
        tree: TokenTree,
        kind: Literal["greedy", "sampled", "point"] = "point",
        q: list[SparseQ] | None = None,
        seconds: float = 0.0,
    ) -> Proposal:
        """A tree proposal: `tokens` (and `q`) follow its main path, each node's first child
        from the root down, so a verifier of chains verifies that path alone."""
        if q is not None and len(q) != len(tree):
            raise ValueError(f"a tree of {len(tree)} nodes needs one q per node, got {len(q)}")
        path, node = [], -1
        while children := tree.children(node):
            node = children[0]
            path.append(node)
        chain_q = [q[i] for i in path] if q is not None else None
        tokens = [tree.tokens[i] for i in path]
        return cls(tokens, kind, chain_q, seconds, tree=tree, tree_q=q)


def empty_proposal(seconds: float = 0.0) -> Proposal:
    return Proposal([], "point", None, seconds)


class Drafter(Protocol):
    # whether it may draft past tokens that are not committed yet (while a remote verifier
    # is busy); prompt lookup may not: its n-gram index must only see committed tokens
    drafts_ahead: bool
    name: str  # what it is ("draft", "exit", "lookup", "lookup+draft", "none")

    def begin(
        self,
        prompt: list[int],
        capacity: int,
        cached: int = 0,
        constraint: Constraint | None = None,
    ) -> None:
        """Start a generation (prefill any state of its own); `cached` as in
        `Verifier.prefill`: state built on the first `cached` prompt tokens may be kept;
        `constraint`: the grammar the output follows (drafts drawn from masked logits)."""

    def source(self, seq: list[int]) -> str | None:
        """The name of the drafter that will propose after seq (a chain: its first member
        that has something to propose), None if nothing will be proposed. Never drafts."""

    def propose(
        self, seq: list[int], plan: Plan, params: SamplingParams, rng: np.random.Generator
    ) -> Proposal:
        """Propose at most plan.length tokens to follow seq (prompt + output so far)."""

    def commit(self, valid: int) -> None:
        """Only the first `valid` tokens of the sequence remain valid in the drafter's cache."""


@dataclass(frozen=True)
class ScoredRows:
    """A verify's target logits: row i scored the token after `inputs[i]` (a chain:
    [last, d_1..d_g]; a tree: the root, then each node)."""

    inputs: list[int]
    logits: np.ndarray


@runtime_checkable
class LearnsFromVerify(Protocol):
    """A drafter that learns from the target's verify logits (Token Recycling)."""

    def observe_verify(self, inputs: list[int], logits: np.ndarray) -> None:
        """Row i of `logits` is the target's score of the token after `inputs[i]`."""


@dataclass
class Verdict:
    """A verifier's answer to a round: the tokens the round appends, of which the first
    `accepted` are its drafts the verifier accepted."""

    accepted: int
    # d_1..d_n accepted (a token tree: the root path it kept), the tokens a server decoded
    # on its own (a streamed round: accepted = 0, the round's drafts are void), then the
    # target's token
    tokens: list[int]
    verify_seconds: float
    verifier: str = "local"  # "local" | "remote" | "stream" | "device" (RoundStats.verifier)
    resync: bool = False  # a new server session answered: the round's drafts were void
    # from a server: the channel as this round saw it, and whether it would stream
    channel: ChannelStats | None = None
    # the rows the target scored, when the verifier has them (local graphs): a drafter
    # that learns from them reads them, nobody writes them
    rows: ScoredRows | None = None
    tree: bool = False  # the proposal's token tree was verified (not its main path alone)
    # seconds the verifier spent catching its cache up on tokens it lacked before this round
    # (split mode's local graphs after rounds at the server): a one-off, not the round's price
    catchup_seconds: float = 0.0

    @property
    def token(self) -> int:
        """The target's token after the accepted drafts (and any streamed ones)."""
        return self.tokens[-1]

    @property
    def streamed(self) -> list[int]:
        """The tokens the server decoded on its own before `token` (a streamed round)."""
        return self.tokens[self.accepted : -1]


def round_stats(
    proposal: Proposal, verdict: Verdict, sent: int, seconds: float, length: int
) -> RoundStats:
    """A decode round's stats, all in one place: what was proposed, the `sent` drafts the
    verifier verified (`Pending.sent`), its verdict, the round's wall time, and `length`,
    the sequence the round continued (what a resync rebuilt the server's session from)."""
    tree = proposal.tree if verdict.tree else None
    n, forced = verdict.accepted, min(proposal.forced, verdict.accepted)
    offered = 0 if verdict.resync else (tree.max_depth if tree is not None else sent)
    processed = len(tree) if tree is not None else sent
    stats = RoundStats(
        "decode",
        len(verdict.tokens),
        length if verdict.resync else processed + 1,
        seconds,
        drafted=max(offered - proposal.forced, 0),  # a tree: the positions it offered
        accepted=n - forced,
        draft_seconds=proposal.seconds,
        verify_seconds=verdict.verify_seconds,
        exit_layer=proposal.exit_layer,
        catchup_seconds=proposal.catchup_seconds + verdict.catchup_seconds,
        verifier=verdict.verifier,
        reconnected=verdict.resync,  # counted as GenerationStats.reconnects
        forced=forced,
    )
    if verdict.channel is not None:
        stats.set_channel(verdict.channel)
    if tree is not None:
        stats.tree_nodes, stats.tree_offers = len(tree), tree.offers(verdict.tokens[:n])
    elif proposal.shadow is not None and not proposal.forced and not verdict.resync:
        # the tree not sent, against what the target produced: its drafts kept and its token
        kept = [*verdict.tokens[:n], verdict.token]
        stats.tree_offers = proposal.shadow.shadow_offers(kept)
    return stats


class Pending(Protocol):
    @property
    def sent(self) -> int:
        """How many of the proposal's drafts this round verifies: all of them, or the prefix
        a server's request limit left room for (the decode loop recommits its drafter to it)."""

    def done(self) -> bool:
        """Whether the verdict is here (never waits)."""

    def result(self) -> Verdict:
        """The verdict (waits for it)."""


@dataclass
class Done:
    """A verdict computed on the spot (local verification)."""

    verdict: Verdict
    sent: int  # the drafts it verified

    def done(self) -> bool:
        return True

    def result(self) -> Verdict:
        return self.verdict


@dataclass(frozen=True)
class Start:
    """What a generation starts from, as a verifier's `prefill` is given it: the prompt, the
    positions its caches may reach (`capacity`) and how tokens are picked (`params`, `rng`).
    `cached`: the first `cached` prompt tokens equal the start of the sequence the last
    generation ran on (a conversation's earlier turns); a verifier may keep those positions
    and process only the rest (0: start afresh). `constraint`: the grammar this generation's
    output follows: every row a verifier scores is masked by it."""

    prompt: list[int]
    capacity: int
    params: SamplingParams
    rng: np.random.Generator
    cached: int = 0
    constraint: Constraint | None = None


class Verifier(Protocol):
    max_positions: int

    def prefill(self, start: Start) -> tuple[int, RoundStats]:
        """Start a generation: process the prompt; the next token and the prefill's stats. A
        verifier that cannot apply `start.constraint` refuses it here with an InputError."""

    def max_drafts(self, seq: list[int]) -> int:
        """The most drafts the next round after `seq` can carry (0: verify none now; -1:
        this verifier can go no further, the generation ends with "server_context")."""

    def submit(
        self,
        seq: list[int],
        proposal: Proposal,
        params: SamplingParams,
        rng: np.random.Generator,
    ) -> Pending:
        """Score the drafts after seq (the verifier holds seq[:-1]) and accept a prefix;
        never changes `proposal` (the round verifies its first `Pending.sent` drafts)."""

    def truncate(self, length: int) -> None:
        """Only the first `length` tokens remain valid in the verifier's cache."""

    def close(self) -> None:
        """The generation is over."""
