"""Normalizers and pre-tokenizers of tokenizer.json, as plain functions.

`_normalizer(cfg)` gives a str -> str function; `_pre_tokenizer(cfg)` gives a function from
pieces to pieces, a piece being (text, whether it starts at offset 0 of the input), split the
way the Rust library's `NormalizedString::split` splits. Also the byte-level alphabet (GPT-2's
byte -> printable character table) that the ByteLevel pre-tokenizer and decoder share.
Unsupported component types raise `TokenizerError` naming the supported ones.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from typing import Any

from edgespec.runtime.tokenizer.errors import TokenizerError, _unsupported
from edgespec.runtime.tokenizer.regex import _GPT2_PATTERN, _WS, _compile, _pattern


def _bytes_to_unicode() -> list[str]:
    bs = [*range(33, 127), *range(161, 173), *range(174, 256)]
    cs, extra = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    table = dict(zip(bs, cs, strict=True))
    return [chr(table[b]) for b in range(256)]


_BYTE_CHARS = _bytes_to_unicode()
_CHAR_BYTES = {c: b for b, c in enumerate(_BYTE_CHARS)}

# ----------------------------------------------------------------------- splitting helpers
Piece = tuple[str, bool]  # (text, starts at offset 0 of the original input)


def _split(
    s: str, regex: re.Pattern[str], behavior: str, invert: bool = False
) -> list[tuple[int, int]]:
    """`NormalizedString::split` of the Rust library for one string: the (start, end) pieces."""
    parts: list[tuple[int, int, bool]] = []
    prev = 0
    for m in regex.finditer(s):
        a, b = m.span()
        if prev != a:
            parts.append((prev, a, invert))
        parts.append((a, b, not invert))
        prev = b
    if prev != len(s):
        parts.append((prev, len(s), invert))
    if behavior == "Removed":
        spans = [(a, b) for a, b, is_match in parts if not is_match]
    elif behavior == "Isolated":
        spans = [(a, b) for a, b, _ in parts]
    elif behavior in ("MergedWithPrevious", "MergedWithNext", "Contiguous"):
        nxt = behavior == "MergedWithNext"
        merged: list[list[int]] = []
        previous, contiguous = False, behavior == "Contiguous"
        for a, b, is_match in reversed(parts) if nxt else parts:
            join = is_match == previous if contiguous else is_match and not previous
            if join and merged:
                merged[-1][0 if nxt else 1] = a if nxt else b
            else:
                merged.append([a, b])
            previous = is_match
        spans = [(a, b) for a, b in (reversed(merged) if nxt else merged)]
    else:
        raise TokenizerError(f"unsupported split behavior {behavior!r}")
    return [(a, b) for a, b in spans if a < b]


def _split_step(
    regex: re.Pattern[str], behavior: str, invert: bool = False
) -> Callable[[list[Piece]], list[Piece]]:
    def step(pieces: list[Piece]) -> list[Piece]:
        out: list[Piece] = []
        for s, at0 in pieces:
            out += [(s[a:b], at0 and a == 0) for a, b in _split(s, regex, behavior, invert)]
        return out

    return step


# ------------------------------------------------------------------------------ components
def _normalizer(cfg: dict[str, Any]) -> Callable[[str], str]:
    kind = cfg.get("type")
    if kind == "Prepend":
        return lambda s: cfg["prepend"] + s if s else s
    if kind == "Replace":
        regex, content = _pattern(cfg["pattern"]), cfg["content"]
        return lambda s: regex.sub(lambda _: content, s)
    if kind in ("NFC", "NFD", "NFKC", "NFKD"):
        return lambda s: unicodedata.normalize(kind, s)
    if kind == "Lowercase":
        return str.lower
    if kind == "Strip":
        left, right = cfg.get("strip_left", True), cfg.get("strip_right", True)

        def strip(s: str) -> str:
            s = s.lstrip(_WS) if left else s
            return s.rstrip(_WS) if right else s

        return strip
    if kind == "StripAccents":
        return lambda s: "".join(c for c in s if unicodedata.category(c) != "Mn")
    raise _unsupported(
        "normalizer",
        cfg,
        "Sequence, Prepend, Replace, NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents",
    )


def _pre_tokenizer(cfg: dict[str, Any]) -> Callable[[list[Piece]], list[Piece]]:
    kind = cfg.get("type")
    if kind == "ByteLevel":
        prefix, regex = cfg.get("add_prefix_space", True), None
        if cfg.get("use_regex", True):
            regex = _compile(_GPT2_PATTERN)

        def byte_level(pieces: list[Piece]) -> list[Piece]:
            out: list[Piece] = []
            for s, at0 in pieces:
                if prefix and s and not s.startswith(" "):
                    s = " " + s
                spans = _split(s, regex, "Isolated") if regex else [(0, len(s))]
                out += [
                    ("".join([_BYTE_CHARS[c] for c in s[a:b].encode()]), at0 and a == 0)
                    for a, b in spans
                ]
            return out

        return byte_level
    if kind == "Split":
        return _split_step(_pattern(cfg["pattern"]), cfg["behavior"], cfg.get("invert", False))
    if kind == "Metaspace":
        rep = cfg.get("replacement", "\u2581")
        scheme = cfg.get("prepend_scheme") or (
            "always" if cfg.get("add_prefix_space", True) else "never"
        )
        split = re.compile(re.escape(rep)) if cfg.get("split", True) else None

        def metaspace(pieces: list[Piece]) -> list[Piece]:
            out: list[Piece] = []
            for s, at0 in pieces:
                s = s.replace(" ", rep)
                if (
                    s
                    and not s.startswith(rep)
                    and (scheme == "always" or scheme == "first" and at0)
                ):
                    s = rep + s
                spans = _split(s, split, "MergedWithNext") if split else [(0, len(s))]
                out += [(s[a:b], at0 and a == 0) for a, b in spans]
            return out

        return metaspace
    if kind == "Digits":
        return _split_step(
            _compile(r"\p{N}" if cfg.get("individual_digits") else r"\p{N}+"), "Isolated"
        )
    if kind == "Whitespace":
        return _split_step(_compile(r"\w+|[^\w\s]+"), "Removed", invert=True)
    if kind == "WhitespaceSplit":
        return _split_step(_compile(r"\s+"), "Removed")
    if kind == "Punctuation":
        punct = re.escape("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
        return _split_step(_compile(f"[{punct}\\p{{P}}]"), cfg.get("behavior", "Isolated"))
    if kind == "CharDelimiterSplit":
        return _split_step(re.compile(re.escape(cfg["delimiter"])), "Removed")
    raise _unsupported(
        "pre_tokenizer",
        cfg,
        "Sequence, ByteLevel, Split, Metaspace, Digits, "
        "Whitespace, WhitespaceSplit, Punctuation, CharDelimiterSplit",
    )
