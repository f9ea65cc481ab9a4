"""The inputs of one prefill call of a bundle graph, for the export's own checks (`verify.py`,
`shared_backbone.py`) and qdq-int8 calibration (`quantize.py`): a prompt from position 0 with
an empty KV cache, every position's logits kept.

Built from the graph's declared inputs, so it fits any role (`full`, `head@k` with its k
layers' caches, `tail@k` on `hidden`), a bundle with or without batched verify
(`query_seqlens`, onnxruntime 1.32+), and tree-verification graphs (the prompt as a chain).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx

from edgespec.runtime.graphs.session import ORT_TYPES


def session_inputs(session: Any) -> dict[str, tuple[list[Any], np.dtype]]:
    """name -> (shape, dtype) of an onnxruntime session's inputs."""
    return {
        i.name: (list(i.shape), np.dtype(ORT_TYPES.get(i.type, "float32")))
        for i in session.get_inputs()
    }


def proto_inputs(model: onnx.ModelProto) -> dict[str, tuple[list[Any], np.dtype]]:
    """name -> (shape, dtype) of an onnx ModelProto's inputs."""
    out = {}
    for vi in model.graph.input:
        t = vi.type.tensor_type
        shape = [d.dim_value or d.dim_param for d in t.shape.dim]
        out[vi.name] = (shape, onnx.helper.tensor_dtype_to_np_dtype(t.elem_type))
    return out


def prefill_feed(
    inputs: dict[str, tuple[list[Any], np.dtype]],
    ids: Sequence[int] | np.ndarray,
    hidden: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """One prefill call's feed: `ids` ([S] or [1, S]) from position 0, an empty cache for
    every `past_*` input, all S logits kept; `hidden` ([1, S, H]) for a tail@k graph."""
    ids = np.asarray(ids, np.int64).reshape(1, -1)
    s = ids.shape[1]
    feed: dict[str, np.ndarray] = {}
    for name, (shape, dtype) in inputs.items():
        if name == "input_ids":
            feed[name] = ids
        elif name == "hidden":
            if hidden is None:
                raise ValueError("a tail graph's prefill takes head@k's hidden states")
            feed[name] = hidden
        elif name == "seqlens_k":
            feed[name] = np.array([s - 1], np.int32)
        elif name == "total_seq_len":
            feed[name] = np.array(s, np.int32)
        elif name == "num_logits_to_keep":
            feed[name] = np.array(s, np.int64)
        elif name == "query_seqlens":
            feed[name] = np.array([s], np.int32)
        elif name == "position_ids":  # a tree-verification graph: the prompt as a chain
            feed[name] = np.arange(s, dtype=np.int64)[None]
        elif name == "tree_mask":
            feed[name] = np.tri(s, dtype=bool)
        elif name.startswith("past_"):
            feed[name] = np.zeros((1, shape[1], 0, shape[3]), dtype)
        else:
            raise ValueError(f"no prefill value for the graph input {name!r}")
    return feed
