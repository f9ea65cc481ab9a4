"""`edgespec serve BUNDLE`: the cloud side of split decoding, on starlette + uvicorn.

    WS   /v1/session      one generation session per connection (binary `protocol` messages)
    GET  /health          liveness, load and the model's backbone fingerprint
    POST /v1/completions  OpenAI-style plain completion, for cloud-only use

Guarantees: a bearer token is required when configured (HTTP 401 otherwise); at most
`max_sessions` sessions hold a KV cache at once, each at most `max_context` positions;
requests larger than `max_request_bytes`, malformed messages, bad ids and out-of-step rounds
get an ERROR naming the problem and close only that session; a session idle for
`idle_timeout` seconds is closed and its cache freed. On shutdown new rounds are refused
(ERROR 503) while rounds already running are answered, then connections close.
All model work runs on one `Worker` thread; each session owns a slot of one `KVPool`, and
verify rounds that arrive together share forwards (`batching`; `max_batch = 1`: each alone).
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from edgespec import protocol as P
from edgespec.backbone import HELLO_PREFIX, BackboneMismatch, check_hello
from edgespec.bundle import Manifest
from edgespec.runtime.graph import GraphSession
from edgespec.runtime.opener import GraphOptions, open_bundle
from edgespec.runtime.stack import Stack
from edgespec.runtime.tokenizer import Tokenizer
from edgespec.serve.batching import KVPool
from edgespec.serve.session import BatchStats, ServerSession, release_all, start, verify_rounds
from edgespec.serve.worker import Worker

log = logging.getLogger("edgespec.serve")


@dataclass
class ServerConfig:
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
    sessions: set[int] = field(default_factory=set)
    ids: itertools.count = field(default_factory=lambda: itertools.count(1))
    closing: bool = False
    rounds: int = 0


def load_state(config: ServerConfig) -> State:
    graphs = open_bundle(config.bundle, GraphOptions(config.device, config.threads))
    target = Stack([graphs.open("full")])
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
        config.max_sessions,
        stages[0].kv_dtype,
    )
    stats = BatchStats()
    worker = Worker(
        lambda rounds: verify_rounds(pool, stages, rounds, stats),
        config.max_batch,
        config.batch_window_ms / 1000,
    )
    tokenizer = graphs.tokenizer()
    return State(config, graphs.manifest, stages, tokenizer, worker, context, limits, pool, stats)


def authorized(config: ServerConfig, headers: Any) -> bool:
    if not config.token:
        return True
    given = headers.get("authorization", "")
    return hmac.compare_digest(given.encode(), f"Bearer {config.token}".encode())


# -- WebSocket sessions ---------------------------------------------------------------------
async def session_endpoint(ws: WebSocket) -> None:
    state: State = ws.app.state.edgespec
    if not authorized(state.config, ws.headers):
        await ws.send_denial_response(
            PlainTextResponse(
                "missing or wrong bearer token: pass the server's token (--token-file)\n", 401
            )
        )
        return
    await ws.accept()
    sid = next(state.ids)
    if state.closing or len(state.sessions) >= state.config.max_sessions:
        reason = (
            "the server is shutting down"
            if state.closing
            else f"the server is full ({state.config.max_sessions} sessions): try again later"
        )
        await _refuse(ws, P.Error(P.UNAVAILABLE, reason, sid), 1013)
        return
    state.sessions.add(sid)
    try:
        await _serve_session(ws, state, sid)
    except WebSocketDisconnect:
        pass  # the device went away; its cache goes with this frame
    finally:
        state.sessions.discard(sid)


async def _serve_session(ws: WebSocket, state: State, sid: int) -> None:
    held: list[ServerSession] = []  # the session's slot, freed however the connection ends
    try:
        await _session_rounds(ws, state, sid, held)
    finally:  # on the worker, after any job of this session still queued there
        state.worker.submit(release_all, state.pool, held)


async def _session_rounds(ws: WebSocket, state: State, sid: int, held: list[ServerSession]) -> None:
    session: ServerSession | None = None
    while True:
        try:
            event = await asyncio.wait_for(ws.receive(), state.config.idle_timeout)
        except TimeoutError:
            text = (
                f"idle for {state.config.idle_timeout:g}s: the session's KV cache was freed; "
                "reconnect and START again to continue"
            )
            await _refuse(ws, P.Error(P.IDLE_TIMEOUT, text, sid), 1000)
            return
        if event["type"] == "websocket.disconnect":
            return
        data = event.get("bytes") if event.get("bytes") is not None else event.get("text", "")
        round_id = 0
        try:
            msg = P.decode(data, state.limits)
            round_id = msg.round
            if state.closing:
                raise P.ProtocolError("the server is shutting down: reconnect later", P.UNAVAILABLE)
            if isinstance(msg, P.Start):
                fingerprint = state.manifest.backbone_fingerprint
                if msg.fingerprint.startswith(HELLO_PREFIX):
                    try:  # a shared-backbone edge bundle: same tokenizer and lower layers?
                        check_hello(state.manifest.backbone, msg.fingerprint)
                    except BackboneMismatch as e:
                        raise P.ProtocolError(str(e), P.INCOMPATIBLE) from None
                elif msg.fingerprint and msg.fingerprint != fingerprint:
                    raise P.ProtocolError(
                        "the device's bundle does not share this server's backbone "
                        f"(device {msg.fingerprint[:19]}..., server {fingerprint[:19]}...): "
                        "export both from the same base model",
                        P.INCOMPATIBLE,
                    )
                session = None  # free the old slot before taking a new one
                state.worker.submit(release_all, state.pool, held)
                session, reply = await state.worker.run(
                    start, state.pool, state.stages, msg, state.max_context, held
                )
            elif isinstance(msg, P.Verify):
                if session is None:
                    raise P.ProtocolError("VERIFY before START: start the session first")
                reply = await state.worker.round((session, msg))
            elif isinstance(msg, P.End):
                session = None
                state.worker.submit(release_all, state.pool, held)
                continue
            else:
                raise P.ProtocolError(
                    f"{P.NAMES[P.HEADER.unpack_from(data)[2]]} is a server message: devices "
                    "send START, VERIFY and END"
                )
        except P.ProtocolError as e:
            await _refuse(ws, P.Error(e.code, str(e), sid, round_id), 1008)
            return
        except Exception as e:
            log.exception("session %d: round failed", sid)
            text = f"internal error ({type(e).__name__}: {e})"
            await _refuse(ws, P.Error(P.INTERNAL, text, sid, round_id), 1011)
            return
        state.rounds += 1
        reply.session, reply.round = sid, round_id
        try:
            await ws.send_bytes(P.encode(reply))
        except (WebSocketDisconnect, RuntimeError, OSError):
            return  # the device left while its round ran


async def _refuse(ws: WebSocket, error: P.Error, close_code: int) -> None:
    """Send an ERROR, then close this session only; a device already gone is fine."""
    log.info("session %d: %d %s", error.session, error.code, error.text)
    try:
        await ws.send_bytes(P.encode(error))
        await ws.close(close_code, reason=error.text[:120])
    except (WebSocketDisconnect, RuntimeError, OSError):
        pass


# -- HTTP -----------------------------------------------------------------------------------
async def health(request: Request) -> JSONResponse:
    state: State = request.app.state.edgespec
    m = state.manifest
    return JSONResponse(
        {
            "status": "closing" if state.closing else "ok",
            "model": m.source.get("model"),
            "backbone_fingerprint": m.backbone_fingerprint,
            "sessions": len(state.sessions),
            "max_sessions": state.config.max_sessions,
            "max_context": state.max_context,
            "rounds_served": state.rounds,
            "max_batch": state.config.max_batch,
            "batch_window_ms": state.config.batch_window_ms,
            **state.stats.report(),
        }
    )


def _bad(message: str, status: int = 400) -> JSONResponse:
    kind = "authentication_error" if status == 401 else "invalid_request_error"
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status)


async def completions(request: Request) -> JSONResponse:
    """OpenAI-style `POST /v1/completions` (no streaming): the server decodes alone."""
    state: State = request.app.state.edgespec
    if not authorized(state.config, request.headers):
        return _bad("missing or wrong bearer token", 401)
    body = await request.body()
    if len(body) > state.config.max_request_bytes:
        return _bad(f"request of {len(body)} bytes exceeds {state.config.max_request_bytes}", 413)
    try:
        req = _completion_request(state, body)
    except ValueError as e:
        return _bad(str(e))
    if state.closing or len(state.sessions) >= state.config.max_sessions:
        return _bad("the server is full or shutting down: try again later", 503)
    sid = next(state.ids)
    state.sessions.add(sid)
    try:
        tokens, finish = await _complete(state, *req)
    except P.ProtocolError as e:
        return _bad(str(e))
    finally:
        state.sessions.discard(sid)
    prompt_ids = req[0].ids
    text = state.tokenizer.decode(
        [t for t in tokens if state.tokenizer.id_to_token(t) is not None],
        skip_special_tokens=True,
    )
    return JSONResponse(
        {
            "id": f"cmpl-{sid}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": state.manifest.source.get("model"),
            "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}],
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": len(tokens),
                "total_tokens": len(prompt_ids) + len(tokens),
            },
        }
    )


def _completion_request(state: State, body: bytes) -> tuple[P.Start, int, bool]:
    import json

    try:
        req = json.loads(body or b"{}")
    except json.JSONDecodeError as e:
        raise ValueError(f"the body is not JSON: {e}") from None
    if not isinstance(req, dict):
        raise ValueError("the body must be a JSON object")
    if req.get("stream"):
        raise ValueError("stream=true is not supported: use the /v1/session WebSocket")
    prompt = req.get("prompt")
    if isinstance(prompt, str) and prompt:
        ids = state.tokenizer.encode(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(i, int) for i in prompt):
        ids = prompt
    else:
        raise ValueError("prompt must be a non-empty string or a list of token ids")
    vocab = state.manifest.target.vocab_size
    if any(not 0 <= i < vocab for i in ids):
        raise ValueError(f"prompt token ids must be in 0..{vocab - 1}")
    try:
        max_tokens = int(req.get("max_tokens", 16))
        temperature = float(req.get("temperature", 1.0))
        top_p = float(req.get("top_p", 1.0))
        seed = None if req.get("seed") is None else int(req["seed"])
    except (TypeError, ValueError):
        raise ValueError("max_tokens, temperature, top_p and seed must be numbers") from None
    if max_tokens < 1:
        raise ValueError("max_tokens must be at least 1")
    start_msg = P.Start(ids, len(ids) + max_tokens, temperature, top_p, 0, seed)
    return start_msg, max_tokens, bool(req.get("ignore_eos", False))


async def _complete(state: State, msg: P.Start, max_tokens: int, ignore_eos: bool):
    """Plain decoding, one round per token, batched with other sessions' rounds."""
    held: list[ServerSession] = []
    try:
        session, reply = await state.worker.run(
            start, state.pool, state.stages, msg, state.max_context, held
        )
        stop = frozenset() if ignore_eos else frozenset(state.manifest.eos_token_ids)
        tokens = [reply.token]
        while True:
            if tokens[-1] in stop:
                return tokens, "stop"
            if len(tokens) >= max_tokens:
                return tokens, "length"
            if len(session.seq) >= session.capacity or state.closing:
                return tokens, "length"
            reply = await state.worker.round((session, P.Verify(len(session.seq), [])))
            tokens.append(reply.token)
    finally:
        state.worker.submit(release_all, state.pool, held)


# -- app and process ------------------------------------------------------------------------
def create_app(config: ServerConfig, state: State | None = None) -> Starlette:
    app = Starlette(
        routes=[
            WebSocketRoute("/v1/session", session_endpoint),
            Route("/health", health),
            Route("/v1/completions", completions, methods=["POST"]),
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

    uv_config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        # frames up to 4x the limit reach our decoder, which answers ERROR 413 by name;
        # beyond that the WebSocket layer itself closes the connection (code 1009)
        ws_max_size=4 * config.max_request_bytes,
        ws_ping_interval=None,  # rounds are our liveness signal; pings would add traffic
        lifespan="off",
    )
    server = Server(uv_config)
    try:
        server.run()
    finally:
        state.worker.stop()
