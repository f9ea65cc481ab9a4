"""Hugging Face side of export: load a checkpoint, pick its family, read what the bundle records.

`load_checkpoint(model, revision)` gives a transformers causal LM (fp32, eval) and its fast
tokenizer from a local folder, a hub id or a `builtin:` name; `family_of(config)` the family
module (FAMILIES: model_type -> module) that `extract` uses to read `DecoderWeights`;
`model_info` the manifest's `ModelInfo`. The tokenizer helpers save the tokenizer files,
read the bos/eos ids, the calibration ids and the backbone fingerprint. Every unsupported
checkpoint is an `ExportError` naming the problem.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from edgespec.bundle import ModelInfo
from edgespec.export import gemma, gpt2, granite, llama, olmo2
from edgespec.export.decoder import DecoderWeights
from edgespec.export.errors import ExportError

# model_type (transformers config) -> the family module that extracts its weights.
# The family differences are data (docs/families.md); a module is a few lines.
FAMILIES: dict[str, ModuleType] = {
    "llama": llama,
    "mistral": llama,
    "qwen2": llama,
    "qwen3": llama,
    "smollm3": llama,
    "gemma": gemma,
    "gemma2": gemma,
    "gemma3_text": gemma,
    "phi3": llama,
    "granite": granite,
    "olmo2": olmo2,
    "gpt2": gpt2,
}


def load_checkpoint(model: str | Path, revision: str | None) -> tuple[Any, Any]:
    """A transformers causal LM and its fast tokenizer, from a local folder or a hub id."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from edgespec.export.builtin import BUILTIN_PREFIX, builtin_checkpoint

    source = str(model)
    if source.startswith(BUILTIN_PREFIX):
        source = str(builtin_checkpoint(source))
    local = Path(source).expanduser()
    if local.exists():
        if not (local / "config.json").exists():
            raise ExportError(f"{local} has no config.json: not a Hugging Face checkpoint folder")
        source = str(local)
    elif source.startswith((".", "/", "~")) or source.count("/") > 1:
        raise ExportError(f"model folder {source} does not exist")
    try:
        # trust_remote_code=False: never run a checkpoint's code, and never prompt for it
        config = AutoConfig.from_pretrained(source, revision=revision, trust_remote_code=False)
    except (OSError, ValueError) as e:
        if "trust_remote_code" in str(e):
            raise ExportError(
                f"{source!r} needs trust_remote_code (its config maps to the checkpoint's own "
                "Python code), which edgespec never runs; supported architectures: "
                + ", ".join(sorted(FAMILIES))
            ) from None
        raise ExportError(
            f"cannot load a config for {source!r}: {e}\n"
            "Pass a local checkpoint folder, or a hub id with network access (or a warm HF cache)."
        ) from None
    family_of(config)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, revision=revision)
    except (OSError, ValueError) as e:
        raise ExportError(f"cannot load the tokenizer of {source!r}: {e}") from None
    if not getattr(tokenizer, "is_fast", False):
        raise ExportError(
            f"{source!r} has no fast tokenizer (tokenizer.json), which edgespec needs"
        )
    hf = AutoModelForCausalLM.from_pretrained(source, revision=revision, dtype=torch.float32)
    return hf.eval(), tokenizer


def family_of(config: Any) -> ModuleType:
    family = FAMILIES.get(config.model_type)
    if family is None:
        raise ExportError(
            f"architecture {config.model_type!r} is not supported; supported: "
            + ", ".join(sorted(FAMILIES))
        )
    try:
        family.check(config)
    except ValueError as e:
        raise ExportError(str(e)) from None
    return family


def extract(hf_model: Any, prefix: str = "") -> DecoderWeights:
    weights = family_of(hf_model.config).extract(hf_model, prefix=prefix)
    if weights.attn.head_dim % 16:
        raise ExportError(
            f"head_dim {weights.attn.head_dim} is not a multiple of 16, which onnxruntime's "
            "GroupQueryAttention kernel requires"
        )
    return weights


def model_info(hf_model: Any) -> ModelInfo:
    cfg = hf_model.config
    family = family_of(cfg)
    heads = cfg.num_attention_heads
    return ModelInfo(
        architecture=family.__name__.rsplit(".", 1)[-1],
        model_type=cfg.model_type,
        num_layers=cfg.num_hidden_layers,
        hidden_size=cfg.hidden_size,
        num_heads=heads,
        num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
        vocab_size=cfg.vocab_size,
        max_position_embeddings=family.max_positions(cfg),
        tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
    )


def check_same_tokenizer(target_tok: Any, draft_tok: Any, target: Any, draft: Any) -> None:
    check_same_vocab(target_tok.get_vocab(), draft_tok.get_vocab(), target, draft)


def check_same_vocab(t: dict[str, int], d: dict[str, int], target: Any, draft: Any) -> None:
    """An ExportError unless the draft's token -> id table is the target's."""
    if t != d:
        only_t = len(set(t.items()) - set(d.items()))
        raise ExportError(
            f"draft {draft} does not share the tokenizer of {target} ({len(t)} vs {len(d)} "
            f"tokens, {only_t} differ): speculative decoding needs the same token ids. Pick a "
            "draft from the same model family (same tokenizer)."
        )


def calibration_ids(tokenizer: Any, prompts: Sequence[str], info: ModelInfo) -> list[list[int]]:
    """Token ids of the calibration prompts, clipped to the vocabulary and the context."""
    out = []
    for text in prompts:
        ids = [i for i in tokenizer(text)["input_ids"] if 0 <= i < info.vocab_size]
        if ids:
            out.append(ids[: min(128, info.max_position_embeddings - 1)])
    if not out:
        raise ExportError("the calibration prompts tokenize to nothing: give some text")
    return out


def save_tokenizer(tokenizer: Any, out: Path) -> list[str]:
    tokenizer.save_pretrained(str(out))
    files = [
        f
        for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
        if (out / f).exists()
    ]
    if "tokenizer.json" not in files:
        raise ExportError(
            "the tokenizer did not save a tokenizer.json; edgespec needs a fast tokenizer"
        )
    return files


def special_ids(hf_model: Any, tokenizer: Any) -> tuple[int | None, list[int]]:
    gen = getattr(hf_model, "generation_config", None)
    eos: Any = getattr(gen, "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    eos_ids = [] if eos is None else [int(e) for e in (eos if isinstance(eos, list) else [eos])]
    bos = tokenizer.bos_token_id
    return (None if bos is None else int(bos)), eos_ids


def backbone_fingerprint(tokenizer: Any, weights: DecoderWeights) -> str:
    """sha256 of the tokenizer vocabulary and the embedding table: what a draft must share."""
    h = hashlib.sha256()
    h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    h.update(np.ascontiguousarray(weights.embed, dtype=np.float32).tobytes())
    return "sha256:" + h.hexdigest()
