"""Built-in tiny checkpoints, so `edgespec export builtin:tiny-llama` needs no download.

`builtin_checkpoint("builtin:NAME")` writes (once, into a cache folder) a small random-weight
Hugging Face checkpoint of the named family with a byte-level BPE tokenizer trained on
Python standard-library sources, and returns its folder. Its text is gibberish: it exists to
show and test the whole pipeline on any machine, offline.
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

from edgespec.export.errors import ExportError

BUILTIN_PREFIX = "builtin:"
VOCAB = 2048
TINY_LLAMA = dict(
    model_type="llama",
    hidden_size=256,
    intermediate_size=688,
    num_hidden_layers=6,
    num_attention_heads=8,
    num_key_value_heads=2,
    max_position_embeddings=2048,
)
CONFIGS = {
    "tiny-llama": TINY_LLAMA,
    "tiny-qwen2": dict(TINY_LLAMA, model_type="qwen2"),
    "tiny-gpt2": dict(model_type="gpt2", n_embd=256, n_layer=6, n_head=8, n_positions=1024),
}


def cache_dir() -> Path:
    root = os.environ.get("EDGESPEC_CACHE") or Path.home() / ".cache" / "edgespec"
    return Path(root) / "builtin"


def builtin_checkpoint(name: str) -> Path:
    key = name.removeprefix(BUILTIN_PREFIX)
    if key not in CONFIGS:
        raise ExportError(
            f"unknown built-in model {name!r}; built-ins: "
            + ", ".join(BUILTIN_PREFIX + k for k in CONFIGS)
        )
    folder = cache_dir() / key
    if not (folder / "config.json").exists():
        write_checkpoint(folder, **CONFIGS[key])
    return folder


_TRAINED: dict[int, str] = {}  # vocab size -> tokenizer.json text (training is the slow part)


def train_tokenizer(folder: Path, vocab_size: int = VOCAB) -> None:
    """A GPT-2-style byte-level BPE trained on stdlib sources, saved as a fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size not in _TRAINED:
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        texts = [p.read_text(errors="ignore") for p in sorted(stdlib.glob("*.py"))[:60]]
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer)
        _TRAINED[vocab_size] = tok.to_str()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_TRAINED[vocab_size]),
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
    )
    fast.save_pretrained(str(folder))


def write_checkpoint(
    folder: Path,
    model_type: str,
    seed: int = 0,
    tie: bool = True,
    vocab_size: int = VOCAB,
    **dims: int,
) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    train_tokenizer(folder)
    config = AutoConfig.for_model(
        model_type,
        vocab_size=vocab_size,
        bos_token_id=0,
        eos_token_id=0,
        tie_word_embeddings=tie,
        **dims,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    randomize(model, seed)
    model.save_pretrained(str(folder))
    return folder


def randomize(model, seed: int) -> None:
    """Weights with unit-scale activations: transformers' default init (std 0.02) makes tiny
    models near-identity maps that echo their last input token, which would let parity tests
    pass on degenerate output."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                fan_in = p.shape[0] if "c_" in name else p.shape[-1]  # GPT-2 Conv1D is [in, out]
                # small embeddings so the layers, not an echo of the input token, decide the output
                scale = 0.1 if "wte" in name or "embed" in name or "wpe" in name else fan_in**-0.5
                p.copy_(torch.randn(p.shape, generator=gen) * scale)
            elif name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
            else:  # norm gains
                p.copy_(1.0 + torch.randn(p.shape, generator=gen) * 0.1)
