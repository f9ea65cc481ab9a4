"""A split session's token-tree round on the server: its row of the KV pool, alone.

A VERIFY with a tree (`Verify.parents`, sent only by a device the server offered trees to)
runs the target's tree-verification graphs (exported with `--tree-verify`:
`Manifest.tree_graphs`; opened on the first tree, so a server whose devices send chains
holds one copy of the weights) over the session's row alone, batch 1: onnxruntime's
GroupQueryAttention with a KV cache takes a multi-token tree step only at batch 1, so the
chain rounds of other sessions keep sharing their forwards while a tree runs by itself. The
nodes are laid out as the device's own verifier lays them out (`tree_feed`: the root, the
last committed token, then each node at the position of its depth, seeing the row, the
root and its own ancestors), padded to the pool's step width like every call on a row, and
accepted with `accept_tree` (the device's greedy / recursive rejection sampling rule); the
kept path's keys and values are gathered to follow the root (`batching.keep_rows`), so the
row holds what a chain of the path's tokens would have left. A failure leaves the row at
its length before the round. The answer is a PATH: the RESULT and the kept nodes.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter
from typing import Any

from edgespec.protocol import BAD_REQUEST, ProtocolError, Result, Verify
from edgespec.runtime.graphs.kv_cache import KVPool
from edgespec.runtime.graphs.tree_verify import TreeGraph, tree_feed
from edgespec.runtime.tree import TokenTree
from edgespec.runtime.verify.tree_accept import accept_tree
from edgespec.serve.batching import forward_tree_alone, keep_rows

ServerSession = Any  # serve.session.ServerSession (which imports this module)
TreeStages = Callable[[], list[TreeGraph]]  # the graphs, opened on first use (`Stack.tree_graphs`)

NO_TREES = (
    "this server's bundle has no tree-verification graphs: send chains (VERIFY without a "
    "tree), or re-export the bundle with `edgespec export MODEL --out FOLDER --tree-verify`"
)


def check_tree(
    s: ServerSession, msg: Verify, stages: TreeStages | None
) -> tuple[TokenTree, list[TreeGraph]]:
    """The round's tree and the graphs verifying it; ProtocolError (422) if this server or
    session cannot verify it."""
    assert msg.parents is not None
    if stages is None:
        raise ProtocolError(NO_TREES, BAD_REQUEST)
    if s.constraint is not None:
        raise ProtocolError(
            "a session under a grammar verifies chains (its rows are masked along one path): "
            "send the tree's main path",
            BAD_REQUEST,
        )
    if msg.q is not None and len(msg.q) != len(msg.drafts):
        raise ProtocolError("VERIFY: a tree's q rows must be one per node", BAD_REQUEST)
    try:
        graphs = stages()  # opened on the first tree: a second copy of the target's weights
    except ValueError as e:  # BundleError: these graphs cannot verify trees
        raise ProtocolError(f"{NO_TREES} ({e})", BAD_REQUEST) from None
    return TokenTree(tuple(msg.drafts), tuple(msg.parents)), graphs


def verify_tree(
    pool: KVPool, stages: TreeStages | None, s: ServerSession, msg: Verify, t0: float
) -> Result:
    """Score every node of msg's tree in one forward on s's row, accept a root path, keep
    its rows; s.seq grows by the path and the target's next token."""
    tree, graphs = check_tree(s, msg, stages)
    slot, base = s.slot, len(s.seq)
    assert slot is not None
    valid = base - 1  # what stays valid in the row if anything below raises
    try:
        ids, positions, mask = tree_feed(s.seq[-1], tree, base)
        logits = forward_tree_alone(graphs, pool, slot, ids, positions, mask)
        path, token = accept_tree(tree, msg.q, logits, s.params, s.rng)
        keep_rows(pool, slot, base, path)  # node i's row is base + i
        valid = base + len(path)
    finally:
        pool.truncate(slot, valid)
    s.seq += [*(tree.tokens[i] for i in path), token]
    s.rounds += 1
    return Result(len(path), token, len(s.seq), perf_counter() - t0, path=path)
