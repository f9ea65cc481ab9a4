"""What a tree drafter adds to the drafter contract, and the expansion every model-free one shares.

  TreeDrafter   a `Drafter` that can also propose a `TokenTree` after seq, given a node budget
                and a maximum depth (its chain proposals, `propose`, serve chain verification;
                a tree's first children from the root down are its most likely root path)
  greedy_chain  the most likely root path (each step: the most likely child): the chain
  best_first    grows a tree from scored candidates: each node's children come with their
                conditional probabilities, a node's score is the product along its root path
                (the chance the target takes that path, if the scores are calibrated), and
                the `budget` highest-scoring nodes within `max_depth` are kept (a parent always
                scores at least as high as its children, so the kept set is a tree). The sum
                of kept scores is the expected number of accepted drafts (SuffixDecoding's
                frequency-scored speculation trees; Sequoia's node value)

  merged_paths  candidate continuations (prompt lookup's matches) merged into one tree
  AsTree        a tree drafter proposing trees through the chain contract: `plan.length` is
                the node budget, `plan.tree_depth` the depth (0: the drafter's chain; a
                verifier that cannot verify trees takes the main path)
  TreeRounds    a tree drafter whose trees come with how they were drawn (a model drafter's:
                its q per node, its timings; `runtime/drafters/model_tree.py`): AsTree takes its
                whole proposal
  shared        the one store (or table) of a bundle that every generation on it shares

Node order is best-first order, so parents come before children as `TokenTree` requires, and
among siblings the more likely child comes first (a child's rank is its index among its
siblings: acceptance statistics per depth and rank read it from there).
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from time import perf_counter
from typing import Protocol, TypeVar, runtime_checkable
from weakref import WeakKeyDictionary

import numpy as np

from edgespec.runtime.grammar.constraints import Constraint
from edgespec.runtime.round import Drafter, LearnsFromVerify, Plan, Proposal
from edgespec.runtime.sampling import SamplingParams
from edgespec.runtime.tree import TokenTree

T = TypeVar("T")
_SHARED: WeakKeyDictionary[object, dict[type, object]] = WeakKeyDictionary()
_SHARED_LOCK = threading.Lock()


def shared(owner: object, kind: Callable[[], T]) -> T:
    """The one `kind()` of `owner` (a bundle's opened graphs): what model-free drafters learn
    (a store of earlier replies, a table of recycled candidates) is shared by every
    generation on that bundle (a conversation's turns, a server's requests), and goes with
    it."""
    with _SHARED_LOCK:
        mine = _SHARED.setdefault(owner, {})
        if kind not in mine:
            mine[kind] = kind()  # type: ignore[index]
        return mine[kind]  # type: ignore[index,return-value]


# children of a node: (token, conditional probability, the node's key for its own children)
Expand = Callable[[object], Sequence[tuple[int, float, object]]]


@runtime_checkable
class TreeDrafter(Drafter, Protocol):
    def propose_tree(self, seq: list[int], budget: int, max_depth: int) -> TokenTree:
        """At most `budget` nodes, at most `max_depth` deep, to follow seq (prompt + output so
        far; committed tokens only). An empty tree when there is nothing to propose."""


@runtime_checkable
class TreeRounds(TreeDrafter, Protocol):
    def propose_tree_round(
        self, seq: list[int], plan: Plan, params: SamplingParams, rng: np.random.Generator
    ) -> Proposal:
        """A tree of at most `plan.length` nodes, its spine `plan.tree_depth` deep, as a
        proposal (or a chain, where the drafter found no side candidates)."""


def best_first(
    root: object, expand: Expand, budget: int, max_depth: int
) -> tuple[TokenTree, list[float]]:
    """The `budget` most likely nodes below `root` (see the module doc), and their scores."""
    tokens: list[int] = []
    parents: list[int] = []
    scores: list[float] = []
    # (-score, tie-break, parent node, depth, token, key)
    heap: list[tuple[float, int, int, int, int, object]] = []
    order = 0

    def push(key: object, parent: int, depth: int, score: float) -> None:
        nonlocal order
        if depth > max_depth:
            return
        for token, p, child in expand(key):
            if p > 0.0:
                heapq.heappush(heap, (-score * p, order, parent, depth, token, child))
                order += 1

    push(root, -1, 1, 1.0)
    while heap and len(tokens) < budget:
        neg, _, parent, depth, token, key = heapq.heappop(heap)
        tokens.append(token)
        parents.append(parent)
        scores.append(-neg)
        push(key, len(tokens) - 1, depth + 1, -neg)
    return TokenTree(tuple(tokens), tuple(parents)), scores


def greedy_chain(root: object, expand: Expand, plan: Plan) -> tuple[list[int], float]:
    """The most likely root path, `plan.length` long at most: from the root, each step takes
    the most likely child (ties: the first), its probability the drafter's confidence (the
    plan's confidence stop ends the chain after a token drafted below it). Returns the tokens
    and the expected number of them accepted (the sum of their path probabilities)."""
    out: list[int] = []
    key, path, expected = root, 1.0, 0.0
    while len(out) < plan.length:
        children = [c for c in expand(key) if c[1] > 0.0]
        if not children:
            break
        token, p, key = max(children, key=lambda c: c[1])
        out.append(token)
        path *= p
        expected += path
        if not plan.keep_drafting(p):
            break
    return out, expected


def merged_paths(paths: Sequence[Sequence[int]], budget: int, max_depth: int) -> TokenTree:
    """Candidate continuations merged where they agree, as a tree of at most `budget` nodes
    (a node's score: the share of the paths through it; ties: the earlier path first)."""
    root: dict[int, tuple[int, dict]] = {}
    for path in paths:
        node = root
        for t in path[:max_depth]:
            count, below = node.get(t, (0, {}))
            node[t] = (count + 1, below)
            node = below

    def expand(node: object) -> list[tuple[int, float, object]]:
        assert isinstance(node, dict)
        total = sum(c for c, _ in node.values())
        return [(t, c / total, below) for t, (c, below) in node.items()]

    return best_first(root, expand, budget, max_depth)[0]


SHADOW_NODES = 16  # a shadow tree's nodes: what the tree policy prices at most


class AsTree:
    """`drafter`'s trees as its proposals: at most `plan.length` nodes, `max_depth` deep,
    through `Proposal.of_tree` (the main path is the most likely root path)."""

    def __init__(self, drafter: TreeDrafter, max_depth: int = 8) -> None:
        self.drafter, self.max_depth = drafter, max_depth
        self.drafts_ahead = False
        self.name = drafter.name

    def begin(
        self,
        prompt: list[int],
        capacity: int,
        cached: int = 0,
        constraint: Constraint | None = None,
    ) -> None:
        self.drafter.begin(prompt, capacity, cached, constraint)

    def source(self, seq: list[int]) -> str | None:
        return self.drafter.source(seq)

    def propose(
        self, seq: list[int], plan: Plan, params: SamplingParams, rng: np.random.Generator
    ) -> Proposal:
        start = perf_counter()
        if plan.length <= 0:
            return Proposal([], "point", None, perf_counter() - start)
        if plan.tree_depth == 0:  # the policy chose a chain this round
            proposal = self.drafter.propose(seq, plan, params, rng)
            if plan.shadow and not isinstance(self.drafter, TreeRounds):
                # and the tree it would have sent, to price side candidates (model-free
                # drafters: a model drafter's tree would cost draft steps and its cache)
                proposal.shadow = self.drafter.propose_tree(seq, SHADOW_NODES, self.max_depth)
            return proposal
        depth = plan.tree_depth or self.max_depth
        if isinstance(self.drafter, TreeRounds):
            plan = replace(plan, tree_depth=depth)
            return self.drafter.propose_tree_round(seq, plan, params, rng)
        tree = self.drafter.propose_tree(seq, plan.length, depth)
        return Proposal.of_tree(tree, seconds=perf_counter() - start)

    def observe_verify(self, inputs: list[int], logits: np.ndarray) -> None:
        if isinstance(self.drafter, LearnsFromVerify):
            self.drafter.observe_verify(inputs, logits)

    def commit(self, valid: int) -> None:
        self.drafter.commit(valid)
