"""Gemma 1, 2 and 3 (text) checkpoints -> DecoderWeights.

Gemma's differences, as data: RMSNorm gains are (1 + w) (folded into the gains, exact in
fp32), embeddings are scaled by sqrt(hidden) (rounded to the weight dtype, as transformers
does), the MLP is gated tanh-GELU; Gemma 2/3 add a post-attention and a post-MLP norm,
sliding-window layers interleaved with global ones (`layer_types`), an attention scale of
`query_pre_attn_scalar`^-0.5 (read from the modules), attention and final-logit soft-caps
(Gemma 2); Gemma 3 adds per-head q/k norms and its own rotary base on the sliding layers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgespec.export.decoder import DecoderWeights
from edgespec.export.family import Layout, check_common, extract_decoder, max_positions

__all__ = ["check", "extract", "max_positions"]

LAYOUTS = {
    "gemma": Layout(norm_offset=1.0),
    "gemma2": Layout(
        post_attn_norm="post_attention_layernorm",
        mlp_norm="pre_feedforward_layernorm",
        post_mlp_norm="post_feedforward_layernorm",
        norm_offset=1.0,
    ),
}
LAYOUTS["gemma3_text"] = LAYOUTS["gemma2"]


def check(config: Any) -> None:
    check_common(config)


def extract(model: Any, prefix: str = "") -> DecoderWeights:
    cfg = model.config
    check(cfg)
    w = extract_decoder(model, prefix, LAYOUTS[cfg.model_type])
    embed = model.model.embed_tokens
    if hasattr(embed, "scalar_embed_scale"):  # Gemma 3: a scaled embedding module
        w.embed_scale = float(embed.embed_scale.to(embed.weight.dtype))
    else:  # Gemma 1/2 scale in the model's forward, in the activations' dtype
        w.embed_scale = float(np.float32(cfg.hidden_size**0.5))
    return w
