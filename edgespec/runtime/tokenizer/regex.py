"""Oniguruma regexes (as written in tokenizer.json) -> stdlib `re` patterns.

`translate_regex` expands \\p{..}, \\s and \\w into explicit code-point classes built from
`unicodedata` (Python's own \\s would also match \\x1c-\\x1f); `_compile` caches the compiled
pattern and turns any failure into a `TokenizerError`. Only general-category properties are
supported; nested character classes are refused.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from functools import cache, lru_cache

from edgespec.runtime.tokenizer.errors import TokenizerError

# ------------------------------------------------------------------ Unicode classes / regexes
# Oniguruma's (and Rust's) \s is the Unicode White_Space property; Python's \s also matches
# \x1c-\x1f, so \s is always replaced by this explicit list.
_WS_RANGES = [
    (0x09, 0x0D),
    (0x20, 0x20),
    (0x85, 0x85),
    (0xA0, 0xA0),
    (0x1680, 0x1680),
    (0x2000, 0x200A),
    (0x2028, 0x2029),
    (0x202F, 0x202F),
    (0x205F, 0x205F),
    (0x3000, 0x3000),
]
_WS = "".join(chr(c) for a, b in _WS_RANGES for c in range(a, b + 1))
_GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_PROP_ALIASES = {
    "Letter": "L",
    "Mark": "M",
    "Number": "N",
    "Punctuation": "P",
    "Symbol": "S",
    "Separator": "Z",
    "Other": "C",
    "LC": "LuLlLt",
    "L&": "LuLlLt",
}


@lru_cache(maxsize=1)
def _categories() -> dict[str, list[tuple[int, int]]]:
    """General category -> sorted code-point ranges (one pass over Unicode, ~0.2 s, cached)."""
    out: dict[str, list[tuple[int, int]]] = {}
    cat, prev, start = unicodedata.category, "", 0
    for cp in range(0x110000):
        c = cat(chr(cp))
        if c != prev:
            if prev:
                out.setdefault(prev, []).append((start, cp - 1))
            prev, start = c, cp
    out.setdefault(prev, []).append((start, 0x10FFFF))
    return out


def _merge_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(b, out[-1][1]))
        else:
            out.append((a, b))
    return out


def _complement(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out, nxt = [], 0
    for a, b in ranges:
        if a > nxt:
            out.append((nxt, a - 1))
        nxt = b + 1
    return out + ([(nxt, 0x10FFFF)] if nxt <= 0x10FFFF else [])


@cache
def _prop_ranges(name: str) -> tuple[tuple[int, int], ...]:
    """Ranges of a Unicode general-category property such as L, N, Lu, P, Letter."""
    if name == "word":  # \w: letters, marks, Nd, Nl, Pc (Onig / Rust regex word characters)
        cats = ["L", "M", "Nd", "Nl", "Pc"]
    else:
        key = _PROP_ALIASES.get(name, name)
        cats = [key[i : i + 2] for i in range(0, len(key), 2)] if len(key) > 2 else [key]
    table = _categories()
    ranges: list[tuple[int, int]] = []
    for c in cats:
        found = [r for k, v in table.items() if k == c or (len(c) == 1 and k[0] == c) for r in v]
        if not found:
            raise TokenizerError(
                f"unsupported regex property \\p{{{name}}}: only general "
                "categories (L, N, Lu, Nd, P, ...) are supported"
            )
        ranges += found
    if name == "word":
        ranges += [(0x200C, 0x200D)]
    return tuple(_merge_ranges(ranges))


def _class_body(ranges: Sequence[tuple[int, int]]) -> str:
    return "".join(f"\\U{a:08x}" if a == b else f"\\U{a:08x}-\\U{b:08x}" for a, b in ranges)


def translate_regex(pattern: str) -> str:
    """Translate an Oniguruma pattern to stdlib `re`: \\p{X}/\\P{X}/\\s/\\S/\\w/\\W become explicit
    classes (inside or outside [...]); \\z becomes \\Z. Nested classes are unsupported."""
    out: list[str] = []
    i, n, in_class = 0, len(pattern), False
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            e = pattern[i + 1]
            ranges: Sequence[tuple[int, int]] | None = None
            neg = e.isupper()
            if e in "pP":
                if pattern.startswith("{", i + 2):
                    j = pattern.index("}", i)
                    name, i = pattern[i + 3 : j], j + 1
                else:
                    name, i = pattern[i + 2], i + 3
                if name.startswith("^"):
                    name, neg = name[1:], not neg
                ranges = _prop_ranges(name)
            elif e in "sSwW":
                ranges = _WS_RANGES if e in "sS" else _prop_ranges("word")
                i += 2
            else:
                out.append("\\Z" if e == "z" else c + e)
                i += 2
                continue
            if in_class:
                out.append(_class_body(_complement(list(ranges)) if neg else ranges))
            else:
                out.append(("[^" if neg else "[") + _class_body(ranges) + "]")
            continue
        if in_class and c == "[":
            raise TokenizerError(f"unsupported regex (nested character class): {pattern!r}")
        if not in_class and c == "[":
            in_class = True
            j = i + 1 + (pattern.startswith("^", i + 1))
            if pattern.startswith("]", j):  # a leading ']' is a literal
                j += 1
            out.append(pattern[i:j])
            i = j
            continue
        if in_class and c == "]":
            in_class = False
        out.append(c)
        i += 1
    return "".join(out)


@lru_cache(maxsize=64)
def _compile(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(translate_regex(pattern))
    except (re.error, ValueError, IndexError) as exc:
        if isinstance(exc, TokenizerError):
            raise
        raise TokenizerError(f"cannot translate regex {pattern!r}: {exc}") from exc


def _pattern(spec: dict[str, str]) -> re.Pattern[str]:
    """A Split/Replace pattern: {"String": literal} or {"Regex": onig pattern}."""
    if "String" in spec:
        return re.compile(re.escape(spec["String"]))
    return _compile(spec["Regex"])


def _is_word(ch: str) -> bool:
    return _compile(r"\w").match(ch) is not None
