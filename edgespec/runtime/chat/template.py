"""Render a conversation with a Hugging Face chat template, as transformers does, without it.

Takes the template text a bundle carries (see `edgespec.bundle.ChatFormat`) and guarantees that
`render(messages, ...)` returns the same string as transformers'
`tokenizer.apply_chat_template(messages, tokenize=False, ...)`: the same jinja2 environment
(sandboxed and immutable — templates from a hub are untrusted code —, `trim_blocks`,
`lstrip_blocks`, loop controls, the `{% generation %}` tag), the same globals and filters
(`raise_exception`, `strftime_now`, `tojson` without HTML escaping, `dict`, `namespace`), the
same inputs (`messages` with None-valued keys dropped and reasoning aliased, `tools`,
`documents`, `add_generation_prompt`, the named special tokens, and any extra flag such as
`enable_thinking` passed through). Every problem — a malformed message, a template that calls
`raise_exception`, a syntax error — is a `ChatTemplateError` saying what to change.
jinja2 and the standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from edgespec.bundle import Manifest
from edgespec.errors import EdgespecError

# what `ChatTemplate.render` passes the template itself: never a template flag
RENDER_ARGUMENTS = ("messages", "add_generation_prompt", "tools", "documents", "template")

# names a message's reasoning may come under; templates read the first (transformers aliases them)
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(EdgespecError, ValueError):
    """A conversation cannot be rendered: bad messages, a template error, or no template."""


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks in
    transformers; rendering only needs its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:  # fmt: skip
    # jinja's own tojson escapes HTML characters (<, >, &, '), which templates do not expect
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _TemplateDict:
    """`dict(...)` in a template, without exposing the dict type itself to the sandbox."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """`namespace(...)` that refuses underscore names (no reaching into CPython internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805  (jinja's signature trick)
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed attributes ({name!r})"
            )


@lru_cache(maxsize=16)
def _compile(text: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _Namespace
    try:
        return env.from_string(text)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise ChatTemplateError(
            f"the chat template does not parse (line {e.lineno}: {e.message}); fix the "
            "template in the checkpoint and re-export"
        ) from None


def _plain(value: Any, where: str) -> Any:
    """JSON-like data only: the sandbox never sees objects with methods of their own."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k, where): _plain(v, where) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v, where) for v in value]
    raise ChatTemplateError(
        f"{where} holds a {type(value).__name__}; give JSON-like data (str, numbers, lists, dicts)"
    )


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """The conversation as plain dicts with None values dropped; refuses malformed ones."""
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise ChatTemplateError(
            'messages must be a list of {"role": ..., "content": ...} dicts, '
            f"not a {type(messages).__name__}"
        )
    if not messages:
        raise ChatTemplateError("messages is empty: give at least one message")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ChatTemplateError(
                f"message {i} is a {type(m).__name__}, not a dict with 'role' and 'content'"
            )
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise ChatTemplateError(f"message {i} has no 'role' (e.g. user, assistant, system)")
        m = {k: v for k, v in _plain(m, f"message {i}").items() if v is not None}
        reasoning = next((m[k] for k in REASONING_FIELDS if m.get(k) is not None), None)
        if reasoning is not None:  # as transformers: templates read one name or another
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        out.append(m)
    return out


class ChatTemplate:
    """One bundle's chat templates (by name) and the special tokens they see."""

    def __init__(self, templates: dict[str, str], special_tokens: dict[str, str] | None = None):
        if not templates:
            raise ChatTemplateError("no chat template given")
        self.templates = templates
        self.special_tokens = dict(special_tokens or {})

    @classmethod
    def from_bundle(cls, folder: str | Path, manifest: Manifest) -> ChatTemplate:
        if manifest.chat is None:
            raise ChatTemplateError(
                f"bundle {folder} has no chat template (its checkpoint is a base model, or it "
                "was exported before edgespec copied templates): use generate() with a plain "
                "prompt, or re-export a checkpoint whose tokenizer_config.json or "
                "chat_template.jinja has one"
            )
        texts = {
            name: (Path(folder) / rel).read_text(encoding="utf-8")
            for name, rel in manifest.chat.templates.items()
        }
        return cls(texts, manifest.chat.special_tokens)

    def pick(self, name: str | None = None, tools: Any = None) -> str:
        """The template text: by name, else "tool_use" when tools are given, else "default"."""
        if name is not None:
            if name not in self.templates:
                raise ChatTemplateError(
                    f"no chat template named {name!r} (this bundle has: "
                    f"{', '.join(sorted(self.templates))})"
                )
            return self.templates[name]
        if tools is not None and "tool_use" in self.templates:
            return self.templates["tool_use"]
        if "default" in self.templates:
            return self.templates["default"]
        if len(self.templates) == 1:
            return next(iter(self.templates.values()))
        raise ChatTemplateError(
            "this bundle has several chat templates and none is named 'default': choose one "
            f"with template=NAME ({', '.join(sorted(self.templates))})"
        )

    def render(
        self,
        messages: Any,
        *,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        documents: list[dict[str, Any]] | None = None,
        template: str | None = None,
        **flags: Any,
    ) -> str:
        """The conversation as the model's prompt text; `flags` (e.g. enable_thinking=False)
        reach the template as variables, as transformers' extra keyword arguments do."""
        chat = check_messages(messages)
        if tools is not None and not (
            isinstance(tools, list) and all(isinstance(t, Mapping) for t in tools)
        ):
            raise ChatTemplateError("tools must be a list of JSON-schema dicts")
        if documents is not None and not (
            isinstance(documents, list) and all(isinstance(d, Mapping) for d in documents)
        ):
            raise ChatTemplateError("documents must be a list of dicts with 'title' and 'text'")
        compiled = _compile(self.pick(template, tools))
        variables = {**self.special_tokens, **_plain(flags, "a template flag")}
        try:
            return compiled.render(
                messages=chat,
                tools=_plain(tools, "tools"),
                documents=_plain(documents, "documents"),
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
        except jinja2.exceptions.TemplateError as e:
            raise ChatTemplateError(f"the chat template refused this conversation: {e}") from None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
            raise ChatTemplateError(
                f"the chat template failed on this conversation ({type(e).__name__}: {e})"
            ) from None
