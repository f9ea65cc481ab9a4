"""Strict parsing of OpenAI chat / completion request bodies into `ChatOptions`.

Takes the raw JSON body; guarantees that what it returns is well typed and in range (finite
numbers, integer counts, known roles, text-only content) or raises `RequestError` naming the
field (`param`) and what is allowed, which the endpoint answers as an OpenAI-shaped 400.
Fields the API defines but edgespec does not implement are refused when set to anything but
their neutral value (n > 1, penalties, logprobs), never silently ignored. A response_format is
compiled here (runtime/grammar/engine.py), so a bad schema is refused before any work.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from edgespec.runtime.chat.session import ChatOptions
from edgespec.runtime.chat.template import RENDER_ARGUMENTS
from edgespec.runtime.grammar.constraints import GrammarError
from edgespec.runtime.grammar.engine import Grammar, from_response_format
from edgespec.serve import requests as R

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_STOP = 4
MAX_DEPTH = 64  # JSON nesting levels a body may use (a tool's schema needs a handful)


class RequestError(ValueError):
    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param, self.code = param, code


@dataclass
class ChatRequest:
    messages: list[dict[str, Any]]
    options: ChatOptions
    stream: bool
    include_usage: bool
    model: str | None


@dataclass
class CompletionRequest:
    prompt: str | list[int]
    options: ChatOptions
    stream: bool
    include_usage: bool
    model: str | None


def parse_json(body: bytes) -> dict[str, Any]:
    """The body as a JSON object whose every string is Unicode text and whose nesting is at
    most MAX_DEPTH levels, or a RequestError naming the field that is not.

    NaN / Infinity parse as floats, and so do integers too long for Python's int-string
    limit (4,300 digits: past every range here): the field they stand in is refused by name
    below, as `1e400` is. A lone UTF-16 surrogate ("\\ud800") is valid JSON but not text: no
    tokenizer, template or JSON encoder takes it. Deep nesting would exhaust the template's
    recursion; no request field needs more than a few levels."""
    try:
        req = json.loads(body or b"", parse_int=R.json_int)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(f"the body is not valid JSON ({e})") from None
    except RecursionError:
        raise RequestError(f"the body is nested deeper than {MAX_DEPTH} levels") from None
    if not isinstance(req, dict):
        raise RequestError("the body must be a JSON object")
    _check_tree(req)
    return req


def _check_tree(req: dict[str, Any]) -> None:
    """Every key and string value Unicode text, every value at most MAX_DEPTH levels deep."""
    stack: list[tuple[Any, str, int]] = [(req, "", 0)]
    while stack:
        value, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise RequestError(
                f"{where} is nested deeper than {MAX_DEPTH} levels: flatten it", where
            )
        if isinstance(value, dict):
            for k, v in value.items():
                name = f"{where}.{_printable(k)}" if where else _printable(k)
                _text(k, name)
                stack.append((v, name, depth + 1))
        elif isinstance(value, list):
            stack.extend((v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value))
        elif isinstance(value, str):
            _text(value, where)


def _text(value: str, where: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = _printable(value[e.start : e.end])
        raise RequestError(
            f"{where} holds a lone UTF-16 surrogate ({bad}), which is not text: send UTF-8 "
            "text (a character past U+FFFF as a surrogate pair)",
            where,
        ) from None


def _printable(text: str) -> str:
    """`text` with lone surrogates as \\uXXXX escapes (safe to echo in a UTF-8 answer)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _field(check: Any, *args: Any) -> Any:
    """`serve.requests`' checks (shared with START and every endpoint), as RequestErrors."""
    try:
        return check(*args)
    except R.FieldError as e:
        raise RequestError(str(e), e.field) from None


def _number(req: dict, name: str, low: float, high: float, low_open: bool = False) -> float | None:
    if req.get(name) is None:
        return None
    v = _field(R.number, req, name, None, low, high)
    if low_open and v == low:
        raise RequestError(f"{name}: {v:g} is outside ({low:g}, {high:g}]", name)
    return v


def _integer(req: dict, name: str, low: int, high: int) -> int | None:
    return _field(R.integer, req, name, None, low, high)


def _bool(req: dict, name: str) -> bool:
    v = req.get(name, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise RequestError(f"{name} must be true or false", name)
    return v


def _unsupported(req: dict) -> None:
    if req.get("n") not in (None, 1):
        raise RequestError("n must be 1: edgespec returns one choice per request", "n")
    for name in ("frequency_penalty", "presence_penalty"):
        if req.get(name) not in (None, 0, 0.0):
            raise RequestError(f"{name} is not supported (leave it at 0)", name)
    if req.get("logprobs") not in (None, False, 0) or req.get("top_logprobs") not in (None, 0):
        raise RequestError("logprobs are not supported", "logprobs")
    if req.get("logit_bias"):
        raise RequestError("logit_bias is not supported", "logit_bias")


def _options(req: dict, context: int, flags: dict[str, Any] | None = None) -> ChatOptions:
    _unsupported(req)
    max_tokens = _integer(req, "max_completion_tokens", 1, context)
    if max_tokens is None:
        max_tokens = _integer(req, "max_tokens", 1, context)
    stop = req.get("stop")
    if stop is None:
        stops: list[str] = []
    elif isinstance(stop, str):
        stops = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = list(stop)
    else:
        raise RequestError("stop must be a string or a list of strings", "stop")
    if len(stops) > MAX_STOP or any(not s for s in stops):
        raise RequestError(f"stop takes at most {MAX_STOP} non-empty strings", "stop")
    top_k = _integer(req, "top_k", -1, 1 << 20)
    return ChatOptions(
        max_new_tokens=max_tokens if max_tokens is not None else min(256, context),
        temperature=_temperature(req),
        top_p=_number(req, "top_p", 0, 1, low_open=True),
        top_k=None if top_k is None else max(top_k, 0),  # vLLM's -1 means off, as 0 does here
        seed=_integer(req, "seed", 0, (1 << 63) - 1),
        stop=stops,
        ignore_eos=_bool(req, "ignore_eos"),
        flags=flags or {},
        response_format=_response_format(req),
    )


def _response_format(req: dict) -> Grammar | None:
    """json_object / json_schema compiled here: a bad schema is a 400 naming the problem
    (json_schema's `strict` is always honoured: every token follows the schema)."""
    try:
        grammar = from_response_format(req.get("response_format"))
    except GrammarError as e:
        raise RequestError(str(e), "response_format") from None
    if grammar is not None and _bool(req, "ignore_eos"):
        raise RequestError("ignore_eos: a response_format ends where it ends", "ignore_eos")
    return grammar


def _temperature(req: dict) -> float | None:
    t = _number(req, "temperature", 0, 2)
    return None if t is None else _field(R.temperature, t)


def _stream(req: dict) -> tuple[bool, bool]:
    stream = _bool(req, "stream")
    so = req.get("stream_options")
    if so is None:
        return stream, False
    if not stream:
        raise RequestError("stream_options needs stream: true", "stream_options")
    if not isinstance(so, dict):
        raise RequestError("stream_options must be an object", "stream_options")
    return stream, _bool(so, "include_usage")


def _model(req: dict) -> str | None:
    m = req.get("model")
    if m is not None and not isinstance(m, str):
        raise RequestError("model must be a string", "model")
    return m


def _content(value: Any, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for j, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") != "text":
                raise RequestError(
                    f"{where}[{j}] is not a text part: edgespec serves text-only models",
                    f"{where}[{j}]",
                )
            if not isinstance(part.get("text"), str):
                raise RequestError(f"{where}[{j}].text must be a string", f"{where}[{j}].text")
            texts.append(part["text"])
        return "\n".join(texts)
    raise RequestError(f"{where} must be a string or a list of text parts", where)


def parse_chat(req: dict[str, Any], context: int) -> ChatRequest:
    messages = req.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of messages", "messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise RequestError(f"{where} must be an object with role and content", where)
        role = m.get("role")
        if role not in ROLES:
            raise RequestError(
                f"{where}.role {role!r} is not one of: {', '.join(ROLES)}", f"{where}.role"
            )
        content = _content(m.get("content"), f"{where}.content")
        if content is None and not (role == "assistant" and m.get("tool_calls")):
            raise RequestError(f"{where}.content is missing", f"{where}.content")
        # templates know "system"; OpenAI's newer name for it is "developer"
        msg = {**m, "role": "system" if role == "developer" else role, "content": content}
        out.append({k: v for k, v in msg.items() if v is not None})
    tools = req.get("tools")
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
    ):
        raise RequestError("tools must be a list of tool objects", "tools")
    flags = req.get("chat_template_kwargs")  # vLLM's extension, e.g. {"enable_thinking": false}
    if flags is not None and not isinstance(flags, dict):
        raise RequestError("chat_template_kwargs must be an object", "chat_template_kwargs")
    taken = sorted(set(flags or ()) & set(RENDER_ARGUMENTS))
    if taken:
        raise RequestError(
            f"chat_template_kwargs.{taken[0]}: the server sets {', '.join(RENDER_ARGUMENTS)} "
            "itself (messages and tools are fields of the request): drop it",
            f"chat_template_kwargs.{taken[0]}",
        )
    options = _options(req, context, flags)
    options.tools = tools or None
    options.tool_choice = _tool_choice(req, tools)
    stream, usage = _stream(req)
    return ChatRequest(out, options, stream, usage, _model(req))


def _tool_choice(req: dict, tools: list | None) -> Any:
    """tool_choice as given ("auto" without one); forcing choices are compiled into the
    prompt's grammar when it is prepared (an unknown name is a 400 there)."""
    choice = req.get("tool_choice")
    if choice is None:
        return "auto"
    if choice in ("auto", "none", "required"):
        if choice == "required" and not tools:
            raise RequestError('tool_choice "required" needs tools', "tool_choice")
        return choice
    f = choice.get("function") if isinstance(choice, dict) else None
    if not isinstance(f, dict) or not isinstance(f.get("name"), str):
        raise RequestError(
            'tool_choice must be "auto", "none", "required" or {"type": "function", '
            '"function": {"name": ...}}',
            "tool_choice",
        )
    names = [t.get("function", {}).get("name") for t in tools or [] if isinstance(t, dict)]
    if f["name"] not in names:
        raise RequestError(f"tool_choice names {f['name']!r}, not one of the tools", "tool_choice")
    return choice


def parse_completion(req: dict[str, Any], context: int) -> CompletionRequest:
    prompt = req.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise RequestError("prompt is empty: give some text", "prompt")
    elif not (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt)
    ):
        raise RequestError("prompt must be a non-empty string or a list of token ids", "prompt")
    if req.get("echo"):
        raise RequestError("echo is not supported", "echo")
    if req.get("suffix"):
        raise RequestError("suffix is not supported", "suffix")
    stream, usage = _stream(req)
    return CompletionRequest(prompt, _options(req, context), stream, usage, _model(req))
