"""Llama-shaped checkpoints -> DecoderWeights: Llama 1-3, Mistral, Qwen2/2.5, Qwen3, SmolLM 1-3,
Phi-3 / Phi-3.5 / Phi-4-mini.

Takes a transformers `*ForCausalLM` with two pre-norms per layer (RMSNorm), rotary
positions (any rope scaling transformers computes) and a gated SiLU MLP; what varies inside
the family is read from the modules by `family.extract_decoder`: q/k/v biases (Qwen2), MLP
biases, per-head q/k RMSNorm (Qwen3), sliding windows on every layer (Mistral, Phi-3) or on
the layers `layer_types` marks (Qwen), NoPE layers (SmolLM3), `head_dim` != hidden / heads,
fused `qkv_proj` / `gate_up_proj` (Phi-3: already the packed layout the graphs use) and
partial rotary (`partial_rotary_factor`, Phi-4-mini). LongRoPE's table is exact only up to
`original_max_position_embeddings`, where the bundle's context stops (`family.max_positions`).
"""

from __future__ import annotations

from typing import Any

from edgespec.export.decoder import DecoderWeights
from edgespec.export.family import Layout, check_common, extract_decoder, max_positions

__all__ = ["check", "extract", "max_positions"]

LAYOUT = Layout()


def check(config: Any) -> None:
    check_common(config)


def extract(model: Any, prefix: str = "") -> DecoderWeights:
    check(model.config)
    return extract_decoder(model, prefix, LAYOUT)
