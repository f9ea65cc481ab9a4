"""Tool calls read from streamed reply text, as OpenAI streams them.

`ToolStream(style).push(text, final)` takes reply text as it decodes and yields events:
("content", text) for text that is not a call (released as it comes, except what may open a
call), ("call", ToolCall) when a call's name is complete (its id and name; arguments ""),
then ("arguments", (index, piece)) as its arguments' text decodes. For the JSON formats
(hermes, mistral, phi4) the pieces are the arguments object's text as the model writes it,
so they add up to the `arguments` that `tool_calls.parse` reads from the whole reply; Llama 3's
and the pythonic replies are calls only if the whole reply is, so their calls come at the
end, each with its arguments in one piece. A reply that turns out not to be calls is
content, except that calls already announced stay announced (the text after them is
dropped, as the whole reply's parse would drop it from `content`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from edgespec.runtime.chat.tool_calls import (
    OPENERS,
    ToolCall,
    arguments_text,
    call_nodes,
    call_parts,
    calls_texts,
    parse,
    partial_prefix,
)

INCREMENTAL = ("hermes", "mistral", "phi4")  # formats whose arguments stream in pieces


class ToolStream:
    def __init__(self, style: str) -> None:
        self.style, self.opener = style, OPENERS[style]
        self.held = ""
        self.in_calls = False
        self.started: list[tuple[ToolCall, str]] = []  # announced calls, arguments sent
        self.all_calls = style not in INCREMENTAL  # such a reply is calls or content

    def push(self, text: str, final: bool = False) -> Iterator[tuple[str, Any]]:
        self.held += text
        if self.all_calls:
            # hold a reply that may be calls whole; anything else is content at once
            looks = self.held.lstrip()[:1] in ("{", "[", "`", "<", "")
            if not looks and not self.in_calls:
                yield "content", self.held
                self.held, self.all_calls = "", False
                return
            self.in_calls = True
            if final:
                _, calls = parse(self.held, self.style)
                if calls:
                    for i, c in enumerate(calls):
                        yield from self._advance(i, c.name, c.arguments)
                else:
                    yield "content", self.held
                self.held = ""
            return
        if self.opener is None or not self.in_calls:
            cut = self.held.find(self.opener) if self.opener else -1
            if cut < 0:
                keep = 0 if final or not self.opener else partial_prefix(self.held, self.opener)
                out = self.held[: len(self.held) - keep]
                self.held = self.held[len(self.held) - keep :]
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
        if final:
            _, calls = parse(self.held, self.style)
            if not calls and not self.started:
                yield "content", self.held
            for i, c in enumerate(calls):
                yield from self._advance(i, c.name, c.arguments)
            self.held = ""
            return
        i = 0
        for block in calls_texts(self.held, self.style, final=False):
            try:
                nodes = call_nodes(block)
                for node in nodes:
                    name, args, _ = call_parts(node, block)
                    if name is None:
                        return
                    arguments = arguments_text(args, block, node.done) or ""
                    yield from self._advance(i, name, arguments)
                    i += 1
            except ValueError:  # not (yet) calls: the whole reply's parse decides at the end
                return

    def _advance(self, i: int, name: str, arguments: str) -> Iterator[tuple[str, Any]]:
        """Announce call i (once), then send what its arguments' text adds."""
        if i > len(self.started):
            return
        if i == len(self.started):
            call = ToolCall(name, "")
            self.started.append((call, ""))
            yield "call", call
        call, sent = self.started[i]
        if arguments.startswith(sent) and len(arguments) > len(sent):
            self.started[i] = (call, arguments)
            yield "arguments", (i, arguments[len(sent) :])

    @property
    def calls(self) -> int:
        return len(self.started)
