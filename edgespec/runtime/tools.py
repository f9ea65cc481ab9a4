"""Tool calls: the model's own tool-call format read back into OpenAI-style calls, and
`tool_choice` "required" / a named function enforced through the grammar engine.

Takes the chat template that rendered the tools (its text names the family's format) and the
reply text; gives `ToolCall`s (name, arguments as a JSON string, an id) and the text around
them. Formats, by what the template writes:

  hermes     Qwen 2.5 / 3, Hermes: `<tool_call>\n{"name": .., "arguments": {..}}\n</tool_call>`
             (one block per call)
  mistral    `[TOOL_CALLS] [{"name": .., "arguments": {..}}, ..]`
  phi4       Phi-4-mini: `functools[{"name": .., "arguments": {..}}, ..]`
  llama3     Llama 3.x JSON: `{"name": .., "parameters": {..}}` (`<|python_tag|>` before it
             or `; ` between calls allowed)
  pythonic   Gemma (and Llama 3.2's alternative): `[get_weather(city="Paris"), ..]` or a
             ```tool_code``` block of such calls; arguments are Python literals
A reply that does not parse as calls is content, never an error. `ToolStream` does the same
on streamed text: content is released as it comes except what may open a call, and each call
is released whole once its text is complete (OpenAI's deltas: index, id, name, arguments).
`required_grammar` builds the llguidance grammar (Lark with inline JSON schemas) that makes
the reply one or more calls of the given tools in the family's format, the arguments valid
against each tool's parameters schema.
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from edgespec.runtime.grammar import JSON_OPTIONS, Grammar, from_lark, from_response_format

TokenId = Callable[[str], "int | None"]

STYLES = ("hermes", "mistral", "phi4", "llama3", "pythonic")
# where each style's calls begin in a reply (None: the whole reply is calls or it is content)
OPENERS: dict[str, str | None] = {
    "hermes": "<tool_call>",
    "mistral": "[TOOL_CALLS]",
    "phi4": "functools[",
    "llama3": None,
    "pythonic": None,
}


@dataclass
class ToolCall:
    name: str
    arguments: str  # a JSON object, as OpenAI sends it
    id: str = ""

    def __post_init__(self) -> None:
        self.id = self.id or f"call_{uuid.uuid4().hex[:24]}"

    def openai(self, index: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "type": "function"}
        out["function"] = {"name": self.name, "arguments": self.arguments}
        return out if index is None else {"index": index, **out}


def style_of(template: str) -> str:
    """The tool-call format a chat template's text teaches its model."""
    if "<tool_call>" in template:
        return "hermes"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "functools" in template or "<|tool|>" in template:
        return "phi4"
    if "<|python_tag|>" in template or "<|start_header_id|>" in template:
        return "llama3"
    return "pythonic"


def check_tools(tools: Any) -> dict[str, dict]:
    """name -> parameters schema of OpenAI-style tools; raises ValueError naming a bad one."""
    out = {}
    for i, t in enumerate(tools or []):
        f = t.get("function") if isinstance(t, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not f["name"]:
            raise ValueError(
                f'tools[{i}] must be {{"type": "function", "function": {{"name": ..}}}}'
            )
        params = f.get("parameters", {"type": "object"})
        if not isinstance(params, dict):
            raise ValueError(f"tools[{i}].function.parameters must be a JSON schema object")
        out[f["name"]] = params
    return out


# -- reading calls ------------------------------------------------------------------------
def _call(obj: Any, args_key: str = "arguments") -> ToolCall:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ValueError("not a call")
    if isinstance(obj.get("function"), dict):  # {"type": "function", "function": {...}}
        return _call(obj["function"])
    args = obj.get(args_key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(args, str):
        args = json.loads(args)
    if not isinstance(args, dict):
        raise ValueError("arguments are not an object")
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False), str(obj.get("id") or ""))


def _json_values(text: str) -> list[Any]:
    """Consecutive JSON values in text (separated by whitespace, `;` or `,`)."""
    dec, i, out = json.JSONDecoder(), 0, []
    while True:
        while i < len(text) and text[i] in " \t\r\n;,":
            i += 1
        if i >= len(text):
            return out
        value, i = dec.raw_decode(text, i)
        out.append(value)


def _listed(text: str) -> list[ToolCall]:
    values = _json_values(text)
    items = values[0] if len(values) == 1 and isinstance(values[0], list) else values
    return [_call(v) for v in items]


def _pythonic(text: str) -> list[ToolCall]:
    body = text.strip()
    m = re.fullmatch(r"```(?:tool_code|python)?\s*(.*?)\s*```", body, re.S)
    if m:
        body = m.group(1)
    tree = ast.parse(body if body.startswith("[") else f"[{body}]", mode="eval").body
    if not isinstance(tree, ast.List | ast.Tuple):
        raise ValueError("not a list of calls")
    calls = []
    for node in tree.elts:
        if not isinstance(node, ast.Call) or node.args:
            raise ValueError("not a keyword call")
        name = ast.unparse(node.func)
        args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
        calls.append(ToolCall(name, json.dumps(args, ensure_ascii=False)))
    return calls


def parse(text: str, style: str) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) of a whole reply; a reply that is not calls is all content."""
    try:
        if style == "hermes":
            blocks = re.findall(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", text, re.S)
            calls = [c for b in blocks for c in _listed(b)]
            content = text.split("<tool_call>", 1)[0].strip()
        elif style in ("mistral", "phi4"):
            opener = OPENERS[style]
            assert opener is not None
            if opener not in text:
                return text, []
            content, rest = text.split(opener, 1)
            if style == "phi4":
                rest = "[" + rest
            calls, content = _listed(rest.strip()), content.strip()
        elif style == "llama3":
            body = text.strip().removeprefix("<|python_tag|>")
            calls, content = _listed(body) if body.startswith("{") else [], ""
        else:
            body = text.strip()
            calls, content = [], ""
            if body[:1] in "[`":
                try:
                    calls = _pythonic(body)
                except (ValueError, SyntaxError):
                    calls = _listed(body)  # calls written as JSON objects
    except (ValueError, SyntaxError, json.JSONDecodeError, TypeError, AssertionError):
        return text, []
    if not calls:
        return text, []
    return content or None, calls


class ToolStream:
    """Streamed reply text in, ("content", text) / ("call", ToolCall) events out."""

    def __init__(self, style: str) -> None:
        self.style, self.opener = style, OPENERS[style]
        self.held = ""
        self.in_calls = False
        self.emitted = 0  # calls already released
        self.all_calls = style in ("llama3", "pythonic")  # such a reply is calls or content

    def push(self, text: str, final: bool = False) -> Iterator[tuple[str, Any]]:
        self.held += text
        if self.all_calls:
            # hold a reply that may be calls whole; anything else is content at once
            looks = self.held.lstrip()[:1] in ("{", "[", "`", "<", "")
            if not looks and self.emitted == 0 and not self.in_calls:
                yield "content", self.held
                self.held, self.all_calls = "", False
                return
            if final:
                content, calls = parse(self.held, self.style)
                if calls:
                    yield from (("call", c) for c in calls)
                else:
                    yield "content", self.held
                self.held = ""
            return
        if self.opener is None or not self.in_calls:
            cut = self.held.find(self.opener) if self.opener else -1
            if cut < 0:
                keep = 0 if final or not self.opener else _partial(self.held, self.opener)
                out, self.held = (
                    self.held[: len(self.held) - keep],
                    self.held[len(self.held) - keep :],
                )
                if out:
                    yield "content", out
                if not final:
                    return
            else:
                before, self.held = self.held[:cut], self.held[cut:]
                self.in_calls = True
                if before.strip():
                    yield "content", before.rstrip()
        if self.in_calls:
            yield from self._calls(final)

    def _calls(self, final: bool) -> Iterator[tuple[str, Any]]:
        """Release calls whose text is complete (a closed block; the end of the reply)."""
        if self.style == "hermes":
            closed = self.held.rfind("</tool_call>")
            text = self.held if final else self.held[: closed + len("</tool_call>")]
            if closed < 0 and not final:
                return
        elif not final:
            return
        else:
            text = self.held
        _, calls = parse(text, self.style)
        if not calls and final:
            yield "content", self.held
            self.held = ""
            return
        for c in calls[self.emitted :]:
            yield "call", c
        self.emitted = max(self.emitted, len(calls))
        if final:
            self.held = ""


def _partial(text: str, opener: str) -> int:
    for n in range(min(len(opener) - 1, len(text)), 0, -1):
        if opener.startswith(text[-n:]):
            return n
    return 0


# -- enforcing calls ------------------------------------------------------------------------
def reply_format(
    options: Any, tools: Any, template: str, token_id: TokenId
) -> tuple[str | None, Grammar | None]:
    """For a chat request's options (`ChatOptions`): the tool-call format its reply is read in
    (None: calls are not read) and the grammar it must follow (its response_format's, or a
    tool_choice that forces calls). ValueError naming what cannot be served."""
    grammar = from_response_format(options.response_format)
    choice = options.tool_choice
    style = style_of(template) if tools and choice != "none" else None
    forced = choice_grammar(tools, choice, style, token_id)
    if forced is not None and grammar is not None:
        raise ValueError("give a response_format or a tool_choice that forces calls, not both")
    if (grammar or forced) is not None and options.ignore_eos:
        raise ValueError("ignore_eos: a response_format ends where its grammar ends")
    return style, grammar or forced


def choice_grammar(
    tools: Any, choice: Any, style: str | None, token_id: TokenId = lambda text: None
) -> Grammar | None:
    """The grammar a tool_choice of "required" or a named function asks for (None for "auto"
    and "none"); raises ValueError naming what is wrong with the choice. `token_id`: the id
    of a marker the vocabulary holds as one token (Qwen's `<tool_call>`), else None."""
    if choice in ("auto", "none", None):
        return None
    named = check_tools(tools)
    if not named:
        raise ValueError(f"tool_choice {choice!r} needs tools: give the tools to choose from")
    name = None
    if choice != "required":
        f = choice.get("function") if isinstance(choice, dict) else None
        name = f.get("name") if isinstance(f, dict) else None
        if not isinstance(name, str):
            raise ValueError(
                'tool_choice must be "auto", "none", "required" or {"type": "function", '
                '"function": {"name": ...}}'
            )
        if name not in named:
            raise ValueError(f"tool_choice names {name!r}, which is not among the tools given")
    return required_grammar(style or "hermes", named, name, token_id)


def required_grammar(
    style: str,
    tools: dict[str, dict],
    name: str | None = None,
    token_id: TokenId = lambda text: None,
) -> Grammar:
    """A grammar whose replies are calls (one call of `name`, or one or more of any tool) in
    the family's format, with arguments valid against the tool's parameters schema. A marker
    the vocabulary holds as one token must be that token (as the model writes it)."""

    def lit(text: str) -> str:
        i = token_id(text)
        return f"<[{i}]>" if i is not None else json.dumps(text)

    chosen = {name: tools[name]} if name is not None else tools
    args_key = "parameters" if style == "llama3" else "arguments"
    one_of = [
        {
            "type": "object",
            "properties": {"name": {"const": n}, args_key: schema},
            "required": ["name", args_key],
            "additionalProperties": False,
        }
        for n, schema in chosen.items()
    ]
    schema = {"anyOf": one_of} if len(one_of) > 1 else one_of[0]
    call = "%json " + json.dumps({**schema, "x-guidance": JSON_OPTIONS})

    def calls(first: str, sep: str) -> str:  # one call of a named tool, else one or more
        return first if name is not None else f"{first} ({sep} {first})*"

    comma = '", "'
    if style == "hermes":
        block = f'{lit("<tool_call>")} "\\n" call "\\n" {lit("</tool_call>")}'
        body = calls(block, '"\\n"')
    elif style == "mistral":
        body = f'{lit("[TOOL_CALLS]")} " [" {calls("call", comma)} "]"'
    elif style == "phi4":
        body = f'"functools[" {calls("call", comma)} "]"'
    elif style == "llama3":
        body = calls("call", '"; "')
    else:  # pythonic: a JSON-schema'd Python call is not expressible here; calls as JSON
        body = f'"[" {calls("call", comma)} "]"'
    lark = f"start: {body}\ncall: {call}\n"
    return from_lark(lark, f"tool_choice ({style})")
