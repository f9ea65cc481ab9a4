"""`Graph`: the contract every graph session meets — an onnxruntime `GraphSession`
(session.py), the fixed-shape `StaticGraphSession` (static.py) and the Core ML `CoreMLSession`
(coreml.py) — and all that the stacks, the drafters and the decode loop use of one: `run`,
and the capabilities a KV cache is allocated by (`fixed_capacity`, `holds_kv`, `kv_device`).
Declared, so that nothing probes a session for what it can do. `Feed`: one call's new
positions, checked once for every session.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from edgespec.bundle import CoreMLPackage, GraphInfo, ModelInfo
from edgespec.runtime.graphs.kv_cache import Device, KVCache


@dataclass(frozen=True, slots=True)
class Feed:
    """One call's new positions: token ids [1, S] or hidden states [1, S, H] (exactly one),
    and `keep`: the last positions whose logits come back (0 to S; hidden states come back
    for all S). ValueError on anything else."""

    input_ids: np.ndarray | None = None
    hidden: np.ndarray | None = None
    keep: int = 1

    def __post_init__(self) -> None:
        if (self.input_ids is None) == (self.hidden is None):
            raise ValueError("a graph takes token ids or hidden states: pass exactly one")
        if not 0 <= self.keep <= self.width:
            raise ValueError(
                f"keep={self.keep} must be between 0 and the {self.width} new positions"
            )

    @property
    def new(self) -> np.ndarray:
        """The ids or hidden states given, [1, S] or [1, S, H]."""
        return self.input_ids if self.input_ids is not None else self.hidden  # type: ignore[return-value]

    @property
    def width(self) -> int:
        """S, the number of new positions."""
        return self.new.shape[1]


class Graph(Protocol):
    """A graph session of one role, as the runtime calls it."""

    @property
    def graph(self) -> GraphInfo | CoreMLPackage:
        """Its I/O contract; `kv_layers`: the layers whose KV it owns."""

    @property
    def model(self) -> ModelInfo:
        """The transformer it is part of (the target, or the draft model)."""

    @property
    def kv_dtype(self) -> np.dtype:
        """Of its KV cache, and of the hidden states between a head and its tail."""

    @property
    def takes_hidden(self) -> bool:
        """Fed hidden states (a tail), not token ids."""

    @property
    def output_names(self) -> list[str]: ...

    @property
    def fixed_capacity(self) -> int | None:
        """Runs only on a cache of exactly this many positions (None: any)."""

    @property
    def holds_kv(self) -> bool:
        """Keeps the KV in its own state: the `KVCache` it is given keeps only the length."""

    @property
    def kv_device(self) -> Device | None:
        """Where the cache buffers must live (None: host memory)."""

    def run(self, cache: KVCache, past: int, feed: Feed) -> dict[str, np.ndarray]:
        """Process the S new positions `feed` holds after `past` cached ones, writing their
        keys/values into `cache`; return the outputs (logits for its last `keep` positions).
        The caller owns the cache length."""
        ...
