"""A slow, plain numpy forward of `DecoderWeights`: the oracle for exports without torch.

`reference_logits(w, ids)` runs one sequence (no cache) through the weights as the graph
builders read them — packed matrices (`PackedMatrix`) at their exact dequantized values —
in float32 with float64 accumulation in attention, and returns logits [len(ids), vocab].
It follows decoder.py's contract: the norms a layer has, packed q|k|v with optional per-head
or whole-projection q/k norms, rotate-half rotary on the first rotary dims, grouped-query
attention with an optional sliding window and soft-cap, gated SiLU / tanh-GELU MLPs, the
embedding scale and the final soft-cap. It is the GGUF importer's export check.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgespec.export.decoder import DecoderWeights, LayerWeights, Norm


def _f(a: object) -> np.ndarray:
    return np.asarray(a, dtype=np.float32)


def _norm(x: np.ndarray, n: Norm | None) -> np.ndarray:
    if n is None:
        return x
    if n.beta is None:
        var = np.mean(x.astype(np.float64) ** 2, -1, keepdims=True)
        return (x / np.sqrt(var + n.eps)).astype(np.float32) * n.gamma
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return ((x - mu) / np.sqrt(var + n.eps)).astype(np.float32) * n.gamma + n.beta


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def _rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x [S, heads, head_dim]; cos/sin [S, rotary_dim / 2]: rotate-half on the first dims."""
    half = cos.shape[-1]
    x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    c, s = cos[:, None, :], sin[:, None, :]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s, rest], -1)


def _attention(
    lw: LayerWeights, w: DecoderWeights, h: np.ndarray, positions: np.ndarray
) -> np.ndarray:
    a = w.attn
    qkv = h @ _f(lw.qkv_w) + (0 if lw.qkv_b is None else lw.qkv_b)
    nq, nk = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
    q, k, v = qkv[:, :nq], qkv[:, nq : nq + nk], qkv[:, nq + nk :]
    s = h.shape[0]
    heads = {"q": a.num_heads, "k": a.num_kv_heads}
    out = {}
    for tag, t, norm in (("q", q, lw.q_norm), ("k", k, lw.k_norm)):
        if norm is not None and norm.gamma.shape[0] == a.head_dim:
            t = _norm(t.reshape(s, heads[tag], a.head_dim), norm).reshape(s, -1)
        elif norm is not None:
            t = _norm(t, norm)
        out[tag] = t.reshape(s, heads[tag], a.head_dim)
    q, k = out["q"], out["k"]
    v = v.reshape(s, a.num_kv_heads, a.head_dim)
    table = {"global": w.rotary, "local": w.rotary_local}.get(lw.rope or "")
    if lw.rope is not None and table is not None:
        cos, sin = table[0][positions], table[1][positions]
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
    group = a.num_heads // a.num_kv_heads
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    scale = a.scale if a.scale is not None else a.head_dim**-0.5
    scores = np.einsum("qhd,khd->hqk", q.astype(np.float64), k.astype(np.float64)) * scale
    if a.softcap is not None:
        scores = a.softcap * np.tanh(scores / a.softcap)
    i, j = np.arange(s)[:, None], np.arange(s)[None, :]
    visible = j <= i
    if lw.window is not None:
        visible &= i - j < lw.window
    scores = np.where(visible[None], scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ctx = np.einsum("hqk,khd->qhd", p, v.astype(np.float64)).astype(np.float32)
    return ctx.reshape(s, -1) @ _f(lw.o_w) + (0 if lw.o_b is None else lw.o_b)


def _mlp(lw: LayerWeights, activation: str, h: np.ndarray) -> np.ndarray:
    up = h @ _f(lw.up_w) + (0 if lw.up_b is None else lw.up_b)
    if activation == "gelu_tanh":
        inner = _gelu_tanh(up)
    else:
        gate, up = np.split(up, 2, axis=-1)
        act = gate / (1 + np.exp(-gate)) if activation == "silu" else _gelu_tanh(gate)
        inner = act * up
    return inner @ _f(lw.down_w) + (0 if lw.down_b is None else lw.down_b)


def reference_logits(w: DecoderWeights, ids: Sequence[int]) -> np.ndarray:
    """Logits [len(ids), vocab] float32 of one sequence from position 0."""
    ids = np.asarray(ids, np.int64)
    positions = np.arange(len(ids))
    x = _f(w.embed)[ids] * np.float32(w.embed_scale)
    if w.pos_embed is not None:
        x = x + _f(w.pos_embed)[positions]
    for lw in w.layers:
        a = _norm(_attention(lw, w, _norm(x, lw.attn_norm), positions), lw.post_attn_norm)
        x = x + a
        d = _norm(_mlp(lw, w.activation, _norm(x, lw.mlp_norm)), lw.post_mlp_norm)
        x = x + d
    logits = _norm(x, w.final_norm) @ _f(w.lm_head).T
    if w.lm_head_b is not None:
        logits = logits + w.lm_head_b
    if w.final_softcap is not None:
        logits = w.final_softcap * np.tanh(logits / w.final_softcap)
    return logits.astype(np.float32)
