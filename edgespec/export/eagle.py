"""A feature head (EAGLE style) as the bundle's `eagle` graph, drafting from the target's own
hidden states.

Takes the target's `DecoderWeights` (its embeddings, final norm, LM head and rotary table,
which the head shares: the graph names the very initializers of the bundle's `full` graph,
so no second vocabulary matrix is written or loaded) and `HeadWeights` (trained by
`edgespec distill`). The graph, at each new position p:

  g  = features_p @ fuse + state_p      features: the target's feature layers' residual
                                        streams at p (concatenated), state: the head's own
                                        `next_state` of p - 1; a position takes one of the
                                        two, the other zero
  z  = [rms(embed(input_ids_p)), rms(g)] @ proj
  z += attention(rms(z)) ; z += mlp(rms(z))   one decoder layer, KV cache in/out (layer 0)
  next_state = z                        what the target's last feature layer would be at
                                        p + 1: the head's own g for its next step
  logits = lm_head(final_norm(z))       the next token after input_ids_p (kept positions)

An EAGLE-3 head as llama.cpp holds it (`HeadWeights.proj` None, export/eagle_gguf.py) differs
as data: its attention reads the 2H-wide [rms(embed), rms(g)] itself, the residual stream
starts at g (or rms(g)), the features may pass an RMSNorm before `fuse`, and it may bring its
own final norm, rotary table, embeddings and LM head, the latter over a draft vocabulary
whose logits land on their target ids (`draft_ids`, llama.cpp's d2t; -inf elsewhere). A
distilled head may have a draft vocabulary too (`draft_ids` without `lm_head`): the rows of
the target's own LM head for those ids (a GGUF's blocks kept as they are), so a head step
scores N ids, not the whole vocabulary; the logits land on the target's ids the same way.

Inputs: as the target's graphs (seqlens_k, total_seq_len, num_logits_to_keep, query_seqlens,
past_key.0 / past_value.0) plus input_ids [batch, sequence], features [batch, sequence, F]
float32, state [batch, sequence, hidden] float32. Outputs: logits, next_state, present_*.
Guarantees: the graph computes what `edgespec.distill.head.FeatureHead` (torch) computes
with the same weights (tested); a bundle's head is drafting only, the target verifies.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from edgespec.bundle import GraphInfo, TensorSpec
from edgespec.export.builder import AttentionShape, GraphBuilder, WeightStore, io_specs
from edgespec.export.config import DTYPES
from edgespec.export.decoder import (
    DecoderWeights,
    LayerWeights,
    Norm,
    _lm_head,
    _mlp,
    _norm,
    softcap,
)
from edgespec.export.errors import ExportError
from edgespec.export.positions import last_positions

# the head's own float matrices in a bundle: int8 blocks read a quarter of float's bytes a
# draft step (on SmolLM2's Q4_1 file a float head step cost 0.30 target steps); drafts only
HEAD_QUANTIZE = "int8"
FILE = "eagle.onnx"
WEIGHTS = "eagle.bin"
PREFIX = "eagle."
# the target's tensors the head reads: never written again (the full graph's are named)
SHARED = ("embed.", "lm_head.", "final_norm.", "rotary.")


@dataclass
class HeadWeights:
    """A feature head's own weights (numpy, [in, out] like the graph builders take)."""

    feature_layers: list[int]  # the target layers `fuse`'s rows read, in their order
    fuse: Any  # [len(feature_layers) * hidden, hidden]
    embed_norm: Norm
    state_norm: Norm
    proj: np.ndarray | None  # [2 * hidden, hidden]; None: the attention reads the 2H input
    layer: LayerWeights  # a llama-style layer: attn_norm, qkv, o, mlp_norm, gate|up, down
    # an EAGLE-3 head's differences (export/eagle_gguf.py); the defaults are a distilled head's
    feature_norm: Norm | None = None  # over the concatenated features, before fuse
    residual_normed: bool = False  # proj None: the residual stream starts at rms(g), not g
    final_norm: Norm | None = None  # None: the target's
    lm_head: Any = None  # [hidden, draft vocab]; None: the target's (its draft_ids' rows)
    draft_ids: np.ndarray | None = None  # the target id of each draft id (d2t); None: same vocab
    embed: Any = None  # [vocab, hidden]; None: the target's
    rotary: tuple[np.ndarray, np.ndarray] | None = None  # None: the target's table
    attn: AttentionShape | None = None  # None: the target's shape

    def arrays(self) -> dict[str, np.ndarray]:
        """Every tensor by name (a checkpoint's layout, see `from_arrays`)."""
        lw = self.layer
        assert lw.attn_norm is not None and lw.mlp_norm is not None and self.proj is not None
        vocab = {} if self.draft_ids is None else {"draft_ids": np.asarray(self.draft_ids)}
        return vocab | {
            "feature_layers": np.asarray(self.feature_layers, np.int64),
            "fuse": self.fuse,
            "embed_norm": self.embed_norm.gamma,
            "state_norm": self.state_norm.gamma,
            "proj": self.proj,
            "attn_norm": lw.attn_norm.gamma,
            "qkv": lw.qkv_w,
            "o": lw.o_w,
            "mlp_norm": lw.mlp_norm.gamma,
            "up": lw.up_w,
            "down": lw.down_w,
        }

    @classmethod
    def from_arrays(cls, a: dict[str, np.ndarray], eps: float) -> HeadWeights:
        def norm(name: str) -> Norm:
            return Norm(np.asarray(a[name], np.float32), None, eps)

        ints = ("feature_layers", "draft_ids")
        f32 = {k: np.asarray(v, np.float32) for k, v in a.items() if k not in ints}
        layer = LayerWeights(
            attn_norm=norm("attn_norm"),
            qkv_w=f32["qkv"],
            qkv_b=None,
            o_w=f32["o"],
            o_b=None,
            mlp_norm=norm("mlp_norm"),
            up_w=f32["up"],
            up_b=None,
            down_w=f32["down"],
            down_b=None,
        )
        return cls(
            [int(k) for k in a["feature_layers"]],
            f32["fuse"],
            norm("embed_norm"),
            norm("state_norm"),
            f32["proj"],
            layer,
            draft_ids=np.asarray(a["draft_ids"], np.int64) if "draft_ids" in a else None,
        )


class SharedStore(WeightStore):
    """A weight store that hands out the `full` graph's own initializer for a tensor of the
    same name and shape (the target's embeddings, LM head, final norm and rotary tables) and
    writes only the head's own tensors into its file."""

    def __init__(self, path: Path, full: onnx.ModelProto) -> None:
        super().__init__(path)
        self.shared = {t.name: t for t in full.graph.initializer}
        self.missing: list[str] = []  # target tensors the full graph does not hold as named

    def tensor(self, name: str, array: np.ndarray) -> TensorProto:
        if name.startswith(SHARED):
            t = self.shared.get(name)
            if t is not None and list(t.dims) == list(array.shape):
                out = TensorProto()
                out.CopyFrom(t)
                return out
            self.missing.append(name)
        return super().tensor(name, array)


def build_head_graph(
    target: DecoderWeights,
    head: HeadWeights,
    gb: GraphBuilder,
    shared: str | None = None,
    layers: list[int] | None = None,
) -> None:
    """Populate `gb` with the eagle graph (module doc): the head's own matrices quantized as
    `gb.quantize` says, the target's embeddings and LM head as `shared` (the bundle's
    quantization: the names its full graph gave them). `layers`: the bundle's feature layers,
    whose concatenation the `features` input is (None: the head's own, in their order)."""
    if target.rotary is None or target.pos_embed is not None:
        raise ExportError("a feature head needs a rotary-position family (llama, qwen, ...)")
    hidden = target.embed.shape[1]
    layers = list(head.feature_layers if layers is None else layers)
    dt = gb.onnx_dtype
    seqlens = gb.add_input("seqlens_k", TensorProto.INT32, ["batch"])
    total = gb.add_input("total_seq_len", TensorProto.INT32, [])
    keep = gb.add_input("num_logits_to_keep", TensorProto.INT64, [])
    query = (
        gb.add_input("query_seqlens", TensorProto.INT32, ["batch"]) if gb.query_seqlens else None
    )
    ids = gb.add_input("input_ids", TensorProto.INT64, ["batch", "sequence"])
    width = len(layers) * hidden
    features = gb.add_input("features", TensorProto.FLOAT, ["batch", "sequence", width])
    state = gb.add_input("state", TensorProto.FLOAT, ["batch", "sequence", hidden])
    if dt != TensorProto.FLOAT:
        features = gb.op1("Cast", [features], to=dt)
        state = gb.op1("Cast", [state], to=dt)

    p = PREFIX
    own, gb.quantize = gb.quantize, shared  # the target's tensors as its full graph holds them
    if head.embed is None:
        e = gb.embedding(ids, "embed", target.embed)
    else:
        gb.quantize = own
        e = gb.embedding(ids, f"{p}embed", head.embed)
    gb.quantize = own
    if target.embed_scale != 1.0 and head.embed is None:
        e = gb.op1("Mul", [e, gb.const(np.array(target.embed_scale, gb.dtype))])
    if head.feature_layers != layers:  # the head's columns of the bundle's features
        cols = [layers.index(k) * hidden + np.arange(hidden) for k in head.feature_layers]
        features = gb.op1("Gather", [features, gb.const(np.concatenate(cols))], axis=2)
    if head.feature_norm is not None:
        features = _norm(gb, features, f"{p}feature_norm", head.feature_norm)
    g = gb.op1("Add", [gb.linear(features, f"{p}fuse", head.fuse), state])
    g_normed = _norm(gb, g, f"{p}state_norm", head.state_norm)
    z = gb.op1("Concat", [_norm(gb, e, f"{p}embed_norm", head.embed_norm), g_normed], axis=-1)
    lw = head.layer
    assert lw.mlp_norm is not None
    if head.proj is not None:  # a distilled head: z in the hidden width, normed for attention
        assert lw.attn_norm is not None
        z = gb.linear(z, f"{p}proj", head.proj)
        x = _norm(gb, z, f"{p}layer.attn_norm", lw.attn_norm)
    else:  # EAGLE-3: the attention reads the 2H input, the residual stream starts at g
        x, z = z, g_normed if head.residual_normed else g
    cos_sin = head.rotary or target.rotary
    rotary = gb.rotary_cache(*cos_sin, name="rotary" if head.rotary is None else f"{p}rotary")
    attn = head.attn or target.attn
    a = gb.attention(
        gb.linear(x, f"{p}layer.qkv", lw.qkv_w),
        0,
        AttentionShape(attn.num_heads, attn.num_kv_heads, attn.head_dim, True, attn.scale),
        seqlens,
        total,
        rotary,
        query,
    )
    a = gb.linear(a, f"{p}layer.o", lw.o_w)
    h, z = gb.skip_norm(a, z, f"{p}layer.mlp_norm", lw.mlp_norm.gamma, None, lw.mlp_norm.eps)
    z = gb.op1("Add", [z, _mlp(gb, h, f"{p}layer", lw, "silu")])
    out_state = z if dt == TensorProto.FLOAT else gb.op1("Cast", [z], to=TensorProto.FLOAT)
    gb.add_output(out_state, "next_state", TensorProto.FLOAT, ["batch", "sequence", hidden])
    logits = _head_logits(gb, last_positions(gb, z, keep), target, head, shared)
    gb.add_output(logits, "logits", TensorProto.FLOAT, ["batch", "kept", target.embed.shape[0]])


def _head_logits(
    gb: GraphBuilder, z: str, target: DecoderWeights, head: HeadWeights, shared: str | None
) -> str:
    """float32 logits over the target's vocabulary of the kept positions' states `z`."""
    if head.final_norm is None:
        x = _norm(gb, z, "final_norm", target.final_norm)
    else:
        x = _norm(gb, z, f"{PREFIX}final_norm", head.final_norm)
    if head.lm_head is not None:
        logits = gb.linear(x, f"{PREFIX}lm_head", head.lm_head)
    elif head.draft_ids is not None:  # the target's LM head, the draft vocabulary's rows
        bias = None if target.lm_head_b is None else np.asarray(target.lm_head_b)[head.draft_ids]
        logits = gb.linear(x, f"{PREFIX}lm_rows", lm_rows(target, head.draft_ids), bias)
    else:
        own, gb.quantize = gb.quantize, shared
        logits = _lm_head(gb, x, target)
        gb.quantize = own
    if gb.onnx_dtype != TensorProto.FLOAT:
        logits = gb.op1("Cast", [logits], to=TensorProto.FLOAT)
    if target.final_softcap is not None and head.lm_head is None:
        logits = softcap(gb, logits, target.final_softcap, np.float32)
    if head.draft_ids is None:
        return logits
    # draft id i's logit at target id draft_ids[i]; a target id no draft id maps to: -inf,
    # the column appended past the draft vocabulary
    n = int(head.draft_ids.shape[0])
    at = np.full(target.embed.shape[0], n, np.int64)
    at[head.draft_ids] = np.arange(n)
    padded = gb.op1(
        "Pad",
        [logits, gb.const(np.array([0, 0, 0, 0, 0, 1], np.int64)),
         gb.const(np.array(-np.inf, np.float32))],
    )  # fmt: skip
    return gb.op1("Gather", [padded, gb.const(at)], axis=2)


def lm_rows(target: DecoderWeights, ids: np.ndarray) -> Any:
    """The target's LM head [hidden, len(ids)] for the target ids `ids` (graph layout): a
    GGUF's blocks taken whole, so the values are the target's own."""
    from edgespec.export.gguf_blocks import PackedMatrix

    w = target.lm_head.T
    if isinstance(w, PackedMatrix) and not w.transposed:
        return w.take_columns(np.asarray(ids, np.int64))
    return np.ascontiguousarray(np.asarray(w, np.float32)[:, ids])


def write_head(
    folder: Path,
    target: DecoderWeights,
    head: HeadWeights,
    dtype: str = "fp32",
    batched: bool = True,
    accuracy_level: int = 4,
    quantize: str | None = None,
    shared: str | None = None,
    layers: list[int] | None = None,
) -> GraphInfo:
    """Build the eagle graph into the bundle `folder` (next to its `full.onnx`, whose shared
    tensors it names); return its manifest entry. `quantize`: the head's own matrices as
    int8 / int4 blocks (None: float; a GGUF's blocks stay its own); `shared`: the bundle's
    quantization; `layers`: the bundle's feature layers (None: the head's). An ExportError if
    the full graph holds the target's embeddings or LM head under other names."""
    full = onnx.load(str(folder / "full.onnx"), load_external_data=False)
    store = SharedStore(folder / WEIGHTS, full)
    gb = GraphBuilder(
        store=store,
        dtype=np.dtype(DTYPES[dtype]),
        query_seqlens=batched,
        accuracy_level=accuracy_level,
        quantize=quantize,
    )
    try:
        build_head_graph(target, head, gb, shared, layers)
    finally:
        store.close()
    if store.missing:
        raise ExportError(
            f"the bundle's full graph does not hold {store.missing[0]} as the target's weights "
            "give it (exported with other options): distill from the model file instead"
        )
    onnx.save(gb.model("edgespec_eagle"), str(folder / FILE))
    return GraphInfo(
        role="eagle",
        file=FILE,
        model="target",
        kv_layers=[0],
        inputs=[TensorSpec(**s) for s in io_specs(gb.inputs)],
        outputs=[TensorSpec(**s) for s in io_specs(gb.outputs)],
    )


def initial_head(target: DecoderWeights, feature_layers: list[int], seed: int = 0) -> HeadWeights:
    """A head to start training from (or to test with): g is the last feature layer's state,
    z starts as the normalised g, and the layer is a float copy of the target's last one
    (its attention shape), so the untrained head is about one more target layer."""
    rng = np.random.default_rng(seed)
    hidden = target.embed.shape[1]
    last = target.layers[-1]
    eps = target.final_norm.eps
    fuse = np.zeros((len(feature_layers) * hidden, hidden), np.float32)
    fuse[-hidden:] = np.eye(hidden, dtype=np.float32)
    proj = np.concatenate([rng.normal(0, 0.02, (hidden, hidden)), np.eye(hidden)], 0).astype(
        np.float32
    )
    inter = np.asarray(last.up_w, np.float32).shape[1] // 2 if target.activation.endswith(
        "gated") or target.activation == "silu" else 4 * hidden  # fmt: skip
    up = np.asarray(last.up_w, np.float32)
    if up.shape[1] != 2 * inter:  # a plain MLP: a gated one of random weights
        up = rng.normal(0, hidden**-0.5, (hidden, 2 * inter)).astype(np.float32)
    down = np.asarray(last.down_w, np.float32)
    if down.shape[0] != inter:
        down = rng.normal(0, inter**-0.5, (inter, hidden)).astype(np.float32)

    def gain(norm: Norm | None) -> Norm:
        g = np.ones(hidden, np.float32) if norm is None else np.asarray(norm.gamma, np.float32)
        return Norm(g.copy(), None, eps)

    layer = LayerWeights(
        attn_norm=gain(last.attn_norm),
        qkv_w=np.asarray(last.qkv_w, np.float32).copy(),
        qkv_b=None,
        o_w=np.asarray(last.o_w, np.float32).copy(),
        o_b=None,
        mlp_norm=gain(last.mlp_norm),
        up_w=up.copy(),
        up_b=None,
        down_w=down.copy(),
        down_b=None,
    )
    ones = Norm(np.ones(hidden, np.float32), None, eps)
    return HeadWeights(list(feature_layers), fuse, ones, Norm(ones.gamma.copy(), None, eps),
                       proj, layer)  # fmt: skip
