"""`Graph`: the contract every graph session meets — an onnxruntime `GraphSession`
(session.py), the fixed-shape `StaticGraphSession` (static.py) and the Core ML `CoreMLSession`
(coreml.py) — and all that the stacks, the drafters and the decode loop use of one: `run`,
and the capabilities a KV cache is allocated by (`fixed_capacity`, `holds_kv`, `kv_device`).
Declared, so that nothing probes a session for what it can do.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from edgespec.bundle import CoreMLPackage, GraphInfo, ModelInfo
from edgespec.runtime.graphs.kv_cache import Device, KVCache


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

    def run(
        self,
        cache: KVCache,
        past: int,
        *,
        input_ids: np.ndarray | None = None,
        hidden: np.ndarray | None = None,
        keep: int = 1,
    ) -> dict[str, np.ndarray]:
        """Process S new positions ([1, S] ids, or [1, S, H] hidden states) after `past`
        cached ones, writing their keys/values into `cache`; return the outputs (logits for
        the last `keep` positions). The caller owns the cache length."""
        ...
