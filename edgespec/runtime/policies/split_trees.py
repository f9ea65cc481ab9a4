"""Token trees in split mode: which rounds the server verifies as a tree.

In split mode a round's verify cost is the server's (a forward it runs for every session)
plus the round trip, and over a mobile link the round trip dominates: extra candidates ride
along almost free. `SplitTrees` wraps split mode's draft-length policy (`placement`, or
`channel-aware`). A round it places on the server ("split"), while the server offers trees
(`Remote.tree_nodes`, learned at START), becomes the tree `trees.best_shapes` prices
best, when it promises `margin` more tokens per second than the best chain: the drafter's
acceptance per depth and rank measured online (`RankAcceptance`), and the cost of a round
of N nodes taken as the split policy's own measured round time at width N
(`ChannelAware.round_seconds(N)`: drafting, the bytes each way over the link, the server's
seconds). While side ranks are unmeasured, every `probe_every`-th such round sends a small
probe tree (the chain plus `side` candidates). Every other round is the wrapped policy's.

The wrapped policy learns from every round: a tree round reaches it as its main path (a
chain) would have fared, drafted = the tree's depth and accepted = the main path's accepted
prefix, so the chain acceptance it learns is not inflated by side branches; its link and
server-time fits then see a round slightly larger than that chain's (the other nodes' bytes
and width), erring towards shorter chains. Attributes it does not have are the wrapped
policy's (reports read `placement`'s).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from edgespec.runtime.policies.estimates import PRIORS
from edgespec.runtime.policies.trees import MAX_NODES, RankAcceptance, best_shapes, chain_offers
from edgespec.runtime.round import Plan
from edgespec.runtime.stats import RoundStats


class SplitTrees:
    def __init__(
        self,
        inner: Any,
        tree_nodes: Callable[[], int],
        margin: float = 0.05,
        probe_every: int = 8,
        probe_until: float = 8.0,
        side: int = 3,
    ) -> None:
        """inner: the split policy (`Placement` or `ChannelAware`); tree_nodes: the largest
        tree the server verifies now (0: none; asked each round, a link may change)."""
        self.inner, self.tree_nodes = inner, tree_nodes
        self.margin, self.side = margin, side
        self.probe_every, self.probe_until = probe_every, probe_until
        split = getattr(inner, "split", inner)  # Placement holds its ChannelAware
        self.channel = split if hasattr(split, "round_seconds") else None
        self.acceptance = RankAcceptance(self.channel.cost.priors if self.channel else PRIORS)
        self.rounds = 0  # rounds that could have been trees
        self.trees = 0  # of those, planned as trees
        self.side_taken = 0  # tree rounds whose kept path left the main path (a side branch)

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not yet set (a copy being built)
            raise AttributeError(name)
        return getattr(self.inner, name)

    def plan(self, source: str | None = None) -> Plan:
        base = self.inner.plan(source)
        most = min(self.tree_nodes(), MAX_NODES)
        split = self.channel
        if base.where != "split" or base.length <= 0 or most < 2 or split is None:
            return replace(base, tree_depth=0)
        if split.remote_rounds < 2:  # the link's first slope is learned on chains
            return replace(base, tree_depth=0)
        self.rounds += 1
        chain, tree = best_shapes(self.acceptance.table(), split.round_seconds, most)
        if tree is not None and tree.rate > (1 + self.margin) * chain.rate:
            self.trees += 1
            return replace(base, length=tree.nodes, tree_depth=tree.depth)
        unmeasured = self.acceptance.measured(1) < self.probe_until
        if unmeasured and self.rounds % self.probe_every == 0 and base.length < most:
            self.trees += 1
            nodes = min(base.length + self.side, most)
            return replace(base, length=nodes, tree_depth=base.length)
        return replace(base, tree_depth=0)

    def observe(self, stats: RoundStats) -> None:
        if stats.phase == "decode" and stats.tree_nodes:
            offers = stats.tree_offers
            spine = 0
            while spine < len(offers) and offers[spine][1] == 0:
                spine += 1
            self.acceptance.observe(offers)
            self.side_taken += any(rank > 0 for _, rank in offers)
            self.inner.observe(replace(stats, accepted=min(spine, stats.drafted)))
            return
        if stats.phase == "decode" and stats.drafted:
            self.acceptance.observe(chain_offers(stats))
        self.inner.observe(stats)

    def channel_estimates(self) -> tuple[float | None, float | None]:
        return self.inner.channel_estimates()
