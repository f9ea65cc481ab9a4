"""Hugging Face checkpoint -> edgespec bundle (build time: needs torch and transformers).

`export_bundle(model, out, config)` (pipeline.py) writes a bundle as `ExportConfig`
(config.py) asks; loading checkpoints and reading what a bundle records about them is hf.py,
the check against transformers verify.py; every user mistake is an `ExportError`
(errors.py). Graph building: decoder.py (one decoder graph per role) on builder.py, the
family modules (llama.py, gemma.py, granite.py, olmo2.py, gpt2.py on family.py)
extract weights; static.py, coreml.py, quantize.py (nbits.py: int8/int4 blocks),
exit_adapter.py and shared_backbone.py add the variants.
"""

from __future__ import annotations

from edgespec.export.config import DTYPES, VARIANTS, ExportConfig
from edgespec.export.errors import ExportError
from edgespec.export.hf import (
    FAMILIES,
    backbone_fingerprint,
    calibration_ids,
    check_same_tokenizer,
    extract,
    family_of,
    load_checkpoint,
    model_info,
    save_tokenizer,
    special_ids,
)
from edgespec.export.pipeline import WEIGHTS_FILE, export_bundle
from edgespec.export.verify import verify_export

__all__ = [
    "DTYPES",
    "FAMILIES",
    "VARIANTS",
    "WEIGHTS_FILE",
    "ExportConfig",
    "ExportError",
    "backbone_fingerprint",
    "calibration_ids",
    "check_same_tokenizer",
    "export_bundle",
    "extract",
    "family_of",
    "load_checkpoint",
    "model_info",
    "save_tokenizer",
    "special_ids",
    "verify_export",
]
