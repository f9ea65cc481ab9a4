"""Phi-3 / Phi-3.5 / Phi-4-mini checkpoints -> DecoderWeights.

Llama-shaped, with fused `qkv_proj` and `gate_up_proj` (already the packed layout the
graphs use), partial rotary (`partial_rotary_factor`, Phi-4-mini: only the first part of
each head rotates), an optional sliding window on every layer, and LongRoPE, whose table is
exact up to `original_max_position_embeddings` (the bundle's context stops there, see
`family.max_positions`).
"""

from __future__ import annotations

from typing import Any

from edgespec.export.decoder import DecoderWeights
from edgespec.export.family import Layout, check_common, extract_decoder, max_positions

__all__ = ["check", "extract", "max_positions"]

LAYOUT = Layout()


def check(config: Any) -> None:
    check_common(config)


def extract(model: Any, prefix: str = "") -> DecoderWeights:
    check(model.config)
    return extract_decoder(model, prefix, LAYOUT)
