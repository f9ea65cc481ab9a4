"""A pure-Python reader of Hugging Face ``tokenizer.json`` files (stdlib only, no `tokenizers`).

Takes a ``tokenizer.json`` (plus ``tokenizer_config.json`` / ``generation_config.json`` beside
it, when present) whose model is BPE: byte-level BPE (GPT-2, Qwen2/2.5, Llama-3, SmolLM2) or
sentencepiece-style BPE with byte fallback (Llama-2, TinyLlama). Guarantees that
``encode(text)`` and ``decode(ids)`` give the same ids / text as
``tokenizers.Tokenizer.from_file(path)`` for the supported components:

* normalizers: Sequence, Prepend, Replace, NFC/NFD/NFKC/NFKD, Lowercase, Strip, StripAccents
* pre-tokenizers: Sequence, ByteLevel, Split, Metaspace, Digits, Whitespace, WhitespaceSplit,
  Punctuation, CharDelimiterSplit
* model: BPE (merges as "a b" strings or [a, b] pairs, byte_fallback, unk/fuse_unk,
  continuing_subword_prefix, end_of_word_suffix, ignore_merges; dropout must be 0/None)
* decoders: Sequence, ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, BPEDecoder
* post-processors: TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing, Sequence
* added tokens (special or not) with lstrip / rstrip / single_word / normalized.

Anything else (WordPiece / Unigram / WordLevel models, Precompiled normalizers, script
properties such as ``\\p{Han}`` ...) raises `TokenizerError` when loading. Unlike the library,
`decode` raises `TokenizerError` for an id outside the vocabulary instead of dropping it.

Regexes in the file are written for Oniguruma; they are translated to stdlib ``re`` by
expanding ``\\p{..}``, ``\\s`` and ``\\w`` into explicit code-point classes built from
`unicodedata` (see `translate_regex`; Python's own ``\\s`` would also match \\x1c-\\x1f).
Residual differences: Python's Unicode database (14.0 on 3.11) may classify or NFC-order code
points assigned in other Unicode versions differently than the Rust library, and patterns
that can match the empty string may split differently (none of the usual ones can).
"""

from __future__ import annotations

import heapq
import json
import os
import re
import unicodedata
from collections.abc import Callable, Sequence
from functools import cache, lru_cache
from pathlib import Path
from typing import Any


class TokenizerError(ValueError):
    """A tokenizer file is missing, corrupt or unsupported, or an id is out of range."""


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
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")

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


def _opt(cfg: dict[str, Any] | None, what: str) -> list[dict[str, Any]]:
    """Flatten a (possibly Sequence) component config into a list of configs."""
    if cfg is None:
        return []
    if cfg.get("type") == "Sequence":
        key = {
            "normalizer": "normalizers",
            "pre_tokenizer": "pretokenizers",
            "decoder": "decoders",
            "post_processor": "processors",
        }[what]
        return [c for sub in cfg.get(key, []) for c in _opt(sub, what)]
    return [cfg]


def _unsupported(what: str, cfg: dict[str, Any], supported: str) -> TokenizerError:
    return TokenizerError(f"unsupported {what} type {cfg.get('type')!r}; supported: {supported}")


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


class _BPE:
    """The BPE model: per-word cache + the Rust library's heap-ordered merge loop."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        if cfg.get("dropout") not in (None, 0, 0.0):
            raise TokenizerError(f"BPE dropout={cfg['dropout']} is not supported (random)")
        self.vocab: dict[str, int] = dict(cfg.get("vocab") or {})
        self.prefix: str = cfg.get("continuing_subword_prefix") or ""
        self.suffix: str = cfg.get("end_of_word_suffix") or ""
        self.byte_fallback = bool(cfg.get("byte_fallback"))
        self.fuse_unk = bool(cfg.get("fuse_unk"))
        self.ignore_merges = bool(cfg.get("ignore_merges"))
        self.unk_token: str | None = cfg.get("unk_token")
        self.merges: dict[tuple[int, int], tuple[int, int]] = {}
        for rank, merge in enumerate(cfg.get("merges") or []):
            pair = merge.split(" ") if isinstance(merge, str) else merge
            if len(pair) != 2:
                raise TokenizerError(f"bad BPE merge #{rank}: {merge!r}")
            a, b = pair
            new = a + b[len(self.prefix) :]
            if a not in self.vocab or b not in self.vocab or new not in self.vocab:
                raise TokenizerError(f"BPE merge #{rank} {merge!r} uses a token not in the vocab")
            self.merges[(self.vocab[a], self.vocab[b])] = (rank, self.vocab[new])
        self.cache: dict[str, list[int]] = {}

    def tokenize(self, word: str) -> list[int]:
        if not word:
            return []
        if self.ignore_merges and word in self.vocab:
            return [self.vocab[word]]
        hit = self.cache.get(word)
        if hit is not None:
            return hit
        ids = self._merge(self._symbols(word))
        if len(word) < 256:
            if len(self.cache) > 100_000:
                self.cache.clear()
            self.cache[word] = ids
        return ids

    def _symbols(self, word: str) -> list[int]:
        vocab = self.vocab
        if not (self.prefix or self.suffix):
            try:
                return [vocab[c] for c in word]
            except KeyError:
                pass
        ids: list[int] = []
        unk_pending = False
        last = len(word) - 1
        for i, ch in enumerate(word):
            s = (self.prefix if i and self.prefix else "") + ch + (self.suffix if i == last else "")
            tid = vocab.get(s)
            if tid is not None:
                if unk_pending:
                    ids.append(self._unk_id())
                    unk_pending = False
                ids.append(tid)
                continue
            if self.byte_fallback:
                byte_ids = [vocab.get(f"<0x{b:02X}>") for b in s.encode()]
                if None not in byte_ids:
                    ids += byte_ids  # type: ignore[arg-type]
                    continue
            if self.unk_token is not None:
                if unk_pending and not self.fuse_unk:
                    ids.append(self._unk_id())
                unk_pending = True
        if unk_pending:
            ids.append(self._unk_id())
        return ids

    def _unk_id(self) -> int:
        if self.unk_token not in self.vocab:
            raise TokenizerError(f"unk_token {self.unk_token!r} is not in the vocab")
        return self.vocab[self.unk_token]  # type: ignore[index]

    def _merge(self, ids: list[int]) -> list[int]:
        n = len(ids)
        if n < 2:
            return ids
        merges = self.merges
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prev = list(range(-1, n - 1))
        alive = [True] * n
        heap = [
            (m[0], i, m[1])
            for i in range(n - 1)
            if (m := merges.get((ids[i], ids[i + 1]))) is not None
        ]
        heapq.heapify(heap)
        while heap:
            _, pos, new_id = heapq.heappop(heap)
            j = nxt[pos]
            if not alive[pos] or j == -1:
                continue
            m = merges.get((ids[pos], ids[j]))
            if m is None or m[1] != new_id:
                continue
            ids[pos], alive[j] = new_id, False
            k = nxt[pos] = nxt[j]
            if k != -1:
                prev[k] = pos
            p = prev[pos]
            if p != -1 and (m := merges.get((ids[p], new_id))) is not None:
                heapq.heappush(heap, (m[0], p, m[1]))
            if k != -1 and (m := merges.get((new_id, ids[k]))) is not None:
                heapq.heappush(heap, (m[0], pos, m[1]))
        return [t for t, a in zip(ids, alive, strict=True) if a]


def _post_processor(
    cfg: dict[str, Any], token_to_id: Callable[[str], int | None]
) -> tuple[list[int], list[int]]:
    """(ids put before, ids put after) a single sequence when add_special_tokens=True."""
    kind = cfg.get("type")
    if kind == "ByteLevel":
        return [], []
    if kind in ("RobertaProcessing", "BertProcessing"):
        return [int(cfg["cls"][1])], [int(cfg["sep"][1])]
    if kind == "TemplateProcessing":
        before: list[int] = []
        after: list[int] = []
        seen_a = False
        for item in cfg.get("single", []):
            if "Sequence" in item:
                seen_a = True
                continue
            name = item["SpecialToken"]["id"]
            spec = cfg.get("special_tokens", {}).get(name)
            ids = list(spec["ids"]) if spec else [token_to_id(name)]
            if None in ids:
                raise TokenizerError(f"post_processor special token {name!r} has no id")
            (after if seen_a else before).extend(ids)  # type: ignore[arg-type]
        return before, after
    raise _unsupported(
        "post_processor",
        cfg,
        "TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing, Sequence",
    )


_DECODERS = ("ByteLevel", "Metaspace", "Replace", "ByteFallback", "Fuse", "Strip", "BPEDecoder")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise TokenizerError(f"tokenizer file not found: {path}") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TokenizerError(f"cannot read {path} as JSON: {exc}") from exc


def _token_content(tok: Any) -> str | None:
    return tok.get("content") if isinstance(tok, dict) else tok


# ------------------------------------------------------------------------------- tokenizer
class Tokenizer:
    """Encode / decode like `tokenizers.Tokenizer` for the BPE configurations listed above."""

    def __init__(
        self,
        spec: dict[str, Any],
        config: dict[str, Any] | None = None,
        generation_config: dict[str, Any] | None = None,
        source: str = "<dict>",
    ) -> None:
        model = spec.get("model") if isinstance(spec, dict) else None
        if not isinstance(model, dict):
            raise TokenizerError(f"{source}: no 'model' object; not a tokenizer.json file")
        kind = model.get("type") or ("BPE" if "merges" in model else None)
        if kind != "BPE":
            raise TokenizerError(
                f"{source}: unsupported model type {kind!r}; only BPE "
                "(byte-level or sentencepiece-style) is supported"
            )
        self._model = _BPE(model)
        self._id_to_token = {i: t for t, i in self._model.vocab.items()}
        self._added = {t["content"]: t for t in spec.get("added_tokens") or [] if t.get("content")}
        self._normalizers = [_normalizer(c) for c in _opt(spec.get("normalizer"), "normalizer")]
        for content, tok in self._added.items():  # decoding sees normalized added tokens
            normalized = tok.get("normalized", True)  # normalized (like tokenizers >= 0.22)
            self._id_to_token[int(tok["id"])] = self._normalize(content) if normalized else content
        special = {t for t, tok in self._added.items() if tok.get("special")}
        # skip_special_tokens filters by token string, like the Rust library
        self._special_ids = {i for i, t in self._id_to_token.items() if t in special}
        self._pre = [_pre_tokenizer(c) for c in _opt(spec.get("pre_tokenizer"), "pre_tokenizer")]
        self._decoders = _opt(spec.get("decoder"), "decoder")
        for c in self._decoders:
            if c.get("type") not in _DECODERS:
                raise _unsupported("decoder", c, "Sequence, " + ", ".join(_DECODERS))
        self._prefix: list[int] = []
        self._suffix: list[int] = []
        for c in _opt(spec.get("post_processor"), "post_processor"):
            before, after = _post_processor(c, self.token_to_id)
            self._prefix, self._suffix = before + self._prefix, self._suffix + after
        raw = [t for t, tok in self._added.items() if not tok.get("normalized", True)]
        norm = {self._normalize(t): self._added[t] for t in self._added if t not in raw}
        self._raw_match = self._matcher({t: self._added[t] for t in raw})
        self._norm_match = self._matcher({k: v for k, v in norm.items() if k})
        self._byte_ids = (
            {i for i, t in self._id_to_token.items() if _BYTE_TOKEN.fullmatch(t)}
            if any(c["type"] == "ByteFallback" for c in self._decoders)
            else set()
        )
        self._stream_local = self._is_stream_local()
        self.vocab_size: int = len(self._id_to_token)
        self.bos_token_id, self.eos_token_ids = self._bos_eos(config or {}, generation_config or {})

    # ----------------------------------------------------------------------- construction
    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """Load a tokenizer.json; tokenizer_config.json / generation_config.json beside it are
        read too when present (for bos/eos ids)."""
        path = Path(path)
        spec = _read_json(path)
        extra = [path.parent / n for n in ("tokenizer_config.json", "generation_config.json")]
        config, gen = (_read_json(p) if p.is_file() else {} for p in extra)
        try:
            return cls(spec, config, gen, source=str(path))
        except TokenizerError:
            raise
        except (KeyError, TypeError, AttributeError, ValueError, IndexError) as exc:
            raise TokenizerError(
                f"{path}: malformed tokenizer.json ({type(exc).__name__}: {exc})"
            ) from exc

    @classmethod
    def from_dir(cls, folder: str | os.PathLike[str]) -> Tokenizer:
        return cls.from_file(Path(folder) / "tokenizer.json")

    def _matcher(
        self, tokens: dict[str, dict[str, Any]]
    ) -> tuple[re.Pattern[str], dict[str, dict[str, Any]]] | None:
        if not tokens:
            return None
        # Python alternation is leftmost-first: longest first gives aho-corasick LeftmostLongest.
        alternatives = sorted(tokens, key=len, reverse=True)
        return re.compile("|".join(map(re.escape, alternatives))), tokens

    def _bos_eos(self, config: dict[str, Any], gen: dict[str, Any]) -> tuple[int | None, list[int]]:
        bos = _token_content(config.get("bos_token"))
        bos_id = self.token_to_id(bos) if bos else None
        if bos_id is None and isinstance(gen.get("bos_token_id"), int):
            bos_id = gen["bos_token_id"]
        if bos_id is None and self._prefix:
            bos_id = self._prefix[0]
        eos: list[int] = []
        name = _token_content(config.get("eos_token"))
        if name and self.token_to_id(name) is not None:
            eos.append(self.token_to_id(name))  # type: ignore[arg-type]
        gen_eos = gen.get("eos_token_id")
        for i in gen_eos if isinstance(gen_eos, list) else [gen_eos]:
            if isinstance(i, int) and i not in eos:
                eos.append(i)
        if not eos:  # no config beside the file: fall back on a conventional special token
            for name in ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>"):
                tid = self.token_to_id(name)
                if tid is not None and tid in self._special_ids:
                    eos.append(tid)
                    break
        return bos_id, eos

    # -------------------------------------------------------------------------- lookups
    def token_to_id(self, token: str) -> int | None:
        if token in self._added:
            return int(self._added[token]["id"])
        return self._model.vocab.get(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._id_to_token.get(token_id)

    def _token(self, token_id: int) -> str:
        tok = self._id_to_token.get(token_id)
        if tok is None:
            raise TokenizerError(
                f"token id {token_id} is not in the vocabulary (vocab_size={self.vocab_size})"
            )
        return tok

    # ------------------------------------------------------------------------- encoding
    def _normalize(self, s: str) -> str:
        for f in self._normalizers:
            s = f(s)
        return s

    def _find_added(self, s: str, matcher: Any) -> list[tuple[str, int | None, int]]:
        """Split `s` on added tokens like the Rust AddedVocabulary::find_matches."""
        if matcher is None or not s:
            return [(s, None, 0)]
        regex, tokens = matcher
        out: list[tuple[str, int | None, int]] = []
        pos = 0
        for m in regex.finditer(s):
            start, stop = m.span()
            tok = tokens[m.group()]
            if tok.get("single_word") and (
                (start > 0 and _is_word(s[start - 1])) or (stop < len(s) and _is_word(s[stop]))
            ):
                continue
            if tok.get("lstrip"):
                start = max(len(s[:start].rstrip(_WS)), pos)
            if tok.get("rstrip"):
                stop = len(s) - len(s[stop:].lstrip(_WS))
            if pos < start:
                out.append((s[pos:start], None, pos))
            out.append((s[start:stop], int(tok["id"]), start))
            pos = stop
        if pos < len(s):
            out.append((s[pos:], None, pos))
        return out

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; with add_special_tokens the post-processor's BOS/EOS are added."""
        ids: list[int] = []
        for seg, tid, start in self._find_added(text, self._raw_match):
            if tid is not None:
                ids.append(tid)
                continue
            for sub, sub_id, sub_start in self._find_added(self._normalize(seg), self._norm_match):
                if sub_id is not None:
                    ids.append(sub_id)
                    continue
                pieces: list[Piece] = [(sub, start == 0 and sub_start == 0)]
                for step in self._pre:
                    pieces = step(pieces)
                for word, _ in pieces:
                    ids += self._model.tokenize(word)
        if add_special_tokens:
            ids = self._prefix + ids + self._suffix
        return ids

    # ------------------------------------------------------------------------- decoding
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of `ids` (raises `TokenizerError` for an id outside the vocabulary)."""
        tokens = [
            self._token(int(i))
            for i in ids
            if not (skip_special_tokens and int(i) in self._special_ids)
        ]
        return self._decode_tokens(tokens, first=True)

    def _decode_tokens(self, tokens: list[str], first: bool) -> str:
        """Run the decoder chain; `first=False` means the tokens do not start the sequence."""
        if not self._decoders:
            return " ".join(tokens)
        fused = False
        for cfg in self._decoders:
            kind = cfg["type"]
            if kind == "ByteLevel":
                data = b"".join(
                    bytes(_CHAR_BYTES[c] for c in t)
                    if all(c in _CHAR_BYTES for c in t)
                    else t.encode()
                    for t in tokens
                )
                tokens, fused = [data.decode("utf-8", "replace")], True
            elif kind == "Metaspace":
                rep = cfg.get("replacement", "\u2581")
                scheme = cfg.get("prepend_scheme") or (
                    "always" if cfg.get("add_prefix_space", True) else "never"
                )
                tokens = [
                    t.replace(rep, "" if i == 0 and first and scheme != "never" else " ")
                    for i, t in enumerate(tokens)
                ]
            elif kind == "Replace":
                regex, content = _pattern(cfg["pattern"]), cfg["content"]
                tokens = [regex.sub(lambda _, c=content: c, t) for t in tokens]
            elif kind == "ByteFallback":
                tokens = _byte_fallback(tokens)
            elif kind == "Fuse":
                tokens, fused = ["".join(tokens)], True
            elif kind == "Strip":
                tokens = [
                    _strip(
                        t,
                        cfg["content"],
                        0 if (i == 0 and fused and not first) else cfg.get("start", 0),
                        cfg.get("stop", 0),
                    )
                    for i, t in enumerate(tokens)
                ]
            else:  # BPEDecoder
                suffix = cfg.get("suffix", "</w>")
                tokens = [
                    t.replace(suffix, "" if i == len(tokens) - 1 else " ")
                    for i, t in enumerate(tokens)
                ]
        return "".join(tokens)

    def _is_stream_local(self) -> bool:
        """True when decoding may restart at a token boundary (see StreamDecoder)."""
        if not self._decoders:
            return False
        fused = False
        for c in self._decoders:
            kind = c["type"]
            fused = fused or kind in ("ByteLevel", "Fuse")
            if kind == "BPEDecoder" or (fused and kind == "Strip" and c.get("stop", 0)):
                return False
            if fused and kind == "Replace" and len(next(iter(c["pattern"].values()))) != 1:
                return False
        return True

    def stream_decoder(self, skip_special_tokens: bool = True) -> StreamDecoder:
        """A `StreamDecoder` for detokenising generated ids one at a time."""
        return StreamDecoder(self, skip_special_tokens)


def _is_word(ch: str) -> bool:
    return _compile(r"\w").match(ch) is not None


def _byte_fallback(tokens: list[str]) -> list[str]:
    out: list[str] = []
    pending = bytearray()

    def flush() -> None:
        if pending:
            try:
                out.append(pending.decode("utf-8"))
            except UnicodeDecodeError:
                out.extend("\ufffd" * len(pending))
            pending.clear()

    for t in tokens:
        if len(t) == 6 and _BYTE_TOKEN.fullmatch(t):
            pending.append(int(t[3:5], 16))
        else:
            flush()
            out.append(t)
    flush()
    return out


def _strip(token: str, content: str, start: int, stop: int) -> str:
    a = 0
    while a < min(start, len(token)) and token[a] == content:
        a += 1
    b = len(token)
    for _ in range(stop):
        if b > a and token[b - 1] == content:
            b -= 1
        else:
            break
    return token[a:b]


class StreamDecoder:
    """Incremental detokenisation: `push(id)` returns the text that became final, `flush()` the
    rest. The concatenation of all returned pieces equals `tokenizer.decode(all_ids)` (with the
    same skip_special_tokens). Text ending in U+FFFD (an incomplete UTF-8 character) and
    byte-fallback tokens are held back until the character is complete."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []  # the window still being decoded
        self._first = True  # whether the window starts the whole sequence
        self._emitted = ""  # text already returned for the current window

    def push(self, token_id: int) -> str:
        tok = self._tok
        token_id = int(token_id)
        tok._token(token_id)  # raises on an unknown id
        if self._skip and token_id in tok._special_ids:
            return ""
        self._ids.append(token_id)
        if token_id in tok._byte_ids:
            return ""
        text = tok._decode_tokens([tok._token(i) for i in self._ids], self._first)
        if text.endswith("\ufffd") or not text.startswith(self._emitted):
            return ""
        piece = text[len(self._emitted) :]
        if tok._stream_local and text:  # decoding restarts cleanly after this token
            self._ids, self._first, self._emitted = [], False, ""
        else:
            self._emitted = text
        return piece

    def flush(self) -> str:
        """Return whatever is still held back (e.g. an incomplete character) and reset."""
        tok = self._tok
        text = tok._decode_tokens([tok._token(i) for i in self._ids], self._first)
        piece = text[len(self._emitted) :] if text.startswith(self._emitted) else ""
        self._ids, self._first, self._emitted = [], self._first and not text, ""
        return piece
