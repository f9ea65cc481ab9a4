"""Tiny random-weight checkpoints of each supported family, built and exported once per run.

Nothing is downloaded: configs come from transformers, tokenizers are trained on the Python
standard library's sources, weights are random with unit-scale activations (see
`edgespec.export.builtin.randomize`) so greedy outputs are not degenerate.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Built-in checkpoints land in a per-run cache, never in the user's home.
os.environ.setdefault("EDGESPEC_CACHE", str(Path(__file__).parent / ".cache"))

SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    max_position_embeddings=256,
)
ARCHS = {
    # name: (model_type, dims)
    "llama-gqa-tied": ("llama", dict(SMALL, num_key_value_heads=2)),
    "llama-untied": ("llama", dict(SMALL, num_key_value_heads=4, tie_word_embeddings=False)),
    "qwen2": ("qwen2", dict(SMALL, num_key_value_heads=2)),
    "gpt2": ("gpt2", dict(n_embd=64, n_layer=4, n_head=4, n_positions=256)),
}
EXIT_LAYER = 2


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from edgespec.export.builtin import write_checkpoint

    root = tmp_path_factory.mktemp("checkpoints")
    out = {}
    for name, (model_type, dims) in ARCHS.items():
        dims = dict(dims)
        tied = dims.pop("tie_word_embeddings", True)
        out[name] = write_checkpoint(root / name, model_type, tie=tied, **dims)
    return out


@pytest.fixture(scope="session")
def bundles(
    checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    from edgespec.export import export_bundle

    root = tmp_path_factory.mktemp("bundles")
    out = {}
    for name, ckpt in checkpoints.items():
        out[name] = root / name
        export_bundle(ckpt, out[name], exit_layers=[EXIT_LAYER])
    return out


@pytest.fixture(scope="session")
def hf_models(checkpoints: dict[str, Path]):
    from transformers import AutoModelForCausalLM

    return {n: AutoModelForCausalLM.from_pretrained(p).eval() for n, p in checkpoints.items()}


DRAFT_FOR = {
    "llama-gqa-tied": "qwen2",
    "llama-untied": "llama-gqa-tied",
    "qwen2": "gpt2",
    "gpt2": "llama-gqa-tied",
}
SPEC_EXITS = [1, 2, 3]


@pytest.fixture(scope="session")
def spec_bundles(checkpoints: dict[str, Path], tmp_path_factory) -> dict[str, Path]:
    """Per architecture: a bundle with a separate draft (another random model with the same
    tokenizer, so drafts are often rejected) and exits at layers 1, 2, 3; plus "self-draft",
    whose draft is the target itself (every draft accepted: the bonus-token path)."""
    from edgespec.export import export_bundle

    root = tmp_path_factory.mktemp("spec_bundles")
    out = {}
    for name, ckpt in checkpoints.items():
        out[name] = root / name
        export_bundle(
            ckpt,
            out[name],
            draft=checkpoints[DRAFT_FOR[name]],
            exit_layers=SPEC_EXITS,
        )
    ckpt = checkpoints["qwen2"]
    out["self-draft"] = root / "self-draft"
    export_bundle(ckpt, out["self-draft"], draft=ckpt)
    return out


LONG_CONTEXT = 1024


@pytest.fixture(scope="session")
def long_bundle(tmp_path_factory) -> Path:
    """A tiny 2-layer llama with a 1024-position context (long prompts and decodes, for the
    server tests) whose draft is itself."""
    from edgespec.export import export_bundle
    from edgespec.export.builtin import write_checkpoint

    root = tmp_path_factory.mktemp("long")
    dims = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2)
    dims |= dict(num_attention_heads=4, num_key_value_heads=2)
    ckpt = write_checkpoint(root / "ckpt", "llama", max_position_embeddings=LONG_CONTEXT, **dims)
    export_bundle(ckpt, root / "bundle", draft=ckpt)
    return root / "bundle"


@pytest.fixture(scope="session")
def tiny_vocab_bundle(tmp_path_factory) -> Path:
    """A 16-token model and a different 16-token draft: exact distributions are computable."""
    from edgespec.export import export_bundle
    from edgespec.export.builtin import write_checkpoint

    root = tmp_path_factory.mktemp("tiny_vocab")
    dims = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    target = write_checkpoint(root / "t", "llama", seed=1, vocab_size=16, **dims)
    draft = write_checkpoint(root / "d", "llama", seed=2, vocab_size=16, **dims)
    export_bundle(target, root / "b", draft=draft, exit_layers=[1])
    return root / "b"


@pytest.fixture(scope="session")
def family_checkpoints(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """Per family of tests/family_configs.py: (target, draft), two random models of the
    family sharing one tokenizer."""
    from family_configs import FAMILIES

    from edgespec.export.builtin import write_checkpoint

    root = tmp_path_factory.mktemp("family_checkpoints")
    out = {}
    for name, (model_type, dims) in FAMILIES.items():
        dims = dict(dims)
        tie = dims.pop("tie_word_embeddings", True)
        target, draft = (
            write_checkpoint(root / f"{name}-{seed}", model_type, seed=seed, tie=tie, **dims)
            for seed in (0, 1)
        )
        out[name] = (target, draft)
    return out


FAMILY_WIDTHS = [1, 4]
FAMILY_MAX_CONTEXT = 96


@pytest.fixture(scope="session")
def family_bundles(family_checkpoints, tmp_path_factory) -> dict[str, Path]:
    """Per family of tests/family_configs.py: target + draft, exits at 1 and 2, static
    copies in widths 1 and 4 (test_families.py; test_split_batching.py batches their rows)."""
    from edgespec.export import export_bundle

    root = tmp_path_factory.mktemp("family_bundles")
    out = {}
    for name, (target, draft) in family_checkpoints.items():
        out[name] = root / name
        export_bundle(
            target,
            out[name],
            draft=draft,
            exit_layers=[1, 2],
            static=True,
            max_context=FAMILY_MAX_CONTEXT,
            verify_width=FAMILY_WIDTHS,
        )
    return out


@pytest.fixture(scope="session")
def family_hf(family_checkpoints):
    from transformers import AutoModelForCausalLM

    return {
        name: AutoModelForCausalLM.from_pretrained(target).eval()
        for name, (target, _) in family_checkpoints.items()
    }


CHAT_DIMS = dict(SMALL, num_key_value_heads=2, vocab_size=2048 + 32)


def write_chat_checkpoint(
    folder: Path, seed: int = 0, template: str | None = None, **dims: int
) -> Path:
    """A qwen2 checkpoint whose tokenizer has ChatML control tokens (ids past the trained
    2,048, inside the model's vocab) and, unless template="", a Qwen 2.5-style chat template
    (`chat_templates.CHAT_BUNDLE_TEMPLATE`); `dims` override the model's (e.g. a longer
    max_position_embeddings)."""
    from chat_templates import ADDED_TOKENS, CHAT_BUNDLE_TEMPLATE, SPECIAL_TOKENS
    from transformers import AutoTokenizer, GenerationConfig

    from edgespec.export.builtin import write_checkpoint

    write_checkpoint(folder, "qwen2", seed=seed, **{**CHAT_DIMS, **dims})
    tok = AutoTokenizer.from_pretrained(folder)
    tok.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS})
    tok.add_tokens(ADDED_TOKENS)
    tok.eos_token = "<|im_end|>"
    tok.pad_token = "<|endoftext|>"
    tok.chat_template = CHAT_BUNDLE_TEMPLATE if template is None else (template or None)
    tok.save_pretrained(folder)
    eos = [tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")]
    GenerationConfig(eos_token_id=eos, bos_token_id=0).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def chat_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("chat_checkpoints")
    return {
        "target": write_chat_checkpoint(root / "target", seed=0),
        "draft": write_chat_checkpoint(root / "draft", seed=1),
    }


@pytest.fixture(scope="session")
def chat_bundle(chat_checkpoints: dict[str, Path], tmp_path_factory) -> Path:
    """A chat bundle (Qwen 2.5-style template) with a draft model and an exit at layer 2."""
    from edgespec.export import export_bundle

    out = tmp_path_factory.mktemp("chat_bundle") / "b"
    export_bundle(
        chat_checkpoints["target"],
        out,
        draft=chat_checkpoints["draft"],
        exit_layers=[EXIT_LAYER],
    )
    return out


@pytest.fixture(scope="session")
def held_blocks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny llama GGUF of Q4_1 blocks, imported as they are (int8 activations, step_width 1)."""
    pytest.importorskip("gguf")
    from edgespec.export import export_bundle
    from tests.gguf_files import write_gguf

    root = tmp_path_factory.mktemp("held")
    write_gguf(root / "m.gguf", "llama", "Q4_1")
    export_bundle(root / "m.gguf", root / "b", exit_layers=[1])
    return root / "b"


@pytest.fixture(scope="session")
def int8_export(checkpoints: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny transformers llama exported with `--quantize int8` (blocks of 64, level 4)."""
    from edgespec.export import export_bundle

    out = tmp_path_factory.mktemp("int8") / "b"
    export_bundle(checkpoints["llama-gqa-tied"], out, quantize="int8")
    return out
