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

The package: `regex.py` (Oniguruma -> `re`), `pretokenize.py` (normalizers, pre-tokenizers),
`bpe.py` (the BPE model), `decoder.py` (decoder chain, `StreamDecoder`), `errors.py`; this
module reads the file and puts them together.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from edgespec.runtime.tokenizer.bpe import _BPE
from edgespec.runtime.tokenizer.decoder import (
    _BYTE_TOKEN,
    _DECODERS,
    StreamDecoder,
    Vocabulary,
    decode_tokens,
    is_stream_local,
)
from edgespec.runtime.tokenizer.errors import TokenizerError, _unsupported
from edgespec.runtime.tokenizer.pretokenize import Piece, _normalizer, _pre_tokenizer
from edgespec.runtime.tokenizer.regex import _WS, _is_word, translate_regex

__all__ = ["StreamDecoder", "Tokenizer", "TokenizerError", "translate_regex"]


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
            found = [i for i in ids if i is not None]
            if len(found) < len(ids):
                raise TokenizerError(f"post_processor special token {name!r} has no id")
            (after if seen_a else before).extend(found)
        return before, after
    raise _unsupported(
        "post_processor",
        cfg,
        "TemplateProcessing, ByteLevel, RobertaProcessing, BertProcessing, Sequence",
    )


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise TokenizerError(f"tokenizer file not found: {path}") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TokenizerError(f"cannot read {path} as JSON: {exc}") from exc


def _token_content(tok: Any) -> str | None:
    return tok.get("content") if isinstance(tok, dict) else tok


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
        eos_id = self.token_to_id(name) if name else None
        if eos_id is not None:
            eos.append(eos_id)
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
        return decode_tokens(self._decoders, tokens, first)

    def _is_stream_local(self) -> bool:
        """True when decoding may restart at a token boundary (see StreamDecoder)."""
        return is_stream_local(self._decoders)

    def stream_decoder(self, skip_special_tokens: bool = True) -> StreamDecoder:
        """A `StreamDecoder` for detokenising generated ids one at a time."""
        vocabulary = Vocabulary(
            self._token, self._decoders, self._special_ids, self._byte_ids, self._stream_local
        )
        return StreamDecoder(vocabulary, skip_special_tokens)
