"""A GGUF file -> the `DecoderWeights` and `ModelInfo` the Hugging Face path feeds the graph
builders (numpy and the `gguf` package only; no torch).

`read_gguf(path)` opens the file, maps `general.architecture` onto a family (`ARCHS`) and
reads every weight: block-quantized tensors as `PackedMatrix` (gguf_blocks.py: the file's own
integers and scales, no re-quantization) where their format is exactly representable, F32 /
F16 / BF16 as float32, any other type dequantized and re-quantized to int8 blocks of 32 with the
error measured. What llama.cpp's converter changed is undone: the Q/K row permutation of
rotary-"norm" architectures (llama, mistral, granite), whose ggml rope rotates adjacent pairs
where transformers rotates halves. Gemma's RMSNorm gains are stored as (1 + w) already.
Anything the importer cannot take is a `ValueError` naming the metadata field or tensor,
raised while reading, before the caller writes a file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgespec.bundle import ModelInfo
from edgespec.export.builder import AttentionShape
from edgespec.export.decoder import DecoderWeights, LayerWeights, Norm
from edgespec.export.gguf_blocks import PackedMatrix, concat_columns, pack
from edgespec.export.nbits import quantize_blocks


@dataclass(frozen=True)
class Arch:
    """How one `general.architecture` differs, as data."""

    model_type: str  # the transformers model_type of the same checkpoint
    family: str  # the family module name the manifest records (export/hf.py FAMILIES)
    permuted_qk: bool = False  # llama.cpp permuted q/k rows for its adjacent-pair rope
    activation: str = "silu"
    swa_pattern: int = 0  # every n-th layer is global, the others slide (Gemma 2/3); 0: none
    swa_all: bool = False  # every layer slides (Phi-3)


ARCHS = {
    "llama": Arch("llama", "llama", permuted_qk=True),
    "mistral": Arch("mistral", "llama", permuted_qk=True),
    "granite": Arch("granite", "granite", permuted_qk=True),
    "qwen2": Arch("qwen2", "llama"),
    "qwen3": Arch("qwen3", "llama"),
    "phi3": Arch("phi3", "llama", swa_all=True),
    "olmo2": Arch("olmo2", "olmo2"),
    "gemma": Arch("gemma", "gemma", activation="gelu_tanh_gated"),
    "gemma2": Arch("gemma2", "gemma", activation="gelu_tanh_gated", swa_pattern=2),
    "gemma3": Arch("gemma3_text", "gemma", activation="gelu_tanh_gated", swa_pattern=6),
}
FLOAT_TYPES = ("F32", "F16", "BF16")
# per-layer GGUF norm names -> LayerWeights fields; which exist is the family's layout
NORMS = {
    "attn_norm": "attn_norm",
    "post_attention_norm": "post_attn_norm",
    "ffn_norm": "mlp_norm",
    "post_ffw_norm": "post_mlp_norm",
    "attn_q_norm": "q_norm",
    "attn_k_norm": "k_norm",
}


@dataclass
class GGUFModel:
    """What the importer read: the weights, the manifest's model record, the raw metadata
    (tokenizer, chat template) and where each part came from (`provenance`)."""

    arch: Arch
    weights: DecoderWeights
    info: ModelInfo
    metadata: dict[str, Any]
    provenance: dict[str, Any] = field(default_factory=dict)
    requantized: dict[str, dict[str, float]] = field(default_factory=dict)  # tensor -> error


def read_metadata(reader: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, f in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        try:
            out[key] = f.contents()
        except Exception as e:  # a malformed field: name it
            raise ValueError(f"GGUF metadata field {key!r} cannot be read: {e}") from None
    return out


class _Reader:
    """The file's tensors by name, each read once into the form the builders take."""

    def __init__(self, reader: Any, meta: dict[str, Any], arch_name: str) -> None:
        from gguf import GGMLQuantizationType

        self.tensors = {t.name: t for t in reader.tensors}
        self.meta, self.arch = meta, arch_name
        self.qtype = GGMLQuantizationType
        self.sources: dict[str, str] = {}
        self.requantized: dict[str, dict[str, float]] = {}

    def key(self, name: str, default: Any = None, required: bool = False) -> Any:
        k = f"{self.arch}.{name}"
        if k not in self.meta:
            if required:
                raise ValueError(f"the GGUF file has no {k!r} metadata field")
            return default
        return self.meta[k]

    def has(self, name: str) -> bool:
        return name in self.tensors

    def vector(self, name: str) -> np.ndarray:
        return self.floats(name).reshape(-1)

    def floats(self, name: str) -> np.ndarray:
        """[rows, row length] float32 of any type (exact for F32/F16/BF16)."""
        from gguf.quants import dequantize

        t = self._tensor(name)
        w = np.asarray(dequantize(t.data, t.tensor_type), np.float32)
        return w.reshape(-1, int(t.shape[0]))

    def matrix(self, name: str) -> PackedMatrix | np.ndarray:
        """A weight with rows = output features as W [K, N]: held blocks, float, or int8."""
        t = self._tensor(name)
        kind = t.tensor_type.name
        k = int(t.shape[0])
        if kind in FLOAT_TYPES:
            self.sources[name] = f"{kind} -> float"
            return np.ascontiguousarray(self.floats(name).T)
        packed = pack(np.asarray(t.data).reshape(-1, t.data.shape[-1]), kind, k)
        if packed is not None:
            self.sources[name] = f"{kind} -> MatMulNBits {packed.bits}-bit block {packed.block}"
            return packed
        w = self.floats(name)  # [N, K] as ggml dequantizes it
        q, s, _ = quantize_blocks(w.T, 8, 32)
        re = PackedMatrix(8, 32, q, s.reshape(w.shape[0], -1), None, None, f"{kind}->int8")
        err = np.abs(re.dequantize() - w.T)
        self.requantized[name] = {
            "max_abs_error": float(err.max()),
            "relative_rms_error": float(np.sqrt((err**2).mean() / max((w**2).mean(), 1e-30))),
        }
        self.sources[name] = f"{kind} -> dequantized, re-quantized int8 block 32"
        return re

    def _tensor(self, name: str) -> Any:
        if name not in self.tensors:
            raise ValueError(f"the GGUF file has no tensor {name!r}")
        return self.tensors[name]


def _columns(parts: list[Any]) -> Any:
    """q|k|v or gate|up: one packed matrix in the parts' common layout (`common_layout`), or
    floats when any part is float (the parts' exact values as float32: nothing rounds)."""
    if all(isinstance(p, PackedMatrix) for p in parts):
        joined = concat_columns(parts)
        if joined is not None:
            return joined
    return np.concatenate([np.asarray(p, np.float32) for p in parts], 1)


def _unpermute(heads: int, n: int) -> np.ndarray:
    """Rows of llama.cpp's permuted q/k back in transformers' order."""
    return np.arange(n).reshape(heads, n // heads // 2, 2).swapaxes(1, 2).reshape(-1)


def rotary(dim: int, base: float, positions: int, divisors: np.ndarray | None = None):
    """cos, sin [positions, dim / 2] float32, as transformers computes the default rope
    (`divisors`: per-frequency factors, llama.cpp's rope_freqs / a linear scaling)."""
    inv = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim))
    inv = inv.astype(np.float32)
    if divisors is not None:
        inv = (inv / divisors).astype(np.float32)
    freqs = np.outer(np.arange(positions, dtype=np.float32), inv).astype(np.float32)
    return np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)


def _rope_divisors(r: _Reader, dim: int) -> np.ndarray | None:
    kind = r.key("rope.scaling.type", "none")
    if r.has("rope_factors_long") or r.has("rope_factors_short"):
        raise ValueError(
            f"{r.arch} with rope_factors_long/short (LongRoPE) is not supported by the GGUF "
            "importer; export the Hugging Face checkpoint instead"
        )
    div = np.ones(dim // 2, np.float32)
    if r.has("rope_freqs.weight"):  # Llama 3.x: per-frequency factors
        div = div * r.vector("rope_freqs.weight")
    if kind == "linear":
        div = div * np.float32(r.key("rope.scaling.factor", 1.0))
    elif kind not in ("none", None):
        raise ValueError(
            f"{r.arch}.rope.scaling.type={kind!r} is not supported by the GGUF importer "
            "(supported: none, linear, llama3 rope_freqs)"
        )
    return None if np.all(div == 1) else div


def read_gguf(path: str | Path, max_positions: int | None = None) -> GGUFModel:
    """Read `path` (see the module doc); `max_positions` caps the rotary tables' length."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except (ValueError, OSError) as e:
        raise ValueError(f"{path} is not a readable GGUF file: {e}") from None
    meta = read_metadata(reader)
    name = meta.get("general.architecture")
    if name not in ARCHS:
        raise ValueError(
            f"general.architecture={name!r} is not supported by the GGUF importer; "
            f"supported: {', '.join(ARCHS)}"
        )
    arch = ARCHS[name]
    r = _Reader(reader, meta, name)
    hidden = int(r.key("embedding_length", required=True))
    n_layers = int(r.key("block_count", required=True))
    heads = int(r.key("attention.head_count", required=True))
    kv = r.key("attention.head_count_kv", heads)
    if not isinstance(kv, int):
        raise ValueError(f"{name}.attention.head_count_kv varies by layer; not supported")
    head_dim = int(r.key("attention.key_length", hidden // heads))
    if int(r.key("attention.value_length", head_dim)) != head_dim:
        raise ValueError(f"{name}.attention.value_length differs from key_length; not supported")
    if head_dim % 16:
        raise ValueError(
            f"{name}.attention.key_length {head_dim} is not a multiple of 16, which "
            "onnxruntime's GroupQueryAttention needs"
        )
    rot_dim = int(r.key("rope.dimension_count", head_dim))
    if rot_dim != head_dim and rot_dim % 16:
        raise ValueError(f"{name}.rope.dimension_count {rot_dim} is not a multiple of 16")
    eps = float(r.key("attention.layer_norm_rms_epsilon", required=True))
    context = int(r.key("context_length", required=True))
    n_pos = min(context, max_positions or context)
    divisors = _rope_divisors(r, rot_dim)
    base = float(r.key("rope.freq_base", 10000.0))
    window = r.key("attention.sliding_window")

    layers = [_layer(r, arch, i, heads, kv, head_dim, eps, window, n_layers)
              for i in range(n_layers)]  # fmt: skip
    embed = r.matrix("token_embd.weight").T
    lm_head = r.matrix("output.weight").T if r.has("output.weight") else embed
    scale = r.key("attention.scale")
    if scale is None and arch.family == "gemma" and name != "gemma":
        big = n_layers == {"gemma2": 46, "gemma3": 62}[name]  # llama.cpp: 27B's scale
        scale = (hidden / heads) ** -0.5 if big else None
    softcap = r.key("attn_logit_softcapping")
    w = DecoderWeights(
        embed=embed,
        pos_embed=None,
        layers=layers,
        final_norm=Norm(r.vector("output_norm.weight"), None, eps),
        lm_head=lm_head,
        lm_head_b=None,
        rotary=rotary(rot_dim, base, n_pos, divisors),
        rotary_local=rotary(rot_dim, 10000.0, n_pos) if name == "gemma3" else None,
        attn=AttentionShape(
            heads,
            kv,
            head_dim,
            rotary=True,
            scale=None if scale is None or scale == head_dim**-0.5 else float(scale),
            softcap=float(softcap) if softcap else None,
        ),
        activation=arch.activation,
        final_softcap=float(r.key("final_logit_softcapping") or 0) or None,
    )
    if arch.family == "gemma":
        w.embed_scale = float(np.float32(hidden**0.5))
    if name == "granite":
        _granite(r, w)
    info = ModelInfo(
        architecture=arch.family,
        model_type=arch.model_type,
        num_layers=n_layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        vocab_size=int(embed.shape[0]),
        max_position_embeddings=n_pos,
        tie_word_embeddings=lm_head is embed,
    )
    return GGUFModel(arch, w, info, meta, dict(r.sources), r.requantized)


def _layer(
    r: _Reader, arch: Arch, i: int, heads: int, kv: int, head_dim: int, eps: float,
    window: Any, n_layers: int,
) -> LayerWeights:  # fmt: skip
    p = f"blk.{i}."
    norms = {
        dst: Norm(r.vector(f"{p}{src}.weight"), None, eps)
        for src, dst in NORMS.items()
        if r.has(f"{p}{src}.weight")
    }
    if r.has(f"{p}attn_qkv.weight"):  # Phi-3: fused, already q|k|v
        qkv_w: Any = r.matrix(f"{p}attn_qkv.weight")
        qkv_b = r.vector(f"{p}attn_qkv.bias") if r.has(f"{p}attn_qkv.bias") else None
    else:
        parts, biases = [], []
        for tag, nh in (("q", heads), ("k", kv), ("v", kv)):
            m = r.matrix(f"{p}attn_{tag}.weight")
            b = r.vector(f"{p}attn_{tag}.bias") if r.has(f"{p}attn_{tag}.bias") else None
            if arch.permuted_qk and tag != "v":
                order = _unpermute(nh, nh * head_dim)
                m = m.take_columns(order) if isinstance(m, PackedMatrix) else m[:, order]
                b = None if b is None else b[order]
            parts.append(m)
            biases.append(b if b is not None else np.zeros(nh * head_dim, np.float32))
        qkv_w = _columns(parts)
        has_bias = any(r.has(f"{p}attn_{t}.bias") for t in "qkv")
        qkv_b = np.concatenate(biases) if has_bias else None
    if r.has(f"{p}ffn_gate.weight"):
        up_w = _columns([r.matrix(f"{p}ffn_gate.weight"), r.matrix(f"{p}ffn_up.weight")])
    else:  # Phi-3: ffn_up holds gate|up
        up_w = r.matrix(f"{p}ffn_up.weight")
    slide = _slides(r, arch, i, window)
    rope = "local" if arch.model_type == "gemma3_text" and slide else "global"
    return LayerWeights(
        attn_norm=norms.get("attn_norm"),
        qkv_w=qkv_w,
        qkv_b=qkv_b,
        o_w=r.matrix(f"{p}attn_output.weight"),
        o_b=r.vector(f"{p}attn_output.bias") if r.has(f"{p}attn_output.bias") else None,
        mlp_norm=norms.get("mlp_norm"),
        up_w=up_w,
        up_b=None,
        down_w=r.matrix(f"{p}ffn_down.weight"),
        down_b=None,
        q_norm=norms.get("q_norm"),
        k_norm=norms.get("k_norm"),
        post_attn_norm=norms.get("post_attn_norm"),
        post_mlp_norm=norms.get("post_mlp_norm"),
        window=int(window) if slide and window else None,
        rope=rope,
    )


def _slides(r: _Reader, arch: Arch, i: int, window: Any) -> bool:
    """Whether layer i attends through the sliding window: `attention.sliding_window_pattern`
    (a bool per layer, or every n-th layer global) where the file states it, else the
    architecture's rule (llama.cpp's: Gemma 2 every 2nd, Gemma 3 every 6th layer global,
    Phi-3 every layer; the others, as llama.cpp, none)."""
    pattern = r.key("attention.sliding_window_pattern")
    if isinstance(pattern, list):
        return bool(pattern[i])
    if isinstance(pattern, int) and pattern > 0:
        return (i + 1) % pattern != 0
    if window and arch.model_type == "olmo2":
        raise ValueError(
            f"{r.arch}.attention.sliding_window with no sliding_window_pattern: which layers "
            "slide is not stated"
        )
    return bool(arch.swa_all or (arch.swa_pattern and (i + 1) % arch.swa_pattern != 0))


def _granite(r: _Reader, w: DecoderWeights) -> None:
    """Granite's multipliers folded as export/granite.py folds them."""
    w.embed_scale = float(r.key("embedding_scale", 1.0))
    res = float(r.key("residual_scale", 1.0))
    for lw in w.layers:
        for f in ("o_w", "down_w"):
            m = getattr(lw, f)
            setattr(lw, f, m.scaled(res) if isinstance(m, PackedMatrix) else m * np.float32(res))
    w.final_norm.gamma = w.final_norm.gamma / np.float32(r.key("logit_scale", 1.0))
