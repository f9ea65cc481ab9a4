"""Where a call's positions sit, for the graph builders (export/decoder.py): the absolute
positions of the new tokens, the last `keep` of them that reach the LM head, and the lone-row
pad that keeps attention batch-invariant.

Each function takes the `GraphBuilder` being filled and the names of its values, adds the
nodes and returns the names of what they compute.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from edgespec.export.builder import GraphBuilder


def last_positions(gb: GraphBuilder, hidden: str, keep: str) -> str:
    """hidden[:, -keep:] (keep = 0 gives an empty slice: no LM head work)."""
    seq = gb.op1("Gather", [gb.op1("Shape", [hidden]), gb.const(np.array(1))], axis=0)
    start = gb.op1("Sub", [seq, keep])
    starts = gb.op1("Unsqueeze", [start, gb.const(np.array([0]))])
    return gb.op1("Slice", [hidden, starts, gb.const(np.array([2**62])), gb.const(np.array([1]))])


def positions(gb: GraphBuilder, seqlens_k: str, query_seqlens: str | None, input_ids: str) -> str:
    """Absolute positions [B, S] of the new tokens: seqlens_k + 1 - Q + arange(S), Q the
    row's valid positions (query_seqlens; padding rows run past them, unread), or S
    where the graph has no query_seqlens."""
    seq = gb.op1("Gather", [gb.op1("Shape", [input_ids]), gb.const(np.array(1))], axis=0)
    steps = gb.op1("Range", [gb.const(np.array(0)), seq, gb.const(np.array(1))])
    valid = seq if query_seqlens is None else gb.op1("Cast", [query_seqlens], to=TensorProto.INT64)
    first = gb.op1("Sub", [gb.op1("Cast", [seqlens_k], to=TensorProto.INT64), valid])
    first = gb.op1("Add", [first, gb.const(np.array(1))])
    first = gb.op1("Unsqueeze", [first, gb.const(np.array([1]))])
    return gb.op1("Add", [first, steps])


def lone_row_pad(
    gb: GraphBuilder, x: str, seqlens_k: str, total_len: str, query_seqlens: str | None
) -> tuple[str, str, str | None, tuple[str, str]]:
    """Batch invariance of attention: onnxruntime's GroupQueryAttention takes another path
    for a one-position call than for wider ones (rounding-level differences, which int8
    activations magnify into other tokens), while the rows of calls of 2..16 positions
    come out bitwise the same. So a call of one position (x [B, S, ...], S = 1) runs its
    attention on that row and a copy of it (Pad, mode edge), and keeps the first row; the
    copy's keys and values land one past the call's positions (the cache keeps room for
    it: runtime/graphs/kv_cache.py PAD_ROOM) and are overwritten by the next call. Wider calls
    pad nothing. Returns seqlens_k, total_len and query_seqlens counting the pad, and
    (pads, S [1]) for `attention`."""
    seq = gb.op1("Gather", [gb.op1("Shape", [x]), gb.const(np.array(1))], axis=0)
    lone = gb.op1("Cast", [gb.op1("Equal", [seq, gb.const(np.array(1))])],
                    to=TensorProto.INT64)  # fmt: skip
    one = gb.op1("Unsqueeze", [lone, gb.const(np.array([0]))])
    pads = gb.op1(
        "Concat",
        [gb.const(np.zeros(4, np.int64)), one, gb.const(np.zeros(1, np.int64))],
        axis=0,
    )
    lone32 = gb.op1("Cast", [lone], to=TensorProto.INT32)
    query = None if query_seqlens is None else gb.op1("Add", [query_seqlens, lone32])
    ends = gb.op1("Unsqueeze", [seq, gb.const(np.array([0]))])
    return (
        gb.op1("Add", [seqlens_k, lone32]),
        gb.op1("Add", [total_len, lone32]),
        query,
        (pads, ends),
    )
