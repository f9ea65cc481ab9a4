"""The bundle's Core ML packages driven like its ONNX graphs — macOS 15+ only, UNTESTED there.

Takes a `CoreMLPackage` (from `manifest.coreml`) and offers the same
`run(cache, past, Feed)` as `GraphSession`, so `Target`, the drafters
and the decode loop use it unchanged. The KV cache lives in the package's Core ML states
(`holds_kv`: the `KVCache` the loop passes keeps only the length): each call of up to W
positions writes its keys/values at `write_offset = past` and attends cache slots
< past + i + 1 for row i; longer inputs run in chunks of W, shorter ones are padded (the
padding lands in slots beyond the valid length, masked and later overwritten). Rolling back
rejected tokens is therefore still only a length change.

`open_coreml` is the only place coremltools is imported, lazily, when an app asks for Core
ML: the rest of the runtime never imports it. It was written on Linux, where Core ML cannot
run predictions: the tests drive `CoreMLSession` through a numpy reference interpreter of
the same ML program, never through Core ML itself.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from edgespec.bundle import BundleError, CoreMLPackage, CoreMLVariants, ModelInfo
from edgespec.runtime.graphs.kv_cache import Device, KVCache
from edgespec.runtime.graphs.protocol import Feed

MASKED = -30000.0  # must match edgespec.export.static.MASKED
Predict = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


class CoreMLSession:
    """One role's Core ML model and its state, a `Graph` like `GraphSession`."""

    holds_kv = True  # the KV cache is the model's Core ML state, not a KVCache buffer
    kv_device: Device | None = None

    def __init__(
        self, package: CoreMLPackage, model: ModelInfo, variants: CoreMLVariants, predict: Predict
    ) -> None:
        self.graph, self.model, self.predict = package, model, predict
        self.kv_dtype = np.dtype(np.float32)  # of `hidden` between head@k and tail@k
        self.fixed_capacity, self.width = variants.max_context, variants.verify_width
        self.takes_hidden = any(t.name == "hidden" for t in package.inputs)
        self.output_names = [t.name for t in package.outputs]
        w, slots = self.width, self.fixed_capacity + self.width
        self._slot = np.arange(slots)[None, :]
        self._row = np.arange(w)[:, None]
        self._mask = np.zeros((1, 1, w, slots), np.float32)

    def run(self, cache: KVCache, past: int, feed: Feed) -> dict[str, np.ndarray]:
        """Process S new positions after `past`; logits of the last `keep`, hidden of all."""
        new, keep = feed.new[0], feed.keep
        s, w = len(new), self.width
        if past + s > self.fixed_capacity:
            raise ValueError(
                f"Core ML context full: {past + s} positions > max context {self.fixed_capacity}"
            )
        parts: dict[str, list[np.ndarray]] = {name: [] for name in self.output_names}
        for start in range(0, s, w):
            n = min(w, s - start)
            out = self.predict(self._inputs(past + start, new[start : start + n]))
            for name in self.output_names:
                first = 0 if name == "hidden" else max(0, s - keep - start)
                if first < n:
                    parts[name].append(np.asarray(out[name], np.float32)[0, first:n])
        result = {}
        for name, rows in parts.items():
            width = self.model.hidden_size if name == "hidden" else self.model.vocab_size
            result[name] = np.concatenate(rows)[None] if rows else np.zeros((1, 0, width))
        return result

    def _inputs(self, past: int, chunk: np.ndarray) -> dict[str, np.ndarray]:
        n, w, c = len(chunk), self.width, self.fixed_capacity
        if self.takes_hidden:
            x = np.zeros((1, w, chunk.shape[1]), np.float32)
            key = "hidden"
        else:
            x, key = np.zeros((1, w), np.int32), "input_ids"
        x[0, :n] = chunk
        # row i sees slots 0..past + i: the valid cache and the new positions up to itself
        self._mask[0, 0] = np.where(self._slot <= past + self._row, 0.0, MASKED)
        return {
            key: x,
            "position_ids": np.minimum(np.arange(past, past + w), c - 1)[None].astype(np.int32),
            "attention_mask": self._mask,
            "write_offset": np.array([past], np.int32),
        }


def open_coreml(
    folder: Path, package: CoreMLPackage, model: ModelInfo, variants: CoreMLVariants
) -> CoreMLSession:
    """Load a role's .mlpackage with Core ML (macOS 15+, the [coreml] extra) and a fresh state."""
    if sys.platform != "darwin":
        raise BundleError(
            "Core ML packages run on macOS 15 / iOS 18 only; on this machine run the ONNX "
            "graphs (drop coreml=True / --coreml), or the static ones for NPUs (static=True)"
        )
    try:
        import coremltools as ct  # lazily: only apps that ask for Core ML need it
    except ImportError as e:
        raise BundleError(
            f"running Core ML packages needs coremltools ({e}): pip install 'edgespec[coreml]'"
        ) from None
    mlmodel = ct.models.MLModel(str(folder / package.path), compute_units=ct.ComputeUnit.ALL)
    state = mlmodel.make_state()

    def predict(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return mlmodel.predict(inputs, state=state)

    return CoreMLSession(package, model, variants, predict)
