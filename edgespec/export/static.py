"""Fixed-shape ("static") graphs for NPUs: standard ONNX ops only, every dimension fixed.

Takes the same family-neutral `DecoderWeights` as decoder.py, a max context C and a verify
width W, and builds each bundle role (full, draft, head@k, tail@k) as a graph that NPU
compilers (QNN, Core ML's ANE through onnxruntime, OpenVINO NPU) accept: ONNX opset 17,
default domain only (no GroupQueryAttention, fused norms, rotary or FastGelu contrib ops),
no dynamic dimension anywhere.

  inputs   input_ids [1, W] int32 (tail@k: hidden [1, W, H])   int32: NPUs lack int64
           position_ids [1, W] int32          absolute position of each new token
           attention_mask [1, 1, W, C + W]    float32, additive: 0 attends, MASKED does not;
                                              columns 0..C-1 are the cache, C.. the new tokens
           past_key.{i}, past_value.{i} [1, kv_heads, C, head_dim]   the runtime's whole cache
  outputs  logits [1, W, vocab] float32 (head@k: exit_logits, plus hidden [1, W, H])
           new_key.{i}, new_value.{i} [1, kv_heads, W, head_dim]    only the W new positions

Writing, checking and verifying the bundle's static files is static_bundle.py.
The runtime (edgespec/runtime/graphs/static.py) pads shorter calls to W, copies the real new
positions into its preallocated cache at their offset (W positions, never the cache) and
prefills long prompts in chunks of W. Attention scores the cache and the new tokens
separately and softmaxes them together, so the cache is read, never concatenated; GQA
groups the query heads of each KV head (the same result as repeating the KV heads, without
the copy). Guarantees: the graphs compute what the dynamic graphs compute (the exporter
checks `full` against transformers), and `check_static` finds no non-standard op and no
dynamic dimension, also after ONNX shape inference of every intermediate value.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from edgespec.export.builder import GraphBuilder
from edgespec.export.decoder import DecoderWeights, LayerWeights, Norm, role_layers

STATIC_OPSET = 17  # LayerNormalization is standard from 17; NPU toolchains accept 17 widely
STATIC_IR_VERSION = 8  # the IR of opset 17; onnxruntime and older NPU converters read it
MASKED = -30000.0  # exp(-30000) is exactly 0 in fp32; finite, so fp16 NPUs do not see inf


@dataclass(frozen=True)
class StaticShape:
    max_context: int  # C: cache positions
    verify_width: int  # W: positions per call


def build_static_graph(w: DecoderWeights, role: str, gb: GraphBuilder, shape: StaticShape) -> None:
    """Populate `gb` with the fixed-shape graph for `role` (full | draft | head@k | tail@k)."""
    if gb.quantize is not None:
        raise ValueError(
            "static graphs are float only (block-wise weights are the contrib MatMulNBits op)"
        )
    kind = role.partition("@")[0]
    first, last = role_layers(role, len(w.layers))
    c, width = shape.max_context, shape.verify_width
    hidden_size = w.embed.shape[1]
    dt, p = gb.onnx_dtype, w.prefix

    pos = gb.add_input("position_ids", TensorProto.INT32, [1, width])
    mask = gb.add_input("attention_mask", TensorProto.FLOAT, [1, 1, width, c + width])
    if kind == "tail":
        x = gb.add_input("hidden", dt, [1, width, hidden_size])
    else:
        ids = gb.add_input("input_ids", TensorProto.INT32, [1, width])
        x = gb.op1("Gather", [gb.weight(f"{p}embed.weight", w.embed), ids], axis=0)
        if w.embed_scale != 1.0:
            x = gb.op1("Mul", [x, gb.const(np.array(w.embed_scale, gb.dtype))])
        if w.pos_embed is not None:
            table = gb.weight(f"{p}pos_embed.weight", w.pos_embed)
            x = gb.op1("Add", [x, gb.op1("Gather", [table, pos], axis=0)])
    layers = w.layers[first:last]
    tables = {"global": w.rotary, "local": w.rotary_local}
    rotary = {
        name: _rotary(gb, t, "rotary" if name == "global" else f"rotary_{name}", pos, width)
        for name, t in tables.items()
        if t is not None and any(lw.rope == name for lw in layers)
    }
    group = w.attn.num_heads // w.attn.num_kv_heads
    # one mask per window size: the query rows of a KV head are (group, position) pairs
    masks = {
        window: gb.op1(
            "Tile",
            [_window_mask(gb, mask, pos, shape, window), gb.const(np.array([1, 1, group, 1]))],
        )
        for window in {lw.window for lw in layers}
    }

    for i in range(first, last):
        lw, name = w.layers[i], f"{p}layers.{i}"
        h = _norm(gb, x, f"{name}.attn_norm", lw.attn_norm) if lw.attn_norm is not None else x
        qkv = gb.linear(h, f"{name}.qkv", lw.qkv_w, lw.qkv_b)
        rope = rotary.get(lw.rope) if lw.rope is not None else None
        a = _attention(gb, qkv, i, w, lw, shape, masks[lw.window], rope)
        a = gb.linear(a, f"{name}.o", lw.o_w, lw.o_b)
        if lw.post_attn_norm is not None:
            a = _norm(gb, a, f"{name}.post_attn_norm", lw.post_attn_norm)
        x = gb.op1("Add", [x, a])
        h = _norm(gb, x, f"{name}.mlp_norm", lw.mlp_norm) if lw.mlp_norm is not None else x
        m = _mlp(gb, h, name, lw, w.activation)
        if lw.post_mlp_norm is not None:
            m = _norm(gb, m, f"{name}.post_mlp_norm", lw.post_mlp_norm)
        x = gb.op1("Add", [x, m])

    if kind == "head":
        gb.add_output(x, "hidden", dt, [1, width, hidden_size])
        adapter = w.exit_adapters.get(last)
        if adapter is not None:  # the same exit adapter as the dynamic head@k: exit logits only
            name = f"{p}exit_adapter.{last}"
            x = gb.op1(
                "Add", [x, gb.linear(_norm(gb, x, f"{name}.norm", adapter.norm), name, adapter.w)]
            )
    h = _norm(gb, x, f"{p}final_norm", w.final_norm)
    logits = _lm_head(gb, h, w, width)
    if dt != TensorProto.FLOAT:
        logits = gb.op1("Cast", [logits], to=TensorProto.FLOAT)
    if w.final_softcap is not None:
        logits = _softcap(gb, logits, w.final_softcap, np.float32)
    name = "exit_logits" if kind == "head" else "logits"
    gb.add_output(logits, name, TensorProto.FLOAT, [1, width, w.embed.shape[0]])


def static_model(gb: GraphBuilder, name: str) -> onnx.ModelProto:
    """The ModelProto of a static graph: default ONNX domain only, opset 17."""
    graph = helper.make_graph(gb.nodes, name, gb.inputs, gb.outputs, gb.initializers)
    opsets = [helper.make_opsetid("", STATIC_OPSET)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="edgespec")
    model.ir_version = STATIC_IR_VERSION
    return model


def check_static(model: onnx.ModelProto) -> list[str]:
    """What keeps `model` from being an NPU-friendly static graph (empty list: nothing).

    Every node must be a standard ONNX op of the model's opset (onnxruntime registers some
    of its own ops, e.g. SimplifiedLayerNormalization, in the default domain: those count as
    non-standard), and every input, output and intermediate value must have a fully known
    shape after ONNX shape inference."""
    problems: list[str] = []
    opset = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    for domain in opset:
        if domain != "ai.onnx":
            problems.append(f"imports the non-standard op domain {domain!r}")
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx"):
            problems.append(f"contrib op {node.domain}.{node.op_type} ({node.name})")
            continue
        try:
            onnx.defs.get_schema(node.op_type, opset.get("ai.onnx", 1), "")
        except onnx.defs.SchemaError:
            problems.append(f"{node.op_type} ({node.name}) is not a standard ONNX op")
    if problems:
        return problems  # shape inference would stop at the unknown ops anyway
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    g = inferred.graph
    typed = {v.name: v for v in (*g.input, *g.output, *g.value_info)}
    for node in g.node:
        for out in node.output:
            if out and out not in typed:
                problems.append(f"no inferred shape for {out} ({node.op_type})")
    for v in typed.values():
        t = v.type.tensor_type
        if not t.HasField("shape"):
            problems.append(f"{v.name} has an unknown rank")
            continue
        dims = [
            d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim
        ]
        if not all(isinstance(d, int) and d > 0 for d in dims):
            problems.append(f"{v.name} has a dynamic shape {dims}")
    return problems


# -- pieces ----------------------------------------------------------------------------------
def _reshape(gb: GraphBuilder, x: str, shape: list[int]) -> str:
    return gb.op1("Reshape", [x, gb.const(np.array(shape, np.int64))])


def _split(gb: GraphBuilder, x: str, sizes: list[int]) -> list[str]:
    return gb.op("Split", [x, gb.const(np.array(sizes, np.int64))], len(sizes), axis=-1)


def _to_float(gb: GraphBuilder, x: str) -> str:
    """fp16 graphs normalise and softmax in fp32, as the fused dynamic kernels do."""
    return x if gb.onnx_dtype == TensorProto.FLOAT else gb.op1("Cast", [x], to=TensorProto.FLOAT)


def _from_float(gb: GraphBuilder, x: str) -> str:
    return x if gb.onnx_dtype == TensorProto.FLOAT else gb.op1("Cast", [x], to=gb.onnx_dtype)


def _norm(gb: GraphBuilder, x: str, name: str, norm: Norm) -> str:
    g = gb.weight(f"{name}.weight", norm.gamma)
    if norm.beta is not None:  # LayerNorm is a standard op since opset 17
        b = gb.weight(f"{name}.bias", norm.beta)
        return gb.op1("LayerNormalization", [x, g, b], axis=-1, epsilon=norm.eps)
    # RMSNorm from basic ops: x / sqrt(mean(x^2) + eps) * gamma
    x32 = _to_float(gb, x)
    ms = gb.op1("ReduceMean", [gb.op1("Mul", [x32, x32])], axes=[-1], keepdims=1)
    eps = gb.const(np.array(norm.eps, np.float32))
    y = gb.op1("Div", [x32, gb.op1("Sqrt", [gb.op1("Add", [ms, eps])])])
    return gb.op1("Mul", [_from_float(gb, y), g])


def _rotary(
    gb: GraphBuilder, tables: tuple[np.ndarray, np.ndarray], name: str, pos: str, width: int
) -> tuple[str, str]:
    """cos, sin rows of the new positions, [1, W, 1, rotary_dim / 2] (broadcast over heads)."""
    half = tables[0].shape[1]
    rows = []
    for part, table in zip(("cos", "sin"), tables, strict=True):
        stored = gb.weight(f"{name}.{part}", gb.rotary_rows(table))
        picked = gb.op1("Gather", [stored, pos], axis=0)
        rows.append(_reshape(gb, picked, [1, width, 1, half]))
    return rows[0], rows[1]


def _rope(gb: GraphBuilder, x: str, rotary: tuple[str, str], half: int, head_dim: int) -> str:
    """Half-split rotation of the first 2 * half dims: [x1, x2] -> [x1 cos - x2 sin,
    x2 cos + x1 sin]; the rest of the head (partial rotary) passes through."""
    cos, sin = rotary
    rest = head_dim - 2 * half
    x1, x2, *tail = _split(gb, x, [half, half] + ([rest] if rest else []))
    m = lambda a, b: gb.op1("Mul", [a, b])  # noqa: E731
    first = gb.op1("Sub", [m(x1, cos), m(x2, sin)])
    second = gb.op1("Add", [m(x2, cos), m(x1, sin)])
    return gb.op1("Concat", [first, second, *tail], axis=-1)


def _window_mask(
    gb: GraphBuilder, mask: str, pos: str, shape: StaticShape, window: int | None
) -> str:
    """The runtime's causal mask, plus MASKED where the key is `window` or more positions
    before the query (cache column j holds position j, new column C + i position pos[i])."""
    if window is None:
        return mask
    c = shape.max_context
    q = gb.op1("Cast", [_reshape(gb, pos, [shape.verify_width, 1])], to=TensorProto.INT64)
    k = gb.op1(
        "Concat",
        [gb.const(np.arange(c, dtype=np.int64)[None]), gb.op1("Cast", [pos], to=TensorProto.INT64)],
        axis=-1,
    )  # [1, C + W]
    far = gb.op1("GreaterOrEqual", [gb.op1("Sub", [q, k]), gb.const(np.array(window, np.int64))])
    extra = gb.op1(
        "Where", [far, gb.const(np.array(MASKED, np.float32)), gb.const(np.array(0.0, np.float32))]
    )
    return gb.op1("Add", [mask, extra])


def _softcap(gb: GraphBuilder, x: str, cap: float, dtype: type) -> str:
    c = gb.const(np.array(cap, dtype))
    return gb.op1("Mul", [gb.op1("Tanh", [gb.op1("Div", [x, c])]), c])


def _head_norm(gb: GraphBuilder, t: str, name: str, norm: Norm | None, heads: int, hd: int) -> str:
    """q or k [1, W, heads, hd] after its RMSNorm: per head, or over the whole projection."""
    if norm is None:
        return t
    if norm.gamma.shape[0] == hd:
        return _norm(gb, t, name, norm)
    width = _reshape(gb, t, [1, -1, heads * hd])
    return _reshape(gb, _norm(gb, width, name, norm), [1, -1, heads, hd])


def _attention(
    gb: GraphBuilder,
    qkv: str,
    layer: int,
    w: DecoderWeights,
    lw: LayerWeights,
    shape: StaticShape,
    mask: str,
    rotary: tuple[str, str] | None,
) -> str:
    heads, kv, hd = w.attn.num_heads, w.attn.num_kv_heads, w.attn.head_dim
    c, width = shape.max_context, shape.verify_width
    group = heads // kv
    dt = gb.onnx_dtype
    q, k, v = _split(gb, qkv, [heads * hd, kv * hd, kv * hd])
    q, k, v = (_reshape(gb, t, [1, width, n, hd]) for t, n in ((q, heads), (k, kv), (v, kv)))
    name = f"{w.prefix}layers.{layer}"
    q = _head_norm(gb, q, f"{name}.q_norm", lw.q_norm, heads, hd)
    k = _head_norm(gb, k, f"{name}.k_norm", lw.k_norm, kv, hd)
    if rotary is not None:
        half = (w.rotary_local if lw.rope == "local" else w.rotary)[0].shape[1]  # type: ignore[index]
        q, k = _rope(gb, q, rotary, half, hd), _rope(gb, k, rotary, half, hd)
    new_k = gb.op1("Transpose", [k], perm=[0, 2, 1, 3])  # [1, kv, W, hd]
    new_v = gb.op1("Transpose", [v], perm=[0, 2, 1, 3])
    gb.add_output(new_k, f"new_key.{layer}", dt, [1, kv, width, hd])
    gb.add_output(new_v, f"new_value.{layer}", dt, [1, kv, width, hd])
    past_k = gb.add_input(f"past_key.{layer}", dt, [1, kv, c, hd])
    past_v = gb.add_input(f"past_value.{layer}", dt, [1, kv, c, hd])
    # query heads of one KV head side by side: [1, heads, W, hd] -> [1, kv, group * W, hd]
    q = _reshape(gb, gb.op1("Transpose", [q], perm=[0, 2, 1, 3]), [1, kv, group * width, hd])
    scale = w.attn.scale if w.attn.scale is not None else hd**-0.5
    q = gb.op1("Mul", [q, gb.const(np.array(scale, gb.dtype))])
    scores = gb.op1(
        "Concat",
        [
            gb.op1("MatMul", [q, gb.op1("Transpose", [past_k], perm=[0, 1, 3, 2])]),
            gb.op1("MatMul", [q, gb.op1("Transpose", [new_k], perm=[0, 1, 3, 2])]),
        ],
        axis=-1,
    )  # [1, kv, group * W, C + W]
    scores = _to_float(gb, scores)
    if w.attn.softcap is not None:
        scores = _softcap(gb, scores, w.attn.softcap, np.float32)
    probs = gb.op1("Softmax", [gb.op1("Add", [scores, mask])], axis=-1)
    p_past, p_new = _split(gb, _from_float(gb, probs), [c, width])
    out = gb.op1(
        "Add", [gb.op1("MatMul", [p_past, past_v]), gb.op1("MatMul", [p_new, new_v])]
    )  # [1, kv, group * W, hd]
    out = gb.op1("Transpose", [_reshape(gb, out, [1, heads, width, hd])], perm=[0, 2, 1, 3])
    return _reshape(gb, out, [1, width, heads * hd])


def _mlp(gb: GraphBuilder, h: str, name: str, lw: LayerWeights, activation: str) -> str:
    up = gb.linear(h, f"{name}.up", lw.up_w, lw.up_b)
    if activation == "silu":
        inter = lw.down_w.shape[0]
        gate, up = _split(gb, up, [inter, inter])
        inner = gb.op1("Mul", [gb.op1("Mul", [gate, gb.op1("Sigmoid", [gate])]), up])
    elif activation == "gelu_tanh":
        inner = _gelu_tanh(gb, up)
    elif activation == "gelu_tanh_gated":
        inter = lw.down_w.shape[0]
        gate, up = _split(gb, up, [inter, inter])
        inner = gb.op1("Mul", [_gelu_tanh(gb, gate), up])
    else:
        raise ValueError(f"unknown activation {activation}")
    return gb.linear(inner, f"{name}.down", lw.down_w, lw.down_b)


def _gelu_tanh(gb: GraphBuilder, x: str) -> str:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))"""
    cube = gb.op1("Mul", [x, gb.op1("Mul", [x, x])])
    inside = gb.op1("Add", [x, gb.op1("Mul", [cube, gb.const(np.array(0.044715, gb.dtype))])])
    t = gb.op1("Tanh", [gb.op1("Mul", [inside, gb.const(np.array((2 / np.pi) ** 0.5, gb.dtype))])])
    half_x = gb.op1("Mul", [x, gb.const(np.array(0.5, gb.dtype))])
    return gb.op1("Mul", [half_x, gb.op1("Add", [gb.const(np.array(1.0, gb.dtype)), t])])


def _lm_head(gb: GraphBuilder, h: str, w: DecoderWeights, width: int) -> str:
    """Logits [1, W, vocab]; a tied head reuses the embedding table (Gemm with transB)."""
    name = f"{w.prefix}embed.weight" if w.tied else f"{w.prefix}lm_head.weight"
    ins = [_reshape(gb, h, [width, w.embed.shape[1]]), gb.weight(name, w.lm_head)]
    if w.lm_head_b is not None:
        ins.append(gb.weight(f"{w.prefix}lm_head.bias", w.lm_head_b))
    return _reshape(gb, gb.op1("Gemm", ins, transB=1), [1, width, w.embed.shape[0]])
