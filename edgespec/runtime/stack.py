"""A stack of graph stages over one KV cache: the unit every model in a bundle runs as.

Takes the graph sessions of one layout — `full`; `head@k` then `tail@k`; the `draft` graph;
or `head@k` alone as a stand-alone drafter (its exit logits) — and gives one operation,
`forward(ids, keep)` -> logits of the last `keep` positions, appended to one KV cache that
holds every layer the stages own. The target, the draft model, the split client's exit
drafter and the server's per-session rows all run through `run_stages`, the one place where
ids go into the first stage and hidden states into the next.

`step_width` 2 (the manifest's, for graphs whose activations are quantized): a call of one
position runs two wide. onnxruntime's kernels take other paths for one row than for several
(attention, float GEMM: rounding-level differences), and int8 activation rounding magnifies
such a difference into logits that differ by whole units, so a one-token step and a verify
round of the same tokens would disagree. Every call of two or more positions gives each row
bitwise the same values whatever the width, so a one-position call re-runs the previous
position with it (its keys and values come out the same; the stack keeps the ids it cached
for that), or, on an empty cache, runs a copy of the token after it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from edgespec.runtime.graph_protocol import Graph
from edgespec.runtime.kv_cache import KVCache

G = TypeVar("G", bound=Graph)


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


class Stack:
    def __init__(self, stages: list[Graph], logits: str = "logits", step_width: int = 1) -> None:
        self.stages = stages
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
        self.ids = np.zeros(0, np.int64)  # the token at each cached position (step_width 2)

    @property
    def length(self) -> int:
        return self.cache.length if self.cache else 0

    def reset(self, capacity: int) -> None:
        """An empty cache with room for `capacity` positions (buffers reused when big enough)."""
        capacity = self.fixed_capacity or capacity
        if self.stages[0].holds_kv:  # Core ML: KV in the model's state
            self.cache = KVCache([], [], [])  # only the length is kept here
            return
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
        capacity = self.fixed_capacity or capacity
        if not self.stages[0].holds_kv and self.cache.capacity < capacity:
            # grow geometrically: a conversation gains a turn at a time
            room = min(max(capacity, 2 * self.cache.capacity), self.max_positions)
            self.cache = self.cache.grown(max(room, capacity))
        return keep

    def forward(self, ids: np.ndarray, keep: int = 1) -> np.ndarray:
        """Logits [keep, vocab] for new token ids [S], appended to the cache."""
        cache = self.cache
        assert cache is not None, "call reset() first"
        past, feed, rows = cache.length, ids, keep
        if self.step_width > 1 and len(ids) == 1:
            if past > 0:  # the previous position again, then this one
                past, feed = past - 1, np.array([self.ids[past - 1], ids[0]], np.int64)
            elif cache.capacity >= 2:  # a copy after it, in the cache past its length
                feed, rows = np.array([ids[0], ids[0]], np.int64), 2 if keep else 0

        def call(stage: Graph, x: dict, last: bool) -> dict:
            return stage.run(cache, past, keep=rows if last else 0, **x)

        out = run_stages(self.stages, feed[None, :], call)
        self.record(cache.length, ids)
        cache.length += len(ids)
        logits = out[self.logits][0]
        return logits[:keep] if rows > keep else logits

    def forward_tail(
        self, tail: Graph, hidden: np.ndarray, keep: int, ids: np.ndarray, back: int = 0
    ) -> np.ndarray:
        """Logits for hidden states [S, H] that a head already computed (its layers' KV are in
        the cache beyond `length`) of new token ids [S - back]; the first `back` rows are
        cached positions computed again (step_width 2). Advances the length by S - back."""
        assert self.cache is not None
        start = self.cache.length - back
        out = tail.run(self.cache, start, hidden=hidden[None], keep=keep)
        self.record(self.cache.length, ids)
        self.cache.length += hidden.shape[0] - back
        return out["logits"][0]

    def record(self, past: int, ids: np.ndarray) -> None:
        """The ids now cached at positions past.. (what a two-wide step re-runs)."""
        if self.step_width == 1:
            return
        end = past + len(ids)
        if len(self.ids) < end:
            self.ids = np.concatenate([self.ids, np.zeros(max(end, 64), np.int64)])
        self.ids[past:end] = ids

    def truncate(self, length: int) -> None:
        if self.cache is not None:
            self.cache.truncate(min(length, self.cache.length))
