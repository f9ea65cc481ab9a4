"""Decoding ids back to text: the decoder chain of tokenizer.json and streaming detokenisation.

`decode_tokens(decoders, tokens, first)` runs the decoders (ByteLevel, Metaspace, Replace,
ByteFallback, Fuse, Strip, BPEDecoder) over token strings, like `tokenizers`' decode;
`StreamDecoder` detokenises generated ids one at a time and guarantees that the pieces it
returns concatenate to `Tokenizer.decode(all_ids)`, holding back incomplete UTF-8 characters.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from edgespec.runtime.tokenizer.pretokenize import _CHAR_BYTES
from edgespec.runtime.tokenizer.regex import _pattern

_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")
_DECODERS = ("ByteLevel", "Metaspace", "Replace", "ByteFallback", "Fuse", "Strip", "BPEDecoder")


def decode_tokens(decoders: list[dict[str, Any]], tokens: list[str], first: bool) -> str:
    """Run the decoder chain; `first=False` means the tokens do not start the sequence."""
    if not decoders:
        return " ".join(tokens)
    fused = False
    for cfg in decoders:
        kind = cfg["type"]
        if kind == "ByteLevel":
            data = b"".join(
                bytes(_CHAR_BYTES[c] for c in t) if all(c in _CHAR_BYTES for c in t) else t.encode()
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
                t.replace(suffix, "" if i == len(tokens) - 1 else " ") for i, t in enumerate(tokens)
            ]
    return "".join(tokens)


def is_stream_local(decoders: list[dict[str, Any]]) -> bool:
    """True when decoding may restart at a token boundary (see StreamDecoder)."""
    if not decoders:
        return False
    fused = False
    for c in decoders:
        kind = c["type"]
        fused = fused or kind in ("ByteLevel", "Fuse")
        if kind == "BPEDecoder" or (fused and kind == "Strip" and c.get("stop", 0)):
            return False
        if fused and kind == "Replace" and len(next(iter(c["pattern"].values()))) != 1:
            return False
    return True


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


@dataclass(frozen=True)
class Vocabulary:
    """What streaming detokenisation reads of a tokenizer."""

    token: Callable[[int], str]  # id -> token string; raises on an unknown id
    decoders: list[dict[str, Any]]  # tokenizer.json's decoder chain
    special_ids: Collection[int]
    byte_ids: Collection[int]  # byte-fallback tokens (<0xNN>): held until a character ends
    stream_local: bool  # decoding may restart at a token boundary (`is_stream_local`)

    def decode(self, ids: list[int], first: bool) -> str:
        return decode_tokens(self.decoders, [self.token(i) for i in ids], first)


class StreamDecoder:
    """Incremental detokenisation: `push(id)` returns the text that became final, `flush()` the
    rest. The concatenation of all returned pieces equals `tokenizer.decode(all_ids)` (with the
    same skip_special_tokens). Text ending in U+FFFD (an incomplete UTF-8 character) and
    byte-fallback tokens are held back until the character is complete."""

    def __init__(self, vocabulary: Vocabulary, skip_special_tokens: bool = True) -> None:
        self._tok = vocabulary
        self._skip = skip_special_tokens
        self._ids: list[int] = []  # the window still being decoded
        self._first = True  # whether the window starts the whole sequence
        self._emitted = ""  # text already returned for the current window

    def push(self, token_id: int) -> str:
        tok = self._tok
        token_id = int(token_id)
        tok.token(token_id)  # raises on an unknown id
        if self._skip and token_id in tok.special_ids:
            return ""
        self._ids.append(token_id)
        if token_id in tok.byte_ids:
            return ""
        text = tok.decode(self._ids, self._first)
        if text.endswith("\ufffd") or not text.startswith(self._emitted):
            return ""
        piece = text[len(self._emitted) :]
        if tok.stream_local and text:  # decoding restarts cleanly after this token
            self._ids, self._first, self._emitted = [], False, ""
        else:
            self._emitted = text
        return piece

    def flush(self) -> str:
        """Return whatever is still held back (e.g. an incomplete character) and reset."""
        text = self._tok.decode(self._ids, self._first)
        piece = text[len(self._emitted) :] if text.startswith(self._emitted) else ""
        self._ids, self._first, self._emitted = [], self._first and not text, ""
        return piece
