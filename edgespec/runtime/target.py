"""The target model's forward pass: the `full` graph, or `head@k` then `tail@k` back to back.

Takes the graph sessions of one of those layouts and gives one operation, `forward(ids, keep)`
-> logits of the last `keep` positions, over caches that always hold the same length. Both
layouts compute the same logits; the split one lets self-speculation reuse the head's work.
"""

from __future__ import annotations

import numpy as np

from edgespec.runtime.graph import GraphSession
from edgespec.runtime.kv_cache import KVCache


class Target:
    def __init__(self, stages: list[GraphSession]) -> None:
        self.stages = stages
        self.caches: list[KVCache] = []
        self.vocab_size = stages[-1].model.vocab_size
        self.max_positions = stages[0].model.max_position_embeddings

    @property
    def length(self) -> int:
        return self.caches[0].length if self.caches else 0

    def reset(self, capacity: int) -> None:
        """Empty caches with room for `capacity` positions (buffers reused when big enough)."""
        if self.caches and self.caches[0].capacity >= capacity:
            for c in self.caches:
                c.truncate(0)
        else:
            self.caches = [s.new_cache(capacity) for s in self.stages]

    def forward(self, ids: np.ndarray, keep: int = 1) -> np.ndarray:
        """Logits [keep, vocab] for new token ids [S], appended to the caches."""
        start = self.length
        try:
            x = {"input_ids": ids[None, :]}
            for stage, cache in zip(self.stages, self.caches, strict=True):
                last = stage is self.stages[-1]
                out = stage.run(cache, keep=keep if last else 0, **x)
                x = {"hidden": out.get("hidden")}
            return out["logits"][0]
        except BaseException:
            self.truncate(start)  # never leave one stage advanced and another not
            raise

    def truncate(self, length: int) -> None:
        for c in self.caches:
            c.truncate(min(length, c.length))
