"""Fixed-shape graphs (the bundle's static variants) driven like the dynamic ones.

Takes a role's static graphs (from `manifest.static`, one per verify width W) and offers
the same `run(cache, past, Feed)` as `GraphSession`, so `Target`, the
drafters and the decode loop use it unchanged. A call of S new positions runs in chunks:
each chunk goes to the narrowest graph that takes the rest at once, else the widest (so
with widths 1 and 8 a decode step runs W = 1, a verification or prefill W = 8, and a long
prompt is prefilled in chunks of 8). Each chunk is padded to its W, gets its position ids
and additive mask [1, 1, W, C + W] (cache columns < past and the causal new columns
attend), reads the whole cache buffer (bound, never copied), and its real new keys/values
— the graph returns only the W new positions — are copied into the cache at
[past, past + w). Padding rows attend to nothing real and are never written back,
so the real rows are exactly what a dynamic graph computes.

The cache must hold exactly C positions: `fixed_capacity` tells `Target` to allocate that.
Inputs and outputs are bound once to preallocated buffers (their shapes never change).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from edgespec.bundle import BundleError, GraphInfo, ModelInfo, static_width
from edgespec.runtime.graphs.kv_cache import Device, KVCache
from edgespec.runtime.graphs.protocol import Feed
from edgespec.runtime.graphs.session import check_io, copies_on_bind

MASKED = -30000.0  # must match edgespec.export.static.MASKED (exp() of it is 0 in fp32)
DTYPES = {"float32": np.float32, "float16": np.float16, "int64": np.int64, "int32": np.int32}


class StaticGraphSession:
    """The static graphs of one role (one per width), a `Graph` like `GraphSession`."""

    holds_kv = False
    kv_device: Device | None = None  # the cache is copied in and out of host buffers

    def __init__(
        self,
        folder: Path,
        graphs: dict[int, GraphInfo],
        model: ModelInfo,
        providers: list[str],
        options: ort.SessionOptions,
        kv_dtype: np.dtype,
        max_context: int,
    ) -> None:
        self.calls = [
            _FixedWidth(folder, graphs[w], providers, options, max_context) for w in sorted(graphs)
        ]
        self.graph = self.calls[-1].graph
        self.model, self.kv_dtype, self.fixed_capacity = model, kv_dtype, max_context
        self.width = self.calls[-1].width
        self.takes_hidden = self.calls[-1].takes_hidden
        self.output_names = self.calls[-1].output_names

    def run(self, cache: KVCache, past: int, feed: Feed) -> dict[str, np.ndarray]:
        """Process the S new positions `feed` holds after `past` cached ones, writing their
        keys/values into `cache`; return the outputs (logits for the last `keep` positions,
        hidden states for all S). The caller owns the length."""
        new, keep = feed.new[0], feed.keep
        s = len(new)
        if cache.capacity != self.fixed_capacity:
            raise ValueError(
                f"static graphs need a cache of exactly {self.fixed_capacity} positions, "
                f"got {cache.capacity}"
            )
        if past + s > self.fixed_capacity:
            raise ValueError(
                f"static context full: {past + s} positions > max context {self.fixed_capacity}"
            )
        parts: dict[str, list[np.ndarray]] = {name: [] for name in self.output_names}
        start = 0
        while start < s:
            # the narrowest graph that takes the rest in one call, else the widest
            call = next((c for c in self.calls if c.width >= s - start), self.calls[-1])
            n = min(call.width, s - start)
            outputs = call(cache, past + start, new[start : start + n])
            for name in self.output_names:
                # hidden states of every position; logits only of the last `keep`
                first = 0 if name == "hidden" else max(0, s - keep - start)
                if first < n:
                    parts[name].append(outputs[name][0, first:n].copy())
            start += n
        widest = self.calls[-1].buffers
        return {
            name: (
                np.concatenate(rows)[None]
                if rows
                else np.zeros((1, 0, *widest[name].shape[2:]), widest[name].dtype)
            )
            for name, rows in parts.items()
        }

    def run_tree(
        self, cache: KVCache, past: int, feed: Feed, positions: np.ndarray, mask: np.ndarray
    ) -> dict[str, np.ndarray]:
        """`run` for a token tree (`tree_verify.tree_feed`): S new positions at `positions`,
        each seeing the cache and the new positions `mask` [S, S] allows, in one call of the
        narrowest graph that takes them all (the graphs' own position and mask inputs)."""
        s, keep = feed.width, feed.keep
        call = next((c for c in self.calls if c.width >= s), None)
        if call is None:
            raise ValueError(
                f"a token tree of {s} positions is wider than the static graphs' widest verify "
                f"width {self.width}: draft smaller trees, or re-export with a larger "
                "`--verify-width`"
            )
        if cache.capacity != self.fixed_capacity or past + s > self.fixed_capacity:
            raise ValueError(f"static context full: {past + s} > {self.fixed_capacity}")
        outputs = call(cache, past, feed.new[0], (positions, mask))
        return {
            name: outputs[name][:, (0 if name == "hidden" else s - keep) : s].copy()
            for name in self.output_names
        }


class _FixedWidth:
    """One static graph of width W: its session, buffers bound once, and one call."""

    def __init__(
        self,
        folder: Path,
        graph: GraphInfo,
        providers: list[str],
        options: ort.SessionOptions,
        max_context: int,
    ) -> None:
        self.graph, self.capacity, self.width = graph, max_context, static_width(graph)
        path = folder / graph.file
        try:
            self.session = ort.InferenceSession(str(path), options, providers=providers)
        except Exception as e:  # onnxruntime raises its own untyped errors
            raise BundleError(
                f"onnxruntime cannot load {path}: {e}; re-export the bundle"
            ) from None
        check_io(self.session, graph, path)
        self.takes_hidden = any(i.name == "hidden" for i in graph.inputs)
        self.output_names = [o.name for o in graph.outputs if not o.name.startswith("new_")]
        # every buffer preallocated with the graph's fixed shapes and bound once
        self.buffers = {
            t.name: np.zeros(t.shape, DTYPES[t.dtype])
            for t in (*graph.inputs, *graph.outputs)
            if not t.name.startswith("past_")
        }
        self._x = self.buffers["hidden" if self.takes_hidden else "input_ids"]
        self._positions = self.buffers["position_ids"]
        self._mask = self.buffers["attention_mask"]
        w, c = self.width, max_context
        self._mask[0, 0, :, c:] = np.where(np.tri(w, dtype=bool), 0.0, MASKED)
        self._io = self.session.io_binding()
        self._inputs = {
            t.name: _ortvalue(self.buffers[t.name])
            for t in graph.inputs
            if not t.name.startswith("past_")
        }
        for name, value in self._inputs.items():
            self._io.bind_ortvalue_input(name, value)
        self._rebind = copies_on_bind(self.session)  # then the in-place inputs each call
        for t in graph.outputs:
            self._io.bind_ortvalue_output(t.name, _ortvalue(self.buffers[t.name]))
        self._bound_cache: KVCache | None = None
        self._slots: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []

    def _bind(self, cache: KVCache) -> None:
        self._slots = []
        for i in self.graph.kv_layers:
            j = cache.layers.index(i)
            for kind in ("key", "value"):
                self._io.bind_ortvalue_input(f"past_{kind}.{i}", cache.bound[f"{kind}.{i}"])
            self._slots.append(
                (
                    cache.keys[j],
                    cache.values[j],
                    self.buffers[f"new_key.{i}"],
                    self.buffers[f"new_value.{i}"],
                )
            )
        self._bound_cache = cache

    def __call__(
        self,
        cache: KVCache,
        past: int,
        chunk: np.ndarray,
        tree: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        """One call for up to W positions starting at `past`; the real new keys/values are
        copied into the cache; returns the output buffers (overwritten by the next call).
        `tree`: the chunk's positions and [n, n] mask among its new positions (a token tree)
        instead of consecutive positions and a causal mask."""
        if cache is not self._bound_cache or self._rebind:
            self._bind(cache)
        n, w, c = len(chunk), self.width, self.capacity
        self._x[0, :n] = chunk
        self._x[0, n:] = 0  # padding: any valid id / a zero hidden state
        self._positions[0] = np.minimum(np.arange(past, past + w), c - 1)
        mask = self._mask[0, 0]
        mask[:n, :past] = 0.0  # real rows see the valid cache ...
        mask[:n, past:c] = MASKED  # ... and nothing beyond it
        mask[n:, :c] = MASKED  # padding rows see no cache (only new columns, never kept)
        if tree is not None:
            self._positions[0, :n] = tree[0]
            mask[:n, c : c + n] = np.where(tree[1], 0.0, MASKED)
        if self._rebind:
            for name, value in self._inputs.items():
                self._io.bind_ortvalue_input(name, value)
        self.session.run_with_iobinding(self._io)
        if tree is not None:  # the causal mask back for the next call
            mask[:n, c : c + n] = np.where(np.tri(n, dtype=bool), 0.0, MASKED)
        for keys, values, new_k, new_v in self._slots:
            keys[:, :, past : past + n] = new_k[:, :, :n]
            values[:, :, past : past + n] = new_v[:, :, :n]
        return self.buffers


def _ortvalue(array: np.ndarray) -> ort.OrtValue:
    return ort.OrtValue.ortvalue_from_numpy(array)
