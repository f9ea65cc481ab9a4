"""KV caches: preallocated buffers plus one integer length.

The graphs' GroupQueryAttention reads `past_*` and writes the new positions of `present_*`
in place when both are bound to the same buffer, so a decode step never copies the cache,
and rejecting drafted tokens is `truncate(n)`: lowering the length, never a copy. One cache
holds every layer of one model; `length` is the number of positions valid in all layers.

The buffers live where the attention runs: host memory (numpy, the default), or an
accelerator's memory (`device`, e.g. ("cuda", 0)) when the graph's attention runs there. A
cache in host memory bound to a CUDA session would cross the bus whole, both ways, at every
step (a 360M model's fp16 cache is ~80 MB at 2,048 positions).

`KVPool` is the same cache for many sequences at once (the server's sessions and
conversations): per layer one buffer [rows, kv_heads, capacity, head_dim], a length per row,
and `rows(lo, hi)` -> a `KVCache` over a range of rows, the same memory, bound without a copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort

Device = tuple[str, int]  # onnxruntime's device type ("cuda", ...) and its index

# positions past a call's last one that a graph may write: an exported graph runs a one-position
# call's attention as two (export/positions.py `lone_row_pad`), whose copy's keys and values land
# there and are overwritten by the next call
PAD_ROOM = 1


def room(step_width: int) -> int:
    """Positions a cache holds past its capacity: a step-width pad's or the lone-row pad's."""
    return max(step_width - 1, PAD_ROOM)


@dataclass
class KVCache:
    layers: list[int]
    keys: list[np.ndarray]  # [1, kv_heads, capacity, head_dim] each; empty on a device
    values: list[np.ndarray]
    length: int = 0
    bound: dict[str, ort.OrtValue] = field(default_factory=dict)
    device: Device | None = None  # None: the buffers are `keys`/`values` in host memory
    shape: tuple[int, ...] = ()  # of each buffer
    dtype: np.dtype | None = None

    def __post_init__(self) -> None:
        if self.keys:
            self.shape, self.dtype = tuple(self.keys[0].shape), self.keys[0].dtype

    @classmethod
    def allocate(
        cls,
        layers: list[int],
        kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: np.dtype,
        device: Device | None = None,
    ) -> KVCache:
        shape = (1, kv_heads, capacity, head_dim)
        if device is not None:
            cache = cls(layers, [], [], device=device, shape=shape, dtype=np.dtype(dtype))
            zeros = np.zeros(shape, dtype)  # as the host buffers start: no stale values
            for name in _names(layers):
                value = ort.OrtValue.ortvalue_from_shape_and_type(shape, dtype, *device)
                value.update_inplace(zeros)
                cache.bound[name] = value
            return cache
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
        return self.shape[2] if self.shape else 1 << 62

    def grown(self, capacity: int) -> KVCache:
        """A cache with room for `capacity` positions holding this one's valid positions: one
        copy, when a conversation that keeps its cache outgrows the buffers."""
        _, heads, _, head_dim = self.shape
        assert self.dtype is not None
        out = KVCache.allocate(self.layers, heads, head_dim, capacity, self.dtype, self.device)
        n = self.length
        if self.device is None:
            for src, dst in zip(self.keys + self.values, out.keys + out.values, strict=True):
                dst[:, :, :n] = src[:, :, :n]
        else:  # through host memory: rare (a conversation outgrowing its buffers)
            for name, src in self.bound.items():
                host = np.zeros(out.shape, self.dtype)
                host[:, :, :n] = src.numpy()[:, :, :n]
                out.bound[name].update_inplace(host)
        out.length = n
        return out

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of length {self.length} to {length}")
        self.length = length

    def keep_rows(self, start: int, rows: list[int]) -> None:
        """Positions start + rows[j] move to start + j, and the length becomes
        start + len(rows): a verified token tree's accepted path, its nodes' rows in feed
        order (`rows` ascending), kept as a chain of them would have left the cache. Rows
        already in place are not copied: a chain's path is a length change."""
        if any(b <= a for a, b in zip(rows, rows[1:], strict=False)) or (rows and rows[0] < 0):
            raise ValueError(f"rows to keep must ascend from 0 or more, got {rows}")
        if start + (rows[-1] if rows else -1) >= self.length:
            raise ValueError(f"row {start + rows[-1]} is past the cache's {self.length}")
        moved = [j for j, r in enumerate(rows) if r != j]
        if moved:
            src = np.asarray([start + rows[j] for j in moved])
            dst = np.asarray([start + j for j in moved])
            if self.device is None:
                for buf in self.keys + self.values:
                    buf[:, :, dst] = buf[:, :, src]  # fancy indexing reads before it writes
            else:  # through host memory (a device cache)
                for value in self.bound.values():
                    host = value.numpy()
                    host[:, :, dst] = host[:, :, src]
                    value.update_inplace(host)
        self.length = start + len(rows)


def _names(layers: list[int]) -> list[str]:
    return [f"{kind}.{i}" for i in layers for kind in ("key", "value")]


@dataclass
class KVPool:
    """KV caches of many sequences, one row each (see the module docstring)."""

    layers: list[int]
    keys: list[np.ndarray]  # [max_sessions, kv_heads, capacity, head_dim] each
    values: list[np.ndarray]
    lengths: np.ndarray  # [max_sessions] positions valid in each row
    free: list[int]  # free slots, lowest first (keeps busy rows together)
    views: dict[tuple[int, int], KVCache] = field(default_factory=dict)
    reserved: list[int] = field(default_factory=list)  # rows held for good: see `reserve`
    # every call on a row runs a multiple of this many positions (the graphs' step_width,
    # runtime/graphs/stack.py); each row has room past `capacity` for the copies that pad a call
    step_width: int = 1
    # the target's declared features per row and position (`with_features`; a feature head
    # drafts from a row's, runtime/drafters/eagle.py); None: not kept
    features: np.ndarray | None = None

    def with_features(self, width: int) -> KVPool:
        """Keep `width` features per position of each row (zeros mapped lazily)."""
        rows, _, positions, _ = self.keys[0].shape
        self.features = np.zeros((rows, positions, width), np.float32)
        return self

    def write_features(self, slot: int, at: int, rows: np.ndarray) -> None:
        if self.features is not None:
            self.features[slot, at : at + len(rows)] = rows

    @classmethod
    def allocate(
        cls,
        layers: list[int],
        kv_heads: int,
        head_dim: int,
        context: int,
        max_sessions: int,
        dtype: np.dtype,
        step_width: int = 1,
    ) -> KVPool:
        # np.zeros maps untouched pages lazily: memory grows with the positions used
        shape = (max_sessions, kv_heads, context + room(step_width), head_dim)
        keys = [np.zeros(shape, dtype) for _ in layers]
        values = [np.zeros(shape, dtype) for _ in layers]
        lengths, free = np.zeros(max_sessions, np.int64), list(range(max_sessions))
        return cls(layers, keys, values, lengths, free, step_width=step_width)

    @property
    def held(self) -> int:
        """Slots owned by sessions now (what /health reports: it cannot drift from the pool);
        reserved rows are not sessions."""
        return self.keys[0].shape[0] - len(self.free) - len(self.reserved)

    def reserve(self) -> int:
        """A row taken for as long as the pool lives: an OpenAI conversation's cache, kept
        between its requests so that the next turn prefills only what is new."""
        slot = self.acquire()
        if slot is None:
            raise ValueError("the KV pool has no free row to reserve")
        self.reserved.append(slot)
        return slot

    @property
    def capacity(self) -> int:
        """The positions a row holds (its buffer has `room(step_width)` more, for pads)."""
        return self.keys[0].shape[2] - room(self.step_width)

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
