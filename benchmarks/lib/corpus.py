"""The trained pair's data: a BPE tokenizer trained on Python's standard library, the corpus
it encodes, and the held-out code and text prompts the speculative scenarios decode
(`benchmarks/train_models.py` trains on them).

Data: stdlib ``*.py`` files minus tests, ``site-packages``, and two data-only packages
(``encodings``: codec tables, ``pydoc_data``: one big string of docs), split by a hash of the
path relative to the stdlib root: ~95% train, ~5% held out. The tokenizer is a GPT-2 style
byte-level BPE (vocab 4096, ``<|endoftext|>`` = id 0 as bos/eos/pad), trained on the train
split only.
"""

from __future__ import annotations

import ast
import json
import random
import re
import sysconfig
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    from transformers import PreTrainedTokenizerFast


from benchmarks.lib.models import EXCLUDED_DIRS, HELDOUT_PERCENT

SCRIPT_VERSION = 1
SEED = 0
EOS = "<|endoftext|>"  # id 0: bos, eos and pad of both models
VOCAB_SIZE = 4096
N_CODE_PROMPTS = 32
N_TEXT_PROMPTS = 16


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------------------------- data
def data_config() -> dict[str, Any]:
    """Everything the tokenizer and the split depend on (part of every cache key)."""
    return {
        "corpus": "python-stdlib",
        "python": sysconfig.get_python_version(),
        "excluded_dirs": sorted(EXCLUDED_DIRS),
        "heldout_percent": HELDOUT_PERCENT,
        "vocab_size": VOCAB_SIZE,
        "version": SCRIPT_VERSION,
    }


def train_tokenizer(texts: Iterable[str]) -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    """GPT-2 style byte-level BPE with `<|endoftext|>` as id 0."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=EOS, eos_token=EOS, pad_token=EOS
    )


def load_or_train_tokenizer(
    out: Path, train_texts: dict[str, str], force: bool
) -> PreTrainedTokenizerFast:
    from transformers import PreTrainedTokenizerFast

    folder = out / "tokenizer"
    info_path = folder / "tokenizer_info.json"
    config = data_config()
    if not force and read_config(info_path) == normalized(config):
        return PreTrainedTokenizerFast.from_pretrained(folder)
    log("training the tokenizer on the train split")
    tok = train_tokenizer(train_texts.values())
    tok.save_pretrained(folder)
    write_json(info_path, {"config": config})
    return tok


def encode_corpus(tok: PreTrainedTokenizerFast, texts: Iterable[str]) -> np.ndarray:
    """All documents as one id stream, each preceded by `<|endoftext|>`."""
    import numpy as np

    eos = tok.convert_tokens_to_ids(EOS)
    encoded = tok.backend_tokenizer.encode_batch(list(texts), add_special_tokens=False)
    ids: list[int] = []
    for enc in encoded:
        ids.append(eos)
        ids.extend(enc.ids)
    return np.asarray(ids, dtype=np.int64)


# ------------------------------------------------------------------------------ prompts
def cut_points(source: str) -> list[tuple[str, int]]:
    """(kind, line index) where a prompt may end, from the file's syntax tree.

    "def": right after the ':' of a one-line function signature (the model must write the
    body); "body": at the end of a statement inside a function that is followed by another
    statement of the same block (the model must continue the function).
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    lines = source.split("\n")  # ast's line numbers (str.splitlines also splits on \f)
    points: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if lines[node.lineno - 1].rstrip().endswith(":"):
            points.append(("def", node.lineno - 1))
        for stmt, nxt in zip(node.body, node.body[1:], strict=False):
            simple = isinstance(stmt, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Expr)
            docstring = isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
            if simple and not docstring and stmt.end_lineno and nxt.lineno > stmt.end_lineno:
                points.append(("body", stmt.end_lineno - 1))
    return sorted(set(points), key=lambda p: (p[1], p[0]))


def chunk_before(
    tok: PreTrainedTokenizerFast, lines: list[str], end: int, lo: int = 100, hi: int = 200
) -> str | None:
    """Whole lines ending at line `end` (trailing whitespace cut), ~150 tokens, or None."""
    n = 0
    start = end
    while start > 0 and n < (lo + hi) // 2:
        start -= 1
        n += len(tok.encode(lines[start]))
    text = "".join(lines[start:end]) + lines[end].rstrip()
    count = len(tok.encode(text))
    return text if lo <= count <= hi else None


def code_prompts(tok: PreTrainedTokenizerFast, heldout: dict[str, str]) -> list[dict[str, Any]]:
    """N_CODE_PROMPTS held-out chunks: round-robin over files, alternating the cut kind."""
    rng = random.Random(SEED)
    per_file: list[tuple[str, list[str], list[tuple[str, int]]]] = []
    for rel, source in heldout.items():
        points = cut_points(source)
        rng.shuffle(points)
        if points:
            per_file.append((rel, [line + "\n" for line in source.split("\n")], points))
    prompts: list[dict[str, Any]] = []
    while len(prompts) < N_CODE_PROMPTS and any(points for _, _, points in per_file):
        for rel, lines, points in per_file:
            if len(prompts) >= N_CODE_PROMPTS or not points:
                continue
            want = ("def", "body")[len(prompts) % 2]
            pick = next((i for i, (kind, _) in enumerate(points) if kind == want), 0)
            kind, line = points.pop(pick)
            text = chunk_before(tok, lines, line)
            if text is not None:
                prompts.append({"source": f"{rel}:{line + 1}", "cut": kind, "prompt": text})
    return [
        {"id": f"code-{i:02d}", "kind": "code", **p, "prompt_tokens": len(tok.encode(p["prompt"]))}
        for i, p in enumerate(prompts)
    ]


def text_prompts(
    tok: PreTrainedTokenizerFast, train: dict[str, str], code: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """N_TEXT_PROMPTS high-entropy prompts (~150 tokens), styles interleaved."""
    rng = random.Random(SEED + 1)
    words = sorted(set(re.findall(r"\b[a-z]{3,10}\b", "\n".join(train.values()))))
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"

    def random_words() -> str:
        return " ".join(rng.choice(words) for _ in range(8))

    def random_identifiers() -> str:
        names = ["".join(rng.choice(alphabet) for _ in range(rng.randint(3, 12))) for _ in range(4)]
        return f"{names[0]} = {names[1]}.{names[2]}({names[3]})\n"

    prompts: list[dict[str, Any]] = []
    styles = ("words", "identifiers", "shuffled")
    for i in range(N_TEXT_PROMPTS):
        style = styles[i % len(styles)]
        if style == "shuffled":
            chars = list(code[i % len(code)]["prompt"])
            rng.shuffle(chars)
            text = "".join(chars)
            while (n := len(tok.encode(text))) > 160:  # shuffled text needs ~2x the tokens
                text = text[: len(text) * 150 // n]
        else:
            text = ""
            while len(tok.encode(text)) < 150:
                text += (random_words() + " ") if style == "words" else random_identifiers()
        prompts.append(
            {
                "id": f"text-{i:02d}",
                "kind": "text",
                "style": style,
                "prompt": text.rstrip(),
                "prompt_tokens": len(tok.encode(text.rstrip())),
            }
        )
    return prompts


def normalized(obj: Any) -> Any:
    """JSON round trip, so that configs compare equal to what was read back from disk."""
    return json.loads(json.dumps(obj, sort_keys=True))


def read_config(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("config")
    except (OSError, ValueError):
        return None


def write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)
