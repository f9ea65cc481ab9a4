"""A token tree: several candidate continuations of the sequence, verified in one forward.

Node i holds `tokens[i]`; `parents[i]` is the node it follows, or -1 for a child of the root
(the root is the sequence's last token, which the verifier already has). Parents come before
their children (`parents[i] < i`), so node order is a valid feed order: node i sits at
position `start + depth[i] - 1` and may attend to the cached prefix, to itself and to its
ancestors (`ancestor_mask`). A chain is the tree whose parents are -1, 0, 1, ...

Drafters build trees; verifiers score every node in one forward; acceptance keeps one root
path (`path`), and the caches keep that path's rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class TokenTree:
    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    depth: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError(
                f"a token tree needs one parent per token: {len(self.tokens)} tokens, "
                f"{len(self.parents)} parents"
            )
        depth: list[int] = []
        for i, p in enumerate(self.parents):
            if not -1 <= p < i:
                raise ValueError(
                    f"node {i}'s parent is {p}: a parent must be -1 (the root) or an earlier node"
                )
            depth.append(1 if p < 0 else depth[p] + 1)
        object.__setattr__(self, "depth", tuple(depth))

    @classmethod
    def chain(cls, tokens: Sequence[int]) -> TokenTree:
        return cls(tuple(int(t) for t in tokens), tuple(range(-1, len(tokens) - 1)))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    @property
    def max_depth(self) -> int:
        return max(self.depth, default=0)

    def children(self, node: int) -> list[int]:
        """The nodes that follow `node` (-1: the root), in node order."""
        return [i for i, p in enumerate(self.parents) if p == node]

    def path(self, node: int) -> list[int]:
        """The nodes from the root's first child down to `node` (empty for -1)."""
        nodes: list[int] = []
        while node >= 0:
            nodes.append(node)
            node = self.parents[node]
        return nodes[::-1]

    def path_tokens(self, node: int) -> list[int]:
        return [self.tokens[i] for i in self.path(node)]

    def offers(self, path: Sequence[int]) -> tuple[tuple[int, int], ...]:
        """Along an accepted root path (its tokens), per depth from 1: how many children the
        tree offered under the path so far, and the rank of the one the target took (-1 at
        the depth where it took none; no entry once the tree offered nothing)."""
        out: list[tuple[int, int]] = []
        node = -1
        for depth in range(len(path) + 1):
            kids = self.children(node)
            if not kids:
                break
            if depth == len(path):
                out.append((len(kids), -1))
                break
            rank = [self.tokens[k] for k in kids].index(path[depth])
            out.append((len(kids), rank))
            node = kids[rank]
        return tuple(out)

    def shadow_offers(self, known: Sequence[int]) -> tuple[tuple[int, int], ...]:
        """`offers` of a tree that was not verified, against the tokens the target is known to
        have produced after its root (a chain round's accepted drafts and the target's own
        token): per depth, the children offered under the matching path and the rank of the
        known token among them (-1 where none matched; that ends the path). Where the known
        tokens end, nothing more is known: no entry."""
        out: list[tuple[int, int]] = []
        node = -1
        for token in known:
            kids = self.children(node)
            if not kids:
                break
            ranked = [self.tokens[k] for k in kids]
            if token not in ranked:
                out.append((len(kids), -1))
                break
            rank = ranked.index(token)
            out.append((len(kids), rank))
            node = kids[rank]
        return tuple(out)

    def positions(self, start: int) -> np.ndarray:
        """Each node's position when the sequence before the tree holds `start` tokens
        (the root, the last of them, sits at start - 1)."""
        return np.asarray(self.depth, dtype=np.int64) + (start - 1)

    def ancestor_mask(self) -> np.ndarray:
        """(n, n) bool: row i is True at i and at each of i's ancestors."""
        n = len(self.tokens)
        mask = np.zeros((n, n), dtype=bool)
        for i, p in enumerate(self.parents):
            if p >= 0:
                mask[i] = mask[p]
            mask[i, i] = True
        return mask
