"""KV caches: preallocated buffers plus one integer length.

The graphs' GroupQueryAttention reads `past_*` and writes the new positions of `present_*`
in place when both are bound to the same buffer, so a decode step never copies the cache,
and rejecting drafted tokens is `truncate(n)`: lowering the length, never a copy. One cache
holds every layer of one model; `length` is the number of positions valid in all layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort


@dataclass
class KVCache:
    layers: list[int]
    keys: list[np.ndarray]  # [1, kv_heads, capacity, head_dim] each
    values: list[np.ndarray]
    length: int = 0
    bound: dict[str, ort.OrtValue] = field(default_factory=dict)

    @classmethod
    def allocate(
        cls, layers: list[int], kv_heads: int, head_dim: int, capacity: int, dtype: np.dtype
    ) -> KVCache:
        shape = (1, kv_heads, capacity, head_dim)
        keys = [np.zeros(shape, dtype) for _ in layers]
        values = [np.zeros(shape, dtype) for _ in layers]
        cache = cls(layers, keys, values)
        for i, k, v in zip(layers, keys, values, strict=True):
            # OrtValues over the numpy buffers: same memory, no copy, bound as past and present.
            cache.bound[f"key.{i}"] = ort.OrtValue.ortvalue_from_numpy(k)
            cache.bound[f"value.{i}"] = ort.OrtValue.ortvalue_from_numpy(v)
        return cache

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2] if self.keys else 1 << 62

    def grown(self, capacity: int) -> KVCache:
        """A cache with room for `capacity` positions holding this one's valid positions: one
        copy, when a conversation that keeps its cache outgrows the buffers."""
        k0 = self.keys[0]
        out = KVCache.allocate(self.layers, k0.shape[1], k0.shape[3], capacity, k0.dtype)
        n = self.length
        for src, dst in zip(self.keys + self.values, out.keys + out.values, strict=True):
            dst[:, :, :n] = src[:, :, :n]
        out.length = n
        return out

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of length {self.length} to {length}")
        self.length = length
