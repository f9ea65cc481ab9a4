"""Llama-family checkpoints (Llama 1-3 incl. GQA, Qwen2 / Qwen2.5, SmolLM) -> DecoderWeights.

Takes a transformers `*ForCausalLM` of that family (RMSNorm, rotary positions, gated SiLU
MLP, optional q/k/v biases, tied or untied LM head). The rotary tables come from the model's
own rotary module, so every rope scaling transformers implements is exported as it computes it.
"""

from __future__ import annotations

import numpy as np
import torch

from edgespec.export.builder import AttentionShape
from edgespec.export.decoder import DecoderWeights, LayerWeights, Norm


def _np(t: torch.Tensor | None) -> np.ndarray | None:
    return None if t is None else t.detach().to(torch.float32).cpu().numpy()


def check(config) -> None:
    if getattr(config, "use_sliding_window", False):
        raise ValueError(f"{config.model_type} with sliding-window attention is not supported yet")
    if getattr(config, "hidden_act", "silu") != "silu":
        raise ValueError(
            f"{config.model_type} with hidden_act={config.hidden_act} is not supported (silu only)"
        )
    if getattr(config, "mlp_bias", False):
        raise ValueError("Llama with mlp_bias=True is not supported yet")


def rotary_tables(model, max_pos: int, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    rope = model.model.rotary_emb
    positions = torch.arange(max_pos)[None, :]
    probe = torch.zeros(1, dtype=torch.float32)
    with torch.no_grad():
        cos, sin = rope(probe, positions)
    half = cos.shape[-1] // 2
    if cos.shape[-1] != head_dim:
        raise ValueError("partial rotary embeddings are not supported yet")
    return _np(cos[0, :, :half]), _np(sin[0, :, :half])


def extract(model, prefix: str = "") -> DecoderWeights:
    cfg = model.config
    check(cfg)
    heads, kv_heads = (
        cfg.num_attention_heads,
        getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads,
    )
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    layers = []
    for layer in model.model.layers:
        at, mlp = layer.self_attn, layer.mlp
        qkv_w = np.concatenate(
            [_np(at.q_proj.weight).T, _np(at.k_proj.weight).T, _np(at.v_proj.weight).T], 1
        )
        qkv_b = None
        if at.q_proj.bias is not None:
            qkv_b = np.concatenate([_np(at.q_proj.bias), _np(at.k_proj.bias), _np(at.v_proj.bias)])
        layers.append(
            LayerWeights(
                attn_norm=Norm(_np(layer.input_layernorm.weight), None, cfg.rms_norm_eps),
                qkv_w=qkv_w,
                qkv_b=qkv_b,
                o_w=_np(at.o_proj.weight).T,
                o_b=_np(at.o_proj.bias),
                mlp_norm=Norm(_np(layer.post_attention_layernorm.weight), None, cfg.rms_norm_eps),
                up_w=np.concatenate([_np(mlp.gate_proj.weight).T, _np(mlp.up_proj.weight).T], 1),
                up_b=None,
                down_w=_np(mlp.down_proj.weight).T,
                down_b=None,
            )
        )
    embed = _np(model.model.embed_tokens.weight)
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return DecoderWeights(
        embed=embed,
        pos_embed=None,
        layers=layers,
        final_norm=Norm(_np(model.model.norm.weight), None, cfg.rms_norm_eps),
        lm_head=embed if tied else _np(model.lm_head.weight),
        lm_head_b=_np(getattr(model.lm_head, "bias", None)),
        rotary=rotary_tables(model, cfg.max_position_embeddings, head_dim),
        attn=AttentionShape(heads, kv_heads, head_dim, rotary=True),
        activation="silu",
        prefix=prefix,
    )
