"""What export needs for shared-backbone (FlexSpec-style) bundles: hashes and a check.

`backbone_record(tokenizer, weights)` hashes the tokenizer vocabulary, the layer-independent
inputs of the stack (embeddings, learned positions, rotary tables, attention shape,
activation) and each layer's weights, in the layout `edgespec.backbone` reads. Every bundle
records it, so any cloud bundle can be checked against any edge bundle later.
`verify_head(hf_model, path, k)` checks an exported head@k's hidden state against
transformers' (a shared-backbone bundle has no `full` graph to check).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import astuple, fields
from pathlib import Path
from typing import Any

import numpy as np

from edgespec.export.decoder import DecoderWeights, LayerWeights, Norm
from edgespec.export.errors import ExportError
from edgespec.export.feeds import prefill_feed, session_inputs


def _update(h: Any, value: Any) -> None:
    if value is None:
        h.update(b"none")
    elif isinstance(value, Norm):
        for part in astuple(value):
            _update(h, part)
    elif isinstance(value, np.ndarray):
        a = np.ascontiguousarray(value, dtype=np.float32)
        h.update(str(a.shape).encode())
        h.update(a.tobytes())
    else:
        h.update(repr(value).encode())


def layer_hash(layer: LayerWeights) -> str:
    h = hashlib.sha256()
    for f in fields(layer):
        h.update(f.name.encode())
        _update(h, getattr(layer, f.name))
    return h.hexdigest()


def backbone_record(tokenizer: Any, weights: DecoderWeights) -> dict[str, Any]:
    vocab = json.dumps(sorted(tokenizer.get_vocab().items())).encode()
    base = hashlib.sha256()
    for value in (weights.embed, weights.pos_embed, *(weights.rotary or (None, None))):
        _update(base, value)
    _update(base, astuple(weights.attn))
    _update(base, weights.activation)
    return {
        "tokenizer": hashlib.sha256(vocab).hexdigest(),
        "base": base.hexdigest(),
        "layers": [layer_hash(layer) for layer in weights.layers],
    }


def verify_head(hf_model: Any, path: Path, k: int) -> float:
    """Max |difference| between head@k's `hidden` and transformers' hidden_states[k]."""
    import onnxruntime as ort
    import torch

    from edgespec.runtime.graphs.session import session_options

    rng = np.random.default_rng(0)
    ids = rng.integers(0, hf_model.config.vocab_size, size=(1, 8), dtype=np.int64)
    with torch.no_grad():
        ref = hf_model(torch.from_numpy(ids), output_hidden_states=True).hidden_states[k]
    ref = ref.float().numpy()
    sess = ort.InferenceSession(str(path), session_options(None), ["CPUExecutionProvider"])
    takes = session_inputs(sess)
    feeds = prefill_feed(takes, ids)
    got = sess.run(["hidden"], feeds)[0].astype(np.float32)
    diff = float(np.abs(got - ref).max())
    if takes["past_key.0"][1] == np.float32 and diff > 1e-3 * max(float(np.abs(ref).max()), 1.0):
        raise ExportError(
            f"the exported head@{k} disagrees with transformers (max hidden difference "
            f"{diff:.3g}); this is a bug in edgespec's export, please report it"
        )
    return diff
