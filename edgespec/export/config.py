"""What an export is asked to do: `ExportConfig`, every option with its one default, checked.

Building an `ExportConfig` refuses contradictory or unsupported options (an `ExportError`
saying which option and what to do) before anything is loaded or written; what can only be
checked against the model (exit layers in range, static shapes) is checked by the pipeline.
`on_progress` receives one short line per export step ("loading ...", "building full graph",
..., "done"); the library itself never prints, the CLI renders these lines.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgespec.export.errors import ExportError
from edgespec.export.quantize import QuantConfig

DTYPES = {"fp32": np.float32, "fp16": np.float16}
VARIANTS = ("standard", "shared-backbone")
# a draft quantized apart from its target: block-wise weights or float ("none")
DRAFT_QUANTIZATIONS = ("int8", "int4", "none")
GGUF_WEIGHTS = ("blocks", "float")


@dataclass
class ExportConfig:
    """Options of `export_bundle` (see its docstring for what each one builds).

    static: also write fixed-shape copies of every graph (`max_context` cache positions,
    `verify_width` positions per call — one set per width when several are given, e.g.
    (1, 8) — standard ONNX ops only) for NPUs; the dynamic graphs stay, so the bundle still
    runs anywhere (`edgespec.load(..., static=True)` picks these).
    coreml: also convert every role to a Core ML ML program (.mlpackage: iOS 18 / macOS 15,
    fp16, KV cache in Core ML states) with the same max context and the largest verify
    width; needs the [coreml] extra (coremltools).
    quantize: None | "int8" | "int4" (`block_size`, `accuracy_level`) | "qdq-int8"
    (calibrated on `calibration_prompts`, default a few built-in ones); see export/quantize.py.
    draft_quantize: the draft model's weights when they should differ from the target's:
    "int8" | "int4" | "none" (float); None: as `quantize`. The draft's precision changes only
    how fast it drafts and how often its drafts are accepted, never the output (the target
    verifies every token), so a float target with an int8 draft is a sound pairing: the draft
    step is a quarter of the bytes.
    variant: "shared-backbone" writes an edge bundle holding only head@`backbone_layers` (a
    frozen draft for split decoding, see edgespec.backbone); `fit_exit_adapter`: a calibration
    text file on which an adapter is fitted into every head@k (export/exit_adapter.py).
    batched_verify: graphs whose attention takes `query_seqlens`, so that a verifier server
    runs the verify rounds of several devices, of different widths, in one call; such graphs
    need onnxruntime >= 1.32 to load. False: graphs for older onnxruntime (onnxruntime-gpu's
    newest release is 1.31); a server then verifies rounds one by one. None: whichever the
    onnxruntime installed here loads.
    tree_verify: also write each dynamic role's tree-verification graph (`Manifest.tree_graphs`:
    the same graph taking `position_ids` and a `tree_mask`, so a token tree is verified in one
    forward; the chain graphs stay as they are).
    gguf_weights: a GGUF file's quantized tensors as "blocks" (kept as MatMulNBits blocks, the
    file's own integers and scales; `accuracy_level` sets their compute) or "float" (their
    exact dequantized values as float weights: float compute, larger and slower than blocks).
    feature_layers: the `full` graph also outputs `features`, the residual stream after each
    of these layers (0..num_layers; 0: the embeddings) at every new position, concatenated:
    what a feature head (`edgespec distill`, export/eagle.py) drafts from. Empty: no such output.
    eagle_gguf: an EAGLE-3 head in llama.cpp's GGUF (export/eagle_gguf.py) for this target,
    written as the bundle's eagle graph; the features it reads join `feature_layers`. Its
    float matrices as `draft_quantize` says (None: int8 blocks, as a distilled head's; "none":
    float), its block-quantized ones as the file's blocks.
    on_progress: called with a short description of each step as it starts.
    """

    draft: str | Path | None = None
    exit_layers: Sequence[int] = ()
    dtype: str = "fp32"
    quantize: str | None = None
    draft_quantize: str | None = None
    block_size: int | None = None  # None: the method's default (export/nbits.py)
    accuracy_level: int = 4
    calibration_prompts: Sequence[str] | None = None
    revision: str | None = None
    verify: bool = True
    overwrite: bool = False
    static: bool = False
    max_context: int = 512
    verify_width: int | Sequence[int] = 8
    coreml: bool = False
    variant: str = "standard"
    backbone_layers: int | None = None
    fit_exit_adapter: str | Path | None = None
    adapter_steps: int = 300
    batched_verify: bool | None = None
    tree_verify: bool = False
    gguf_weights: str = "blocks"
    feature_layers: Sequence[int] = ()
    eagle_gguf: str | Path | None = None
    on_progress: Callable[[str], None] | None = None
    # derived in __post_init__: the weight quantization of the target and of the draft, checked
    quant: QuantConfig | None = field(init=False, default=None, repr=False)
    draft_quant: QuantConfig | None = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        if self.batched_verify is None:
            from edgespec.runtime.graphs.session import ort_takes_query_seqlens

            self.batched_verify = ort_takes_query_seqlens()
        self.exit_layers = tuple(
            _check_variant(
                self.variant,
                self.backbone_layers,
                self.exit_layers,
                self.draft,
                self.fit_exit_adapter,
            )
        )
        self.feature_layers = tuple(sorted({int(k) for k in self.feature_layers}))
        if self.eagle_gguf is not None and self.variant != "standard":
            raise ExportError(
                "--eagle-gguf drafts from the full graph's features, which a shared-backbone "
                "edge bundle does not have: drop one of them"
            )
        if self.gguf_weights not in GGUF_WEIGHTS:
            raise ExportError(
                f"--gguf-weights {self.gguf_weights!r} is not one of: {', '.join(GGUF_WEIGHTS)}"
            )
        dtype, quantize = self.dtype, self.quantize
        if dtype not in DTYPES:
            raise ExportError(
                f"--dtype {dtype!r} is not supported; choose one of {', '.join(DTYPES)}"
            )
        self.quant = self._quant(quantize)
        if quantize == "qdq-int8" and dtype != "fp32":
            raise ExportError("--quantize qdq-int8 starts from fp32 graphs: use --dtype fp32")
        self.draft_quant = self.quant if self.draft_quantize is None else self._draft_quant()

    def check_feature_layers(self, num_layers: int) -> None:
        """Refuse feature layers outside 0..num_layers (an ExportError naming the range)."""
        bad = [k for k in self.feature_layers if not 0 <= k <= num_layers]
        if bad:
            raise ExportError(
                f"feature layer {bad[0]} is out of range: the model has {num_layers} layers, "
                f"so a feature layer must be between 0 and {num_layers}"
            )

    def step_width(self) -> int:
        """The bundle's `step_width` (runtime/graphs/stack.py): 1 where a row's logits do not depend
        on its call's width (tests/test_batch_invariance.py), else 2 (even-width calls, whose
        rows agree whatever the width). MatMulNBits with int8 activations (accuracy level >= 2)
        quantizes them per row and block, and with blocks of 32 or 16 (every GGUF block
        format held, `--block-size 32`) a lone row takes the same path as a wide call's rows;
        with larger blocks (the int8 / int4 default of 128) onnxruntime's one-row kernel
        rounds differently. Attention pads a one-position call (export/positions.py `lone_row_pad`).
        QDQ graphs quantize activations per tensor: 2."""
        q = self.quant
        if q is not None and q.method == "qdq-int8":
            return 2
        wide_blocks = q is not None and q.block_size is not None and q.block_size > 32
        return 2 if wide_blocks and self.accuracy_level >= 2 else 1

    def _quant(self, method: str | None) -> QuantConfig | None:
        if method is None:
            return None
        prompts = self.calibration_prompts
        try:
            return QuantConfig(
                method,
                self.block_size,
                self.accuracy_level,
                *([tuple(prompts)] if prompts is not None else []),
            )
        except ValueError as e:
            raise ExportError(str(e)) from None

    def _draft_quant(self) -> QuantConfig | None:
        """The draft's own weight quantization (`--draft-quantize`), checked."""
        if self.draft is None and self.eagle_gguf is None:
            raise ExportError(
                "--draft-quantize sets a draft's weights: also pass --draft or --eagle-gguf"
            )
        if self.draft_quantize not in DRAFT_QUANTIZATIONS:
            raise ExportError(
                f"--draft-quantize {self.draft_quantize!r} is not supported; choose one of "
                f"{', '.join(DRAFT_QUANTIZATIONS)}"
            )
        if self.quantize == "qdq-int8":
            raise ExportError(
                "--quantize qdq-int8 calibrates the draft with the target for static NPU graphs: "
                "drop --draft-quantize"
            )
        return self._quant(None if self.draft_quantize == "none" else self.draft_quantize)


def _check_variant(
    variant: str,
    backbone_layers: int | None,
    exit_layers: Sequence[int],
    draft: object,
    fit_exit_adapter: object,
) -> Sequence[int]:
    """The exit layers to build (a shared-backbone bundle: exactly its backbone depth)."""
    if variant not in VARIANTS:
        raise ExportError(f"--variant {variant!r} is not one of: {', '.join(VARIANTS)}")
    if variant == "standard":
        if backbone_layers is not None:
            raise ExportError("--backbone-layers needs --variant shared-backbone")
        if fit_exit_adapter is not None and not exit_layers:
            raise ExportError("--fit-exit-adapter fits head@k adapters: also pass --exit-layers K")
        return exit_layers
    if backbone_layers is None:
        raise ExportError(
            "--variant shared-backbone needs --backbone-layers K: how many lower layers the "
            "edge draft shares with the target"
        )
    if draft is not None:
        raise ExportError(
            "--variant shared-backbone drafts with the target's own lower layers: drop --draft"
        )
    if any(k != backbone_layers for k in exit_layers):
        raise ExportError(
            f"a shared-backbone bundle holds only head@{backbone_layers}: drop --exit-layers"
        )
    return [backbone_layers]
