"""Continuous batching of verify rounds: one KV pool for all sessions, shared forwards.

The pool (`runtime.graphs.kv_cache.KVPool`) holds, per layer, one buffer [max_sessions, kv_heads,
capacity, head_dim]; a session owns a slot (a row) and an integer length (the positions valid
in its row). A contiguous range of rows of a C-order buffer is contiguous memory, so a
`KVCache` over rows lo..hi (numpy views, OrtValues over them) binds to onnxruntime without a
copy.

`forward_rounds(stages, pool, work)` takes the new token ids of several rows, appends them to
their rows and returns each row's logits for all its ids (the caller truncates rejected
positions), and which rows each forward ran. Two ways to run a round:

  alone     a row on its one-row view, one forward of its W_r positions (what an unbatched
            server does; also every prefill)
  together  rounds of width ≤ S in one forward over their row range at full width: ids
            [rows, S], right-padded, each row adding its own W_r positions after its own
            length (GroupQueryAttention's `query_seqlens`); rows of the range that are not in
            the batch (a session not in this batch, a free slot) are idle rows of width 0,
            which the kernel leaves untouched

`plan` picks S: rounds much wider than the rest would make every row pay their width in
padding, so they run alone. A row also needs room for the whole padded chunk after its
length (the kernel's rule), so a round near the end of its row runs alone. Bundles exported
before graphs took `query_seqlens` run every round alone.

A pool of `step_width` 2 (graphs whose activations are quantized: runtime/graphs/stack.py) pads
every row's ids to an even count with copies of its last id, alone and together alike (the
copies' keys and values land past the row's length, in the room the pool keeps for them, and
are overwritten later), so each row's logits are bitwise those of the device's own target
calls. Together, the unit is the row, not the batch: an unpadded one-position row in a
batch of even width S still gave other logits than the device's step (measured on Q4_1
blocks), while rows padded each to an even width give bitwise the rows alone
(tests/test_quantized_server_steps.py). On a pool of `step_width` 1 the same holds for lone
rows: a one-position row in a wider batch takes GroupQueryAttention's lone-row path (its
`query_seqlens` is 1), which a one-position call alone never takes (the graph pads its
attention: export/positions.py `lone_row_pad`); so a batched row is at least two wide
(`row_width`), its copy's keys and values in the pool's room.
"""

from __future__ import annotations

import logging

import numpy as np

from edgespec.bundle import FEATURES
from edgespec.runtime.graphs.kv_cache import KVPool
from edgespec.runtime.graphs.protocol import Feed
from edgespec.runtime.graphs.session import GraphSession
from edgespec.runtime.graphs.stack import pad_call, pad_ids, pad_tree, run_stages
from edgespec.runtime.graphs.tree_verify import TreeGraph

DUMMY_TOKEN = 0
log = logging.getLogger("edgespec.serve")
_told = False  # the log said batching is off for these graphs


def batchable(stages: list[GraphSession]) -> bool:
    """Whether the graphs take `query_seqlens` (static graphs, bundles exported for
    onnxruntime < 1.32 and bundles exported before it do not: their rounds run alone; said
    once in the log)."""
    global _told
    ok = all(getattr(g, "batched", False) for g in stages)
    if not ok and not _told:
        _told = True
        log.warning(
            "the verifier's graphs take no query_seqlens (static graphs, exported with "
            "--no-batched-verify for onnxruntime < 1.32, or before it): verify rounds run one "
            "by one; re-export the bundle with onnxruntime >= 1.32 to batch them"
        )
    return ok


def plan(widths: list[int]) -> int:
    """The width S up to which rounds run together in one padded forward (wider ones run
    alone): the largest S at which the padded positions are at most twice the real ones;
    0 = every round alone (fewer than two rounds would share the forward)."""
    best = 0
    for s in sorted(set(widths)):
        together = [w for w in widths if w <= s]
        if len(together) > 1 and len(together) * s <= 2 * sum(together):
            best = s
    return best


def row_width(n: int, step: int) -> int:
    """The positions a row of `n` new ids runs in a batched forward: a multiple of the pool's
    step width, and at least two (see the module doc)."""
    return max(n + (-n) % step, 2)


def forward_rounds(
    stages: list[GraphSession], pool: KVPool, work: list[tuple[int, np.ndarray]]
) -> tuple[list[np.ndarray], list[list[int]]]:
    """Logits [len(ids), vocab] per (slot, ids) in `work` (distinct slots), the ids appended
    to their rows (lengths advanced); also the slots each forward served."""
    step = pool.step_width
    widths = [row_width(len(ids), step) for _, ids in work]
    width = plan(widths) if batchable(stages) else 0
    # the kernel needs room for the whole padded chunk after each row's length
    room = pool.keys[0].shape[2]
    together = [
        (slot, ids)
        for (slot, ids), w in zip(work, widths, strict=True)
        if w <= width and pool.lengths[slot] + width <= room
    ]
    by_slot: dict[int, np.ndarray] = {}
    forwards: list[list[int]] = []
    if len(together) > 1:
        logits = forward_batch(stages, pool, together)
        by_slot = dict(zip([s for s, _ in together], logits, strict=True))
        forwards.append([s for s, _ in together])
    for slot, ids in work:
        if slot not in by_slot:
            by_slot[slot] = forward_alone(stages, pool, slot, ids)
            forwards.append([slot])
    return [by_slot[slot] for slot, _ in work], forwards


def forward_alone(
    stages: list[GraphSession], pool: KVPool, slot: int, ids: np.ndarray
) -> np.ndarray:
    """Logits [len(ids), vocab] for ids appended to one row, in one batch-1 forward."""
    view, past = pool.rows(slot, slot + 1), int(pool.lengths[slot])
    pad, rows, wanted = pad_call(len(ids), len(ids), pool.step_width)
    feed = pad_ids(ids, pad)

    def call(stage: GraphSession, x: dict, last: bool) -> dict:
        return stage.run(view, past, Feed(**x, keep=rows if last else 0))

    out = run_stages(stages, feed[None, :], call)
    if FEATURES in out:
        pool.write_features(slot, past, out[FEATURES][0][: len(ids)])
    pool.lengths[slot] += len(ids)
    return out["logits"][0][wanted]


def forward_batch(
    stages: list[GraphSession],
    pool: KVPool,
    work: list[tuple[int, np.ndarray]],
    exact: bool = True,
) -> list[np.ndarray]:
    """Every row of `work` in one forward over their row range at full width; returns the
    logits [W_r, vocab] of each row. `exact`: each row padded (`row_width`) so that its
    logits are bitwise those of the row alone; False: no padding, a row's logits only up to
    rounding (half the positions for one-token rows: edgespec distill's replies)."""
    slots = [slot for slot, _ in work]
    lo, hi = min(slots), max(slots) + 1
    step = pool.step_width

    def padded_width(n: int) -> int:
        return row_width(n, step) if exact else n

    width = max(padded_width(len(ids)) for _, ids in work)
    tokens = np.full((hi - lo, width), DUMMY_TOKEN, np.int64)
    widths = np.zeros(hi - lo, np.int32)
    for slot, ids in work:
        padded = padded_width(len(ids))  # copies of the last id (see the docstring)
        tokens[slot - lo, :padded] = ids[-1]
        tokens[slot - lo, : len(ids)] = ids
        widths[slot - lo] = padded
    view, pasts = pool.rows(lo, hi), pool.lengths[lo:hi].copy()

    def call(stage: GraphSession, x: dict, last: bool) -> dict:
        return stage.run_batch(view, pasts, widths, logits=last, **x)

    out = run_stages(stages, tokens, call)
    for slot, ids in work:
        if FEATURES in out:
            pool.write_features(slot, int(pool.lengths[slot]), out[FEATURES][slot - lo, : len(ids)])
        pool.lengths[slot] += len(ids)
    return [out["logits"][slot - lo, : len(ids)] for slot, ids in work]


def forward_tree_alone(
    stages: list[TreeGraph],
    pool: KVPool,
    slot: int,
    ids: np.ndarray,
    positions: np.ndarray,
    mask: np.ndarray,
) -> np.ndarray:
    """`forward_alone` for a token tree (`tree_verify.tree_feed`'s ids, positions and mask)
    through the tree-verification graphs: batch 1, as a multi-token tree step with a KV
    cache must run; padded to the pool's step width like every call on a row."""
    view, past, n = pool.rows(slot, slot + 1), int(pool.lengths[slot]), len(ids)
    pad, rows, wanted = pad_call(n, n, pool.step_width)
    ids, positions, mask = pad_tree(ids, positions, mask, pad)

    def call(stage: TreeGraph, x: dict, last: bool) -> dict:
        return stage.run_tree(view, past, Feed(**x, keep=rows if last else 0), positions, mask)

    out = run_stages(stages, ids[None, :], call)
    pool.lengths[slot] += n
    return out["logits"][0][wanted]


def keep_rows(pool: KVPool, slot: int, start: int, rows: list[int]) -> None:
    """`KVCache.keep_rows` on a pool row: positions start + rows[j] move to start + j (an
    accepted tree path's keys and values follow the root); the caller sets the length."""
    moved = [j for j, r in enumerate(rows) if r != j]
    if moved:
        src = np.asarray([start + rows[j] for j in moved])
        dst = np.asarray([start + j for j in moved])
        for buf in pool.keys + pool.values:
            buf[slot, :, dst] = buf[slot, :, src]  # fancy indexing reads before it writes
