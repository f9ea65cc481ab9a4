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
A reply that does not parse as calls is content, never an error. A call's `arguments` is the
text the model wrote for its arguments object (as OpenAI sends it; a JSON string's value when
the model wrote one), checked to be a JSON object; `runtime.chat.tool_stream` streams the same text
in pieces as it decodes.
`required_grammar` builds the llguidance grammar (Lark with inline JSON schemas) that makes
the reply one or more calls of the given tools in the family's format, the arguments valid
against each tool's parameters schema.
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edgespec.runtime.grammar import partial_json
from edgespec.runtime.grammar.engine import JSON_OPTIONS, Grammar, from_lark, from_response_format
from edgespec.runtime.grammar.partial_json import Node

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
def _call(node: Node, text: str) -> ToolCall:
    """A complete call object: {"name": .., "arguments" | "parameters": {..}}, or OpenAI's
    {"type": "function", "function": {..}}."""
    name, args, ident = call_parts(node, text)
    if name is None or not node.done:
        raise ValueError("not a call")
    arguments = arguments_text(args, text, done=True)
    if arguments is None or not isinstance(json.loads(arguments), dict):
        raise ValueError("arguments are not an object")
    return ToolCall(name, arguments, ident)


def call_parts(node: Node, text: str) -> tuple[str | None, Node | None, str]:
    """(name once complete, the arguments' node, the id) of a call object read so far."""
    if node.kind != "object":
        raise ValueError("not a call")
    wrapped = node.members.get("function")
    if wrapped is not None and wrapped.kind == "object":
        return call_parts(wrapped, text)
    name = node.members.get("name")
    if name is not None and name.done and not isinstance(name.value, str):
        raise ValueError("a call's name is not a string")
    args = node.members.get("arguments", node.members.get("parameters"))
    ident = node.members.get("id")
    return (
        name.value if name is not None and name.done else None,
        args,
        str(ident.value) if ident is not None and ident.done and ident.value else "",
    )


def arguments_text(args: Node | None, text: str, done: bool) -> str | None:
    """The arguments' text so far: an object's own text (growing as it streams), a string's
    value once complete, "{}" for a complete call without arguments; None: not yet known."""
    if args is None:
        return "{}" if done else None
    if args.kind == "object":
        return args.text(text)
    if args.kind == "string":
        return args.value if args.done else None
    raise ValueError("arguments are not an object")


def call_nodes(text: str) -> list[Node]:
    """The call objects of a calls text: a JSON array of them, or consecutive objects."""
    nodes = partial_json.values(text)
    return nodes[0].items if len(nodes) == 1 and nodes[0].kind == "array" else nodes


def _listed(text: str) -> list[ToolCall]:
    nodes = partial_json.values(text)
    if not all(n.done for n in nodes):
        raise ValueError("the calls' text is cut short")
    return [_call(n, text) for n in call_nodes(text)]


def calls_texts(text: str, style: str, final: bool = True) -> list[str]:
    """The texts holding a reply's JSON calls, in order (hermes: one per block); while
    streaming (not final) without what may be the start of a block's closing tag."""
    if style == "hermes":
        blocks = re.findall(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", text, re.S)
        if blocks and not final and not text.rstrip().endswith("</tool_call>"):
            last = blocks[-1]
            blocks[-1] = last[: len(last) - partial_prefix(last, "</tool_call>")]
        return blocks
    if style in ("mistral", "phi4"):
        opener = OPENERS[style]
        assert opener is not None
        if opener not in text:
            return []
        rest = text.split(opener, 1)[1]
        return [("[" if style == "phi4" else "") + rest.strip()]
    return [text.strip().removeprefix("<|python_tag|>")]


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
            calls = [c for b in calls_texts(text, style) for c in _listed(b)]
            content = text.split("<tool_call>", 1)[0].strip()
        elif style in ("mistral", "phi4"):
            opener = OPENERS[style]
            assert opener is not None
            if opener not in text:
                return text, []
            calls = [c for b in calls_texts(text, style) for c in _listed(b)]
            content = text.split(opener, 1)[0].strip()
        elif style == "llama3":
            (body,) = calls_texts(text, style)
            calls, content = _listed(body) if body.startswith("{") else [], ""
        else:
            body = text.strip()
            calls, content = [], ""
            if body[:1] in "[`":
                try:
                    calls = _pythonic(body)
                except (ValueError, SyntaxError):
                    calls = _listed(body)  # calls written as JSON objects
    except (ValueError, SyntaxError, TypeError, AssertionError, RecursionError):
        return text, []
    if not calls:
        return text, []
    return content or None, calls


def partial_prefix(text: str, opener: str) -> int:
    """Length of the longest end of `text` that begins `opener`."""
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
