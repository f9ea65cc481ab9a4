"""The server's plain HTTP endpoints: `/health` and OpenAI-style `POST /v1/completions`.

Guarantees: a body is refused by its `Content-Length` before a byte of it is read (413), read
at most up to `max_request_bytes` (413 as soon as it is over), and within `body_timeout`
seconds (408); a client that disconnects while sending it gets nothing and leaves no
traceback. Every field is checked by `serve.requests` (400 naming the field). "No free slot"
is 503 with `Retry-After`. A completion whose client disconnects is cancelled between two
tokens and its slot freed. `/health` answers everyone with liveness only; the model, the
load and the batching statistics need the token when one is configured.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from edgespec import protocol as P
from edgespec.serve import requests as R
from edgespec.serve.auth import client_address
from edgespec.serve.session import ServerSession, prefill, release_all

if TYPE_CHECKING:
    from edgespec.serve.server import State

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
        if not length.isdigit():
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
            "sessions": state.pool.held,  # KV slots really held (WebSocket and completions)
            "connections": len(state.connections),
            "max_sessions": state.config.max_sessions,
            "max_context": state.max_context,
            "max_request_bytes": state.config.max_request_bytes,
            "rounds_served": state.rounds,
            "completion_tokens": state.completion_tokens,
            "prefill_chunks": state.worker.steps_run,
            # most prompt positions prefilled while a queued round waited (<= 2 chunks)
            "prefill_positions_before_a_round_max": state.worker.most_step_work_before_a_round,
            "rejected_tokens": state.gate.rejected,
            "max_batch": state.config.max_batch,
            "batch_window_ms": state.config.batch_window_ms,
            **state.stats.report(),
        }
    )


async def completions(request: Request) -> Response:
    """OpenAI-style `POST /v1/completions` (no streaming): the server decodes alone."""
    state: State = request.app.state.edgespec
    if not state.gate.allows(request.headers):
        await state.gate.refuse(client_address(request.client))
        return error("missing or wrong bearer token", 401)
    try:
        body = await read_body(request, state.config.max_request_bytes, state.config.body_timeout)
        msg, max_tokens, ignore_eos = completion_request(state, body)
    except BodyError as e:
        return e.response or Response(status_code=400)  # None: nobody is listening
    except ValueError as e:
        return error(str(e))
    if state.closing:
        return busy("the server is shutting down: try again later or elsewhere")
    decode = asyncio.ensure_future(_complete(state, msg, max_tokens, ignore_eos))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait([decode, gone], return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not decode.done():  # the client left: stop decoding (the slot is freed in its finally)
        decode.cancel()
        await asyncio.gather(decode, return_exceptions=True)
        return Response(status_code=499)
    try:
        tokens, finish = decode.result()
    except P.ProtocolError as e:
        if e.code == P.UNAVAILABLE:
            return busy(str(e))
        return error(str(e))
    sid = next(state.ids)
    tokenizer = state.tokenizer
    text = tokenizer.decode(
        [t for t in tokens if tokenizer.id_to_token(t) is not None], skip_special_tokens=True
    )
    return JSONResponse(
        {
            "id": f"cmpl-{sid}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": state.manifest.source.get("model"),
            "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}],
            "usage": {
                "prompt_tokens": len(msg.ids),
                "completion_tokens": len(tokens),
                "total_tokens": len(msg.ids) + len(tokens),
            },
        }
    )


async def _disconnected(request: Request) -> None:
    """Returns when the client disconnects (the body was read: only that can come now)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def completion_request(state: State, body: bytes) -> tuple[P.Start, int, bool]:
    try:
        req = json.loads(body or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"the body is not JSON: {e}") from None
    except RecursionError:
        raise ValueError("the body nests JSON too deeply") from None
    if not isinstance(req, dict):
        raise ValueError("the body must be a JSON object")
    if req.get("stream"):
        raise ValueError("stream=true is not supported: use the /v1/session WebSocket")
    vocab = state.manifest.target.vocab_size
    prompt = req.get("prompt")
    if isinstance(prompt, str) and prompt:
        ids = state.tokenizer.encode(prompt)
    elif (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt)
    ):
        ids = prompt
    else:
        raise ValueError("prompt must be a non-empty string or a list of token ids")
    if any(not 0 <= i < vocab for i in ids):
        raise ValueError(f"prompt token ids must be in 0..{vocab - 1}")
    max_tokens = R.integer(req, "max_tokens", 16, 1, 1 << 30)  # capped by the context
    assert max_tokens is not None
    s = R.sampling(req, vocab)
    ignore_eos = req.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise R.FieldError("ignore_eos", f"{ignore_eos!r} is not true or false")
    start = P.Start(ids, len(ids) + max_tokens, s.temperature, s.top_p, s.top_k, s.seed)
    return start, max_tokens, ignore_eos


async def _complete(state: State, msg: P.Start, max_tokens: int, ignore_eos: bool):
    """Plain decoding, one round per token, batched with other sessions' rounds."""
    held: list[ServerSession] = []
    try:
        session, reply = await state.worker.steps(
            prefill,
            state.pool,
            state.stages,
            msg,
            state.max_context,
            held,
            state.config.prefill_chunk,
            state.config.prefill_budget_ms / 1000,
        )
        stop = frozenset() if ignore_eos else frozenset(state.manifest.eos_token_ids)
        tokens = [reply.token]
        while True:
            state.completion_tokens += 1
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
