"""OpenAI-compatible endpoints of `edgespec serve`, for apps written against the `openai` client.

    POST /v1/chat/completions  the bundle's chat template, streamed (SSE) or not
    POST /v1/completions       plain text (or token id) prompts, streamed or not
    GET  /v1/models            the one model served (any `model` name is accepted)

Takes the server's config (bearer token, request size, max sessions, context) and a
`ChatEngine` decoding with the local mode the server was started with (`--mode`) on the
server's own target graphs and KV pool (`serve.chat_engine`). Guarantees
OpenAI's shapes: `chat.completion` / `chat.completion.chunk` / `text_completion` objects,
SSE streams that end with `data: [DONE]`, `usage` (with `prompt_tokens_details.cached_tokens`:
prompt positions reused from a conversation's cache) on every reply and, with
`stream_options.include_usage`, as a last chunk; errors as `{"error": {"message", "type",
"param", "code"}}` with 400 (bad request, template error, over the context), 401, 413 or 503 —
a bad request never disturbs the requests being decoded.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from edgespec.runtime.chat.session import ChatError, ChatReply, Prompt
from edgespec.runtime.chat.template import ChatTemplateError
from edgespec.runtime.chat.tool_stream import ToolStream
from edgespec.serve.chat_engine import ChatEngine, Job
from edgespec.serve.http import BodyError, busy, disconnected, read_body, sessions_admitted
from edgespec.serve.openai_requests import (
    RequestError,
    parse_chat,
    parse_completion,
    parse_json,
)
from edgespec.serve.state import State

log = logging.getLogger("edgespec.serve")
NO_TOKEN = "missing or wrong bearer token (Authorization: Bearer ...)"


def error(message: str, status: int = 400, param: str | None = None, code: str | None = None):
    kind = {401: "authentication_error", 503: "server_error", 413: "invalid_request_error"}
    body = {
        "message": message,
        "type": kind.get(status, "invalid_request_error"),
        "param": param,
        "code": code,
    }
    return JSONResponse({"error": body}, status_code=status)


async def _admit(request: Request) -> tuple[State, dict[str, Any] | Response]:
    """(server state, the parsed body) or (state, an error response)."""
    state: State = request.app.state.edgespec
    if not await state.gate.admit(request.headers, request.client):
        return state, error(NO_TOKEN, 401)
    try:  # bounded in size (by Content-Length first) and in time (`serve.http`)
        body = await read_body(request, state.config.max_request_bytes, state.config.body_timeout)
    except BodyError as e:
        return state, e.response or Response(status_code=400)  # None: the client left
    try:
        return state, parse_json(body)
    except RequestError as e:
        return state, error(str(e), param=e.param)


def _busy(state: State) -> Response | None:
    if state.closing:
        return busy("the server is shutting down: try again later")
    if sessions_admitted(state) >= state.config.max_sessions:
        return busy("the server is full: try again later")
    return None


def _usage(reply: ChatReply) -> dict[str, Any]:
    n = len(reply.tokens)
    return {
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": n,
        "total_tokens": reply.prompt_tokens + n,
        "prompt_tokens_details": {"cached_tokens": reply.cached_tokens},
    }


def _bad_prompt(e: Exception) -> Response:
    code = "context_length_exceeded" if "context" in str(e) else None
    return error(str(e), 400, code=code)


async def _serve(request: Request, kind: str, build: Callable[..., Any]) -> Response:
    """Admit, parse (`build`: the body -> (parsed request, prompt)), check load, decode."""
    state, req = await _admit(request)
    if isinstance(req, Response):
        return req
    engine: ChatEngine = state.chat
    try:
        parsed, prompt = build(req, state.max_context, engine)
    except RequestError as e:
        return error(str(e), param=e.param)
    except (ChatError, ChatTemplateError) as e:
        return _bad_prompt(e)
    full = _busy(state)
    if full is not None:
        return full
    model = parsed.model or _name(state)
    return await _respond(request, engine, prompt, kind, model, parsed.stream, parsed.include_usage)


def _chat_prompt(req: dict[str, Any], context: int, engine: ChatEngine) -> tuple[Any, Prompt]:
    parsed = parse_chat(req, context)
    # rendered and checked on a session's template, no cache touched
    return parsed, engine.sessions[0].prepare(parsed.messages, parsed.options)


def _text_prompt(req: dict[str, Any], context: int, engine: ChatEngine) -> tuple[Any, Prompt]:
    parsed = parse_completion(req, context)
    p = parsed.prompt
    ids = engine.model.tokenizer.encode(p) if isinstance(p, str) else list(p)
    return parsed, engine.sessions[0].prepare_ids(ids, parsed.options)


async def chat_completions(request: Request) -> Response:
    return await _serve(request, "chat", _chat_prompt)


async def completions(request: Request) -> Response:
    return await _serve(request, "text", _text_prompt)


async def models(request: Request) -> Response:
    state = request.app.state.edgespec
    if not await state.gate.admit(request.headers, request.client):
        return error(NO_TOKEN, 401)
    card = {"id": _name(state), "object": "model", "created": 0, "owned_by": "edgespec"}
    return JSONResponse({"object": "list", "data": [card]})


def _name(state: State) -> str:
    return str(state.manifest.source.get("model") or "edgespec")


# -- answering ------------------------------------------------------------------------------
class _Shape:
    """The OpenAI objects of one reply, chat or text completion."""

    def __init__(self, kind: str, model: str, tool_style: str | None = None) -> None:
        self.kind, self.model, self.created = kind, model, int(time.time())
        # chat with tools: calls in the reply become tool_calls (streamed: ToolStream's deltas)
        self.tools = ToolStream(tool_style) if tool_style and kind == "chat" else None
        self.calls = 0
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex[:24]}"

    def _base(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def whole(self, reply: ChatReply) -> dict[str, Any]:
        if self.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": reply.text}
            if reply.tool_calls:
                message["content"] = reply.content
                message["tool_calls"] = [c.openai() for c in reply.tool_calls]
            choice = {
                "index": 0,
                "message": message,
                "finish_reason": reply.finish_reason,
                "logprobs": None,
            }
            return {**self._base("chat.completion"), "choices": [choice], "usage": _usage(reply)}
        choice = {"index": 0, "text": reply.text, "finish_reason": reply.finish_reason}
        choice["logprobs"] = None
        return {**self._base("text_completion"), "choices": [choice], "usage": _usage(reply)}

    def chunk(self, text: str | None, finish: str | None, role: bool = False) -> dict[str, Any]:
        if self.kind == "chat":
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
            return {**self._base("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
        return {**self._base("text_completion"), "choices": [choice]}

    def pieces(self, text: str, final: bool = False) -> list[dict[str, Any]]:
        """The chunks of a piece of reply text: content deltas, and with tools OpenAI's call
        deltas: {index, id, type, function: {name, arguments: ""}} when a call's name is
        complete, then {index, function: {arguments: piece}} as its arguments decode."""
        if self.tools is None:
            return [self.chunk(text, None)] if text else []
        out = []
        for what, value in self.tools.push(text, final):
            if what == "content":
                out.append(self.chunk(value, None))
                continue
            if what == "call":
                delta = value.openai(self.calls)
                self.calls += 1
            else:
                index, piece = value
                delta = {"index": index, "function": {"arguments": piece}}
            chunk = self.chunk(None, None)
            chunk["choices"][0]["delta"]["tool_calls"] = [delta]
            out.append(chunk)
        return out

    def usage_chunk(self, reply: ChatReply) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {**self._base(obj), "choices": [], "usage": _usage(reply)}


def _sse(obj: dict[str, Any] | str) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


def _failure(e: BaseException) -> tuple[str, int, str | None]:
    if isinstance(e, ChatError | ChatTemplateError | ValueError):
        return str(e), 400, None
    return f"decoding failed: {e}", 500, None


async def _respond(
    request: Request,
    engine: ChatEngine,
    prompt: Prompt,
    kind: str,
    model: str,
    stream: bool,
    usage: bool,
) -> Response:
    shape = _Shape(kind, model, prompt.tool_style)
    job = engine.submit(prompt)
    if stream:
        return StreamingResponse(
            _stream(engine, job, shape, usage),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )
    gone = asyncio.ensure_future(disconnected(request))  # a client that left stops its decode
    try:
        while True:
            answer = asyncio.ensure_future(job.queue.get())
            await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not answer.done():
                answer.cancel()
                return Response(status_code=499)  # nobody is there to read it
            what, payload = answer.result()
            if what == "done":
                return JSONResponse(shape.whole(payload))
            if what == "error":
                message, status, code = _failure(payload)
                return error(message, status, code=code)
    finally:
        gone.cancel()
        engine.cancel(job)  # a no-op once done; frees the session if the client left


async def _stream(engine: ChatEngine, job: Job, shape: _Shape, usage: bool) -> AsyncIterator[bytes]:
    """The SSE events of one reply. Its 200 headers are out before the first event, so a
    failure after them cannot become a status: it ends the stream with an error event and
    `[DONE]`, as a decoding error does (a client that left is not written to)."""
    try:
        async for event in _events(job, shape, usage):
            yield event
    except Exception as e:
        log.exception("a streamed reply failed after its headers")
        err = {"message": f"the reply failed ({type(e).__name__})", "type": "server_error"}
        yield _sse(json.dumps({"error": err | {"param": None, "code": None, "status": 500}}))
        yield _sse("[DONE]")
    finally:
        engine.cancel(job)


async def _events(job: Job, shape: _Shape, usage: bool) -> AsyncIterator[bytes]:
    if shape.kind == "chat":
        yield _sse(shape.chunk(None, None, role=True) | ({"usage": None} if usage else {}))
    while True:
        what, payload = await job.queue.get()
        if what == "chunk":
            for piece in shape.pieces(payload.text):
                yield _sse(piece | ({"usage": None} if usage else {}))
            continue
        if what == "done":
            for piece in shape.pieces("", final=True):
                yield _sse(piece | ({"usage": None} if usage else {}))
            reason = "tool_calls" if shape.calls else payload.finish_reason
            finish = shape.chunk(None, reason)
            yield _sse(finish | ({"usage": None} if usage else {}))
            if usage:
                yield _sse(shape.usage_chunk(payload))
        else:
            message, status, code = _failure(payload)
            err = {"message": message, "type": "invalid_request_error", "code": code}
            yield _sse({"error": err | {"param": None, "status": status}})
        yield _sse("[DONE]")
        return


ROUTES = [
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/models", models, methods=["GET"]),
]
