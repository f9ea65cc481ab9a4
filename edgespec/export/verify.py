"""The export check: the exported `full` graph against the transformers model it came from.

`verify_export` runs both on one short random prompt and returns the largest logit difference
and the argmax agreement (recorded in the manifest); an fp32, unquantized graph that disagrees
beyond 1e-3 of the logit scale is an `ExportError` (a bug in edgespec's export, not the user's).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edgespec.bundle import ModelInfo
from edgespec.export.errors import ExportError


def verify_export(
    hf_model: Any, path: Path, info: ModelInfo, dtype: str, quantize: str | None
) -> dict[str, float]:
    """Run the exported full graph and transformers on one short random prompt; compare logits."""
    import onnxruntime as ort
    import torch

    from edgespec.runtime.graph import session_options

    rng = np.random.default_rng(0)
    ids = rng.integers(0, info.vocab_size, size=(1, 8), dtype=np.int64)
    with torch.no_grad():
        ref = hf_model(torch.from_numpy(ids)).logits.float().numpy()
    sess = ort.InferenceSession(str(path), session_options(None), ["CPUExecutionProvider"])
    kv_dtype = np.float16 if dtype == "fp16" else np.float32
    feeds: dict[str, np.ndarray] = {
        "input_ids": ids,
        "seqlens_k": np.array([ids.shape[1] - 1], np.int32),
        "total_seq_len": np.array(ids.shape[1], np.int32),
        "num_logits_to_keep": np.array(ids.shape[1], np.int64),
    }
    for i in range(info.num_layers):
        for kind in ("key", "value"):
            feeds[f"past_{kind}.{i}"] = np.zeros((1, info.num_kv_heads, 0, info.head_dim), kv_dtype)
    got = sess.run(["logits"], feeds)[0]
    diff = float(np.abs(got - ref).max())
    scale = float(np.abs(ref).max()) or 1.0
    same_argmax = float((got.argmax(-1) == ref.argmax(-1)).mean())
    if dtype == "fp32" and quantize is None and diff > 1e-3 * max(scale, 1.0):
        raise ExportError(
            f"the exported graph disagrees with transformers (max logit difference {diff:.3g}); "
            "this is a bug in edgespec's export of this architecture, please report it"
        )
    return {"max_abs_logit_diff": diff, "argmax_agreement": same_argmax}
