"""Grammars for constrained decoding, on llguidance (the `[grammar]` extra).

Takes what a caller asks for — an OpenAI `response_format` ({"type": "text"},
{"type": "json_object"}, {"type": "json_schema", "json_schema": {"name", "schema",
"strict"}}), a bare JSON schema, or a `Grammar` already built — and gives a `Grammar`: the
compiled llguidance grammar, checked against the bundle's vocabulary when it is built, so a
bad schema is refused before any work with the engine's own message. `Grammar.start(n)`
opens a `Constraint` (runtime/grammar/constraints.py) for an output that begins after n tokens.

Why llguidance: numpy token bitmasks, rollback, no torch (xgrammar needs torch; see
benchmarks/bench_grammar.py for the mask time per token at 49k and 152k vocabularies).
It is imported here, lazily, only when a request asks for a constraint; without it such a
request is refused with the install line.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgespec.bundle import Manifest
from edgespec.runtime.grammar.constraints import Constraint, GrammarError

INSTALL = "structured output needs llguidance: pip install 'edgespec[grammar]'"
# JSON laid out as Python's json.dumps writes it (", " and ": ", no other whitespace): what
# models mostly emit, and no run of whitespace for a weak model to loop in; more is forced
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _llg() -> Any:
    try:
        import llguidance
    except ImportError:
        raise GrammarError(INSTALL) from None
    return llguidance


class LLGuidanceMatcher:
    """`constraints.Matcher` over an llguidance LLMatcher, masks trimmed to the model's
    vocabulary (ids past the tokenizer's are padded embedding rows: never allowed)."""

    def __init__(self, matcher: Any, vocab: int) -> None:
        self.m, self.vocab = matcher, vocab
        # per advanced token, whether llguidance counted it: an end of sequence after the
        # grammar completed is taken without a state of its own, so a rollback skips it
        self.counted: list[bool] = []

    def mask(self) -> np.ndarray:
        bits = np.frombuffer(self.m.compute_bitmask(), np.uint8)
        self._check()
        return np.unpackbits(bits, bitorder="little")[: self.vocab].view(bool)

    def advance(self, token: int) -> None:
        counted = not self.m.is_stopped()
        if counted:
            self.m.consume_token(token)
            self._check()
        self.counted.append(counted)

    def rollback(self, n: int) -> None:
        real = sum(self.counted[len(self.counted) - n :])
        del self.counted[len(self.counted) - n :]
        if real:
            self.m.rollback(real)
            self._check()

    def stopped(self) -> bool:
        return bool(self.m.is_stopped())

    def _check(self) -> None:
        if self.m.is_error():
            raise GrammarError(f"the grammar engine failed: {self.m.get_error()}")


class Vocabulary:
    """The bundle's tokenizer as llguidance sees it (built once per bundle, ~0.03-1 s)."""

    def __init__(self, tokenizer_json: Path, vocab: int, eos_ids: list[int]) -> None:
        llg = _llg()
        text = tokenizer_json.read_text(encoding="utf-8")
        self.tokenizer = llg.LLTokenizer(text, n_vocab=vocab, eos_token=list(eos_ids))
        self.vocab = vocab


def bundle_vocabulary(folder: str | Path, manifest: Manifest) -> Vocabulary:
    """The Vocabulary of a bundle's tokenizer and model vocabulary (built once, then kept)."""
    path = Path(folder) / "tokenizer.json"
    return _vocabulary(path, manifest.target.vocab_size, tuple(manifest.eos_token_ids))


@functools.lru_cache(maxsize=8)
def _vocabulary(path: Path, vocab: int, eos_ids: tuple[int, ...]) -> Vocabulary:
    if not path.exists():
        raise GrammarError(f"structured output needs the bundle's tokenizer.json ({path})")
    return Vocabulary(path, vocab, list(eos_ids))


@dataclass(frozen=True)
class Grammar:
    """A compiled grammar, valid for one vocabulary; `kind` names what it was built from."""

    text: str  # the llguidance grammar (JSON)
    kind: str  # "json_object" | "json_schema"
    schema: dict | None = None  # the JSON schema a reply must validate against, if any

    def start(self, vocabulary: Vocabulary, prompt_length: int) -> Constraint:
        llg = _llg()
        matcher = llg.LLMatcher(vocabulary.tokenizer, self.text, log_level=0)
        if matcher.is_error():
            raise GrammarError(f"{self.kind}: {matcher.get_error()}")
        return Constraint(LLGuidanceMatcher(matcher, vocabulary.vocab), prompt_length, self.text)


def from_schema(schema: Any, kind: str = "json_schema") -> Grammar:
    if not isinstance(schema, dict):
        raise GrammarError(f"{kind}: a JSON schema is an object, got {type(schema).__name__}")
    llg = _llg()
    try:
        text = llg.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    except (ValueError, TypeError) as e:
        raise GrammarError(f"{kind}: {e}") from None
    error = llg.LLMatcher.validate_grammar(text)
    if error:
        raise GrammarError(f"{kind}: the schema cannot be used: {error}")
    return Grammar(text, kind, schema)


def from_lark(lark: str, kind: str) -> Grammar:
    """A Grammar from llguidance's Lark dialect (`%json {schema}` inlines a JSON schema)."""
    llg = _llg()
    text = llg.LLMatcher.grammar_from_lark(lark)
    error = llg.LLMatcher.validate_grammar(text)
    if error:
        raise GrammarError(f"{kind}: {error}")
    return Grammar(text, kind)


def from_response_format(fmt: Any) -> Grammar | None:
    """A Grammar for an OpenAI-style response_format (None: plain text)."""
    if fmt is None or isinstance(fmt, Grammar):
        return fmt
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise GrammarError(
            'response_format must be an object with a "type": "text", "json_object" or '
            '"json_schema"'
        )
    kind = fmt["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return from_schema({"type": "object"}, "response_format json_object")
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise GrammarError(
                'response_format json_schema needs "json_schema": {"name": ..., "schema": {...}}'
            )
        name = spec.get("name")
        return from_schema(spec["schema"], f"response_format json_schema {name or ''}".strip())
    raise GrammarError(
        f'response_format type {kind!r}: choose "text", "json_object" or "json_schema"'
    )


def read_schema(path: str | Path) -> Grammar:
    """A Grammar from a JSON schema file (`edgespec generate --json-schema FILE`)."""
    try:
        schema = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise GrammarError(f"cannot read the JSON schema {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise GrammarError(f"{path} is not JSON: {e}") from None
    return from_schema(schema, f"json_schema {Path(path).name}")
