"""The bundle's static graphs: options checked, graphs written, the result verified.

`static_shapes` checks the --static options against the models (a ValueError says what to
change); `write_static_graph` builds a role's fixed-shape graph (static.py), checks it is
NPU-friendly and saves it; `verify_static` runs the static `full` graph through the runtime
on a prompt longer than the verify width and compares its logits with transformers'.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx

from edgespec.bundle import GraphInfo, Manifest, ModelInfo
from edgespec.export.builder import GraphBuilder, WeightStore
from edgespec.export.decoder import DecoderWeights, graph_info
from edgespec.export.static import StaticShape, build_static_graph, check_static, static_model


def static_shapes(
    max_context: int, widths: list[int], quantize: str | None, models: list[ModelInfo | None]
) -> list[StaticShape]:
    """Check the --static options against the models; a ValueError says what to change."""
    if quantize is not None:
        raise ValueError(
            "--static/--coreml with --quantize int8 is not supported: those graphs use standard "
            "ONNX ops only and int8 here is onnxruntime's contrib DynamicQuantizeMatMul; "
            "export the static graphs in fp32 or fp16"
        )
    if not widths or min(widths) < 1:
        raise ValueError(f"--verify-width must be at least 1, got {widths}")
    if max_context < max(widths):
        raise ValueError(
            f"--max-context {max_context} is smaller than --verify-width {max(widths)}"
        )
    for m in models:
        if m is not None and max_context > m.max_position_embeddings:
            raise ValueError(
                f"--max-context {max_context} is beyond the model's "
                f"{m.max_position_embeddings} positions; choose at most "
                f"{m.max_position_embeddings}"
            )
    return [StaticShape(max_context, w) for w in widths]


def write_static_graph(
    weights: DecoderWeights,
    role: str,
    model: str,
    out: Path,
    store: WeightStore,
    dtype: np.dtype,
    shape: StaticShape,
) -> GraphInfo:
    """Build, check and save the static graph of `role`; its manifest entry."""
    gb = GraphBuilder(store=store, dtype=dtype)
    build_static_graph(weights, role, gb, shape)
    proto = static_model(gb, f"edgespec_static_{role}")
    problems = check_static(proto)
    if problems:  # a bug in this module, not a user error
        raise RuntimeError(f"static {role} graph is not NPU-friendly: {'; '.join(problems[:5])}")
    file = f"static_w{shape.verify_width}_" + role.replace("@", "_at_") + ".onnx"
    onnx.save(proto, str(out / file))
    return graph_info(role, file, model, len(weights.layers), gb)


def verify_static(hf_model: Any, folder: Path, manifest: Manifest) -> dict[str, float]:
    """Run the static full graph through the runtime on a prompt longer than W (so the
    chunked prefill is exercised) and compare its logits with transformers'."""
    import torch

    from edgespec.runtime.graph import session_options
    from edgespec.runtime.stack import Stack
    from edgespec.runtime.static import StaticGraphSession

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
