"""Granite (3.x dense) checkpoints -> DecoderWeights.

Llama-shaped with four multipliers, folded as data: `embedding_multiplier` scales the
embeddings, `residual_multiplier` the attention and MLP outputs (folded into the o and down
projections), `attention_multiplier` is the attention scale (read from the modules), and
the logits are divided by `logits_scaling` (folded into the final norm's gain, so head@k's
exit logits are scaled the same way).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgespec.export.decoder import DecoderWeights
from edgespec.export.family import Layout, check_common, extract_decoder, max_positions

__all__ = ["check", "extract", "max_positions"]

LAYOUT = Layout()


def check(config: Any) -> None:
    check_common(config)


def extract(model: Any, prefix: str = "") -> DecoderWeights:
    cfg = model.config
    check(cfg)
    w = extract_decoder(model, prefix, LAYOUT)
    w.embed_scale = float(cfg.embedding_multiplier)
    r = np.float32(cfg.residual_multiplier)
    for lw in w.layers:
        lw.o_w, lw.down_w = lw.o_w * r, lw.down_w * r
        lw.o_b = None if lw.o_b is None else lw.o_b * r
        lw.down_b = None if lw.down_b is None else lw.down_b * r
    w.final_norm.gamma = w.final_norm.gamma / np.float32(cfg.logits_scaling)
    if w.lm_head_b is not None:
        w.lm_head_b = w.lm_head_b / np.float32(cfg.logits_scaling)
    return w
