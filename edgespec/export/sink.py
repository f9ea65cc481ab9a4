"""Where an export writes: the bundle folder checked and prepared, and `GraphSink`, which
builds one role's graph of `DecoderWeights` into it (shared by the Hugging Face pipeline and
the GGUF importer).

`_check_out` refuses a file, or a non-empty folder that is not a bundle, or a bundle without
`overwrite`, before anything is loaded; `_prepare_out` empties it only once the checkpoint
was accepted. `GraphSink.write` builds the graph for a role (float, block-quantized, or
calibrated QDQ), saves it and returns its manifest entry.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from edgespec.bundle import GraphInfo
from edgespec.export.builder import GraphBuilder, WeightStore
from edgespec.export.config import DTYPES
from edgespec.export.decoder import DecoderWeights, build_graph, graph_info
from edgespec.export.errors import ExportError
from edgespec.export.quantize import QdqCalibration, QuantConfig, externalize

WEIGHTS_FILE = "weights.bin"


def _check_out(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file; give a folder path")
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise ExportError(f"--out {out} is not empty; choose a new folder or pass --overwrite")
        if not (out / "manifest.json").exists():
            raise ExportError(
                f"--out {out} is not empty and is not a bundle; refusing to overwrite it"
            )


def _prepare_out(out: Path, overwrite: bool) -> Path:
    _check_out(out, overwrite)
    if out.exists() and any(out.iterdir()):
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    return out


@dataclasses.dataclass(frozen=True)
class GraphSink:
    """Where an export's graphs go: the bundle folder, its weights file, the float dtype and
    whether GroupQueryAttention takes `query_seqlens` (batched verify rounds)."""

    out: Path
    store: WeightStore
    dtype: str
    batched: bool = True
    accuracy_level: int = 4  # MatMulNBits' compute of a GGUF import's kept blocks

    def write(
        self,
        weights: DecoderWeights,
        role: str,
        model: str,
        quant: QuantConfig | None,
        qdq: QdqCalibration | None = None,
        tree: bool = False,
    ) -> GraphInfo:
        """Build `role`'s graph of `weights` (quantized as `quant` says), save it, describe it;
        `tree`: its tree-verification twin (`GraphBuilder.tree`), saved as `tree_<file>`."""
        weight_only = quant.method if quant is not None and qdq is None else None
        kw: dict[str, Any] = {"accuracy_level": self.accuracy_level}
        if quant is not None:
            kw = {"block_size": quant.block_size, "accuracy_level": quant.accuracy_level}
        if qdq is None:
            gb = GraphBuilder(
                store=self.store,
                dtype=np.dtype(DTYPES[self.dtype]),
                quantize=weight_only,
                query_seqlens=self.batched,
                tree=tree,
                **kw,
            )
            build_graph(weights, role, gb)
            proto = gb.model(f"edgespec_{role}")
        else:  # float graph in a scratch file, quantized, then its tensors into the bundle's file
            with tempfile.TemporaryDirectory() as tmp:
                scratch = WeightStore(Path(tmp) / "float.bin")
                gb = GraphBuilder(
                    store=scratch,
                    dtype=np.dtype(np.float32),
                    matmul_head=True,
                    query_seqlens=self.batched,
                    tree=tree,
                    # QDQ's activation scales are per tensor: its calls pad to even widths
                    # (step_width 2), and its shape inference cannot size a data-driven Pad
                    pad_lone_rows=False,
                )
                build_graph(weights, role, gb)
                scratch.close()
                proto = gb.model(f"edgespec_{role}")
                onnx.load_external_data_for_model(proto, tmp)
            proto = externalize(qdq.quantize(proto, role), self.store)
        file = ("tree_" if tree else "") + role.replace("@", "_at_") + ".onnx"
        onnx.save(proto, str(self.out / file))
        return graph_info(role, file, model, len(weights.layers), gb)
