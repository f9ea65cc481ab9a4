"""The split verifier's WebSocket, `/v1/session`: one connection, one session at a time.

A connection is admitted past the bearer token and `max_sessions` open connections (a full
server first evicts the connection whose session was paused longest ago, if there is one: a
paused conversation never keeps a new session out). Its messages are served in order:

    START   keep = 0: a new session (the old slot, if any, is freed first); keep > 0: the
            session this connection holds, resumed: cut to `keep` positions, only the new
            ids prefilled (`session.prefill`)
    VERIFY  a round, batched on the worker with the rounds of other sessions
    PAUSE   the generation is over; the slot and cache stay for the next START
    END     the generation is over; the slot is freed
    STREAM  the server decodes on its own and streams TOKENS (`serve.streaming`), or answers
            ERROR 429 "verify only" (the connection stays open); STOP ends the stream after
            the round it runs; any other message first ends a running stream, then is served

A bad message gets an ERROR naming the problem and closes this connection only; a refused
resume (ERROR 410: nothing to resume, 409: keep past the cache) leaves it open for the full
START that follows. A connection idle for `idle_timeout` seconds, paused or not, gets ERROR
408 and is closed. Every way out frees the slot, on the worker, after the jobs this session
queued there. `state.Counters` count what STARTs prefilled and what resumes kept, for /health.
"""

from __future__ import annotations

import asyncio
import logging
import time

from starlette.responses import PlainTextResponse
from starlette.websockets import WebSocket, WebSocketDisconnect

from edgespec import protocol as P
from edgespec.backbone import HELLO_PREFIX, BackboneMismatch, parse_hello
from edgespec.backbone import check as check_backbone
from edgespec.runtime.grammar.constraints import Constraint, GrammarError
from edgespec.runtime.grammar.engine import Grammar, bundle_vocabulary
from edgespec.serve.http import sessions_admitted
from edgespec.serve.pool_verifier import PoolVerifier
from edgespec.serve.requests import FieldError
from edgespec.serve.requests import check_start as check_sampling
from edgespec.serve.session import CannotResume, ServerSession, prefill, release_all
from edgespec.serve.state import Conn, State
from edgespec.serve.streaming import Stream, start_stream

log = logging.getLogger("edgespec.serve")


async def session_endpoint(ws: WebSocket) -> None:
    state: State = ws.app.state.edgespec
    if not await state.gate.admit(ws.headers, ws.client):
        await ws.send_denial_response(
            PlainTextResponse(
                "missing or wrong bearer token: pass the server's token (--token-file)\n", 401
            )
        )
        return
    # a device that offers the subprotocol learns the limits in its START's RESULT (and,
    # offering edgespec.trees, the largest token tree this server verifies)
    offered = ws.scope.get("subprotocols", [])
    limits = P.TREES if P.TREES in offered else P.SUBPROTOCOL if P.SUBPROTOCOL in offered else None
    await ws.accept(subprotocol=limits)
    sid = next(state.ids)
    full = sessions_admitted(state) >= state.config.max_sessions  # OpenAI requests count too
    victim = _evictable(state) if full and not state.closing else None
    if state.closing or sessions_admitted(state) >= state.config.max_sessions:
        reason = (
            "the server is shutting down"
            if state.closing
            else f"the server is full ({state.config.max_sessions} sessions): try again later"
        )
        await _refuse(ws, P.Error(P.UNAVAILABLE, reason, sid), 1013)
        return
    conn = state.connections[sid] = Conn(ws, sid)
    try:
        if victim is not None:
            await _evict(state, victim)
        await _serve_session(conn, state, limits)
    except WebSocketDisconnect:
        pass  # the device went away; its cache goes with this frame
    finally:
        state.connections.pop(sid, None)


def _evictable(state: State) -> Conn | None:
    """The connection paused longest ago, taken out of the count (None: none is paused)."""
    paused = [c for c in state.connections.values() if c.paused_at is not None]
    if not paused:
        return None
    victim = min(paused, key=lambda c: c.paused_at or 0.0)
    del state.connections[victim.sid]
    victim.evicted = True
    return victim


async def _evict(state: State, victim: Conn) -> None:
    """Free a paused session's slot (queued before any START of the newcomer) and close it;
    its device STARTs afresh next time (its link sees the close)."""
    state.counters.evictions += 1
    state.worker.submit(release_all, state.pool, victim.held)
    text = (
        "evicted: the server was full and this session was paused the longest; its cache "
        "was freed: reconnect and START with keep 0 and the whole sequence"
    )
    await _refuse(victim.ws, P.Error(P.GONE, text, victim.sid), 1000)


async def _serve_session(conn: Conn, state: State, limits: str | None) -> None:
    try:
        await _session_rounds(conn, state, limits)
    finally:  # on the worker, after any job of this session still queued there
        state.worker.submit(release_all, state.pool, conn.held)


async def _session_rounds(conn: Conn, state: State, limits: str | None) -> None:
    streaming: list[Stream] = []  # the session's stream, while one may run
    try:
        await _rounds(conn, state, limits, streaming)
    finally:
        for s in streaming:
            s.stop.set()  # its next round finds the slot freed and ends quietly


async def _end_stream(streaming: list[Stream]) -> None:
    """Stop a running stream (after its round) and wait for its thread to end."""
    for s in streaming:
        s.stop.set()
        await asyncio.to_thread(s.thread.join)
    streaming.clear()


def _stream(
    conn: Conn, state: State, session: ServerSession | None, msg: P.Stream, round_id: int
) -> Stream:
    """Start the session's stream: TOKENS go out from its thread through this event loop."""
    if session is None:
        raise P.ProtocolError("STREAM before START: start the session first")
    loop = asyncio.get_running_loop()

    def send(tokens: P.Message) -> bool:
        tokens.session, tokens.round = conn.sid, round_id
        try:
            return asyncio.run_coroutine_threadsafe(_send(conn.ws, tokens), loop).result(60)
        except Exception:  # the loop is gone (shutdown) or the send never finished
            return False

    def failed(e: Exception) -> None:
        error = P.Error(P.INTERNAL, f"the stream failed ({type(e).__name__}: {e})", conn.sid)
        asyncio.run_coroutine_threadsafe(_refuse(conn.ws, error, 1011), loop)

    c = state.config
    rows = PoolVerifier(
        state.worker, state.pool, state.stages, c.prefill_chunk, 0.0, session=session
    )
    stop_ids = frozenset(state.manifest.eos_token_ids)
    return start_stream(state.streams, rows, session, msg, stop_ids, send, failed)


async def _rounds(conn: Conn, state: State, limits: str | None, streaming: list[Stream]) -> None:
    ws, sid = conn.ws, conn.sid
    session: ServerSession | None = None
    while True:
        try:
            event = await asyncio.wait_for(ws.receive(), state.config.idle_timeout)
        except TimeoutError:
            if any(s.thread.is_alive() for s in streaming):
                continue  # streaming: the device is listening, not idle
            text = (
                f"idle for {state.config.idle_timeout:g}s: the session's KV cache was freed; "
                "reconnect and START again to continue"
            )
            await _refuse(ws, P.Error(P.IDLE_TIMEOUT, text, sid), 1000)
            return
        if event["type"] == "websocket.disconnect" or conn.evicted:
            return  # evicted: its slot is gone and it was told so
        conn.paused_at = None
        data = event.get("bytes") if event.get("bytes") is not None else event.get("text", "")
        round_id = 0
        try:
            msg = P.decode(data, state.limits)
            round_id = msg.round
            if state.closing:
                raise P.ProtocolError("the server is shutting down: reconnect later", P.UNAVAILABLE)
            if isinstance(msg, P.Stop):
                for s in streaming:
                    s.stop.set()
                continue  # answered by the stream's FINAL tokens (no stream: nothing to do)
            if streaming:
                await _end_stream(streaming)
            if isinstance(msg, P.Stream):
                streaming.append(_stream(conn, state, session, msg, round_id))
                continue
            if isinstance(msg, P.Start):
                check_start(state, msg)
                if not msg.keep:  # a new session: free the old slot before taking one
                    session = None
                    state.worker.submit(release_all, state.pool, conn.held)
                session, reply = await state.worker.steps(
                    prefill,
                    state.pool,
                    state.stages,
                    msg,
                    state.max_context,
                    conn.held,
                    state.config.prefill_chunk,
                    state.config.prefill_budget_ms / 1000,
                    session,
                    start_grammar(state, msg),
                )
                count = state.counters
                count.positions_prefilled += len(msg.ids)
                count.positions_kept += msg.keep
                count.resumes += msg.keep > 0
                if limits:
                    offer = P.ServerLimits(
                        state.max_context, state.config.max_request_bytes, *state.streams.offer()
                    )
                    if limits == P.TREES:  # the largest tree it verifies; 0: chains only
                        offer.tree_nodes = P.MAX_DRAFTS if state.tree_stages else 0
                    reply.limits = offer
            elif isinstance(msg, P.Verify):
                if session is None:
                    raise P.ProtocolError("VERIFY before START: start the session first")
                reply = await state.worker.round((session, msg))
            elif isinstance(msg, P.Pause):
                if session is not None and session.slot is not None:
                    conn.paused_at = time.monotonic()
                continue
            elif isinstance(msg, P.End):
                session = None
                state.worker.submit(release_all, state.pool, conn.held)
                continue
            else:
                raise P.ProtocolError(
                    f"{P.NAMES[P.HEADER.unpack_from(data)[2]]} is a server message: devices "
                    "send START, VERIFY, STREAM, STOP, PAUSE and END"
                )
        except CannotResume as e:  # nothing changed: the device STARTs afresh on this link
            state.counters.resumes_refused += 1
            log.info("session %d: %d %s", sid, e.code, e)
            if not await _send(ws, P.Error(e.code, str(e), sid, round_id)):
                return
            continue
        except P.ProtocolError as e:
            if e.code == P.BUSY:  # "verify only": the session stays, VERIFY rounds go on
                if not await _send(ws, P.Error(e.code, str(e), sid, round_id)):
                    return
                continue
            await _refuse(ws, P.Error(e.code, str(e), sid, round_id), 1008)
            return
        except Exception as e:
            log.exception("session %d: round failed", sid)
            text = f"internal error ({type(e).__name__}: {e})"
            await _refuse(ws, P.Error(P.INTERNAL, text, sid, round_id), 1011)
            return
        state.rounds += 1
        reply.session, reply.round = sid, round_id
        if not await _send(ws, reply):
            return  # the device left while its round ran


async def _send(ws: WebSocket, msg: P.Message) -> bool:
    """Send one answer; False if the device is gone."""
    try:
        await ws.send_bytes(P.encode(msg))
        return True
    except (WebSocketDisconnect, RuntimeError, OSError):
        return False


async def _refuse(ws: WebSocket, error: P.Error, close_code: int) -> None:
    """Send an ERROR, then close this session only; a device already gone is fine."""
    log.info("session %d: %d %s", error.session, error.code, error.text)
    try:
        await ws.send_bytes(P.encode(error))
        await ws.close(close_code, reason=error.text[:120])
    except (WebSocketDisconnect, RuntimeError, OSError):
        pass


def start_grammar(state: State, msg: P.Start) -> Constraint | None:
    """The START's grammar, opened over this server's vocabulary (ERROR 422 if unusable)."""
    if msg.grammar is None:
        return None
    text, start = msg.grammar
    if start > msg.keep + len(msg.ids):
        raise P.ProtocolError(
            f"START: the grammar starts at {start}, past the sequence's "
            f"{msg.keep + len(msg.ids)} tokens",
            P.BAD_REQUEST,
        )
    try:
        vocabulary = bundle_vocabulary(state.config.bundle, state.manifest)
        return Grammar(text, "grammar").start(vocabulary, start)
    except GrammarError as e:
        raise P.ProtocolError(f"START: {e}", P.BAD_REQUEST) from None


def check_start(state: State, msg: P.Start) -> None:
    """A START's sampling fields and backbone fingerprint; raises ProtocolError naming them."""
    try:
        check_sampling(msg.temperature, msg.top_p, msg.top_k, state.limits.vocab_size)
    except FieldError as e:
        raise P.ProtocolError(f"START: {e}", P.BAD_REQUEST) from None
    fingerprint = state.manifest.backbone_fingerprint
    if msg.fingerprint.startswith(HELLO_PREFIX):
        try:
            hello = parse_hello(msg.fingerprint)
        except BackboneMismatch as e:  # not a fingerprint at all: a bad message
            raise P.ProtocolError(f"START: {e}", P.BAD_MESSAGE) from None
        try:  # a shared-backbone edge bundle: same tokenizer and lower layers?
            check_backbone(state.manifest.backbone, *hello)  # type: ignore[misc]
        except BackboneMismatch as e:
            raise P.ProtocolError(str(e), P.INCOMPATIBLE) from None
    elif msg.fingerprint and msg.fingerprint != fingerprint:
        raise P.ProtocolError(
            "the device's bundle does not share this server's backbone "
            f"(device {msg.fingerprint[:19]}..., server {fingerprint[:19]}...): "
            "export both from the same base model",
            P.INCOMPATIBLE,
        )
