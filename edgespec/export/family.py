"""What every rotary-decoder family module shares: reading a transformers model into
`DecoderWeights`.

Takes a transformers `*ForCausalLM` whose `model.layers[i]` hold `self_attn` (q/k/v/o
projections or a fused `qkv_proj`, optional `q_norm`/`k_norm`) and `mlp` (gate/up/down or a
fused `gate_up_proj`), plus a `Layout` naming which of the layer's norms sit where. What the
modules themselves say is read from them — the attention scale (`scaling`), attention
soft-cap, sliding window per layer (`config.layer_types`), NoPE layers (`use_rope`), biases,
fused projections, partial rotary — so a family module only adds what lives in its forward
code (embedding scale, multipliers, final soft-cap). The rotary tables come from the model's
own rotary module, so every rope scaling transformers implements is exported as it computes
it, and positions past what a fixed table can express are refused by `max_positions`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from edgespec.export.builder import AttentionShape
from edgespec.export.decoder import DecoderWeights, LayerWeights, Norm

if TYPE_CHECKING:
    import torch

# config activation name -> DecoderWeights.activation of a gated MLP
GATED_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh_gated"}
# rope types whose table depends on the sequence length: exact only up to the original length
LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")


@dataclass(frozen=True)
class Layout:
    """Which attribute of a decoder layer is which norm (None: that norm does not exist)."""

    attn_norm: str | None = "input_layernorm"
    post_attn_norm: str | None = None
    mlp_norm: str | None = "post_attention_layernorm"
    post_mlp_norm: str | None = None
    norm_offset: float = 0.0  # Gemma's RMSNorm multiplies by (1 + w): folded into the gain


def np32(t: torch.Tensor | None) -> np.ndarray | None:
    import torch  # the Hugging Face path only: a GGUF import never loads it

    return None if t is None else t.detach().to(torch.float32).cpu().numpy()


def activation_of(config: Any) -> str:
    """The gated MLP activation, or a ValueError naming the config field."""
    field = "hidden_activation" if getattr(config, "hidden_activation", None) else "hidden_act"
    name = getattr(config, field)
    if name not in GATED_ACTIVATIONS:
        raise ValueError(
            f"{config.model_type} with {field}={name!r} is not supported; supported: "
            + ", ".join(GATED_ACTIVATIONS)
        )
    return GATED_ACTIVATIONS[name]


def rope_parameters(config: Any, layer_type: str | None = None) -> dict:
    params = getattr(config, "rope_parameters", None) or {}
    if layer_type is not None and isinstance(params.get(layer_type), dict):
        params = params[layer_type]
    return params


def max_positions(config: Any) -> int:
    """The positions a fixed rotary table can serve exactly: a length-dependent rope (dynamic
    NTK, LongRoPE) changes every position's angle once the sequence passes the original
    length, so bundles of such models stop there."""
    n = config.max_position_embeddings
    kinds = {rope_parameters(config, t).get("rope_type") for t in _layer_types(config)}
    if kinds & set(LENGTH_DEPENDENT_ROPE):
        original = rope_parameters(config).get("original_max_position_embeddings") or getattr(
            config, "original_max_position_embeddings", None
        )
        if original:
            n = min(n, int(original))
    return n


def check_common(config: Any) -> None:
    """Refusals every rotary family shares, each naming the config field and value."""
    activation_of(config)
    for t in _layer_types(config):
        kind = rope_parameters(config, t).get("rope_type", "default")
        if kind in LENGTH_DEPENDENT_ROPE and not (
            rope_parameters(config).get("original_max_position_embeddings")
            or getattr(config, "original_max_position_embeddings", None)
        ):
            raise ValueError(
                f"{config.model_type} with rope_type={kind!r} and no "
                "original_max_position_embeddings is not supported"
            )
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    factor = rope_parameters(config).get("partial_rotary_factor", 1.0)
    rotary_dim = int(head_dim * factor)
    if rotary_dim != head_dim and rotary_dim % 16:
        raise ValueError(
            f"{config.model_type} with partial_rotary_factor={factor} rotates {rotary_dim} of "
            f"{head_dim} head dims; onnxruntime's GroupQueryAttention needs a multiple of 16"
        )
    types = getattr(config, "layer_types", None) or []
    unknown = sorted(set(types) - {"full_attention", "sliding_attention"})
    if unknown:
        raise ValueError(f"{config.model_type} with layer_types {unknown} is not supported")
    if getattr(config, "use_bidirectional_attention", False):
        raise ValueError(
            f"{config.model_type} with use_bidirectional_attention=True is not a causal LM"
        )


def _layer_types(config: Any) -> list[str | None]:
    params = getattr(config, "rope_parameters", None) or {}
    nested = [k for k, v in params.items() if isinstance(v, dict)]
    return nested or [None]


def rope_layer_types(config: Any) -> tuple[str | None, str | None]:
    """(global, local): the layer types whose rotary tables the bundle's "global" and "local"
    tables are (None: the one table of a model without per-type rope parameters). A model with
    per-type rope parameters (Gemma 3) builds a rotary table only for the layer types it has:
    a Gemma 3 of fewer than 6 layers has sliding layers only, whose table is then the global one.
    """
    if len(_layer_types(config)) < 2:
        return None, None
    present = set(getattr(config, "layer_types", None) or [])
    if present == {"sliding_attention"}:
        return "sliding_attention", None
    if present == {"full_attention"}:
        return "full_attention", None
    return "full_attention", "sliding_attention"


def rotary_tables(
    model: Any, max_pos: int, layer_type: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [max_pos, rotary_dim / 2] as the model's rotary module computes them."""
    import torch

    rope = model.model.rotary_emb
    positions = torch.arange(max_pos)[None, :]
    probe = torch.zeros(1, dtype=torch.float32)
    takes_type = "layer_type" in inspect.signature(rope.forward).parameters
    with torch.no_grad():
        cos, sin = rope(probe, positions, layer_type) if takes_type else rope(probe, positions)
    half = cos.shape[-1] // 2
    return np32(cos[0, :, :half]), np32(sin[0, :, :half])


def layer_window(config: Any, i: int) -> int | None:
    """The sliding window of layer i: every layer (Mistral, Phi-3) or the layers
    `config.layer_types` marks "sliding_attention" (Gemma 2/3, Qwen, SmolLM3)."""
    window = getattr(config, "sliding_window", None)
    if window is None:
        return None
    types = getattr(config, "layer_types", None)
    if types is None:
        return int(window)
    return int(window) if types[i] == "sliding_attention" else None


def norm(module: Any, offset: float = 0.0) -> Norm | None:
    if module is None:
        return None
    eps = getattr(module, "variance_epsilon", None) or module.eps
    gamma = np32(module.weight)
    if offset:  # fp32 (1 + w), exactly what the Gemma norm multiplies by
        gamma = (np.float32(offset) + gamma).astype(np.float32)
    return Norm(gamma, None, float(eps))


def _linear_t(m: Any) -> tuple[np.ndarray, np.ndarray | None]:
    return np32(m.weight).T, np32(getattr(m, "bias", None))


def _cat(parts: list[tuple[np.ndarray, np.ndarray | None]]) -> tuple[np.ndarray, Any]:
    w = np.concatenate([p[0] for p in parts], 1)
    if all(p[1] is None for p in parts):
        return w, None
    return w, np.concatenate(
        [p[1] if p[1] is not None else np.zeros(p[0].shape[1], np.float32) for p in parts]
    )


def extract_decoder(model: Any, prefix: str, layout: Layout) -> DecoderWeights:
    cfg = model.config
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    types = getattr(cfg, "layer_types", None)
    global_type, local_type = rope_layer_types(cfg)
    layers = []
    attn0 = model.model.layers[0].self_attn
    for i, layer in enumerate(model.model.layers):
        at, mlp = layer.self_attn, layer.mlp
        if hasattr(at, "qkv_proj"):  # Phi-3: fused
            qkv_w, qkv_b = _linear_t(at.qkv_proj)
        else:
            qkv_w, qkv_b = _cat([_linear_t(at.q_proj), _linear_t(at.k_proj), _linear_t(at.v_proj)])
        if hasattr(mlp, "gate_up_proj"):  # Phi-3: fused gate|up
            up_w, up_b = _linear_t(mlp.gate_up_proj)
        else:
            up_w, up_b = _cat([_linear_t(mlp.gate_proj), _linear_t(mlp.up_proj)])
        o_w, o_b = _linear_t(at.o_proj)
        down_w, down_b = _linear_t(mlp.down_proj)

        def get(name: str | None, layer: Any = layer) -> Norm | None:
            return norm(getattr(layer, name), layout.norm_offset) if name else None

        rope: str | None = "global"
        if not getattr(at, "use_rope", True):  # SmolLM3's NoPE layers
            rope = None
        elif local_type is not None and types[i] == local_type:
            rope = "local"
        layers.append(
            LayerWeights(
                attn_norm=get(layout.attn_norm),
                qkv_w=qkv_w,
                qkv_b=qkv_b,
                o_w=o_w,
                o_b=o_b,
                mlp_norm=get(layout.mlp_norm),
                up_w=up_w,
                up_b=up_b,
                down_w=down_w,
                down_b=down_b,
                q_norm=norm(getattr(at, "q_norm", None), layout.norm_offset),
                k_norm=norm(getattr(at, "k_norm", None), layout.norm_offset),
                post_attn_norm=get(layout.post_attn_norm),
                post_mlp_norm=get(layout.post_mlp_norm),
                window=layer_window(cfg, i),
                rope=rope,
            )
        )
    embed = np32(model.model.embed_tokens.weight)
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    n = max_positions(cfg)
    scaling = float(getattr(attn0, "scaling", head_dim**-0.5))
    softcap = getattr(attn0, "attn_logit_softcapping", None) or getattr(
        cfg, "attn_logit_softcapping", None
    )
    return DecoderWeights(
        embed=embed,
        pos_embed=None,
        layers=layers,
        final_norm=norm(model.model.norm, layout.norm_offset),  # type: ignore[arg-type]
        lm_head=embed if tied else np32(model.lm_head.weight),
        lm_head_b=np32(getattr(model.lm_head, "bias", None)),
        rotary=rotary_tables(model, n, global_type),
        rotary_local=rotary_tables(model, n, local_type) if local_type is not None else None,
        attn=AttentionShape(
            heads,
            kv_heads,
            head_dim,
            rotary=True,
            scale=None if scaling == head_dim**-0.5 else scaling,
            softcap=float(softcap) if softcap else None,
        ),
        activation=activation_of(cfg),
        prefix=prefix,
        final_softcap=getattr(cfg, "final_logit_softcapping", None) or None,
    )
