"""Token trees sized by measurement: each round, the best chain or a tree, whichever promises
more tokens per second.

  RankAcceptance  p(d, r): the chance that, with the accepted path reaching depth d - 1, the
                  target takes the drafter's rank-r candidate at depth d (rank: the index among
                  siblings, most likely first), counted online from verdicts (a chain round
                  tells rank 0 only; a tree round every rank it offered), forgotten like the
                  chain policies' acceptance; a rank never offered is priced at 0
  TreePolicy      prices every chain of 1..max nodes and every tree of a spine (the main path,
                  `depth` deep) with side candidates at its depths, by expected tokens over
                  T(nodes) (the cost model learns a round's seconds per node count: drafting
                  plus verifying that width); plans a tree only when it beats the best chain
                  by `margin`, else the chain the drafter's own chain policy (`auto`) plans,
                  as it would without trees. Side ranks of a model-free drafter are measured
                  without sending a tree: every `shadow_every` chain rounds the drafter also
                  builds the tree it would have sent (`Plan.shadow`), and the verdict's tokens
                  (the drafts kept and the target's own) say which of its candidates the
                  target took, as a tree round would have (exactly: greedy, and under sampling
                  where the tree's first candidate is the chain's draft — the target's token
                  after a rejected draft is drawn from the residual that recursive rejection
                  sampling would have offered the next sibling). So no tree forward runs, and
                  the tree graphs are never opened, unless a tree is priced to pay. A model
                  drafter's tree costs draft steps and its cache, so its side ranks are
                  measured by a small probe tree every `probe_every` rounds instead, where
                  even optimistic side ranks could pay (measurement, not a pick)

What `trees=auto|on|off` makes of a drafter on a bundle is `registry.with_trees`'s to say (a
model drafter: its dynamic trees, `runtime/drafters/model_tree.py`, priced per spine step).

The expected tokens of a spine-with-leaves tree: a side candidate at depth d is accepted with
p(d, r) when the spine reached d - 1, and ends the path there; so E = 1 + Σ_d s(d-1)·Σ_r p(d, r)
over the ranks offered at d, s(d) = Π_{j≤d} p(j, 0). A drafter's best-first tree spends its
nodes where its own scores say, which the spine model prices from below.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace
from typing import Any

from edgespec.runtime.policies.estimates import PRIORS, CostModel, Priors
from edgespec.runtime.round import Plan
from edgespec.runtime.stats import RoundStats

MAX_DEPTH = 8  # the deepest spine priced
MAX_RANK = 4  # candidates per depth priced (rank 0: the spine)
MAX_NODES = 16  # the largest round priced (chain or tree)


@dataclass
class RankAcceptance:
    priors: Priors = PRIORS
    # [depth][rank]: exponentially forgotten (times offered, times accepted)
    tried: list[list[float]] = field(default_factory=lambda: _table())
    hits: list[list[float]] = field(default_factory=lambda: _table())

    def observe(self, offers: tuple[tuple[int, int], ...]) -> None:
        """One verdict: per depth from 1, (children offered under the accepted path, the rank
        the target took or -1)."""
        if not offers:
            return
        keep = 1 - self.priors.acceptance_decay
        self.tried = [[v * keep for v in row] for row in self.tried]
        self.hits = [[v * keep for v in row] for row in self.hits]
        for d, (offered, rank) in enumerate(offers[:MAX_DEPTH], 1):
            for r in range(min(offered, MAX_RANK)):
                self.tried[d][r] += 1.0
            if 0 <= rank < MAX_RANK:
                self.hits[d][rank] += 1.0

    def measured(self, rank: int) -> float:
        """Rounds' worth of offers of `rank` at any depth (what a side rank's price rests on)."""
        return sum(row[rank] for row in self.tried)

    def table(self, optimistic: bool = False) -> list[list[float]]:
        """[depth][rank] -> p(depth, rank) for depths 1..MAX_DEPTH (row 0 unused);
        `optimistic`: every side rank not measured above it is given all that the spine
        leaves at its depth, 1 - p(d, 0) (the most it could take: one token is taken)."""
        out = [[self.p(d, r) for r in range(MAX_RANK)] for d in range(MAX_DEPTH + 1)]
        if optimistic:
            for row in out:
                row[1] = max(row[1], 1.0 - row[0] - sum(row[2:]))
        return out

    def p(self, depth: int, rank: int) -> float:
        """p(depth, rank), shrunk towards the same rank over all depths (rank 0: from the
        prior acceptance; side ranks: from 0, a rank is worth nothing until measured)."""
        p = self.priors
        pooled_tried = sum(row[rank] for row in self.tried)
        pooled_hits = sum(row[rank] for row in self.hits)
        start = p.acceptance if rank == 0 else 0.0
        pooled = (pooled_hits + 2 * start) / (pooled_tried + 2)
        d = min(depth, MAX_DEPTH)
        return (self.hits[d][rank] + p.shrink * pooled) / (self.tried[d][rank] + p.shrink)


@dataclass(frozen=True)
class Shape:
    nodes: int
    depth: int  # the spine's length
    tokens: float  # expected tokens of the round (accepted drafts + the target's one)
    rate: float  # expected tokens per second


def best_shapes(
    p: list[list[float]], cost: Any, max_nodes: int, side_discount: float = 0.0
) -> tuple[Shape, Shape | None]:
    """(the best chain, the best tree or None) by expected tokens per second; `p[d][r]` as
    `RankAcceptance.table`, `cost(n)` a round's seconds verifying n drafted nodes, each
    drafted at a step's price; `side_discount`: what a side node costs less than that (a
    model drafter's side leaves: a whole draft step, as they come from the spine's rows)."""
    chain, tree = Shape(0, 0, 0.0, -1.0), None
    memo = _memo(cost)

    def cost(nodes: int, depth: int) -> float:
        return max(memo(nodes) - (nodes - depth) * side_discount, 1e-9)

    for depth in range(1, min(MAX_DEPTH, max_nodes) + 1):
        survive, tokens, gains = 1.0, 1.0, []
        for d in range(1, depth + 1):
            for r in range(1, MAX_RANK):  # side r at d: accepted with p(d, r) once d - 1 is
                gains.append((-survive * p[min(d, MAX_DEPTH)][r], d, r))
            survive *= p[min(d, MAX_DEPTH)][0]
            tokens += survive
        best = Shape(depth, depth, tokens, tokens / cost(depth, depth))
        if best.rate > chain.rate:
            chain = best
        taken: dict[int, int] = {}  # depth -> side ranks taken (in rank order)
        heapq.heapify(gains)
        nodes = depth
        while gains and nodes < max_nodes:
            gain, d, r = heapq.heappop(gains)
            if r != taken.get(d, 0) + 1 or gain >= 0.0:
                continue  # a rank comes after the ones above it; a worthless side is not one
            taken[d] = r
            nodes += 1
            tokens -= gain
            shape = Shape(nodes, depth, tokens, tokens / cost(nodes, depth))
            if tree is None or shape.rate > tree.rate:
                tree = shape
    return chain, tree


@dataclass
class TreePolicy:
    """The draft-length policy of a tree drafter (see the module doc). `plan().tree_depth`:
    0 a chain of `length`, else a tree of `length` nodes at most that deep."""

    max_length: int = MAX_NODES
    cost: CostModel = field(default_factory=CostModel)
    acceptance: RankAcceptance = field(default_factory=RankAcceptance)
    margin: float = 0.05  # a tree must promise this much more than the best chain
    shadow_every: int = 8  # chain rounds between shadow trees (their side ranks' measurement)
    probe_every: int = 0  # rounds between probe trees while side ranks are unmeasured (0: none)
    probe_until: float = 8.0  # side-rank offers (forgotten like acceptance) that end probing
    side: int = 3  # a probe tree's side candidates
    # rounds priced before any probe: the cost line's slope over width is learned from the
    # chain policy's varied lengths first (unlearned, it is shrunk flat, and every tree looks
    # worth a probe)
    probe_after: int = 48
    last: tuple[Shape, Shape | None] | None = None  # the latest pricing (for reports)
    # the chain policy the drafter had (`auto`): it plans every round that is not a tree, as
    # it would without trees, and learns from those rounds only; None: the best chain here
    chain: Any = None
    # the first tree opens the tree-verification graphs: about a second of CPU (1.0-5.7 s
    # measured on a loaded 2-core host), a cost no round's price holds. Rent or buy: a first
    # tree is planned only once the time trees would have saved in the rounds they were
    # priced to pay (`_missed`) adds up to that cost, so opening costs at most what waiting
    # did, and trees that would pay a few % in a handful of rounds never open them
    open_seconds: float = 1.0
    trees_open: bool = False
    _missed: float = 0.0  # seconds trees were priced to save while their graphs were closed
    # the drafter drafts one step per depth (a model drafter's dynamic trees): a side node
    # costs verify width only, and a tree round's draft time is per spine step
    per_depth: bool = False
    force: bool = False  # trees="on": every drafting round a tree (the best, else a probe's)
    _rounds: int = 0

    def plan(self, source: str | None = None) -> Plan:
        self._rounds += 1
        base = self.chain.plan(source) if self.chain is not None else None
        learning = self.cost.t_draft is None or not self.cost.round_time
        if learning and not self.force:  # learn what a round costs
            return replace(base or Plan(min(4, self.max_length)), tree_depth=0)
        if not learning:
            chain, tree = self.last = self._price(self.acceptance.table())
            pays = tree is not None and tree.rate > (1 + self.margin) * chain.rate
            if pays and (self.force or self._repays(chain, tree)):
                self.trees_open = True
                return Plan(tree.nodes, tree_depth=tree.depth)
        base = base or Plan(chain.nodes if not learning else min(4, self.max_length))
        if self.force and base.length > 0:  # on: the chain's spine and side candidates
            return Plan(min(base.length + self.side, self.max_length), tree_depth=base.length)
        # probe only where a tree could pay: if even second candidates taking all the spine
        # leaves would not buy one at these costs (a verify whose cost grows with width), none
        due = self.probe_every > 0 and self._rounds % self.probe_every == 0
        probing = due and self.acceptance.measured(1) < self.probe_until and self._could_pay()
        if base.length > 0 and probing:
            nodes = min(base.length + self.side, self.max_length)
            return Plan(nodes, tree_depth=base.length)
        shadow = base.length > 0 and self.shadow_every and self._rounds % self.shadow_every == 0
        return replace(base, tree_depth=0, shadow=bool(shadow))

    def _repays(self, chain: Shape, tree: Shape | None) -> bool:
        """Whether the tree graphs are open, or the time trees would have saved so far (this
        round's saving counted) repays opening them."""
        assert tree is not None
        if self.trees_open:
            return True
        # this round: a chain costs chain.nodes' price for chain.tokens; a tree, for the same
        # tokens, that time over the ratio of their rates
        self._missed += self.cost.cost(chain.nodes) * (1 - chain.rate / tree.rate)
        return self._missed >= self.open_seconds

    def _could_pay(self) -> bool:
        if self.cost.rounds < self.probe_after:
            return False
        chain, tree = self._price(self.acceptance.table(optimistic=True))
        return tree is not None and tree.rate > (1 + self.margin) * chain.rate

    def observe(self, stats: RoundStats) -> None:
        self.trees_open = self.trees_open or stats.tree_nodes > 0
        steps = None
        if stats.tree_nodes:
            offers = stats.tree_offers
            priced = replace(stats, drafted=stats.tree_nodes)
            steps = stats.drafted if self.per_depth else None
            if self.force and self.chain is not None:  # its rounds are all trees: its spines
                self.chain.observe(stats)
        else:  # a shadow tree's offers, or the chain's own
            offers = stats.tree_offers or chain_offers(stats)
            priced = stats
            if self.chain is not None:
                self.chain.observe(stats)
        self.acceptance.observe(offers)
        self.cost.observe(priced, steps)  # T(nodes): a round's seconds by the nodes verified

    def _price(self, table: list[list[float]]) -> tuple[Shape, Shape | None]:
        discount = (self.cost.t_draft or 0.0) if self.per_depth else 0.0
        return best_shapes(table, self.cost.cost, self.max_length, discount)

    def channel_estimates(self) -> tuple[float | None, float | None]:
        return None, None


def chain_offers(stats: RoundStats) -> tuple[tuple[int, int], ...]:
    """A chain round's `tree_offers`: one candidate at each depth it drafted, taken up to
    the first rejection."""
    missed = stats.accepted < stats.drafted
    return ((1, 0),) * stats.accepted + ((1, -1),) * missed


def _memo(cost: Any) -> Any:
    seen: dict[int, float] = {}

    def priced(nodes: int) -> float:
        if nodes not in seen:
            seen[nodes] = cost(nodes)
        return seen[nodes]

    return priced


def _table() -> list[list[float]]:
    return [[0.0] * MAX_RANK for _ in range(MAX_DEPTH + 1)]
