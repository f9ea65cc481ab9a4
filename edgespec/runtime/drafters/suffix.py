"""SuffixDecoding: drafts from how the text so far continued where it occurred before.

  CountTrie      every substring of at most `depth` tokens of the text added to it, with how
                 often it occurred (a suffix tree cut at `depth`): appending a token is O(depth)
                 (the suffixes that end at it), removing a whole text is its exact inverse, so a
                 bounded store can forget its oldest texts
  SuffixStore    a bounded, thread-safe trie of earlier replies, shared by every generation on
                 one bundle (a server's requests, a conversation's turns): at most `max_tokens`
                 tokens, the oldest replies forgotten first
  SuffixDrafter  matches the longest suffix of the sequence (up to `max_match` tokens, at least
                 `min_match`) in two tries: one of this sequence (prompt, earlier turns and the
                 output so far, kept across a conversation's turns) and the shared store; below
                 the match each child's frequency among its siblings is its probability (with
                 `backoff`, shorter matches that occurred more often add their continuations
                 at half the weight each), and the tree (or chain) from the trie whose tree
                 expects more accepted tokens wins

A chain proposal is the most frequent continuation; a tree proposal keeps the `budget` most
likely nodes (see `tree_draft.best_first`). Deterministic: q is a point mass, like lookup's.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from time import perf_counter

import numpy as np

from edgespec.runtime.drafters.tree_draft import best_first, greedy_chain
from edgespec.runtime.grammar.constraints import Constraint
from edgespec.runtime.round import Plan, Proposal, empty_proposal
from edgespec.runtime.sampling import SamplingParams
from edgespec.runtime.tree import TokenTree


@dataclass(frozen=True)
class SuffixConfig:
    # the longest suffix matched: longer matches are more specific, each costs a trie walk
    max_match: int = 6
    # shorter matches than 2 tokens guess from one token of context: too often wrong to draft
    min_match: int = 2
    # substrings kept: max_match + the deepest draft (18 tokens is past any useful γ on a CPU)
    depth: int = 24
    # the shared store's size: at most depth trie nodes a token, ~270 bytes a node (measured:
    # 8,100 tokens of unrepetitive text, 182k nodes, 49 MB; repetitive text shares nodes)
    store_tokens: int = 8192
    # shorter matches that occurred more often also propose (each half the weight of the
    # next longer one): branches where the longest match knows one continuation
    backoff: bool = True


SUFFIX = SuffixConfig()


class _Node:
    __slots__ = ("count", "children")

    def __init__(self) -> None:
        self.count = 0
        self.children: dict[int, _Node] = {}


class CountTrie:
    """Occurrence counts of every substring of at most `depth` tokens of the added texts."""

    def __init__(self, depth: int) -> None:
        if depth < 1:
            raise ValueError(f"a count trie needs a depth of at least 1, not {depth}")
        self.depth = depth
        self.root = _Node()
        self.nodes = 1

    def start(self) -> list[_Node]:
        """The suffix nodes of an empty text (to pass to `append`)."""
        return [self.root]

    def append(self, active: list[_Node], token: int) -> list[_Node]:
        """Count the substrings that end at `token`, appended to a text whose suffix nodes
        (lengths 0, 1, ... below depth) are `active`; returns the new text's suffix nodes."""
        out = [self.root]
        for node in active:
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = _Node()
                self.nodes += 1
            child.count += 1
            if len(out) < self.depth:
                out.append(child)
        return out

    def add(self, tokens: Sequence[int]) -> None:
        active = self.start()
        for t in tokens:
            active = self.append(active, int(t))

    def remove(self, tokens: Sequence[int]) -> None:
        """Forget a text `add` counted (exactly: the trie is as if it was never added)."""
        for i in range(len(tokens)):
            node = self.root
            for t in tokens[i : i + self.depth]:
                child = node.children[int(t)]
                child.count -= 1
                if child.count == 0:  # only this occurrence reached it: drop its branch
                    del node.children[int(t)]
                    self.nodes -= _size(child)
                    break
                node = child

    def find(self, context: Sequence[int]) -> _Node | None:
        node: _Node | None = self.root
        for t in context:
            node = node.children.get(int(t))
            if node is None:
                return None
        return node

    def matches(self, seq: Sequence[int], longest: int, shortest: int) -> list[_Node]:
        """The nodes of the suffixes of seq (`longest`..`shortest` tokens) that occurred with
        a continuation, longest first; a shorter one only where it occurred more often (it
        adds occurrences the longer ones lack)."""
        out: list[_Node] = []
        seen = 0
        for m in range(min(longest, len(seq), self.depth - 1), shortest - 1, -1):
            node = self.find(seq[len(seq) - m :])
            if node is None or not node.children:
                continue
            total = sum(c.count for c in node.children.values())
            if total > seen:
                out.append(node)
                seen = total
        return out

    def counts(self) -> dict[tuple[int, ...], int]:
        """Every substring counted, with its count (tests compare it with a brute force)."""
        out: dict[tuple[int, ...], int] = {}
        stack: list[tuple[tuple[int, ...], _Node]] = [((), self.root)]
        while stack:
            prefix, node = stack.pop()
            for t, child in node.children.items():
                out[(*prefix, t)] = child.count
                stack.append(((*prefix, t), child))
        return out


def _size(node: _Node) -> int:
    return 1 + sum(_size(c) for c in node.children.values())


# a point of the expansion: trie nodes reached by the same tokens from the matched suffixes,
# with the weight each one's frequencies get
Key = tuple[tuple[_Node, float], ...]


def expand(key: object) -> list[tuple[int, float, object]]:
    """The children of `key`'s nodes, each token's probability its weighted frequency among
    them (one node: its frequency among its siblings)."""
    assert isinstance(key, tuple)
    merged: dict[int, list] = {}
    weights = 0.0
    for node, w in key:
        total = sum(c.count for c in node.children.values())
        if total == 0:
            continue
        weights += w
        for t, c in node.children.items():
            entry = merged.setdefault(t, [0.0, []])
            entry[0] += w * c.count / total
            entry[1].append((c, w))
    return [(t, p / weights, tuple(below)) for t, (p, below) in merged.items()]


class SuffixStore:
    """Earlier replies in one bounded trie; safe to share between threads."""

    def __init__(self, config: SuffixConfig = SUFFIX) -> None:
        self.config = config
        self.trie = CountTrie(config.depth)
        self.texts: deque[tuple[int, ...]] = deque()
        self.tokens = 0
        self.version = 0  # counts the texts added: a drafter's cached match is stale after one
        self.lock = threading.Lock()

    def add(self, tokens: Sequence[int]) -> None:
        text = tuple(int(t) for t in tokens[-self.config.store_tokens :])
        if len(text) < 2:
            return
        with self.lock:
            while self.texts and self.tokens + len(text) > self.config.store_tokens:
                old = self.texts.popleft()
                self.trie.remove(old)
                self.tokens -= len(old)
            self.trie.add(text)
            self.texts.append(text)
            self.tokens += len(text)
            self.version += 1


class SuffixDrafter:
    """SuffixDecoding over this sequence and a shared store of earlier replies."""

    drafts_ahead = False  # its index must only see committed tokens
    name = "suffix"

    def __init__(self, store: SuffixStore | None = None, config: SuffixConfig = SUFFIX) -> None:
        self.store, self.config = store, config
        self._reset()

    def _reset(self) -> None:
        self.local = CountTrie(self.config.depth)
        self.active = self.local.start()
        self.indexed: list[int] = []
        self.prompt_length = 0
        self._found: tuple[tuple[int, int], list[Key]] = ((-1, 0), [])

    def begin(
        self,
        prompt: list[int],
        capacity: int,
        cached: int = 0,
        constraint: Constraint | None = None,
    ) -> None:
        # the last generation's reply goes to the shared store
        if self.store is not None and len(self.indexed) > self.prompt_length:
            self.store.add(self.indexed[self.prompt_length :])
        # the index covers the last sequence's first `indexed` tokens: still exact if the
        # prompt shares them all (a conversation's next turn), else rebuilt (in propose)
        if cached < len(self.indexed):
            self._reset()
        self.prompt_length = len(prompt)
        self._found = ((-1, 0), [])

    def _index(self, seq: list[int]) -> None:
        for t in seq[len(self.indexed) :]:
            self.active = self.local.append(self.active, t)
            self.indexed.append(t)

    def _roots(self, seq: list[int]) -> list[Key]:
        """Where to expand from, per trie (this sequence's, the store's): the matched nodes,
        found once per sequence length (`source` and `propose` of one round share them)."""
        key = (len(seq), self.store.version if self.store is not None else 0)
        if self._found[0] == key:
            return self._found[1]
        self._index(seq)
        c = self.config
        tries = [self.local] if self.store is None else [self.local, self.store.trie]
        roots = []
        for trie in tries:
            nodes = trie.matches(seq, c.max_match, c.min_match)[: None if c.backoff else 1]
            if nodes:
                roots.append(tuple((n, 0.5**i) for i, n in enumerate(nodes)))
        self._found = (key, roots)
        return roots

    def source(self, seq: list[int]) -> str | None:
        with self._guard():
            return self.name if self._roots(seq) else None

    def _best(self, seq: list[int], budget: int, max_depth: int) -> TokenTree:
        """The tree (from this sequence's trie or the store's) expecting more accepted drafts."""
        best: tuple[float, TokenTree] = (-1.0, TokenTree((), ()))
        for root in self._roots(seq):
            tree, scores = best_first(root, expand, budget, max_depth)
            if sum(scores) > best[0]:
                best = (sum(scores), tree)
        return best[1]

    def _guard(self) -> AbstractContextManager:
        """The shared store's lock (another generation may be adding a reply to it)."""
        return self.store.lock if self.store is not None else nullcontext()

    def propose(
        self, seq: list[int], plan: Plan, params: SamplingParams, rng: np.random.Generator
    ) -> Proposal:
        start = perf_counter()
        if plan.length <= 0:
            return empty_proposal(perf_counter() - start)
        with self._guard():  # the chain that expects more accepted drafts
            chains = [greedy_chain(root, expand, plan) for root in self._roots(seq)]
            tokens = max(chains, key=lambda c: c[1], default=([], 0.0))[0]
        if not tokens:
            return empty_proposal(perf_counter() - start)
        return Proposal(tokens, "point", None, perf_counter() - start)

    def propose_tree(self, seq: list[int], budget: int, max_depth: int) -> TokenTree:
        with self._guard():
            return self._best(seq, budget, min(max_depth, self.config.depth - 1))

    def commit(self, valid: int) -> None:
        pass
