"""What `Model.load` takes: one config object, each default in one place.

`LoadConfig` says how to decode (mode, drafter, verifier, draft-length policy) and where
(device profile, threads, static or Core ML graphs); `SplitConfig` says how to reach the
verifier server in split mode. Names of drafters, verifiers and policies are spelled as in
`registry.py`; the CLI builds these objects and leaves validation to the library.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from edgespec.runtime.draft_q import DEFAULT_SUPPORT, DraftSupport
from edgespec.runtime.errors import InputError
from edgespec.runtime.split.session import ANSWER_TIMEOUT


@dataclass
class SplitConfig:
    server: str | None = None  # ws://HOST:PORT of `edgespec serve`
    token: str | None = None  # its bearer token
    timeout: float = ANSWER_TIMEOUT  # seconds to wait for one answer
    # seconds after which an unanswered round is verified here while its answer is still
    # awaited; None: adaptive (4x the EWMA round trip, at least 0.5 s: `split.session.Remote`); at
    # `timeout` or more: never early (only a failed link or a timeout moves rounds here)
    late_after: float | None = None
    energy_budget: float | None = None  # joules per generated token, for channel-aware
    local_fallback: bool = True  # continue on the bundle's own `full` graph if the link fails


@dataclass
class LoadConfig:
    # ar | spec | self-spec | lookup | split (registry.MODES); None: the mode this bundle's
    # calibration on this device favours (`registry.best_local`)
    mode: str | None = None
    drafter: str | None = None  # draft | exit:K | lookup | chains like lookup+draft
    verifier: str | None = None  # full | exit:K (local graphs)
    draft_policy: str | None = None  # fixed:N | confidence:T | acceptance | auto | ...
    exit_layer: int | None = None  # self-spec: the exit to draft from (default: deepest)
    device: str = "cpu"  # a device profile (`edgespec devices`) or "auto"
    threads: int | None = None  # intra-op threads (default: one per core)
    # run on onnxruntime's process-wide thread pool (see `graphs.session.session_options`)
    shared_threads: bool = True
    static: bool = False  # the bundle's fixed-shape graphs (NPUs)
    coreml: bool = False  # the bundle's Core ML packages (macOS 15+)
    # back the weights with 2 MiB pages where the system allows (Linux;
    # runtime/graphs/huge_pages.py)
    huge_pages: bool = True
    # sampling: model drafters draw from their top-k / top-p ids only (runtime/draft_q.py:
    # lossless; in split mode what a drafted token costs on the uplink)
    draft_support: DraftSupport = DEFAULT_SUPPORT
    # target calls run a multiple of this many positions (runtime/graphs/stack.py); None: the
    # bundle's (2 where its activations are quantized). 1 there is faster, but modes may then
    # disagree
    step_width: int | None = None
    split: SplitConfig = field(default_factory=SplitConfig)
    # token trees with a model-free drafter (lookup, suffix, recycle): auto (where the bundle
    # verifies trees, the tree policy chooses chain or tree each round), on (refused where
    # trees cannot run), off (chains). Off by default: on a CPU, where verify width costs,
    # auto's probe trees measured 0.75-0.92x chains (docs/speculative.md); auto is for
    # devices whose verify cost is flat in width (NPU, GPU)
    trees: str = "off"

    @classmethod
    def from_options(cls, **options: Any) -> LoadConfig:
        """A config from flat keywords: LoadConfig fields, and SplitConfig's (server=...)."""
        mine = {f.name for f in fields(cls)}
        split_names = {f.name for f in fields(SplitConfig)}
        unknown = sorted(set(options) - mine - split_names)
        if unknown:
            raise InputError(
                f"unknown option(s) {unknown}: known are {sorted((mine | split_names) - {'split'})}"
            )
        split = {k: v for k, v in options.items() if k in split_names}
        config = cls(**{k: v for k, v in options.items() if k in mine})
        if split:
            config.split = SplitConfig(**split)
        return config
