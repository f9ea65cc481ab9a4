"""GPT-2-family checkpoints -> DecoderWeights.

Takes a transformers `GPT2LMHeadModel`: LayerNorm, learned absolute positions, packed
c_attn Conv1D (already [in, out], q|k|v), tanh-GELU MLP, LM head tied to the embeddings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from edgespec.export.builder import AttentionShape
from edgespec.export.decoder import DecoderWeights, LayerWeights, Norm

if TYPE_CHECKING:
    import torch


def _np(t: torch.Tensor | None) -> np.ndarray | None:
    import torch  # the Hugging Face path only: a GGUF import never loads it

    return None if t is None else t.detach().to(torch.float32).cpu().numpy()


def check(config) -> None:
    if config.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ValueError(f"GPT-2 with activation {config.activation_function} is not supported yet")
    if getattr(config, "scale_attn_by_inverse_layer_idx", False) or getattr(
        config, "reorder_and_upcast_attn", False
    ):
        raise ValueError(
            "GPT-2 with scale_attn_by_inverse_layer_idx/reorder_and_upcast_attn is not supported"
        )
    if not getattr(config, "scale_attn_weights", True):
        raise ValueError("GPT-2 with scale_attn_weights=False is not supported")


def max_positions(config) -> int:
    return config.max_position_embeddings


def extract(model, prefix: str = "") -> DecoderWeights:
    cfg = model.config
    check(cfg)
    tr = model.transformer
    eps = cfg.layer_norm_epsilon
    layers = []
    for block in tr.h:
        layers.append(
            LayerWeights(
                attn_norm=Norm(_np(block.ln_1.weight), _np(block.ln_1.bias), eps),
                qkv_w=_np(block.attn.c_attn.weight),
                qkv_b=_np(block.attn.c_attn.bias),
                o_w=_np(block.attn.c_proj.weight),
                o_b=_np(block.attn.c_proj.bias),
                mlp_norm=Norm(_np(block.ln_2.weight), _np(block.ln_2.bias), eps),
                up_w=_np(block.mlp.c_fc.weight),
                up_b=_np(block.mlp.c_fc.bias),
                down_w=_np(block.mlp.c_proj.weight),
                down_b=_np(block.mlp.c_proj.bias),
            )
        )
    embed = _np(tr.wte.weight)
    tied = model.lm_head.weight.data_ptr() == tr.wte.weight.data_ptr()
    heads = cfg.n_head
    return DecoderWeights(
        embed=embed,
        pos_embed=_np(tr.wpe.weight),
        layers=layers,
        final_norm=Norm(_np(tr.ln_f.weight), _np(tr.ln_f.bias), eps),
        lm_head=embed if tied else _np(model.lm_head.weight),
        lm_head_b=None,
        rotary=None,
        attn=AttentionShape(heads, heads, cfg.n_embd // heads, rotary=False),
        activation="gelu_tanh",
        prefix=prefix,
    )
