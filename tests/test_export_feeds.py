"""The export's prefill feed (export/feeds.py) fits every graph role of a bundle."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edgespec.export.feeds import prefill_feed, session_inputs
from edgespec.runtime.graphs.session import session_options


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), session_options(None), ["CPUExecutionProvider"])


def test_prefill_feed_runs_head_and_tail_to_the_full_graphs_logits(spec_bundles) -> None:
    folder = spec_bundles["qwen2"]
    ids = np.random.default_rng(3).integers(0, 100, 9)
    full = _session(folder / "full.onnx")
    logits = full.run(["logits"], prefill_feed(session_inputs(full), ids))[0]
    assert logits.shape[1] == len(ids)  # every position kept
    for head_file in sorted(folder.glob("head_at_*.onnx")):
        head = _session(head_file)
        tail = _session(folder / head_file.name.replace("head", "tail"))
        hidden = head.run(["hidden"], prefill_feed(session_inputs(head), ids))[0]
        got = tail.run(["logits"], prefill_feed(session_inputs(tail), ids, hidden))[0]
        np.testing.assert_allclose(got, logits, atol=1e-4)


def test_prefill_feed_says_what_a_tail_graph_or_unknown_input_lacks(spec_bundles) -> None:
    folder = spec_bundles["qwen2"]
    tail = _session(next(folder.glob("tail_at_*.onnx")))
    with pytest.raises(ValueError, match="hidden states"):
        prefill_feed(session_inputs(tail), [1, 2, 3])
    with pytest.raises(ValueError, match="'attention_mask'"):
        prefill_feed({"attention_mask": ([1, 3], np.float32)}, [1, 2, 3])
