"""Tiny configs of each supported family, each switching on the features that family adds.

Windows are 16 positions, so a 23-token prompt plus 40 new tokens crosses them; every model
has hidden size 64 and 4 layers (seconds to build, export and run).
"""

from __future__ import annotations

import numpy as np

SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    pad_token_id=0,
)
WINDOW = 16
FAMILIES = {
    # name: (model_type, config) — the comment says what the config exercises
    # per-head q/k norm, head_dim 32 != 64 / 4, sliding window on layers 2-3 only
    "qwen3": (
        "qwen3",
        dict(
            SMALL, head_dim=32, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=2
        ),
    ),
    # (1 + w) norms, sqrt(hidden) embedding scale, gated tanh-GELU, one KV head
    "gemma": ("gemma", dict(SMALL, head_dim=16, num_key_value_heads=1)),
    # + post norms, interleaved windows, attention and final soft-caps, query_pre_attn_scalar
    "gemma2": (
        "gemma2",
        dict(
            SMALL,
            head_dim=16,
            sliding_window=WINDOW,
            query_pre_attn_scalar=24,
            attn_logit_softcapping=20.0,
            final_logit_softcapping=10.0,
        ),
    ),
    # + per-head (1 + w) q/k norms, a local rope base on the sliding layers
    "gemma3": (
        "gemma3_text",
        dict(
            SMALL,
            head_dim=16,
            sliding_window=WINDOW,
            query_pre_attn_scalar=16,
            layer_types=[
                "sliding_attention",
                "sliding_attention",
                "full_attention",
                "sliding_attention",
            ],
        ),
    ),
    # fused qkv / gate_up, partial rotary (half of each 32-dim head), window on every layer
    "phi3": (
        "phi3",
        dict(
            SMALL,
            num_attention_heads=2,
            num_key_value_heads=1,
            sliding_window=WINDOW,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5,
            },
            tie_word_embeddings=False,
        ),
    ),
    # window on every layer, head_dim 32, untied head
    "mistral": (
        "mistral",
        dict(SMALL, head_dim=32, sliding_window=WINDOW, tie_word_embeddings=False),
    ),
    # a NoPE layer, MLP biases
    "smollm3": ("smollm3", dict(SMALL, no_rope_layers=[1, 1, 0, 1], mlp_bias=True)),
    # embedding / residual / attention multipliers, logits scaling, attention biases
    "granite": (
        "granite",
        dict(
            SMALL,
            embedding_multiplier=4.0,
            residual_multiplier=0.5,
            attention_multiplier=0.125,
            logits_scaling=2.0,
            attention_bias=True,
            tie_word_embeddings=False,
        ),
    ),
    # post norms only, q/k norms over the whole projections
    "olmo2": ("olmo2", dict(SMALL, tie_word_embeddings=False)),
}
PROMPT_LEN = 23


def family_prompt() -> list[int]:
    """23 ids with repeats (so prompt lookup drafts)."""
    ids = [int(i) for i in np.random.default_rng(3).integers(1, 2048, 12)]
    return ids + ids[:6] + ids[2:7]
