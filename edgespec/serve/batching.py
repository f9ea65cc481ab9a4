"""Continuous batching of verify rounds: one KV pool for all sessions, shared forwards.

The pool holds, per layer, one buffer [max_sessions, kv_heads, capacity, head_dim]; a session
owns a slot (a row) and an integer length (the positions valid in its row). A contiguous
range of rows of a C-order buffer is contiguous memory, so a `KVCache` over rows lo..hi
(numpy views, OrtValues over them) binds to onnxruntime without a copy.

`forward_rounds(stages, pool, work)` takes the new token ids of several rows, appends them to
their rows and returns each row's logits for all its ids (the caller truncates rejected
positions). Two ways to run a round, mixed so that the batch takes the fewest forwards:

  alone   a row on its one-row view, one forward of its W_r positions (what an unbatched
          server does; also every prefill)
  steps   rounds of width ≤ W together: step j feeds token j of each of them in one forward
          over their row range (batch > 1, one position per row, each at its own length)

Why steps and not one [rows, W] forward: onnxruntime's GroupQueryAttention (its input
check, group_query_attention_helper.h) refuses batch > 1 with more than one new position
after a past ("batch_size must be 1 when sequence_length > 1 and past context is given");
one position per row with per-row lengths is its decode path and matches batch-1 results
(checked in the tests). So N rounds of width W cost W forwards instead of N: rounds of
width 1 (γ = 0 devices, /v1/completions) batch fully, speculative rounds gain when more
rounds than their width arrive together. Rows of a step's range without a token there (a
narrower round, a session not in this batch, a free slot) get a dummy token written just
beyond their valid positions, where nothing reads it; a round that fills its row to the end
(no room for a dummy after it: the position would be past the model's position table) runs
alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort

from edgespec.runtime.graph import GraphSession
from edgespec.runtime.kv_cache import KVCache
from edgespec.runtime.stack import run_stages

DUMMY_TOKEN = 0


@dataclass
class KVPool:
    layers: list[int]
    keys: list[np.ndarray]  # [max_sessions, kv_heads, capacity, head_dim] each
    values: list[np.ndarray]
    lengths: np.ndarray  # [max_sessions] positions valid in each row
    free: list[int]  # free slots, lowest first (keeps busy rows together)
    views: dict[tuple[int, int], KVCache] = field(default_factory=dict)

    @classmethod
    def allocate(
        cls,
        layers: list[int],
        kv_heads: int,
        head_dim: int,
        context: int,
        max_sessions: int,
        dtype: np.dtype,
    ) -> KVPool:
        # np.zeros maps untouched pages lazily: memory grows with the positions used
        shape = (max_sessions, kv_heads, context, head_dim)
        keys = [np.zeros(shape, dtype) for _ in layers]
        values = [np.zeros(shape, dtype) for _ in layers]
        return cls(
            layers, keys, values, np.zeros(max_sessions, np.int64), list(range(max_sessions))
        )

    @property
    def held(self) -> int:
        """Slots owned by sessions now (what /health reports: it cannot drift from the pool)."""
        return self.keys[0].shape[0] - len(self.free)

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def acquire(self) -> int | None:
        if not self.free:
            return None
        self.free.sort()
        slot = self.free.pop(0)
        self.lengths[slot] = 0
        return slot

    def truncate(self, slot: int, length: int) -> None:
        """Only the first `length` positions of the row stay valid (never grows it)."""
        self.lengths[slot] = min(length, int(self.lengths[slot]))

    def release(self, slot: int) -> None:
        self.lengths[slot] = 0
        self.free.append(slot)

    def rows(self, lo: int, hi: int) -> KVCache:
        """A cache over rows lo..hi-1 (same memory; cached, so bindings are reused)."""
        view = self.views.get((lo, hi))
        if view is None:
            keys = [k[lo:hi] for k in self.keys]
            values = [v[lo:hi] for v in self.values]
            view = KVCache(self.layers, keys, values)
            for i, k, v in zip(self.layers, keys, values, strict=True):
                view.bound[f"key.{i}"] = ort.OrtValue.ortvalue_from_numpy(k)
                view.bound[f"value.{i}"] = ort.OrtValue.ortvalue_from_numpy(v)
            self.views[(lo, hi)] = view
        return view


def plan(widths: list[int]) -> int:
    """The width w up to which rounds are stepped together (w forwards), the wider ones run
    alone (one forward each): the w with the fewest forwards; 0 = every round alone (also
    on ties: alone is the batch-1 path, and each forward of a step carries more rows)."""
    best, best_cost = 0, len(widths)
    for w in sorted(set(widths)):
        stepped = sum(1 for x in widths if x <= w)
        cost = w + len(widths) - stepped
        if stepped > 1 and cost < best_cost:
            best, best_cost = w, cost
    return best


def forward_rounds(
    stages: list[GraphSession], pool: KVPool, work: list[tuple[int, np.ndarray]]
) -> tuple[list[np.ndarray], list[int]]:
    """Logits [len(ids), vocab] per (slot, ids) in `work` (distinct slots), the ids appended
    to their rows (lengths advanced); also how many of the rounds each forward served."""
    # a stepped row also writes one dummy position after its round: it must fit
    fits = [(slot, ids) for slot, ids in work if pool.lengths[slot] + len(ids) < pool.capacity]
    w = plan([len(ids) for _, ids in fits])
    stepped = [(slot, ids) for slot, ids in fits if len(ids) <= w]
    logits, per_forward = forward_steps(stages, pool, stepped) if stepped else ([], [])
    by_slot = dict(zip([slot for slot, _ in stepped], logits, strict=True))
    for slot, ids in work:
        if slot not in by_slot:
            by_slot[slot] = forward_alone(stages, pool, slot, ids)
            per_forward.append(1)
    return [by_slot[slot] for slot, _ in work], per_forward


def forward_alone(
    stages: list[GraphSession], pool: KVPool, slot: int, ids: np.ndarray
) -> np.ndarray:
    """Logits [len(ids), vocab] for ids appended to one row, in one batch-1 forward."""
    view, past = pool.rows(slot, slot + 1), int(pool.lengths[slot])

    def call(stage: GraphSession, x: dict, last: bool) -> dict:
        return stage.run(view, past, keep=len(ids) if last else 0, **x)

    out = run_stages(stages, ids[None, :], call)
    pool.lengths[slot] += len(ids)
    return out["logits"][0]


def forward_steps(
    stages: list[GraphSession], pool: KVPool, work: list[tuple[int, np.ndarray]]
) -> tuple[list[np.ndarray], list[int]]:
    """Every row of `work` in max(width) one-position steps over their row range; returns
    logits per row and the rounds each step served."""
    width = {slot: len(ids) for slot, ids in work}
    ids_of = dict(work)
    base = pool.lengths.copy()
    rows_run: list[int] = []
    per_row: dict[int, list[np.ndarray]] = {slot: [] for slot, _ in work}
    for j in range(max(width.values())):
        active = [slot for slot in width if width[slot] > j]
        lo, hi = min(active), max(active) + 1
        tokens = np.full((hi - lo, 1), DUMMY_TOKEN, np.int64)
        # a row's position: its next real one, or (no token here) just beyond its valid ones
        positions = base[lo:hi] + np.asarray(
            [min(j, width.get(r, 0)) for r in range(lo, hi)], np.int64
        )
        for slot in active:
            tokens[slot - lo, 0] = ids_of[slot][j]
        view = pool.rows(lo, hi)

        def call(stage: GraphSession, x: dict, last: bool) -> dict:
            return stage.run_batch(view, positions, **x)  # noqa: B023 (called at once)

        out = run_stages(stages, tokens, call)
        for slot in active:
            per_row[slot].append(out["logits"][slot - lo, -1])
        rows_run.append(len(active))
    for slot, n in width.items():
        pool.lengths[slot] = base[slot] + n
    return [np.stack(per_row[slot]) for slot, _ in work], rows_run
