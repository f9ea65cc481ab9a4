"""A stack of graph stages over one KV cache: the unit every model in a bundle runs as.

Takes the graph sessions of one layout — `full`; `head@k` then `tail@k`; the `draft` graph;
or `head@k` alone as a stand-alone drafter (its exit logits) — and gives one operation,
`forward(ids, keep)` -> logits of the last `keep` positions, appended to one KV cache that
holds every layer the stages own. The target, the draft model, the split client's exit
drafter and the server's per-session rows all run through `run_stages`, the one place where
ids go into the first stage and hidden states into the next.

`step_width` (the manifest's): a row's logits must not depend on how many positions share its
call, or a one-token step and a verify round of the same tokens would disagree once int8
activation rounding magnifies a rounding-level difference into whole logits. Bundles of
`step_width` 1 are built so (export/config.py: MatMulNBits blocks of 32 or 16, attention that
pads a one-position call itself, tests/test_batch_invariance.py). Bundles of `step_width` 2
(wider MatMulNBits blocks, QDQ graphs, bundles from before the lone-row pad) take another
kernel path for a lone row, so every call runs an even number of positions and keeps an even
number of logits rows: an odd call runs with a copy of its last input after it, whose keys and
values land past the cache's length and are overwritten later (`pad_call`). Every cache keeps
`kv_cache.room(step_width)` positions past its capacity for such copies. Whether a lone row
rounds as a wide call's rows is a property of the machine's kernels too: onnxruntime's AVX2
one-row int8 kernel for 4-bit blocks of 32 rounds otherwise, its AVX-512 one does not. So a
target of `step_width` 1 checks it on the machine it opened on (`settle_step_width`) and
steps two positions wide where a lone row parts from its verify round.

A stack whose graph declares the target's `features` output (`Manifest.feature_layers`)
keeps them per cached position (`features[:length]`, float32 [capacity, F]): written by
`forward`, cut with the cache, what a feature head drafts from (runtime/drafters/eagle.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from edgespec.bundle import FEATURES
from edgespec.runtime.graphs.kv_cache import KVCache, room
from edgespec.runtime.graphs.protocol import Feed, Graph
from edgespec.runtime.graphs.tree_verify import TreeGraph

G = TypeVar("G", bound=Graph)


def pad_call(width: int, keep: int, step_width: int) -> tuple[int, int, slice]:
    """A call of `width` new positions keeping the last `keep` logits rows, at `step_width`:
    (positions appended: copies of the last input, rows to keep in the padded call, the slice
    of those rows that are the asked-for ones)."""
    pad = (-width) % step_width
    need = keep + pad if keep else 0  # the last rows of the padded call, the wanted ones in
    rows = min(need + (-need) % step_width, width + pad)
    return pad, rows, slice(rows - need, rows - pad)


def pad_ids(ids: np.ndarray, pad: int) -> np.ndarray:
    """`ids` with `pad` copies of its last id after it (`pad_call`'s pad)."""
    return np.concatenate([ids, ids[-1:].repeat(pad)]) if pad else ids


def run_stages(
    stages: Sequence[G], ids: np.ndarray, call: Callable[[G, dict[str, np.ndarray], bool], dict]
) -> dict:
    """Feed `ids` to the first stage and each stage's hidden states to the next;
    `call(stage, inputs, last)` runs one stage. Returns the last stage's outputs."""
    x: dict[str, np.ndarray] = {"input_ids": ids}
    out: dict[str, np.ndarray] = {}
    for stage in stages:
        last = stage is stages[-1]
        out = call(stage, x, last)
        if not last:
            x = {"hidden": out["hidden"]}
    return out


def pad_tree(
    ids: np.ndarray, positions: np.ndarray, mask: np.ndarray, pad: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A tree feed (`tree_verify.tree_feed`) with `pad` (0 or 1) copies of its last node after
    it, each seeing what that node sees and itself; no node sees them."""
    if not pad:
        return ids, positions, mask
    n = len(ids)
    grown = np.zeros((n + 1, n + 1), bool)
    grown[:n, :n], grown[n, :n], grown[n, n] = mask, mask[n - 1], True
    return np.append(ids, ids[-1]), np.append(positions, positions[-1]), grown


class Stack:
    def __init__(
        self,
        stages: list[Graph],
        logits: str = "logits",
        tree_stages: Callable[[], list[TreeGraph]] | None = None,
        step_width: int = 1,
    ) -> None:
        self.stages = stages
        # opens the stages' tree-verification twins on first use (`forward_tree`); None: the
        # bundle has none (or they were not asked for)
        self._open_tree = tree_stages
        self._tree: list[TreeGraph] | None = None
        self.logits = logits  # "exit_logits" for a head@k run on its own
        self.cache: KVCache | None = None
        model = stages[-1].model
        self.model = model
        self.vocab_size = model.vocab_size
        self.layers = sorted({i for s in stages for i in s.graph.kv_layers})
        # static and Core ML graphs run on a cache of exactly their max context
        self.fixed_capacity = stages[0].fixed_capacity
        self.max_positions = min(model.max_position_embeddings, self.fixed_capacity or 1 << 62)
        # fixed-shape graphs run the widths they were exported for
        self.step_width = step_width if self.fixed_capacity is None else 1
        # the target's features per cached position (0: its graph declares none)
        outputs = stages[-1].graph.outputs if len(stages) == 1 else []
        self.feature_width = next((int(o.shape[-1]) for o in outputs if o.name == FEATURES), 0)
        self.features = np.zeros((0, self.feature_width), np.float32)

    @property
    def length(self) -> int:
        return self.cache.length if self.cache else 0

    def reset(self, capacity: int) -> None:
        """An empty cache with room for `capacity` positions (buffers reused when big enough)."""
        capacity = self.fixed_capacity or capacity + room(self.step_width)  # room for a pad
        if self.stages[0].holds_kv:  # Core ML: KV in the model's state
            self.cache = KVCache([], [], [])  # only the length is kept here
            return
        self._feature_room(capacity, 0)
        if self.cache is not None and self.cache.capacity >= capacity:
            self.cache.truncate(0)
            return
        m = self.model
        first = self.stages[0]
        self.cache = KVCache.allocate(
            self.layers,
            m.num_kv_heads,
            m.head_dim,
            capacity,
            first.kv_dtype,
            first.kv_device,  # None (host memory) for static and Core ML graphs
        )

    def resume(self, capacity: int, keep: int) -> int:
        """Keep the first `keep` cached positions (the prefix a conversation's new prompt
        shares with what the cache holds) with room for `capacity`; return how many were kept
        (never more than the cache holds). keep=0 is `reset`."""
        if keep <= 0 or self.cache is None or self.cache.length == 0:
            self.reset(capacity)
            return 0
        keep = min(keep, self.cache.length)
        self.cache.truncate(keep)
        capacity = self.fixed_capacity or capacity + room(self.step_width)
        if not self.stages[0].holds_kv and self.cache.capacity < capacity:
            # grow geometrically: a conversation gains a turn at a time
            grow = min(max(capacity, 2 * self.cache.capacity), self.max_positions)
            self.cache = self.cache.grown(max(grow, capacity))
        self._feature_room(self.cache.capacity, keep)
        return keep

    def _feature_room(self, capacity: int, keep: int) -> None:
        """Feature rows for `capacity` positions, the first `keep` kept."""
        if self.feature_width and len(self.features) < capacity:
            grown = np.zeros((capacity, self.feature_width), np.float32)
            grown[:keep] = self.features[:keep]
            self.features = grown

    def forward(self, ids: np.ndarray, keep: int = 1) -> np.ndarray:
        """Logits [keep, vocab] for new token ids [S], appended to the cache."""
        cache = self.cache
        assert cache is not None, "call reset() first"
        pad, rows, wanted = pad_call(len(ids), keep, self.step_width)
        feed = pad_ids(ids, pad)

        def call(stage: Graph, x: dict, last: bool) -> dict:
            return stage.run(cache, cache.length, Feed(**x, keep=rows if last else 0))

        out = run_stages(self.stages, feed[None, :], call)
        if self.feature_width:
            self.features[cache.length : cache.length + len(ids)] = out[FEATURES][0][: len(ids)]
        cache.length += len(ids)
        return out[self.logits][0][wanted]

    def forward_tree(
        self, ids: np.ndarray, positions: np.ndarray, mask: np.ndarray, keep: int
    ) -> np.ndarray:
        """`forward` for the token tree `tree_verify.tree_feed` laid out: ids [S] at
        `positions`, each seeing the cache and the new positions `mask` allows."""
        cache = self.cache
        assert cache is not None, "call reset() first"
        tree = self.tree_graphs()
        n = len(ids)
        pad, rows, wanted = pad_call(n, keep, self.step_width)
        ids, positions, mask = pad_tree(ids, positions, mask, pad)

        def call(stage: TreeGraph, x: dict, last: bool) -> dict:
            k = rows if last else 0
            return stage.run_tree(cache, cache.length, Feed(**x, keep=k), positions, mask)

        out = run_stages(tree, ids[None, :], call)
        cache.length += n
        return out[self.logits][0][wanted]

    def tree_graphs(self) -> list[TreeGraph]:
        """The stages' tree-verification twins (opened on first use; BundleError if none)."""
        if self._tree is None:
            if self._open_tree is None:
                raise ValueError("these graphs cannot verify token trees")
            self._tree = self._open_tree()
        return self._tree

    @property
    def verifies_trees(self) -> bool:
        return self._open_tree is not None

    def forward_tail(self, tail: Graph, hidden: np.ndarray, keep: int) -> np.ndarray:
        """Logits for hidden states [S, H] that a head already computed (its layers' KV are in
        the cache beyond `length`); advances the length by S."""
        assert self.cache is not None
        pad, rows, wanted = pad_call(hidden.shape[0], keep, self.step_width)
        feed = np.concatenate([hidden, hidden[-1:].repeat(pad, axis=0)]) if pad else hidden
        out = tail.run(self.cache, self.cache.length, Feed(hidden=feed[None], keep=rows))
        self.cache.length += hidden.shape[0]
        return out["logits"][0][wanted]

    def truncate(self, length: int) -> None:
        if self.cache is not None:
            self.cache.truncate(min(length, self.cache.length))


def settle_step_width(stack: Stack) -> None:
    """`stack.step_width` 2 where, on this machine, the rows of one-position calls are not the
    same bits as the same positions inside one wider call (see the module doc): five probe
    positions, each stepped alone against one 3-wide call after the same two."""
    if stack.step_width != 1 or stack.fixed_capacity is not None or stack.stages[0].holds_kv:
        return
    ids = np.arange(1, 6) % stack.vocab_size
    stack.reset(len(ids))
    stack.forward(ids[:2])
    alone = [stack.forward(ids[i : i + 1])[0] for i in range(2, 5)]
    stack.reset(len(ids))
    stack.forward(ids[:2])
    rows = stack.forward(ids[2:], keep=3)
    stack.cache = None
    if not all(np.array_equal(a, r) for a, r in zip(alone, rows, strict=True)):
        stack.step_width = 2
