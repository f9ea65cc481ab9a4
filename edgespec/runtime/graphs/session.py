"""One bundle graph in an onnxruntime session, driven through IO binding.

Takes a `GraphInfo` from the manifest, checks the ONNX file's real inputs and outputs against
it (a mismatch is a `BundleError`), and runs calls of S new positions against a `KVCache`:
the cache's buffers are bound as both past and present, so onnxruntime writes the new
keys/values in place. Sessions of one model share one `KVCache` (buffers keyed by global
layer index): head@k and tail@k, or several exits, each bind the layers they own.

`GraphSession` is one of the three `protocol.Graph`s (with `StaticGraphSession` and
`CoreMLSession`).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from edgespec.bundle import BundleError, GraphInfo, ModelInfo
from edgespec.runtime.graphs.kv_cache import Device, KVCache
from edgespec.runtime.graphs.protocol import Feed

# providers whose attention kernels run on the accelerator's memory: a session whose first
# provider is one of these keeps its KV cache there (onnxruntime's device type)
KV_DEVICES = {"CUDAExecutionProvider": "cuda"}

# GroupQueryAttention's query_seqlens input (16), which lets a verifier batch rounds of
# different widths, is in onnxruntime from this release on (onnxruntime-gpu's newest is 1.31)
QUERY_SEQLENS_SINCE = (1, 32)

# calls of at most this many new positions run on buffers bound once per width (`Narrow`):
# decode, draft and verify steps; a prompt's prefill binds its own, as it is sized once
NARROW = 16


def ort_takes_query_seqlens(version: str = ort.__version__) -> bool:
    """Whether this onnxruntime loads graphs whose attention takes query_seqlens."""
    parts = [int(p) for p in version.split("+")[0].split(".")[:2] if p.isdigit()]
    return tuple(parts) >= QUERY_SEQLENS_SINCE


ORT_TYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(int64)": "int64",
    "tensor(int32)": "int32",
    "tensor(bool)": "bool",
}


# Size of onnxruntime's process-wide intra-op thread pool once edgespec created it (0: one
# thread per core); None while there is none.
_shared_pool: int | None = None


def session_options(threads: int | None, shared: bool = True) -> ort.SessionOptions:
    """Options for one graph.

    shared: run on onnxruntime's process-wide thread pool (created on first use with `threads`
    threads; later sessions use it whatever their `threads`). A model's graphs (draft, full,
    head@k, tail@k) run one after another, and with a pool per session each idle pool keeps
    spinning on the cores the running graph needs: speculative rounds were 2x slower on
    2 cores. Once that pool exists onnxruntime refuses per-session pools in the process, so
    an app's own sessions must then set `use_per_session_threads = False` too.
    """
    global _shared_pool
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.log_severity_level = 3
    if shared or _shared_pool is not None:
        if _shared_pool is None:
            ort.set_global_thread_pool_sizes(threads or 0, 1)
            _shared_pool = threads or 0
        opts.use_per_session_threads = False
        return opts
    opts.inter_op_num_threads = 1
    if threads:
        opts.intra_op_num_threads = threads
    return opts


class GraphSession:
    """An onnxruntime session for one graph role, plus the metadata to call it (a `Graph`
    of any capacity whose cache lives where its attention runs)."""

    fixed_capacity: int | None = None
    holds_kv = False

    def __init__(
        self,
        folder: Path,
        graph: GraphInfo,
        model: ModelInfo,
        providers: list[str],
        options: ort.SessionOptions,
        kv_dtype: np.dtype,
    ) -> None:
        self.graph, self.model, self.kv_dtype = graph, model, kv_dtype
        path = folder / graph.file
        # rows of one call may add different numbers of positions (see run_batch)
        self.batched = any(i.name == "query_seqlens" for i in graph.inputs)
        if self.batched and not ort_takes_query_seqlens():
            since = ".".join(map(str, QUERY_SEQLENS_SINCE))
            raise BundleError(
                f"{path.name} needs onnxruntime >= {since} (its attention takes query_seqlens, "
                f"for batched verify rounds); this is onnxruntime {ort.__version__}. Upgrade "
                "onnxruntime, or re-export the bundle here with `--no-batched-verify` (graphs "
                "for older onnxruntime, onnxruntime-gpu 1.31 among them; a verifier server "
                "then runs its rounds one by one)"
            )
        try:
            self.session = ort.InferenceSession(str(path), options, providers=providers)
        except Exception as e:  # onnxruntime raises its own untyped Fail/InvalidGraph errors
            raise BundleError(
                f"onnxruntime cannot load {path}: {e}; re-export the bundle"
            ) from None
        check_io(self.session, graph, path)
        self.kv_device = kv_device(self.session, kv_dtype)
        self.output_names = [o.name for o in graph.outputs if not o.name.startswith("present_")]
        self.takes_hidden = any(i.name == "hidden" for i in graph.inputs)
        # One binding reused across calls: the KV buffers are rebound only when the cache
        # changes, and the scalar inputs are OrtValues over numpy arrays updated in place.
        # Rebuilding all of that per call cost ~40% of a small draft model's step.
        self._io = self.session.io_binding()
        # the bindings are shared state: one call at a time (a draft graph shared by the
        # server's conversations, each decoding on a thread of its own)
        self._lock = threading.Lock()
        self._bound_cache: KVCache | None = None
        self._batch_io = self.session.io_binding()  # run_batch's own (see there)
        self._batch_cache: KVCache | None = None
        self._seqlens = np.zeros(1, np.int32)
        self._total = np.zeros((), np.int32)
        self._keep = np.zeros((), np.int64)
        self._query = np.zeros(1, np.int32)
        self._scalars = [
            ("seqlens_k", self._seqlens),
            ("total_seq_len", self._total),
            ("num_logits_to_keep", self._keep),
            *([("query_seqlens", self._query)] if self.batched else []),
        ]
        for name, array in self._scalars:
            self._io.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array))
        # on a GPU the in-place updates would never reach GroupQueryAttention's seqlens_k
        # (every call saw the first call's), nor a host-memory KV cache's new positions
        self._rebind = copies_on_bind(self.session)
        self._narrow = Narrow.of(self) if not self._rebind else None

    def run(
        self,
        cache: KVCache,
        past: int,
        feed: Feed,
        extra: dict[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        """Process the S new positions `feed` holds after `past` cached ones, writing their
        keys/values into `cache` in place; return the outputs (logits for the last `keep`
        positions). The caller owns the cache length. `extra`: further inputs of the graph by
        name (the eagle graph's features and state)."""
        with self._lock:
            new, keep = feed.new, feed.keep
            total = past + new.shape[1]
            if total > cache.capacity:
                raise ValueError(f"KV cache full: {total} positions > capacity {cache.capacity}")
            io = self._io
            self._seqlens[0], self._total[()], self._keep[()] = total - 1, total, keep
            self._query[0] = new.shape[1]
            narrow = self._narrow
            if narrow is not None and new.shape[1] <= NARROW and not extra:
                bound = narrow.bind(new, keep)  # first: get_outputs() keeps binding order
                if cache is not self._bound_cache:
                    self._bind_cache(io, cache)
                    self._bound_cache = cache
                return narrow.run(*bound)
            if narrow is not None:
                narrow.unbind()  # the binding below replaces its input and outputs
            if self.takes_hidden:
                io.bind_cpu_input("hidden", np.ascontiguousarray(feed.hidden, dtype=self.kv_dtype))
            else:
                io.bind_cpu_input("input_ids", np.ascontiguousarray(feed.input_ids, dtype=np.int64))
            for name, array in (extra or {}).items():
                io.bind_cpu_input(name, np.ascontiguousarray(array, dtype=np.float32))
            if self._rebind:
                for name, array in self._scalars:
                    io.bind_cpu_input(name, array)
            self._bind_outputs(io)  # first: get_outputs() keeps binding order
            if cache is not self._bound_cache or self._stale(cache):
                self._bind_cache(io, cache)
                self._bound_cache = cache
            return self._run_bound(io)

    def run_batch(
        self,
        cache: KVCache,
        pasts: np.ndarray,
        widths: np.ndarray,
        *,
        input_ids: np.ndarray | None = None,
        hidden: np.ndarray | None = None,
        logits: bool = True,
    ) -> dict[str, np.ndarray]:
        """Up to S new positions for each of B rows in one call ([B, S] ids or [B, S, H]
        hidden states, right-padded): row b adds its first `widths[b]` positions after its
        `pasts[b]` cached ones, into its own row of `cache` (which holds B rows) in place; a
        row of width 0 is idle (nothing written). Returns the outputs of all S positions of
        every row (logits only if `logits`); those past a row's width are padding,
        unspecified. Needs a graph with `query_seqlens` (`self.batched`; bundles exported
        before it run rows alone). A separate binding from `run()`'s, so alternating the
        two rebinds nothing."""
        with self._lock:
            new = input_ids if input_ids is not None else hidden
            assert new is not None and new.shape[0] == cache.shape[0] == len(widths)
            if not self.batched:
                raise ValueError(
                    f"{self.graph.file} has no query_seqlens input: re-export the bundle"
                )
            width = new.shape[1]
            pasts, widths = np.asarray(pasts, np.int64), np.asarray(widths, np.int32)
            # the kernel needs room for the whole padded chunk after each active row's past
            if int(np.max(np.where(widths > 0, pasts, 0))) + width > cache.capacity:
                raise ValueError(
                    f"KV cache full: a row of {int(pasts.max())} positions has no room for "
                    f"{width} more (capacity {cache.capacity})"
                )
            # an idle row claims one cached position (the kernel needs T >= 1) and adds none
            seqlens = np.where(widths > 0, pasts + widths - 1, 0).astype(np.int32)
            io = self._batch_io
            if self.takes_hidden:
                io.bind_cpu_input("hidden", np.ascontiguousarray(hidden, dtype=self.kv_dtype))
            else:
                io.bind_cpu_input("input_ids", np.ascontiguousarray(input_ids, dtype=np.int64))
            io.bind_cpu_input("seqlens_k", seqlens)
            io.bind_cpu_input(
                "total_seq_len", np.array(max(int(seqlens.max()) + 1, width), np.int32)
            )
            io.bind_cpu_input("num_logits_to_keep", np.array(width if logits else 0, np.int64))
            io.bind_cpu_input("query_seqlens", widths)
            self._bind_outputs(io)
            if cache is not self._batch_cache or self._stale(cache):
                self._bind_cache(io, cache)
                self._batch_cache = cache
            return self._run_bound(io)

    def _stale(self, cache: KVCache) -> bool:
        """A host-memory cache bound to a GPU session: the device holds the copy made when it
        was bound, so it is bound again (copied) each call. Correct but slow: the verifier
        server's KV pool (serve/batching.py) is such a cache; a model's own cache lives on
        the GPU (`kv_device`)."""
        return self._rebind and cache.device is None

    def _bind_cache(self, io: ort.IOBinding, cache: KVCache) -> None:
        """The cache's buffers as both past (read) and present (written in place)."""
        for i in self.graph.kv_layers:
            for kind in ("key", "value"):
                buffer = cache.bound[f"{kind}.{i}"]
                io.bind_ortvalue_input(f"past_{kind}.{i}", buffer)
                io.bind_ortvalue_output(f"present_{kind}.{i}", buffer)

    def _bind_outputs(self, io: ort.IOBinding) -> None:
        for name in self.output_names:
            io.bind_output(name, "cpu")

    def _run_bound(self, io: ort.IOBinding) -> dict:
        self.session.run_with_iobinding(io)
        # the outputs bound first are ours. onnxruntime's `IOBinding.get_outputs()` wraps
        # every output in a Python OrtValue, the KV buffers too: 13 µs a call, 0.8% of a small
        # model's step; its raw list costs 0.2 µs
        raw = getattr(io, "_iobinding", None)
        outputs = raw.get_outputs() if raw is not None else io.get_outputs()
        return {name: outputs[j].numpy() for j, name in enumerate(self.output_names)}


class Narrow:
    """`GraphSession.run` for calls of a few positions (a decode step, a draft step, a verify),
    with buffers bound once per width: ~40% less time around the kernels of a call.

    Each call of a step used to bind its input ids (a new OrtValue over a new array, 16 µs on
    the Xeon VM in the decode loop, where onnxruntime's run has just pushed Python's state out
    of the CPU caches) and its outputs (onnxruntime allocates them anew, 10 µs), then wrap
    them (6 µs) and copy them to numpy (8 µs). Here an input buffer per width and output
    buffers per (width, kept logits) are bound once and written in place; a call copies its
    input in and its outputs out, and binds again only when its shape differs from the last
    call's. onnxruntime's Python wrappers (their checks cost several µs a call) are bypassed
    for its binding objects, which they wrap. Only where the CPU reads host buffers in place
    (`copies_on_bind` false): other providers copy a bound input once, when bound."""

    def __init__(self, graph: GraphSession, io: Any, session: Any) -> None:
        self.io, self.session = io, session
        self.input = "hidden" if graph.takes_hidden else "input_ids"
        self.dtype = graph.kv_dtype if graph.takes_hidden else np.dtype(np.int64)
        self.names = graph.output_names
        self.cpu = ort.OrtDevice.make("cpu", 0)._get_c_device()
        self.inputs: dict[int, tuple[np.ndarray, ort.OrtValue]] = {}
        # (width, keep) -> one buffer per output, learned from the first call of that shape
        self.outputs: dict[tuple[int, int], list[tuple[np.ndarray, ort.OrtValue]]] = {}
        self.fed: int | None = None  # the width whose input buffer is bound
        self.shape: tuple[int, int] | None = None  # whose output buffers are bound

    @classmethod
    def of(cls, graph: GraphSession) -> Narrow | None:
        """None where this onnxruntime's Python API lacks the binding objects it uses."""
        io = getattr(graph._io, "_iobinding", None)
        session = getattr(graph.session, "_sess", None)
        if io is None or session is None or not hasattr(io, "bind_ortvalue_output"):
            return None
        return cls(graph, io, session)

    def unbind(self) -> None:
        self.fed = self.shape = None

    def bind(self, new: np.ndarray, keep: int) -> tuple[tuple[int, int], Any]:
        """Bind this call's input (copied in) and outputs; returns what `run` takes: the
        call's shape and its output buffers (None: onnxruntime allocates them this once)."""
        width = new.shape[1]
        buffer = self.inputs.get(width)
        if buffer is None:
            array = np.zeros(new.shape, self.dtype)
            buffer = self.inputs[width] = array, ort.OrtValue.ortvalue_from_numpy(array)
        buffer[0][...] = new
        if self.fed != width:
            self.io.bind_ortvalue_input(self.input, buffer[1]._ortvalue)
            self.fed = width
        shape = (width, keep)
        outputs = self.outputs.get(shape)
        if self.shape != shape:
            for j, name in enumerate(self.names):
                if outputs is None:  # onnxruntime allocates them; their shapes size ours
                    self.io.bind_output(name, self.cpu)
                else:
                    self.io.bind_ortvalue_output(name, outputs[j][1]._ortvalue)
            self.shape = shape if outputs is not None else None
        return shape, outputs

    def run(self, shape: tuple[int, int], outputs: Any) -> dict[str, np.ndarray]:
        self.session.run_with_iobinding(self.io, None)
        if outputs is None:
            values = self.io.get_outputs()
            arrays = [values[j].numpy() for j in range(len(self.names))]
            self.outputs[shape] = [
                (b := np.empty_like(a), ort.OrtValue.ortvalue_from_numpy(b)) for a in arrays
            ]
            return dict(zip(self.names, arrays, strict=True))
        return {name: outputs[j][0].copy() for j, name in enumerate(self.names)}


def copies_on_bind(session: ort.InferenceSession) -> bool:
    """Whether inputs bound in host memory must be bound again before each run: onnxruntime
    copies such an input to the device of the node that reads it when it is bound, not at each
    run, so an array updated in place after binding reaches a GPU's kernels only if bound
    again. Any provider but the CPU's is treated so (re-binding is always correct)."""
    return session.get_providers()[0] != "CPUExecutionProvider"


def kv_device(session: ort.InferenceSession, kv_dtype: np.dtype) -> Device | None:
    """Where a session's KV cache should live: on its accelerator when its attention runs
    there, else in host memory (None). onnxruntime's CUDA GroupQueryAttention takes fp16 and
    bf16 only: an fp32 graph's attention falls back to the CPU, which reads a host cache in
    place but would copy a device cache to the host and back at every layer."""
    provider = session.get_providers()[0]
    device = KV_DEVICES.get(provider)
    if device is None or np.dtype(kv_dtype) == np.float32:
        return None
    options = session.get_provider_options().get(provider, {})
    return device, int(options.get("device_id", 0))


def check_io(session: ort.InferenceSession, graph: GraphInfo, path: Path) -> None:
    """The ONNX file must have the inputs/outputs (names, dtypes, ranks) the manifest says."""
    for kind, real, declared in (
        ("inputs", session.get_inputs(), graph.inputs),
        ("outputs", session.get_outputs(), graph.outputs),
    ):
        got = {a.name: (ORT_TYPES.get(a.type, a.type), len(a.shape)) for a in real}
        want = {t.name: (t.dtype, len(t.shape)) for t in declared}
        if got != want:
            diff = sorted(set(got.items()) ^ set(want.items()))
            raise BundleError(
                f"{path.name}'s {kind} do not match manifest.json (differences: {diff[:6]}); "
                "the graph file and the manifest come from different exports — re-export the bundle"
            )
