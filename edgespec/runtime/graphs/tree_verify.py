"""Verifying a token tree in one forward of the target's tree-verification graphs.

A bundle exported with `--tree-verify` holds, beside each dynamic graph, a twin that takes
`position_ids` and a `tree_mask` (export/tree.py; `Manifest.tree_graphs`). `TreeGraphSession`
runs one; static NPU graphs verify trees through their own position and mask inputs
(`StaticGraphSession.run_tree`). `tree_feed` lays a tree out for either: the sequence's last
token (the root: the cache holds the tokens before it), then the nodes in node order, each
at the position of its depth, each seeing the cache, the root and its own ancestors. The
new keys and values land in the cache in feed order; once a root path is accepted,
`KVCache.keep_rows` moves its rows to follow the root (a gather of at most the path's
length), and the cache's length is cut to the path: what a chain of the path's tokens would
have left there.
"""

from __future__ import annotations

import threading
from typing import Protocol

import numpy as np

from edgespec.runtime.graphs.kv_cache import KVCache
from edgespec.runtime.graphs.protocol import Feed
from edgespec.runtime.graphs.session import GraphSession
from edgespec.runtime.tree import TokenTree


def tree_feed(last: int, tree: TokenTree, start: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids [n + 1], positions [n + 1], mask [n + 1, n + 1]) verifying `tree` after a sequence
    of `start` tokens whose last is `last` (the cache holds the start - 1 before it)."""
    n = len(tree)
    ids = np.array([last, *tree.tokens], np.int64)
    positions = np.concatenate([[start - 1], tree.positions(start)]).astype(np.int64)
    mask = np.zeros((n + 1, n + 1), dtype=bool)
    mask[:, 0] = True
    mask[1:, 1:] = tree.ancestor_mask()
    return ids, positions, mask


class TreeGraph(Protocol):
    """A graph that verifies token trees: a `TreeGraphSession`, or a `StaticGraphSession`
    (fixed-shape graphs take positions and a mask anyway)."""

    def run_tree(
        self, cache: KVCache, past: int, feed: Feed, positions: np.ndarray, mask: np.ndarray
    ) -> dict[str, np.ndarray]:
        """`Graph.run` for S new positions at `positions` [S] that see the cache and the new
        positions `mask` [S, S] allows (row i: those position i sees)."""
        ...


class TreeGraphSession(GraphSession):
    """A `GraphSession` over a tree-verification graph: `run_tree` feeds the tree's positions
    and mask beside the usual inputs (through the general binding: the per-width `Narrow`
    buffers know only the chain graph's inputs)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._narrow = None
        self._tree_lock = threading.Lock()
        self._fed: tuple[np.ndarray, np.ndarray] | None = None  # alive until the run

    def run_tree(
        self, cache: KVCache, past: int, feed: Feed, positions: np.ndarray, mask: np.ndarray
    ) -> dict[str, np.ndarray]:
        s = feed.width
        if positions.shape != (s,) or mask.shape != (s, s):
            raise ValueError(
                f"a tree of {s} positions needs {s} positions and an {s}x{s} mask, got "
                f"{positions.shape} and {mask.shape}"
            )
        with self._tree_lock:
            self._fed = (
                np.ascontiguousarray(positions[None], dtype=np.int64),
                np.ascontiguousarray(mask, dtype=bool),
            )
            self._io.bind_cpu_input("position_ids", self._fed[0])
            self._io.bind_cpu_input("tree_mask", self._fed[1])
            return self.run(cache, past, feed)
