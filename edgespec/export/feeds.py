"""The inputs of one prefill call of a bundle graph, for the export's own checks (`verify.py`,
`shared_backbone.py`) and qdq-int8 calibration (`quantize.py`): a prompt from position 0 with
an empty KV cache, every position's logits kept.

Built from the graph's declared inputs, so it fits any role (`full`, `head@k` with its k
layers' caches, `tail@k` on `hidden`) and a bundle with or without batched verify
(`query_seqlens`, onnxruntime 1.32+).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

# onnx tensor element types and onnxruntime type strings of the graphs' KV caches
_CACHE_DTYPES: dict[int | str, type] = {1: np.float32, 10: np.float16}
_CACHE_DTYPES.update({"tensor(float)": np.float32, "tensor(float16)": np.float16})


def session_inputs(session: Any) -> dict[str, tuple[list[Any], type]]:
    """name -> (shape, cache dtype) of an onnxruntime session's inputs."""
    inputs = session.get_inputs()
    return {i.name: (list(i.shape), _CACHE_DTYPES.get(i.type, np.float32)) for i in inputs}


def proto_inputs(model: Any) -> dict[str, tuple[list[Any], type]]:
    """name -> (shape, cache dtype) of an onnx ModelProto's inputs."""
    out = {}
    for vi in model.graph.input:
        t = vi.type.tensor_type
        shape = [d.dim_value or d.dim_param for d in t.shape.dim]
        out[vi.name] = (shape, _CACHE_DTYPES.get(t.elem_type, np.float32))
    return out


def prefill_feed(
    inputs: dict[str, tuple[list[Any], type]],
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
        elif name.startswith("past_"):
            feed[name] = np.zeros((1, shape[1], 0, shape[3]), dtype)
        else:
            raise ValueError(f"no prefill value for the graph input {name!r}")
    return feed
