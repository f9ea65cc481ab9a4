"""OLMo 2 checkpoints -> DecoderWeights.

Llama-shaped except for where the norms sit: no pre-norms, an RMSNorm on the attention
output and one on the MLP output before each residual add, and q/k RMSNorms over the whole
q and k projections (not per head) before rotary.
"""

from __future__ import annotations

from typing import Any

from edgespec.export.decoder import DecoderWeights
from edgespec.export.family import Layout, check_common, extract_decoder, max_positions

__all__ = ["check", "extract", "max_positions"]

LAYOUT = Layout(
    attn_norm=None,
    post_attn_norm="post_attention_layernorm",
    mlp_norm=None,
    post_mlp_norm="post_feedforward_layernorm",
)


def check(config: Any) -> None:
    check_common(config)


def extract(model: Any, prefix: str = "") -> DecoderWeights:
    check(model.config)
    return extract_decoder(model, prefix, LAYOUT)
