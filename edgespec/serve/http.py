"""The server's HTTP plumbing: bounded body reading, errors, and `/health`.

Guarantees: a body is refused by its `Content-Length` before a byte of it is read (413), read
at most up to `max_request_bytes` (413 as soon as it is over), and within `body_timeout`
seconds (408); a client that disconnects while sending it gets nothing and leaves no
traceback. "Server full" is 503 with `Retry-After`. The OpenAI endpoints (`serve.openai`)
read their bodies here. `/health` answers everyone with liveness only; the model, the
load and the batching statistics need the token when one is configured.
"""

from __future__ import annotations

import asyncio

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from edgespec.serve.state import State

RETRY_AFTER_SECONDS = 1


class BodyError(Exception):
    def __init__(self, response: Response | None) -> None:
        self.response = response  # None: the client is gone, answer nothing


def error(message: str, status: int = 400, headers: dict[str, str] | None = None) -> JSONResponse:
    kinds = {401: "authentication_error", 503: "server_busy", 408: "timeout"}
    body = {"error": {"message": message, "type": kinds.get(status, "invalid_request_error")}}
    return JSONResponse(body, status_code=status, headers=headers)


def busy(message: str) -> JSONResponse:
    return error(message, 503, {"Retry-After": str(RETRY_AFTER_SECONDS)})


async def read_body(request: Request, limit: int, timeout: float) -> bytes:
    """The body, or BodyError with the answer: 413 by Content-Length or as soon as it is over
    the limit, 408 when it takes longer than `timeout`, None when the client left."""
    length = request.headers.get("content-length")
    if length is not None:
        if not (length.isascii() and length.isdigit() and len(length) <= 18):
            raise BodyError(error(f"Content-Length {length[:20]!r} is not a byte count"))
        if int(length) > limit:
            raise BodyError(error(f"request of {length} bytes exceeds the limit of {limit}", 413))
    chunks, size = [], 0

    async def collect() -> None:
        nonlocal size
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise BodyError(error(f"request body exceeds the limit of {limit} bytes", 413))
            chunks.append(chunk)

    try:
        await asyncio.wait_for(collect(), timeout)
    except TimeoutError:
        raise BodyError(error(f"request body not received within {timeout:g}s", 408)) from None
    except ClientDisconnect:
        raise BodyError(None) from None
    return b"".join(chunks)


def sessions_in_use(state: State) -> int:
    """KV caches really in use: split sessions' pool slots and OpenAI requests running (what
    /health reports and what `max_sessions` bounds)."""
    return state.pool.held + (state.chat.load if state.chat else 0)


def sessions_admitted(state: State) -> int:
    """What `max_sessions` bounds, for both kinds of session: open split connections (each
    holds a slot or STARTs into one; paused ones count until evicted) and OpenAI requests
    running or queued. A split connection and an OpenAI request are admitted only below it."""
    return len(state.connections) + (state.chat.load if state.chat else 0)


async def health(request: Request) -> JSONResponse:
    state: State = request.app.state.edgespec
    status = "closing" if state.closing else "ok"
    if not state.gate.allows(request.headers):
        return JSONResponse({"status": status})  # liveness for load balancers, nothing more
    m = state.manifest
    return JSONResponse(
        {
            "status": status,
            "model": m.source.get("model"),
            "backbone_fingerprint": m.backbone_fingerprint,
            "sessions": sessions_in_use(state),
            "connections": len(state.connections),
            "max_sessions": state.config.max_sessions,
            "max_context": state.max_context,
            "max_request_bytes": state.config.max_request_bytes,
            "rounds_served": state.rounds,
            # prompt positions STARTs prefilled, positions resumed sessions kept instead
            **state.counters.report(state.connections),
            # tokens the OpenAI endpoints produced (a cancelled request stops adding to it)
            "completion_tokens": state.chat.stats.tokens if state.chat else 0,
            "prefill_chunks": state.worker.steps_run,
            # most prompt positions prefilled while a queued round waited (<= 2 chunks)
            "prefill_positions_before_a_round_max": state.worker.most_step_work_before_a_round,
            "rejected_tokens": state.gate.rejected,
            "max_batch": state.config.max_batch,
            "batch_window_ms": state.config.batch_window_ms,
            **state.stats.report(),
            "openai": state.chat.report() if state.chat else None,
            "streaming": state.streams.report(),
        }
    )


async def disconnected(request: Request) -> None:
    """Returns when the client disconnects (the body was read: only that can come now)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
