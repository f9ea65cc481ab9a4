"""`edgespec serve BUNDLE`: the cloud side of split decoding, on starlette + uvicorn.

    WS   /v1/session      one generation session per connection (binary `protocol` messages;
                          paused between a conversation's turns and resumed: `connection`)
    GET  /health          liveness; with the token: load, limits, the backbone fingerprint
    POST /v1/chat/completions, /v1/completions, GET /v1/models: the OpenAI API, decoded with
                          the local speculative mode of `--mode` (`edgespec.serve.openai`)

Guarantees: a bearer token is required when configured (HTTP 401 otherwise); at most
`max_sessions` sessions hold a KV cache at once, each at most `max_context` positions;
requests larger than `max_request_bytes`, malformed messages, bad ids and out-of-step rounds
get an ERROR naming the problem and close only that session; a session idle for
`idle_timeout` seconds is closed and its cache freed, and a full server evicts the session
paused longest ago to admit a new one. On shutdown new rounds are refused
(ERROR 503) while rounds already running are answered, then connections close and the
process exits 0 within drain_seconds + body_timeout + 2 s whatever its clients do
(`transport` bounds headers, handshakes and shutdown; `serve.http` bodies).
All model work runs on one `Worker` thread; each session owns a slot of one `KVPool`, and
verify rounds that arrive together share forwards (`batching`; `max_batch = 1`: each alone),
the OpenAI conversations' rounds included: each conversation holds a row of the same pool
and its target graphs are the same objects (`pool_verifier`; the target is loaded once);
prefills run in chunks (at most `prefill_chunk` positions, sized to take about
`prefill_budget_ms`) between other sessions' rounds. A slot
is taken only once a START has passed every check, and freed on every path out.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.routing import Route, WebSocketRoute

from edgespec import protocol as P
from edgespec.bundle import Manifest
from edgespec.runtime.graph import GraphSession
from edgespec.runtime.opener import GraphOptions, open_bundle
from edgespec.runtime.tokenizer import Tokenizer
from edgespec.serve.auth import Gate
from edgespec.serve.batching import KVPool
from edgespec.serve.chat_engine import ChatEngine, load_model
from edgespec.serve.connection import Conn, Counters, session_endpoint
from edgespec.serve.http import health
from edgespec.serve.openai import ROUTES
from edgespec.serve.pool_verifier import PoolVerifier
from edgespec.serve.session import BatchStats, verify_rounds
from edgespec.serve.transport import uvicorn_config
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
        _seconds("idle_timeout", self.idle_timeout, positive=True)
        _seconds("drain_seconds", self.drain_seconds, positive=False)
        _seconds("header_timeout", self.header_timeout, positive=True)
        _seconds("body_timeout", self.body_timeout, positive=True)
        _seconds("batch_window_ms", self.batch_window_ms, positive=False, most=1000.0)
        _seconds("prefill_budget_ms", self.prefill_budget_ms, positive=False, most=10000.0)


class ConfigError(ValueError):
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
    pool = KVPool.allocate(
        target.layers,
        m.num_kv_heads,
        m.head_dim,
        context,
        config.max_sessions + config.conversations,  # a row reserved per conversation
        stages[0].kv_dtype,
    )
    stats = BatchStats()
    worker = Worker(
        lambda rounds: verify_rounds(pool, stages, rounds, stats),
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
    return State(
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
    )


# -- app and process ------------------------------------------------------------------------
def create_app(config: ServerConfig, state: State | None = None) -> Starlette:
    app = Starlette(
        routes=[
            WebSocketRoute("/v1/session", session_endpoint),
            Route("/health", health),
            *ROUTES,
        ]
    )
    app.state.edgespec = state or load_state(config)
    return app


async def drain(state: State) -> None:
    """Refuse new rounds, let running ones finish (at most drain_seconds)."""
    state.closing = True
    deadline = time.monotonic() + state.config.drain_seconds
    while state.worker.busy and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # let the handlers send the answers they just got


def run(config: ServerConfig, host: str = "127.0.0.1", port: int = 8700, log_level: str = "info"):
    import uvicorn

    state = load_state(config)
    app = create_app(config, state)

    class Server(uvicorn.Server):
        async def shutdown(self, sockets: Any = None) -> None:
            await drain(state)  # before uvicorn closes the WebSockets (code 1012)
            await super().shutdown(sockets)
            # a drained shutdown is a success: exit 0 rather than re-raise SIGTERM/SIGINT
            self._captured_signals.clear()

    server = Server(uvicorn_config(app, config, host, port, log_level))
    try:
        server.run()
    finally:
        stop(state)


def stop(state: State) -> None:
    """Stop the OpenAI requests' threads, then the worker that answers their rounds."""
    if state.chat is not None:
        state.chat.stop()
    state.worker.stop()
