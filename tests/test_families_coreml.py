"""Core ML export of every family: each role converts to an ML program, and the programs
(evaluated by the numpy MIL reference, as Core ML cannot predict off macOS) decode like
transformers over a prompt that crosses the families' sliding windows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from family_configs import FAMILIES
from test_coreml_export import greedy, reference_session

from edgespec.bundle import load_manifest
from edgespec.export import export_bundle
from edgespec.runtime.drafters.base import EarlyExitDrafter, NoDrafter
from edgespec.runtime.graphs.stack import Stack

pytest.importorskip("coremltools", reason="coremltools is not installed")

MAX_CONTEXT, WIDTH = 48, 4  # the same shape test_coreml_export's reference_session builds


@pytest.fixture(scope="session")
def family_coreml_bundles(family_checkpoints, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("family_coreml")
    out = {}
    for name, (target, _) in family_checkpoints.items():
        out[name] = root / name
        export_bundle(
            target,
            out[name],
            exit_layers=[2],
            coreml=True,
            max_context=MAX_CONTEXT,
            verify_width=WIDTH,
        )
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_ml_programs_decode_like_transformers_across_the_window(
    family, family_hf, family_coreml_bundles
):
    hf, folder = family_hf[family], family_coreml_bundles[family]
    m = load_manifest(folder)
    assert m.coreml is not None and sorted(p.role for p in m.coreml.packages) == sorted(m.roles)
    prompt = [int(i) for i in np.random.default_rng(5).integers(1, 2048, 20)]
    n = 12  # 32 positions: past the window of 16
    with torch.no_grad():
        ref_logits = hf(torch.tensor([prompt])).logits[0].numpy()
        ref = hf.generate(
            torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()  # fmt: skip
    full = Stack([reference_session(folder, hf, "full")])
    full.reset(len(prompt))
    got = full.forward(np.array(prompt, np.int64), keep=len(prompt))
    assert np.abs(got - ref_logits).max() < 2e-2 * max(1.0, np.abs(ref_logits).max())
    assert greedy(full, NoDrafter(), prompt, n) == ref
    head, tail = (reference_session(folder, hf, r) for r in ("head@2", "tail@2"))
    split = Stack([head, tail])
    assert greedy(split, EarlyExitDrafter(split, {2: head}, {2: tail}, 2), prompt, n) == ref
