"""JSON read as it streams: the values a text holds so far, each with its span, and whether it
is complete — what tool-call arguments are streamed from.

`values(text)` reads consecutive JSON values (separated by whitespace, `;` or `,`) and returns
`Node`s: `start`/`end` index `text` (the value's text so far, raw), `done` says its text is
complete; objects keep their members by key, arrays their items, strings and scalars their
decoded value once done. A prefix of a text reads as a prefix of the same nodes: a member's
span only grows as text is appended, which is what makes streamed pieces of a value's text
add up to its text in the whole reply. Text that cannot be the start of JSON raises
ValueError; a scalar at the very end is not done (more digits may follow).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

SCALAR = re.compile(r"-?[0-9][0-9.eE+-]*|true|false|null|-")
SEPARATORS = " \t\r\n;,"


@dataclass
class Node:
    kind: str  # object | array | string | scalar
    start: int
    end: int = -1
    done: bool = False
    members: dict[str, Node] = field(default_factory=dict)  # an object's
    items: list[Node] = field(default_factory=list)  # an array's
    value: Any = None  # a done string's or scalar's

    def text(self, text: str) -> str:
        return text[self.start : self.end]


def _ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def read(text: str, i: int) -> Node:
    """The value starting at text[i] (not whitespace), read as far as the text goes."""
    c = text[i]
    if c == "{":
        return _object(text, i)
    if c == "[":
        return _array(text, i)
    if c == '"':
        return _string(text, i)
    m = SCALAR.match(text, i)
    if m is None:
        rest = text[i:]
        if any(word.startswith(rest) for word in ("true", "false", "null")):
            return Node("scalar", i, len(text))  # a literal cut by the end of the text
        raise ValueError(f"not JSON at {i}: {text[i : i + 12]!r}")
    node = Node("scalar", i, m.end())
    if m.end() < len(text):  # followed by something: complete
        node.value, node.done = json.loads(m.group()), True
    return node


def _string(text: str, i: int) -> Node:
    j = i + 1
    while j < len(text):
        if text[j] == "\\":
            j += 2
            continue
        if text[j] == '"':
            node = Node("string", i, j + 1, True)
            node.value = json.loads(text[i : j + 1])
            return node
        j += 1
    return Node("string", i, len(text))


def _object(text: str, i: int) -> Node:
    node = Node("object", i, len(text))
    j = _next(text, node, i, "}")
    while j >= 0:
        if text[j] != '"':
            raise ValueError(f"an object key expected at {j}")
        key = _string(text, j)
        if not key.done:
            return node
        j = _ws(text, key.end)
        if j >= len(text):
            return node
        if text[j] != ":":
            raise ValueError(f"':' expected at {j}")
        j = _ws(text, j + 1)
        if j >= len(text):
            return node
        value = node.members[key.value] = read(text, j)
        j = _next(text, node, value.end, "}", ",") if value.done else -1
    return node


def _array(text: str, i: int) -> Node:
    node = Node("array", i, len(text))
    j = _next(text, node, i, "]")
    while j >= 0:
        value = read(text, j)
        node.items.append(value)
        j = _next(text, node, value.end, "]", ",") if value.done else -1
    return node


def _next(text: str, node: Node, after: int, close: str, comma: str = "") -> int:
    """Where container `node`'s next member or item starts, past the opening bracket or the
    value ending at `after` (then a `comma` must part them), or -1: `node` ends here (at
    `close`: complete; or the text is cut short)."""
    j = _ws(text, after + (0 if comma else 1))
    if j >= len(text):
        return -1
    if text[j] == close:
        node.end, node.done = j + 1, True
        return -1
    if not comma:
        return j
    if text[j] != comma:
        raise ValueError(f"'{comma}' or '{close}' expected at {j}")
    j = _ws(text, j + 1)
    return j if j < len(text) else -1


def values(text: str) -> list[Node]:
    """Consecutive values of `text`; the last may be incomplete."""
    out: list[Node] = []
    i = 0
    while True:
        while i < len(text) and text[i] in SEPARATORS:
            i += 1
        if i >= len(text):
            return out
        node = read(text, i)
        out.append(node)
        if not node.done:
            return out
        i = node.end
