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
