"""What every part of `edgespec serve` shares (a leaf the app, the connections, the HTTP and
OpenAI endpoints and the fleet import): `ServerConfig` (every number checked here; the CLI
only builds it), the running server's `State`, the open connections as admission and eviction
see them (`Conn`), what resumes kept (`Counters`), and `load_state`, which opens the bundle
once: the OpenAI engine's model first, and its target — the graphs split rounds run on, over
one `KVPool` with a row per session and per conversation, verified on one `Worker`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from starlette.websockets import WebSocket

from edgespec import protocol as P
from edgespec.bundle import Manifest
from edgespec.errors import EdgespecError
from edgespec.runtime.chat.store import bundle_identity
from edgespec.runtime.graphs.kv_cache import KVPool
from edgespec.runtime.graphs.opener import GraphOptions, open_bundle
from edgespec.runtime.graphs.session import GraphSession
from edgespec.runtime.tokenizer import Tokenizer
from edgespec.serve.auth import Gate
from edgespec.serve.cache_rows import layouts
from edgespec.serve.chat_engine import ChatEngine, load_model
from edgespec.serve.pool_verifier import PoolVerifier
from edgespec.serve.prefix_cache import PrefixCache
from edgespec.serve.session import BatchStats, ServerSession, verify_rounds
from edgespec.serve.streaming import Streams
from edgespec.serve.tree_rounds import TreeStages
from edgespec.serve.worker import Worker


@dataclass
class ServerConfig:
    """What `edgespec serve` runs; every number is checked here (the CLI only builds it)."""

    bundle: str
    token: str | None = None
    max_sessions: int = 16
    max_context: int | None = None  # default: the model's context
    max_request_bytes: int = 1 << 20
    idle_timeout: float = 300.0
    threads: int | None = None
    device: str = "cpu"  # a device profile name (`edgespec devices`)
    drain_seconds: float = 10.0  # how long shutdown waits for running rounds
    max_batch: int = 16  # rounds per batch (1: every round alone, unbatched)
    batch_window_ms: float = 0.0  # wait this long for more rounds when a batch is not full
    header_timeout: float = 10.0  # seconds a connection has to send its request headers
    body_timeout: float = 10.0  # seconds a request has to send its body
    prefill_chunk: int = 256  # positions per prefill step between other rounds (0: whole)
    prefill_budget_ms: float = 20.0  # size chunks to take about this long (0: fixed size)

    mode: str | None = None  # OpenAI endpoints' decoding mode (default: fastest in the bundle)
    draft_policy: str | None = None  # OpenAI endpoints: the mode's policy (default: auto)
    conversations: int = 4  # OpenAI endpoints: conversations decoded at once, each its own cache
    max_streams: int = 4  # split sessions streamed at once (STREAM); 0: verify only
    cache_dir: str | None = None  # OpenAI endpoints: keep conversations' KV caches here
    cache_bytes: int = 1 << 30  # at most this much in cache_dir (least recently used go first)
    cache_min_tokens: int = 64  # prefixes shorter than this are not written
    # stream only while fewer sessions are open (new STREAMs refused, running ones shed back
    # to their devices at this many); 0: no such bound
    stream_below: int = 0

    def __post_init__(self) -> None:
        _integer("max_sessions", self.max_sessions, 1)
        if self.max_context is not None:
            _integer("max_context", self.max_context, 2)
        _integer("max_request_bytes", self.max_request_bytes, 64)
        if self.threads is not None:
            _integer("threads", self.threads, 1)
        _integer("max_batch", self.max_batch, 1)
        _integer("prefill_chunk", self.prefill_chunk, 0)
        _integer("conversations", self.conversations, 1)
        _integer("max_streams", self.max_streams, 0)
        _integer("cache_bytes", self.cache_bytes, 1)
        _integer("cache_min_tokens", self.cache_min_tokens, 1)
        _integer("stream_below", self.stream_below, 0)
        _seconds("idle_timeout", self.idle_timeout, positive=True)
        _seconds("drain_seconds", self.drain_seconds, positive=False)
        _seconds("header_timeout", self.header_timeout, positive=True)
        _seconds("body_timeout", self.body_timeout, positive=True)
        _seconds("batch_window_ms", self.batch_window_ms, positive=False, most=1000.0)
        _seconds("prefill_budget_ms", self.prefill_budget_ms, positive=False, most=10000.0)


class ConfigError(EdgespecError, ValueError):
    """A server setting out of range; the message names the flag and what it accepts."""


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _integer(name: str, value: object, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"{_flag(name)} {value!r}: give a whole number of at least {least}")


def _seconds(name: str, value: object, positive: bool, most: float = 1e9) -> None:
    ok = (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and math.isfinite(value)
        and (value > 0 if positive else value >= 0)
        and value <= most
    )
    if not ok:
        bound = "more than 0" if positive else "0 or more"
        raise ConfigError(
            f"{_flag(name)} {value!r}: give a finite number, {bound}, at most {most:g}"
        )


@dataclass
class Conn:
    """One open connection, as admission and eviction see it."""

    ws: WebSocket
    sid: int
    held: list[ServerSession] = field(default_factory=list)  # its slot, freed however it ends
    paused_at: float | None = None  # monotonic time of its PAUSE (None: not paused)
    evicted: bool = False


@dataclass
class Counters:
    """Prompt positions STARTs prefilled, positions resumes kept instead, and how resumes
    and paused sessions fared."""

    positions_prefilled: int = 0
    positions_kept: int = 0
    resumes: int = 0
    resumes_refused: int = 0
    evictions: int = 0

    def report(self, connections: dict[int, Conn]) -> dict[str, int]:
        paused = sum(c.paused_at is not None for c in connections.values())
        return {**self.__dict__, "sessions_paused": paused}


@dataclass
class State:
    config: ServerConfig
    manifest: Manifest
    stages: list[GraphSession]  # the target's graphs, run over the pool's rows
    tokenizer: Tokenizer
    worker: Worker
    max_context: int
    limits: P.Limits
    pool: KVPool
    stats: BatchStats
    gate: Gate
    connections: dict[int, Conn] = field(default_factory=dict)  # open /v1/session ones
    counters: Counters = field(default_factory=Counters)  # what STARTs prefilled and kept
    ids: itertools.count = field(default_factory=lambda: itertools.count(1))
    closing: bool = False
    rounds: int = 0
    chat: ChatEngine | None = None  # the OpenAI endpoints' decoder
    streams: Streams = field(default_factory=lambda: Streams(0, None))  # STREAM sessions
    # the target's tree-verification graphs, opened on the first tree (None: chains only)
    tree_stages: TreeStages | None = None

    def busy(self) -> bool:
        """Whether streams give way to split sessions now (`stream_below` sessions open:
        split connections and OpenAI requests, as `max_sessions` counts them)."""
        bound = self.config.stream_below
        load = len(self.connections) + (self.chat.load if self.chat else 0)
        return bound > 0 and load >= bound


def load_state(config: ServerConfig) -> State:
    graphs = open_bundle(config.bundle, GraphOptions(config.device, config.threads))
    # one copy of the target: the OpenAI engine's model is opened first, on the same graphs,
    # and its target (full, or head@k + tail@k for self-spec) is what split rounds run on
    model = load_model(graphs, config.mode, config.draft_policy, config.threads)
    target = model.target
    assert target is not None
    context = target.max_positions
    if config.max_context is not None:
        context = min(context, config.max_context)
    limits = P.Limits(graphs.manifest.target.vocab_size, config.max_request_bytes, context)
    stages, m = target.stages, target.model
    tree_stages = target.tree_graphs if graphs.manifest.tree_graphs else None
    pool = KVPool.allocate(
        target.layers,
        m.num_kv_heads,
        m.head_dim,
        context,
        config.max_sessions + config.conversations,  # a row reserved per conversation
        stages[0].kv_dtype,
        target.step_width,  # calls padded as the device's own target pads them (batching)
    )
    if target.feature_width:  # a feature head drafts from its row's (runtime/drafters/eagle.py)
        pool.with_features(target.feature_width)
    stats = BatchStats()
    worker = Worker(
        lambda rounds: verify_rounds(pool, stages, rounds, stats, tree_stages),
        config.max_batch,
        config.batch_window_ms / 1000,
    )
    tokenizer = graphs.tokenizer()
    gate = Gate(config.token)
    budget = config.prefill_budget_ms / 1000
    rows = [
        PoolVerifier(worker, pool, stages, config.prefill_chunk, budget)
        for _ in range(config.conversations)
    ]
    chat = ChatEngine(model, rows, context)
    if config.cache_dir is not None:
        chat.keep_on_disk(open_prefix_cache(config, graphs.folder, graphs.manifest, chat, pool))
    state = State(
        config,
        graphs.manifest,
        stages,
        tokenizer,
        worker,
        context,
        limits,
        pool,
        stats,
        gate,
        chat=chat,
        streams=Streams.for_model(config.max_streams, model),
    )
    state.streams.busy = state.busy
    state.tree_stages = tree_stages
    return state


# -- a fleet (`--replicas`, serve/fleet.py) -------------------------------------------------
APP = "edgespec"


@dataclass
class FleetConfig:
    replicas: int = 1
    autoscale: tuple[int, int] | None = None  # (min, max) replicas; overrides `replicas`
    target_sessions: float | None = None  # autoscaling: sessions per replica (default half full)
    ray_address: str | None = None  # join this cluster; None: start a local Ray for the command
    cpus_per_replica: float = 0.5
    local_cpus: int | None = None  # logical CPUs of the local Ray (default: enough for replicas)
    object_store_mb: int = 128  # local Ray only: replicas exchange small messages
    report_period: float = 0.5  # seconds between a replica's reports to the board
    name: str = APP

    def __post_init__(self) -> None:
        if self.autoscale is not None:
            lo, hi = self.autoscale
            if not 1 <= lo <= hi:
                raise ValueError(
                    f"--autoscale {lo}:{hi}: use MIN:MAX with 1 <= MIN <= MAX (e.g. 1:4)"
                )
        elif self.replicas < 1:
            raise ValueError(f"--replicas {self.replicas}: at least 1")
        if self.cpus_per_replica <= 0:
            raise ValueError(f"{self.cpus_per_replica} CPUs per replica: must be more than 0")

    @property
    def most_replicas(self) -> int:
        return self.autoscale[1] if self.autoscale else self.replicas


def parse_autoscale(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition(":")
    if not (sep and lo.isdigit() and hi.isdigit()):
        raise ValueError(f"--autoscale {text!r}: write MIN:MAX, e.g. 1:4")
    return int(lo), int(hi)


def open_prefix_cache(
    config: ServerConfig, folder: str, manifest: Manifest, chat: ChatEngine, pool: KVPool
) -> PrefixCache:
    """--cache-dir: the files of this bundle there, for the engine's conversations."""
    assert config.cache_dir is not None
    identity = bundle_identity(folder, [manifest.weights_file, *(g.file for g in manifest.graphs)])
    return PrefixCache(
        config.cache_dir,
        config.cache_bytes,
        identity,
        layouts(chat.sessions[0], pool),
        config.cache_min_tokens,
    )
