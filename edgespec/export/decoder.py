"""One decoder-only transformer, any family, as ONNX graphs of each bundle role.

Takes `DecoderWeights` (numpy arrays in a family-neutral layout, produced by the family
modules `llama.py`, `gpt2.py`) and builds the graph for a role:

  full     input_ids -> embeddings -> layers 0..N-1 -> norm -> LM head -> logits
  head@k   input_ids -> embeddings -> layers 0..k-1 -> hidden (residual stream at k)
                                 [-> exit adapter] -> norm -> LM head -> exit logits
  tail@k   hidden    -> layers k..N-1 -> norm -> LM head -> logits

Common inputs: `seqlens_k` [batch] int32 (cache length after this call, minus one — the
GroupQueryAttention convention), `total_seq_len` [] int32, `num_logits_to_keep` [] int64
(logits only for the last n positions; 0 skips the LM head), `query_seqlens` [batch] int32
(the valid new positions of each row, the others right padding: rows of one call may add
different numbers of positions; S for every row in a plain call), and per layer the KV buffers.
`DecoderWeights.feature_layers` (non-empty): `full` also outputs `features` [batch, sequence,
len * hidden] float32, the residual stream after each of those layers at every new position,
what a feature head drafts from (export/eagle.py); its logits are unchanged.
Guarantees: head@k followed by tail@k computes exactly what full computes. An exit adapter
(`ExitAdapter`, fitted by `exit_adapter.py`) changes only head@k's exit logits, never its
`hidden` output, so verification through tail@k stays exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from onnx import TensorProto

from edgespec.bundle import GraphInfo, TensorSpec
from edgespec.export.builder import AttentionShape, GraphBuilder, io_specs
from edgespec.export.gguf_blocks import PackedMatrix
from edgespec.export.positions import last_positions, lone_row_pad, positions
from edgespec.export.tree import tree_inputs, window_bias


@dataclass
class Norm:
    gamma: np.ndarray
    beta: np.ndarray | None  # None: RMSNorm
    eps: float


@dataclass
class LayerWeights:
    """One layer's weights and the family's per-layer choices, as data the builders read.

    Residual layout: x += post_attn_norm(attention(attn_norm(x))); x += post_mlp_norm(
    mlp(mlp_norm(x))), each norm optional (None: identity): Llama has the two pre-norms,
    Gemma 2/3 all four, OLMo 2 only the two post-norms."""

    attn_norm: Norm | None
    qkv_w: np.ndarray  # [hidden, (heads + 2 * kv_heads) * head_dim], q|k|v packed
    qkv_b: np.ndarray | None
    o_w: np.ndarray  # [heads * head_dim, hidden]
    o_b: np.ndarray | None
    mlp_norm: Norm | None
    up_w: np.ndarray  # gated: [hidden, 2 * inter] packed gate|up; plain: [hidden, inter]
    up_b: np.ndarray | None
    down_w: np.ndarray  # [inter, hidden]
    down_b: np.ndarray | None
    # RMSNorm of q and k before rotary (Qwen3, Gemma 3, OLMo 2): a [head_dim] gain is applied
    # per head, a [heads * head_dim] (k: [kv_heads * head_dim]) gain over the whole projection
    q_norm: Norm | None = None
    k_norm: Norm | None = None
    post_attn_norm: Norm | None = None
    post_mlp_norm: Norm | None = None
    # sliding-window attention: a query sees itself and the window - 1 positions before it
    window: int | None = None
    rope: str | None = "global"  # rotary table: "global" | "local" (DecoderWeights); None: NoPE


@dataclass
class ExitAdapter:
    """exit = h + RMSNorm(h) @ w, applied to the residual stream at k before the shared final
    norm and LM head (w = 0 is the identity, the plain shared-head exit)."""

    norm: Norm
    w: np.ndarray  # [hidden, hidden]


@dataclass
class DecoderWeights:
    embed: np.ndarray  # [vocab, hidden]
    pos_embed: np.ndarray | None  # learned absolute positions [max_pos, hidden] (GPT-2)
    layers: list[LayerWeights]
    final_norm: Norm
    lm_head: np.ndarray  # [vocab, hidden]; the same array as `embed` when tied
    lm_head_b: np.ndarray | None
    rotary: tuple[np.ndarray, np.ndarray] | None  # cos, sin [max_pos, rotary_dim / 2]
    attn: AttentionShape
    activation: str  # "silu" (gated) | "gelu_tanh" (plain) | "gelu_tanh_gated" (Gemma)
    prefix: str = ""  # weight-name prefix, "draft." for a draft model
    # the rotary table of layers with rope="local" (Gemma 3's sliding layers: another base)
    rotary_local: tuple[np.ndarray, np.ndarray] | None = None
    embed_scale: float = 1.0  # embeddings times this (Gemma's sqrt(hidden), Granite's multiplier)
    final_softcap: float | None = None  # logits = cap * tanh(logits / cap) (Gemma 2/3)
    exit_adapters: dict[int, ExitAdapter] = field(default_factory=dict)  # exit layer -> adapter
    # the `full` graph's declared `features` output: the residual stream after each of these
    # layers (1..N), concatenated, for every new position (a feature head drafts from them)
    feature_layers: tuple[int, ...] = ()

    @property
    def tied(self) -> bool:
        return self.lm_head is self.embed


def role_layers(role: str, num_layers: int) -> tuple[int, int]:
    """(first, last + 1): the layers a role computes (and whose KV cache it owns)."""
    kind, _, k = role.partition("@")
    return {
        "full": (0, num_layers),
        "draft": (0, num_layers),
        "head": (0, int(k or 0)),
        "tail": (int(k or 0), num_layers),
    }[kind]


def graph_info(role: str, file: str, model: str, num_layers: int, gb: GraphBuilder) -> GraphInfo:
    """The manifest entry of a graph `gb` built for `role`, saved as `file`."""
    first, last = role_layers(role, num_layers)
    return GraphInfo(
        role=role,
        file=file,
        model=model,
        kv_layers=list(range(first, last)),
        inputs=[TensorSpec(**s) for s in io_specs(gb.inputs)],
        outputs=[TensorSpec(**s) for s in io_specs(gb.outputs)],
    )


def build_graph(w: DecoderWeights, role: str, gb: GraphBuilder) -> None:
    """Populate `gb` with the graph for `role` (full | draft | head@k | tail@k)."""
    kind = role.partition("@")[0]
    first, last = role_layers(role, len(w.layers))
    dt = gb.onnx_dtype
    p = w.prefix

    seqlens = gb.add_input("seqlens_k", TensorProto.INT32, ["batch"])
    total = gb.add_input("total_seq_len", TensorProto.INT32, [])
    keep = gb.add_input("num_logits_to_keep", TensorProto.INT64, [])
    query = (
        gb.add_input("query_seqlens", TensorProto.INT32, ["batch"]) if gb.query_seqlens else None
    )
    if kind == "tail":
        x = gb.add_input("hidden", dt, ["batch", "sequence", w.embed.shape[1]])
    else:
        ids = gb.add_input("input_ids", TensorProto.INT64, ["batch", "sequence"])
    tree = tree_inputs(gb, total) if gb.tree else None
    # attention's seqlens and total length, counting a one-position call's pad row
    att_seqlens, att_total, att_query, pad = seqlens, total, query, None
    if gb.pad_lone_rows and tree is None:
        new = x if kind == "tail" else ids  # [B, S, ...]: S new positions
        att_seqlens, att_total, att_query, pad = lone_row_pad(gb, new, seqlens, total, query)
    if kind != "tail":
        x = gb.embedding(ids, f"{p}embed", w.embed)
        if w.embed_scale != 1.0:
            x = gb.op1("Mul", [x, gb.const(np.array(w.embed_scale, gb.dtype))])
        if w.pos_embed is not None:
            at = tree[0] if tree is not None else positions(gb, seqlens, query, ids)
            pos = gb.op1("Gather", [gb.weight(f"{p}pos_embed.weight", w.pos_embed), at])
            x = gb.op1("Add", [x, pos])
    tables = {"global": w.rotary, "local": w.rotary_local}
    rotary = {  # only the tables this role's layers use
        table: gb.rotary_cache(*t, name="rotary" if table == "global" else f"rotary_{table}")
        for table, t in tables.items()
        if t is not None and any(lw.rope == table for lw in w.layers[first:last])
    }

    delta: str | None = None  # the MLP output not yet added to the residual stream x
    features: dict[int, str] = {}  # layer k -> the residual stream after k layers
    wanted = set(w.feature_layers) if kind == "full" else set()
    windowed: dict[int, tuple[str, str]] = {}  # a tree graph's inputs per sliding window
    for i in range(first, last):
        lw, name = w.layers[i], f"{p}layers.{i}"
        if lw.attn_norm is None:
            x = gb.op1("Add", [x, delta]) if delta is not None else x
            h = x
        elif delta is None:
            h = _norm(gb, x, f"{name}.attn_norm", lw.attn_norm)
        else:
            h, x = _skip_norm(gb, delta, x, f"{name}.attn_norm", lw.attn_norm)
        if i in wanted:  # x is the residual stream after layers 0..i-1
            features[i] = x
        qkv = gb.linear(h, f"{name}.qkv", lw.qkv_w, lw.qkv_b)
        layer_tree, window = tree, lw.window
        if tree is not None and window is not None:  # the window in the bias
            if window not in windowed:
                windowed[window] = (tree[0], window_bias(gb, tree, total, window))
            layer_tree, window = windowed[window], None
        a = gb.attention(
            _qk_norms(gb, qkv, name, lw, w.attn),
            i,
            w.attn,
            att_seqlens,
            att_total,
            rotary.get(lw.rope) if lw.rope is not None else None,
            att_query,
            window=window,
            tree=layer_tree,
            pad=pad,
        )
        a = gb.linear(a, f"{name}.o", lw.o_w, lw.o_b)
        if lw.post_attn_norm is not None:
            a = _norm(gb, a, f"{name}.post_attn_norm", lw.post_attn_norm)
        if lw.mlp_norm is None:
            x = gb.op1("Add", [x, a])
            h = x
        else:
            h, x = _skip_norm(gb, a, x, f"{name}.mlp_norm", lw.mlp_norm)
        delta = _mlp(gb, h, name, lw, w.activation)
        if lw.post_mlp_norm is not None:
            delta = _norm(gb, delta, f"{name}.post_mlp_norm", lw.post_mlp_norm)

    if last in wanted:
        features[last] = gb.op1("Add", [x, delta]) if delta is not None else x
    if wanted:
        feature_output(gb, [features[k] for k in sorted(wanted)], w.embed.shape[1])
    if kind == "head":
        hidden = gb.op1("Add", [x, delta]) if delta is not None else x
        gb.add_output(hidden, "hidden", dt, ["batch", "sequence", w.embed.shape[1]])
        x, delta = hidden, None
    x = last_positions(gb, x, keep)
    adapter = w.exit_adapters.get(last) if kind == "head" else None
    if adapter is not None:
        name = f"{p}exit_adapter.{last}"
        x = gb.op1(
            "Add", [x, gb.linear(_norm(gb, x, f"{name}.norm", adapter.norm), name, adapter.w)]
        )
    if delta is None:
        h = _norm(gb, x, f"{p}final_norm", w.final_norm)
    else:
        h, _ = _skip_norm(gb, last_positions(gb, delta, keep), x, f"{p}final_norm", w.final_norm)
    logits = _lm_head(gb, h, w)
    if dt != TensorProto.FLOAT:
        logits = gb.op1("Cast", [logits], to=TensorProto.FLOAT)
    if w.final_softcap is not None:
        logits = softcap(gb, logits, w.final_softcap, np.float32)
    name = "exit_logits" if kind == "head" else "logits"
    gb.add_output(logits, name, TensorProto.FLOAT, ["batch", "kept", w.embed.shape[0]])


def feature_output(gb: GraphBuilder, states: list[str], hidden: int) -> None:
    """The declared `features` output [batch, sequence, len(states) * hidden], float32."""
    out = states[0] if len(states) == 1 else gb.op1("Concat", states, axis=-1)
    if gb.onnx_dtype != TensorProto.FLOAT:
        out = gb.op1("Cast", [out], to=TensorProto.FLOAT)
    gb.add_output(out, "features", TensorProto.FLOAT, ["batch", "sequence", len(states) * hidden])


def _norm(gb: GraphBuilder, x: str, name: str, norm: Norm) -> str:
    return gb.norm(x, name, norm.gamma, norm.beta, norm.eps)


def softcap(gb: GraphBuilder, x: str, cap: float, dtype: type = np.float32) -> str:
    """cap * tanh(x / cap), in the order transformers computes it."""
    c = gb.const(np.array(cap, dtype))
    return gb.op1("Mul", [gb.op1("Tanh", [gb.op1("Div", [x, c])]), c])


def _qk_norms(
    gb: GraphBuilder, qkv: str, name: str, lw: LayerWeights, a: AttentionShape
) -> str | tuple[str, str, str]:
    """The packed projection, or (q, k, v) after the layer's q/k RMSNorms."""
    if lw.q_norm is None and lw.k_norm is None:
        return qkv
    sizes = [a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim, a.num_kv_heads * a.head_dim]
    q, k, v = gb.op("Split", [qkv, gb.const(np.array(sizes))], 3, axis=-1)
    out = []
    pairs = ((q, lw.q_norm, a.num_heads, "q"), (k, lw.k_norm, a.num_kv_heads, "k"))
    for t, norm, heads, tag in pairs:
        if norm is not None and norm.gamma.shape[0] == a.head_dim:  # per head
            t = gb.op1("Reshape", [t, gb.const(np.array([0, 0, heads, a.head_dim]))])
            t = _norm(gb, t, f"{name}.{tag}_norm", norm)
            t = gb.op1("Reshape", [t, gb.const(np.array([0, 0, heads * a.head_dim]))])
        elif norm is not None:  # over the whole projection (OLMo 2)
            t = _norm(gb, t, f"{name}.{tag}_norm", norm)
        out.append(t)
    return out[0], out[1], v


def _skip_norm(gb: GraphBuilder, x: str, skip: str, name: str, norm: Norm) -> tuple[str, str]:
    return gb.skip_norm(x, skip, name, norm.gamma, norm.beta, norm.eps)


def _mlp(gb: GraphBuilder, h: str, name: str, lw: LayerWeights, activation: str) -> str:
    up = gb.linear(h, f"{name}.up", lw.up_w, lw.up_b)
    # gate|up halves by explicit sizes: onnxruntime-web's WebGPU Split reads no num_outputs
    halves = gb.const(np.array([lw.up_w.shape[1] // 2] * 2, np.int64))
    if activation == "silu":
        gate, up = gb.op("Split", [up, halves], 2, axis=-1)
        act = gb.op1("Mul", [gate, gb.op1("Sigmoid", [gate])])
        inner = gb.op1("Mul", [act, up])
    elif activation == "gelu_tanh":
        inner = gb.op1("FastGelu", [up], domain="com.microsoft")
    elif activation == "gelu_tanh_gated":
        gate, up = gb.op("Split", [up, halves], 2, axis=-1)
        inner = gb.op1("Mul", [gb.op1("FastGelu", [gate], domain="com.microsoft"), up])
    else:
        raise ValueError(f"unknown activation {activation}")
    return gb.linear(inner, f"{name}.down", lw.down_w, lw.down_b)


def _lm_head(gb: GraphBuilder, h: str, w: DecoderWeights) -> str:
    """Logits; a tied head reuses the embedding table (Gemm with transB, no transposed copy)."""
    if gb.quantize in ("int8", "int4") or gb.matmul_head or isinstance(w.lm_head, PackedMatrix):
        return gb.linear(h, f"{w.prefix}lm_head", w.lm_head.T, w.lm_head_b)
    name = f"{w.prefix}embed.weight" if w.tied else f"{w.prefix}lm_head.weight"
    table = gb.weight(name, w.lm_head)
    hidden_size = w.embed.shape[1]
    shape = gb.op1("Shape", [h])
    flat = gb.op1("Reshape", [h, gb.const(np.array([-1, hidden_size]))])
    ins = [flat, table] + (
        [gb.weight(f"{w.prefix}lm_head.bias", w.lm_head_b)] if w.lm_head_b is not None else []
    )
    logits = gb.op1("Gemm", ins, transB=1)
    out_shape = gb.op1(
        "Concat",
        [
            gb.op1("Slice", [shape, gb.const(np.array([0])), gb.const(np.array([2]))]),
            gb.const(np.array([w.embed.shape[0]])),
        ],
        axis=0,
    )
    return gb.op1("Reshape", [logits, out_shape], allowzero=1)  # 0 kept positions stays 0
