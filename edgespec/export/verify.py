"""The export check: the exported `full` graph against the transformers model it came from.

`verify_export` runs both on one short random prompt and returns the largest logit difference
and the argmax agreement (recorded in the manifest); an fp32, unquantized graph that disagrees
beyond 1e-3 of the logit scale is an `ExportError` (a bug in edgespec's export, not the user's).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edgespec.bundle import Manifest, ModelInfo
from edgespec.export.errors import ExportError
from edgespec.export.feeds import prefill_feed, session_inputs


def verify_export(
    hf_model: Any, path: Path, info: ModelInfo, dtype: str, quantize: str | None
) -> dict[str, float]:
    """Run the exported full graph and transformers on one short random prompt; compare logits."""
    import onnxruntime as ort
    import torch

    from edgespec.runtime.graphs.session import session_options

    rng = np.random.default_rng(0)
    ids = rng.integers(0, info.vocab_size, size=(1, 8), dtype=np.int64)
    with torch.no_grad():
        ref = hf_model(torch.from_numpy(ids)).logits.float().numpy()
    sess = ort.InferenceSession(str(path), session_options(None), ["CPUExecutionProvider"])
    feeds = prefill_feed(session_inputs(sess), ids)
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


def verify_static(hf_model: Any, folder: Path, manifest: Manifest) -> dict[str, float]:
    """Run the static full graph through the runtime on a prompt longer than W (so the
    chunked prefill is exercised) and compare its logits with transformers'."""
    import torch

    from edgespec.runtime.graphs.session import session_options
    from edgespec.runtime.graphs.stack import Stack
    from edgespec.runtime.graphs.static import StaticGraphSession

    assert manifest.static is not None
    info = manifest.target
    n = min(max(manifest.static.verify_widths) + 3, manifest.static.max_context)
    ids = np.random.default_rng(0).integers(0, info.vocab_size, size=n, dtype=np.int64)
    with torch.no_grad():
        ref = hf_model(torch.from_numpy(ids[None])).logits.float().numpy()[0]
    kv_dtype = np.dtype(np.float16 if manifest.dtype == "fp16" else np.float32)
    session = StaticGraphSession(
        folder,
        manifest.static.graphs_for("full"),
        info,
        ["CPUExecutionProvider"],
        session_options(None),
        kv_dtype,
        manifest.static.max_context,
    )
    target = Stack([session])
    target.reset(n)
    got = target.forward(ids, keep=n)
    diff = float(np.abs(got - ref).max())
    scale = float(np.abs(ref).max()) or 1.0
    if manifest.dtype == "fp32" and diff > 1e-3 * max(scale, 1.0):
        raise RuntimeError(
            f"the static graph disagrees with transformers (max logit difference {diff:.3g}); "
            "this is a bug in edgespec's static export, please report it"
        )
    return {
        "max_abs_logit_diff": diff,
        "argmax_agreement": float((got.argmax(-1) == ref.argmax(-1)).mean()),
    }
