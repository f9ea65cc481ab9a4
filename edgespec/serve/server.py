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
import time
from typing import Any

from starlette.applications import Starlette
from starlette.routing import Route, WebSocketRoute

from edgespec.serve.connection import session_endpoint
from edgespec.serve.http import health
from edgespec.serve.openai import ROUTES
from edgespec.serve.state import ServerConfig, State, load_state
from edgespec.serve.transport import uvicorn_config


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
