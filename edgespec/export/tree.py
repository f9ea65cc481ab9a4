"""The inputs of a tree-verification graph: a token tree verified in one forward.

A graph built with `GraphBuilder.tree` takes, beside the chain graph's inputs,
`position_ids` [batch, sequence] int64 (each new position's place in the sequence: rotary
and learned positions come from it, not from the cache offset, so siblings share one) and
`tree_mask` [sequence, sequence] bool (row i: the new positions position i sees, itself and
its ancestors). Every new position also sees the whole cache. GroupQueryAttention takes the
positions as its `position_ids` and the mask, turned into an additive bias over
[cache | new], as its `attention_bias`, beside its own causal mask (parents come before
their children, so the causal mask never hides an ancestor). A chain is the tree whose mask
is lower-triangular and whose positions follow the cache: the same logits as the chain graph.
Sliding-window layers get the window in their bias (`window_bias`), by position.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from edgespec.export.builder import GraphBuilder


def tree_inputs(gb: GraphBuilder, total_len: str) -> tuple[str, str]:
    """Declare `position_ids` and `tree_mask`; build the attention bias [1, 1, sequence,
    total] once for every layer: 0 over the cache and where the mask is true, -inf elsewhere
    among the new positions. Returns (position_ids, bias)."""
    pos = gb.add_input("position_ids", TensorProto.INT64, ["batch", "sequence"])
    mask = gb.add_input("tree_mask", TensorProto.BOOL, ["sequence", "sequence"])
    zero = gb.const(np.array(0, gb.dtype))
    blocked = gb.const(np.array(-np.inf, gb.dtype))
    new = gb.op1("Where", [mask, zero, blocked])  # [S, S]
    seq = gb.op1("Shape", [mask], start=0, end=1)  # [S]
    cached = gb.op1("Sub", [gb.op1("Cast", [total_len], to=TensorProto.INT64), seq])
    zeros = gb.const(np.array([0], np.int64))
    pads = gb.op1("Concat", [zeros, cached, zeros, zeros], axis=0)  # before dim 1: the cache
    bias = gb.op1("Pad", [new, pads])
    return pos, gb.op1("Unsqueeze", [bias, gb.const(np.array([0, 1]))])


def window_bias(gb: GraphBuilder, tree: tuple[str, str], total_len: str, window: int) -> str:
    """The bias of a sliding-window layer: `tree`'s bias plus -inf where the query's position
    minus the key's is `window` or more. Keys in the cache sit at their slot (the cache holds
    the sequence in order), new keys at their `position_ids`; the op's own window counts
    slots, which a tree does not fill in order, so it is not used."""
    pos, bias = tree
    q = gb.op1("Reshape", [pos, gb.const(np.array([-1]))])  # [S] (a tree is one row)
    seq = gb.op1("Gather", [gb.op1("Shape", [q]), gb.const(np.array(0))], axis=0)
    cached = gb.op1("Sub", [gb.op1("Cast", [total_len], to=TensorProto.INT64), seq])
    slots = gb.op1("Range", [gb.const(np.array(0)), cached, gb.const(np.array(1))])
    keys = gb.op1("Concat", [slots, q], axis=0)  # [T]
    diff = gb.op1(
        "Sub",
        [
            gb.op1("Unsqueeze", [q, gb.const(np.array([1]))]),
            gb.op1("Unsqueeze", [keys, gb.const(np.array([0]))]),
        ],
    )  # [S, T]
    inside = gb.op1("Less", [diff, gb.const(np.array(window, np.int64))])
    zero = gb.const(np.array(0, gb.dtype))
    blocked = gb.const(np.array(-np.inf, gb.dtype))
    far = gb.op1("Where", [inside, zero, blocked])
    return gb.op1("Add", [bias, gb.op1("Unsqueeze", [far, gb.const(np.array([0, 1]))])])
