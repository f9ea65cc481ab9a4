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


# Each family's transformers default configuration, only shrunk to test size: what a user's
# checkpoint brings when its config.json leaves a field out (rope, windows, multipliers,
# layer types are the library's defaults). Gemma 3's default head_dim (256) is shrunk too.
DEFAULT_SIZES = dict(SMALL, max_position_embeddings=512)
DEFAULTS = {
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {}),
    "gemma": ("gemma", dict(head_dim=16)),
    "gemma2": ("gemma2", dict(head_dim=16)),
    "gemma3": ("gemma3_text", dict(head_dim=16, sliding_window=64)),
    "phi3": ("phi3", {}),
    "mistral": ("mistral", dict(sliding_window=None)),
    "smollm3": ("smollm3", {}),
    "granite": ("granite", {}),
    "olmo2": ("olmo2", {}),
    "llama": ("llama", {}),
}

# The config shapes of real hub checkpoints, shrunk to test size, keeping what decides the
# numbers: rope base and scaling, partial rotary, multipliers, windows (shrunk so a 40-token
# run crosses them, odd where the checkpoint's is), layer types, tied heads.
HUB_SHAPES = {
    # Mistral-7B-v0.3: rope_theta 1e6, no sliding window, untied head
    "mistral-7b-v0.3": (
        "mistral",
        dict(
            SMALL,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6},
            sliding_window=None,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
        ),
    ),
    # Phi-3-mini-4k: a window of 2047 (odd) on every layer, full rotary, untied head
    "phi-3-mini": (
        "phi3",
        dict(
            SMALL,
            sliding_window=15,
            original_max_position_embeddings=256,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
        ),
    ),
    # Phi-4-mini: LongRoPE, partial rotary 0.75 (96 of 128 dims), a window wider than the
    # context, tied head
    "phi-4-mini": (
        "phi3",
        dict(
            SMALL,
            hidden_size=128,
            num_attention_heads=2,
            num_key_value_heads=1,
            sliding_window=4096,
            original_max_position_embeddings=64,
            rope_parameters={
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.75,
                "short_factor": [1.0 + 0.05 * i for i in range(24)],
                "long_factor": [1.5 + 0.25 * i for i in range(24)],
            },
            tie_word_embeddings=True,
        ),
    ),
    # Granite 3.1: the four multipliers at their real values, rope_theta 1e7, tied head
    "granite-3.1": (
        "granite",
        dict(
            SMALL,
            embedding_multiplier=12.0,
            residual_multiplier=0.22,
            attention_multiplier=0.0078125,
            logits_scaling=16.0,
            rope_parameters={"rope_type": "default", "rope_theta": 1e7},
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
        ),
    ),
    # Gemma 3 1B: 5 sliding layers to 1 global (the config's own pattern), one KV head,
    # query_pre_attn_scalar 256 != head_dim, local rope base 1e4 and global 1e6
    "gemma-3-1b": (
        "gemma3_text",
        dict(
            SMALL,
            num_hidden_layers=6,
            num_key_value_heads=1,
            head_dim=16,
            query_pre_attn_scalar=256,
            sliding_window=16,
        ),
    ),
    # Gemma 3 4B: as 1B, plus linear rope scaling (factor 8) on the global layers only
    "gemma-3-4b": (
        "gemma3_text",
        dict(
            SMALL,
            num_hidden_layers=6,
            head_dim=16,
            query_pre_attn_scalar=256,
            sliding_window=16,
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
        ),
    ),
}
