"""The feature-head drafter (EAGLE style): the bundle's `eagle` graph drafting a chain from the
target's own hidden states.

Takes where the target's features are (`FeatureSource`: the target `Stack`, whose `full`
graph declares them and keeps them per cached position, or a server pool row's) and the eagle
graph session (export/eagle.py). Head position p reads the target's
features at p and the embedding of token p + 1, and predicts token p + 2; it keeps a KV
cache of its own, one layer.

Authoritative state, after a round that kept n of γ drafts (the sequence is L tokens; the
target holds L - 1 positions and their features):
  `exact`   head positions 0..exact-1 were computed from the target's features and committed
            tokens: the only ones kept. Drafting writes positions past them from the head's
            own states (`next_state`); `commit` drops those, so the next round recomputes
            them from the target's features (at most n + 1 positions, one call), and its
            first draft comes from the target's features at the last kept position
  draft k   position L - 3 + k; k = 1 reads the target's features at L - 2 (the bonus token
            has none yet: it is position L - 1's token, the head's input there), k > 1 the
            head's own state of the position before
The target verifies every draft: greedy output is the target's, sampling follows the
target's distribution (the drafts' q is what they were drawn from). numpy + onnxruntime.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter
from typing import Any, Protocol, runtime_checkable

import numpy as np

from edgespec.bundle import Manifest
from edgespec.runtime.draft_q import DEFAULT_SUPPORT, DraftSupport
from edgespec.runtime.drafters.base import Chain, OwnCache, _allowed, _proposal, draft_tokens
from edgespec.runtime.errors import InputError
from edgespec.runtime.grammar.constraints import Constraint
from edgespec.runtime.graphs.kv_cache import KVCache
from edgespec.runtime.graphs.protocol import Feed, Graph
from edgespec.runtime.round import Plan, Proposal, empty_proposal
from edgespec.runtime.sampling import SamplingParams


class FeatureSource(Protocol):
    """Where the target's features are: the local target `Stack`, or a server's pool row."""

    @property
    def feature_width(self) -> int: ...

    @property
    def features(self) -> np.ndarray:
        """[capacity, F]; the rows below `length` are the target's at those positions."""

    @property
    def length(self) -> int: ...


@runtime_checkable
class KeepsFeatures(Protocol):
    """A verifier whose cache is not the drafter's target stack (the server's pool rows)."""

    def feature_source(self) -> FeatureSource: ...


def read_features_of(drafter: Any, verifier: Any) -> None:
    """Have the feature heads among `drafter` (a chain's members too) read `verifier`'s
    features, where it keeps its own cache (a conversation on the server's pool)."""
    if not isinstance(verifier, KeepsFeatures):
        return
    for d in drafter.drafters if isinstance(drafter, Chain) else [drafter]:
        if isinstance(d, EagleDrafter):
            d.target = verifier.feature_source()


class EagleDrafter(OwnCache):
    """Drafts with the eagle graph from the target's features (module doc)."""

    drafts_ahead = False  # it reads the target's features of verified positions
    name = "eagle"

    def __init__(
        self, target: FeatureSource, head: Graph, support: DraftSupport = DEFAULT_SUPPORT
    ) -> None:
        if not target.feature_width:
            raise InputError(
                "the eagle drafter reads the target's features: this bundle's full graph "
                "declares none; make the bundle with `edgespec distill`"
            )
        self.target, self.head, self.support = target, head, support
        model = head.model
        self.hidden = model.hidden_size
        self.cache: KVCache | None = None
        self.exact = 0  # head positions computed from the target's features (module doc)
        self.constraint: Constraint | None = None
        self.max_positions = head.model.max_position_embeddings

    @classmethod
    def of(
        cls, target: Any, manifest: Manifest, open_graph: Callable[[str], Graph], support: Any
    ) -> EagleDrafter:
        """The bundle's head drafting for the local target `target` (None: split mode)."""
        if target is None:
            raise InputError(
                "the eagle drafter reads the target's hidden states, which only a local "
                "verifier has: in split mode draft with the bundle's draft model (--drafter "
                "draft) or lookup"
            )
        manifest.graph("eagle")  # a BundleError naming the fix if there is none
        return cls(target, open_graph("eagle"), support)

    def resume_cache(self, prompt: list[int], capacity: int, cached: int) -> None:
        # position p needs token p + 1: the cached prefix keeps positions below cached - 1
        self.exact = min(self.exact, max(cached - 1, 0))
        room = capacity + 1
        if self.cache is None or self.cache.capacity < room:
            m = self.head.model
            old, self.cache = (
                self.cache,
                KVCache.allocate(
                    self.head.graph.kv_layers, m.num_kv_heads, m.head_dim, room, self.head.kv_dtype
                ),
            )
            if old is not None and self.exact:
                for a, b in zip(old.keys + old.values, self.cache.keys + self.cache.values,
                                strict=True):  # fmt: skip
                    b[:, :, : self.exact] = a[:, :, : self.exact]
        self.cache.length = self.exact

    def _run(self, ids: list[int], features: np.ndarray, state: np.ndarray, keep: int) -> dict:
        assert self.cache is not None
        out = self.head.run(
            self.cache,
            self.cache.length,
            Feed(input_ids=np.asarray([ids], np.int64), keep=keep),
            extra={"features": features[None], "state": state[None]},
        )
        self.cache.length += len(ids)
        return out

    def propose(
        self, seq: list[int], plan: Plan, params: SamplingParams, rng: np.random.Generator
    ) -> Proposal:
        start = perf_counter()
        plan = plan.capped(self.max_positions - len(seq))
        if plan.length == 0:
            return empty_proposal()
        cache = self.cache
        assert cache is not None, "call begin() first"
        known = self.target.length  # positions with the target's features: len(seq) - 1
        cache.length = self.exact
        width = self.target.feature_width
        state = np.zeros((1, self.hidden), np.float32)

        def step(ids: list[int]) -> np.ndarray:
            """Feed ids (the tokens of the next head positions); the last one's logits."""
            nonlocal state
            p = cache.length
            exact = max(0, min(len(ids), known - p))  # positions with the target's features
            logits = None
            if exact:
                feats = self.target.features[p : p + exact]
                out = self._run(ids[:exact], feats, np.zeros((exact, self.hidden), np.float32), 1)
                self.exact = cache.length
                state, logits = out["next_state"][0][-1:], out["logits"][0][-1]
            for t in ids[exact:]:  # past the target's features: the head's own state
                out = self._run([t], np.zeros((1, width), np.float32), state, 1)
                state, logits = out["next_state"][0][-1:], out["logits"][0][-1]
            assert logits is not None
            return logits

        allowed = _allowed(self.constraint, seq)
        feed = seq[self.exact + 1 :]
        tokens, qs, _ = draft_tokens(step, feed, plan, params, rng, self.support, allowed)
        return _proposal(tokens, qs, params, seconds=perf_counter() - start)

    def commit(self, valid: int) -> None:
        # the positions drafted from the head's own states are dropped (module doc)
        self.exact = min(self.exact, max(valid - 1, 0), self.target.length)
        if self.cache is not None:
            self.cache.length = self.exact
