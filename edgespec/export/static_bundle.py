"""The bundle's static graphs: options checked, graphs built, checked and written.

`static_shapes` checks the --static options against the models (a ValueError says what to
change); `write_static_graph` builds a role's fixed-shape graph (static.py), checks it is
NPU-friendly and saves it. (verify.py checks the saved `full` graph against transformers.)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from edgespec.bundle import GraphInfo, ModelInfo
from edgespec.export.builder import GraphBuilder, WeightStore
from edgespec.export.decoder import DecoderWeights, graph_info
from edgespec.export.static import StaticShape, build_static_graph, check_static, static_model


def static_shapes(
    max_context: int, widths: list[int], quantized: list[str], models: list[ModelInfo | None]
) -> list[StaticShape]:
    """Check the --static options against the models (`quantized`: the weight quantizations
    asked for, target's and draft's); a ValueError says what to change."""
    if quantized:
        raise ValueError(
            f"--static/--coreml with {quantized[0]} weights is not supported: those graphs use "
            "standard ONNX ops only, and quantized weights here are onnxruntime's contrib ops; "
            "export the static graphs in fp32 or fp16 (drop --quantize/--draft-quantize)"
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
