"""A small ONNX graph builder for decoder-only transformers.

Takes numpy weights and emits the graph ops onnxruntime runs fastest on a CPU:
`GroupQueryAttention` (rotary, causal mask and an in-place KV buffer in one op),
`SkipSimplifiedLayerNormalization` / `SkipLayerNormalization` (residual add fused into the
norm), packed QKV and gate/up projections, and `MatMulNBits` for block-wise int8/int4 weights.
Guarantees: the graph it returns computes what the transformers model computes, in fp32
(or fp16 compute with fp32 logits), with weights kept out of the protobuf (`WeightStore`
writes them once to the bundle's shared weights file, so head@k, tail@k and full share
them on disk).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
from onnx import TensorProto, helper

from edgespec.export.gguf_blocks import PackedMatrix, from_float
from edgespec.export.nbits import (
    BITS,
    WeightFormat,
    block_for,
    embedding_format,
    quantize_blocks,
    weight_format,
)

OPSET = 21
MS_DOMAIN = "com.microsoft"
IR_VERSION = 10  # onnxruntime 1.20+ reads IR 10
ALIGN = 4096  # page-aligned large tensors let onnxruntime map them
SMALL_ALIGN = 64  # small tensors (norm gains, biases, scales) only need cache-line alignment

NP_TO_ONNX = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.int8): TensorProto.INT8,
    np.dtype(np.uint8): TensorProto.UINT8,
}
ONNX_TO_NAME = {TensorProto.FLOAT: "float32", TensorProto.FLOAT16: "float16"}
ONNX_TO_NAME |= {TensorProto.INT64: "int64", TensorProto.INT32: "int32", TensorProto.BOOL: "bool"}


class WeightStore:
    """Writes each distinct tensor once into one file and hands out external-data protos."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: BinaryIO = open(path, "wb")  # noqa: SIM115 - closed by close()
        self._seen: dict[tuple[str, str], tuple[int, int]] = {}  # (dtype, sha1) -> offset, length

    def tensor(self, name: str, array: np.ndarray) -> TensorProto:
        array = np.ascontiguousarray(array)
        data = array.tobytes()
        # keyed by content, not name: an int8 bundle's tied table serves both the LM head's
        # MatMulNBits and the embedding's GatherBlockQuantized, under two names and shapes
        key = (str(array.dtype), hashlib.sha1(data).hexdigest())
        if key not in self._seen:
            align = ALIGN if len(data) >= ALIGN else SMALL_ALIGN
            pad = (-self._file.tell()) % align
            self._file.write(b"\0" * pad)
            self._seen[key] = (self._file.tell(), len(data))
            self._file.write(data)
        offset, length = self._seen[key]
        t = TensorProto(name=name, data_type=NP_TO_ONNX[array.dtype], dims=list(array.shape))
        t.data_location = TensorProto.EXTERNAL
        for k, v in (
            ("location", self.path.name),
            ("offset", str(offset)),
            ("length", str(length)),
        ):
            entry = t.external_data.add()
            entry.key, entry.value = k, v
        return t

    def close(self) -> None:
        self._file.close()


@dataclass
class AttentionShape:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rotary: bool
    scale: float | None = None  # None: 1 / sqrt(head_dim)
    softcap: float | None = None  # attention scores -> cap * tanh(scores / cap) (Gemma 2)


@dataclass
class GraphBuilder:
    """Accumulates nodes, inputs, outputs and initializers for one graph."""

    store: WeightStore
    dtype: np.dtype  # compute dtype of activations and float weights
    quantize: str | None = None  # None | "int8" | "int4" (weight-only; see export/nbits.py)
    block_size: int | None = None  # weights per scale (None: the method's default)
    accuracy_level: int = 4  # MatMulNBits' compute type (4: int8 activations)
    matmul_head: bool = False  # LM head as a plain MatMul on a transposed copy (for QDQ)
    # attention takes query_seqlens (batched verify rounds; onnxruntime >= 1.32 loads it)
    query_seqlens: bool = True
    tree: bool = False  # takes a token tree's positions and mask (export/tree.py)
    # a one-position call's attention runs as two positions (export/positions.py): batch-invariant
    pad_lone_rows: bool = True
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    inputs: list[onnx.ValueInfoProto] = field(default_factory=list)
    outputs: list[onnx.ValueInfoProto] = field(default_factory=list)
    initializers: list[TensorProto] = field(default_factory=list)
    _names: set[str] = field(default_factory=set)
    _counter: int = 0

    @property
    def onnx_dtype(self) -> int:
        return NP_TO_ONNX[np.dtype(self.dtype)]

    # -- plumbing ---------------------------------------------------------------------------
    def fresh(self, hint: str) -> str:
        self._counter += 1
        return f"{hint}_{self._counter}"

    def op(
        self, op_type: str, inputs: list[str], n_out: int = 1, domain: str = "", **attrs
    ) -> list[str]:
        outs = [self.fresh(op_type.lower()) for _ in range(n_out)]
        node = helper.make_node(
            op_type, inputs, outs, name=self.fresh(op_type), domain=domain, **attrs
        )
        self.nodes.append(node)
        return outs

    def op1(self, op_type: str, inputs: list[str], domain: str = "", **attrs) -> str:
        return self.op(op_type, inputs, 1, domain, **attrs)[0]

    def weight(self, name: str, array: np.ndarray, cast: bool = True) -> str:
        """A named initializer (float weights are stored in the compute dtype)."""
        if name in self._names:
            return name
        if cast and array.dtype.kind == "f":
            array = array.astype(self.dtype)
        self.initializers.append(self.store.tensor(name, array))
        self._names.add(name)
        return name

    def const(self, array: np.ndarray) -> str:
        name = self.fresh("const")
        self.initializers.append(onnx.numpy_helper.from_array(np.asarray(array), name))
        return name

    def add_input(self, name: str, elem: int, shape: list[int | str]) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem, shape))
        return name

    def add_output(self, value: str, name: str, elem: int, shape: list[int | str]) -> None:
        self.nodes.append(helper.make_node("Identity", [value], [name], name=self.fresh("out")))
        self.outputs.append(helper.make_tensor_value_info(name, elem, shape))

    def model(self, name: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, self.inputs, self.outputs, self.initializers)
        opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1)]
        model = helper.make_model(graph, opset_imports=opsets, producer_name="edgespec")
        model.ir_version = IR_VERSION
        return model

    # -- layers -----------------------------------------------------------------------------
    def linear(self, x: str, name: str, w: np.ndarray, b: np.ndarray | None = None) -> str:
        """y = x @ w + b, with w stored [in, out]; int8/int4 weights use MatMulNBits
        (layout in export/nbits.py); a `PackedMatrix` (an imported GGUF's blocks) keeps its own
        blocks, whatever `quantize` says."""
        f = weight_format(self.quantize, self.block_size) if self.quantize in BITS else None
        if f is not None and not isinstance(w, PackedMatrix):
            w = from_float(w, f) or w  # None: K padded to whole blocks, below
        if isinstance(w, PackedMatrix):
            y = self._packed_linear(x, name, w)
        elif f is not None:  # K padded: 4-bit symmetric, no zero points (`PackedMatrix.centred`)
            f = replace(f, zero_points=False) if f.bits == 4 else f
            block, tensors = self._nbits(name, w, f)
            y = self.op1(
                "MatMulNBits",
                [x, *tensors],
                domain=MS_DOMAIN,
                K=w.shape[0],
                N=w.shape[1],
                bits=f.bits,
                block_size=block,
                accuracy_level=self.accuracy_level,
            )
        else:
            y = self.op1("MatMul", [x, self.weight(f"{name}.weight", w)])
        if b is not None:
            y = self.op1("Add", [y, self.weight(f"{name}.bias", b)])
        return y

    def embedding(self, ids: str, name: str, table: np.ndarray) -> str:
        """Rows of `table` [vocab, hidden] for `ids`. int8/int4 graphs gather them with
        GatherBlockQuantized from the table quantized as `embedding_format` says, laid out as
        `linear` stores a [hidden, vocab] weight: in an int8 bundle a tied LM head and its
        embedding share one copy of the bytes. (A float table was 544 of the Qwen2.5-0.5B
        shape's 818 MB int4 bundle.) A hidden size no supported block divides stays float."""
        if isinstance(table, PackedMatrix):
            return self._packed_gather(ids, name, table)
        k = table.shape[1]
        f = embedding_format(self.quantize, self.block_size) if self.quantize in BITS else None
        if f is None or k % block_for(k, f.block_size):
            return self.op1("Gather", [self.weight(f"{name}.weight", table), ids], axis=0)
        block, (data, *scales_zp) = self._nbits(name, table.T, f, rows=table.shape[0])
        return self.op1(
            "GatherBlockQuantized",
            [data, ids, *scales_zp],
            domain=MS_DOMAIN,
            gather_axis=0,
            quantize_axis=1,
            block_size=block,
            bits=f.bits,
        )

    def _packed_linear(self, x: str, name: str, w: PackedMatrix) -> str:
        """x @ W for W held in its file's blocks: MatMulNBits over q, scales (and zero points),
        plus, for blocks with a minimum, x's block sums times the centre term [K / block, N]
        (`PackedMatrix.centred`: the zero point at the middle of q's range)."""
        if w.transposed:
            raise ValueError(f"{name}: a transposed packed matrix is an embedding table")
        w = w.centred()
        ins = [x, *self._packed_tensors(name, w)]
        y = self.op1(
            "MatMulNBits",
            ins,
            domain=MS_DOMAIN,
            K=w.k,
            N=w.n,
            bits=w.bits,
            block_size=w.block,
            accuracy_level=self.accuracy_level,
        )
        if w.minima is None:
            return y
        # K / block spelt out: -1 cannot be inferred for 0 positions (a head's keep=0 call)
        blocks = self.op1("Reshape", [x, self.const(np.array([0, 0, w.k // w.block, w.block]))])
        sums = self.op1("ReduceSum", [blocks, self.const(np.array([-1]))], keepdims=0)
        mins = self.weight(f"{name}.minima", np.ascontiguousarray(w.minima.T))
        return self.op1("Add", [y, self.op1("MatMul", [sums, mins])])

    def _packed_tensors(self, name: str, w: PackedMatrix, rows: int | None = None) -> list[str]:
        arrays = [w.packed, w.scales, w.zero_point_tensor()]
        if rows is None:
            arrays[1] = w.scales.reshape(-1)
        names = []
        for suffix, a in zip(("", "scale", "zero"), arrays, strict=True):
            if a is not None:
                a = a if rows is None else a.reshape(rows, -1)
                names.append(self.weight(f"{name}.q{w.bits}{suffix}", a))
        return names

    def _packed_gather(self, ids: str, name: str, table: PackedMatrix) -> str:
        """Rows of an embedding table held in its file's blocks: GatherBlockQuantized over
        the same bytes as the tied LM head's MatMulNBits; blocks with a minimum gather the
        exact float32 rows instead (the op has no minimum term)."""
        if table.minima is not None or not table.transposed:
            return self.op1("Gather", [self.weight(f"{name}.weight", np.asarray(table)), ids],
                            axis=0)  # fmt: skip
        return self.op1(
            "GatherBlockQuantized",
            [*self._packed_tensors(name, table, rows=table.n)[:1], ids,
             *self._packed_tensors(name, table, rows=table.n)[1:]],
            domain=MS_DOMAIN,
            gather_axis=0,
            quantize_axis=1,
            block_size=table.block,
            bits=table.bits,
        )  # fmt: skip

    def _nbits(
        self, name: str, w: np.ndarray, f: WeightFormat, rows: int | None = None
    ) -> tuple[int, list[str]]:
        """w [K, N] quantized as `f` (block: `block_for(K, ...)`): (block, the initializers of
        its packed weights, scales and zero points if any). `rows` reshapes each to [rows, -1],
        GatherBlockQuantized's view of the same bytes."""
        block = block_for(w.shape[0], f.block_size)
        arrays = quantize_blocks(w, f.bits, block, f.zero_points)
        names = [
            self.weight(f"{name}.q{f.bits}{suffix}", a if rows is None else a.reshape(rows, -1))
            for suffix, a in zip(("", "scale", "zero"), arrays, strict=True)
            if a is not None
        ]
        return block, names

    def norm(
        self, x: str, name: str, gamma: np.ndarray, beta: np.ndarray | None, eps: float
    ) -> str:
        """RMSNorm when beta is None, else LayerNorm."""
        g = self.weight(f"{name}.weight", gamma)
        if beta is None:
            return self.op1("SimplifiedLayerNormalization", [x, g], axis=-1, epsilon=eps)
        bb = self.weight(f"{name}.bias", beta)
        return self.op1("LayerNormalization", [x, g, bb], axis=-1, epsilon=eps)

    def skip_norm(
        self, x: str, skip: str, name: str, gamma: np.ndarray, beta: np.ndarray | None, eps: float
    ) -> tuple[str, str]:
        """(norm(x + skip), x + skip) in one fused op."""
        g = self.weight(f"{name}.weight", gamma)
        if beta is None:
            outs = self.op(
                "SkipSimplifiedLayerNormalization", [x, skip, g], 4, MS_DOMAIN, epsilon=eps
            )
        else:
            bb = self.weight(f"{name}.bias", beta)
            outs = self.op("SkipLayerNormalization", [x, skip, g, bb], 4, MS_DOMAIN, epsilon=eps)
        return outs[0], outs[3]

    def attention(
        self,
        qkv: str | tuple[str, str, str],
        layer: int,
        shape: AttentionShape,
        seqlens_k: str,
        total_len: str,
        rotary: tuple[str, str] | None,
        query_seqlens: str | None,
        window: int | None = None,
        tree: tuple[str, str] | None = None,
        pad: tuple[str, str] | None = None,
    ) -> str:
        """GroupQueryAttention over a packed QKV projection (or separate q, k, v), KV written
        in place; `window`: a query sees itself and the window - 1 positions before it.

        `query_seqlens` [batch] (valid new positions per row, the rest right padding) lets
        rows of one call take different numbers of new positions after different pasts: a
        batch of verify rounds runs at full width in one call (without it onnxruntime
        refuses batch > 1 with more than one new position after a past). None: graphs for
        onnxruntime < 1.32, whose attention has no such input. `tree`: (position_ids,
        attention_bias) of export/tree.py (rotary at those positions, the bias added). `pad`:
        export/positions.py `lone_row_pad`'s (pads, sequence length), with seqlens_k,
        total_len and query_seqlens already counting the pad."""
        past_k = self.add_input(f"past_key.{layer}", self.onnx_dtype, kv_shape(shape))
        past_v = self.add_input(f"past_value.{layer}", self.onnx_dtype, kv_shape(shape))
        q_k_v = [qkv, "", ""] if isinstance(qkv, str) else list(qkv)
        if pad is not None:
            q_k_v = [self.op1("Pad", [t, pad[0]], mode="edge") if t else t for t in q_k_v]
        ins = [*q_k_v, past_k, past_v, seqlens_k, total_len]
        attrs = {"num_heads": shape.num_heads, "kv_num_heads": shape.num_kv_heads}
        ins += list(rotary) if rotary is not None else ["", ""]
        if rotary is not None:
            attrs |= {"do_rotary": 1, "rotary_interleaved": 0}
        if tree is not None or query_seqlens is not None:  # inputs 9, 10
            ins += list(tree) if tree is not None else ["", ""]  # position_ids, attention_bias
        if query_seqlens is not None:  # head_sink .. k_norm_weight unused; then input 16
            ins += [""] * 5 + [query_seqlens]
        if shape.scale is not None:
            attrs["scale"] = float(shape.scale)
        if shape.softcap is not None:
            attrs["softcap"] = float(shape.softcap)
        if window is not None:
            attrs["local_window_size"] = int(window)  # it attends keys with q - k < window
        out, pk, pv = self.op("GroupQueryAttention", ins, 3, MS_DOMAIN, **attrs)
        for src, dst in ((pk, f"present_key.{layer}"), (pv, f"present_value.{layer}")):
            self.add_output(src, dst, self.onnx_dtype, kv_shape(shape))
        if pad is not None:
            zero, axis = self.const(np.array([0])), self.const(np.array([1]))
            out = self.op1("Slice", [out, zero, pad[1], axis])
        return out

    def rotary_cache(
        self, cos: np.ndarray, sin: np.ndarray, name: str = "rotary"
    ) -> tuple[str, str]:
        """cos/sin tables [max_positions, rotary_dim / 2] shared by the layers that use them
        (rotary_dim < head_dim: only the first rotary_dim dims of each head rotate). With
        `pad_lone_rows` a row more (the last one's copy): a one-position call at the last
        position pads its attention one past it."""
        cos, sin = self.rotary_rows(cos), self.rotary_rows(sin)
        return self.weight(f"{name}.cos", cos), self.weight(f"{name}.sin", sin)

    def rotary_rows(self, table: np.ndarray) -> np.ndarray:
        """A rotary table as graphs store it: with `pad_lone_rows`, its last row once more
        (static graphs store the same bytes, so a bundle holds one copy)."""
        return np.concatenate([table, table[-1:]]) if self.pad_lone_rows else table


def kv_shape(shape: AttentionShape) -> list[int | str]:
    return ["batch", shape.num_kv_heads, "capacity", shape.head_dim]


def io_specs(values: list[onnx.ValueInfoProto]) -> list[dict]:
    specs = []
    for v in values:
        t = v.type.tensor_type
        dims = [d.dim_param if d.dim_param else d.dim_value for d in t.shape.dim]
        specs.append({"name": v.name, "dtype": ONNX_TO_NAME[t.elem_type], "shape": dims})
    return specs
