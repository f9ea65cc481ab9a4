"""Core ML export: every role converts to an ML program whose saved spec matches the
manifest, and the programs compute what transformers computes — checked by evaluating the
same MIL programs with a numpy reference interpreter driven by the runtime's Core ML
session, since Core ML itself cannot run predictions off macOS."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import DRAFT_FOR
from mil_reference import run_program

import edgespec
from edgespec.bundle import BundleError, load_manifest
from edgespec.export import export_bundle, extract
from edgespec.export.coreml import build_program, package_specs
from edgespec.export.static import StaticShape
from edgespec.runtime.decode import decode
from edgespec.runtime.drafters.base import EarlyExitDrafter, ModelDrafter, NoDrafter
from edgespec.runtime.graphs.coreml import CoreMLSession
from edgespec.runtime.graphs.stack import Stack
from edgespec.runtime.policies.draft_length import FixedLength
from edgespec.runtime.sampling import SamplingParams
from edgespec.runtime.verify.local import LocalVerifier

ct = pytest.importorskip(
    "coremltools", reason="coremltools is not installed (pip install 'edgespec[coreml]')"
)

MAX_CONTEXT, WIDTH = 48, 4
ARCHS = ["llama-gqa-tied", "gpt2"]


@pytest.fixture(scope="module")
def coreml_bundles(checkpoints, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("coreml_bundles")
    out = {}
    for name in ARCHS:
        out[name] = root / name
        export_bundle(
            checkpoints[name],
            out[name],
            draft=checkpoints[DRAFT_FOR[name]],
            exit_layers=[2],
            coreml=True,
            max_context=MAX_CONTEXT,
            verify_width=WIDTH,
        )
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_every_role_converts_to_an_ml_program_whose_spec_matches_the_manifest(arch, coreml_bundles):
    folder = coreml_bundles[arch]
    m = load_manifest(folder)
    assert m.coreml is not None and m.static is None
    assert sorted(p.role for p in m.coreml.packages) == sorted(m.roles)
    for p in m.coreml.packages:
        spec = ct.utils.load_spec(str(folder / p.path))
        assert spec.WhichOneof("Type") == "mlProgram"
        assert spec.specificationVersion >= 9  # iOS 18 / macOS 15: stateful models
        assert package_specs(folder / p.path) == (p.inputs, p.outputs, p.states)
        info = m.model_info(p)
        kv = [1, info.num_kv_heads, MAX_CONTEXT + WIDTH, info.head_dim]
        assert [s.name for s in p.states] == [
            f"{kind}_cache_{i}" for i in p.kv_layers for kind in ("key", "value")
        ]
        assert all(s.shape == kv and s.dtype == "float16" for s in p.states)
        first = "hidden" if p.role.startswith("tail@") else "input_ids"
        assert [t.name for t in p.inputs] == [
            first,
            "position_ids",
            "attention_mask",
            "write_offset",
        ]
        assert p.outputs[-1].shape == [1, WIDTH, info.vocab_size]


def reference_session(folder: Path, hf, role: str) -> CoreMLSession:
    """The runtime's Core ML session for the bundle's `role` package, predicting through a
    numpy evaluation of the same ML program (built from the same weights)."""
    m = load_manifest(folder)
    assert m.coreml is not None
    package = m.coreml.package(role)
    prog = build_program(extract(hf), role, StaticShape(MAX_CONTEXT, WIDTH))
    states = {s.name: np.zeros(s.shape, np.float16) for s in package.states}
    predict = lambda inputs: run_program(prog, inputs, states)  # noqa: E731
    return CoreMLSession(package, m.model_info(package), m.coreml, predict)


def greedy(target: Stack, drafter, prompt: list[int], n: int) -> list[int]:
    steps = decode(
        LocalVerifier(target), drafter, FixedLength(3), prompt, SamplingParams(), n, frozenset()
    )
    return [t for s in steps for t in s.tokens]


@pytest.mark.parametrize("arch", ARCHS)
def test_the_ml_programs_decode_like_transformers(arch, hf_models, coreml_bundles):
    hf, folder = hf_models[arch], coreml_bundles[arch]
    prompt = [int(i) for i in np.random.default_rng(5).integers(1, 2048, 10)]
    n = 12
    with torch.no_grad():
        ref_logits = hf(torch.tensor([prompt])).logits[0].numpy()
        ref = hf.generate(
            torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False
        )[0, len(prompt) :].tolist()
    # prefill in three chunks of W, state written at offsets 0, 4, 8: fp16 KV, close logits
    full = Stack([reference_session(folder, hf, "full")])
    full.reset(len(prompt))
    got = full.forward(np.array(prompt, np.int64), keep=len(prompt))
    assert np.abs(got - ref_logits).max() < 2e-2 * max(1.0, np.abs(ref_logits).max())
    assert (got.argmax(-1) == ref_logits.argmax(-1)).all()
    # greedy ar on full, and self-speculation on head@2 + tail@2 (KV in each one's state)
    assert greedy(full, NoDrafter(), prompt, n) == ref
    head, tail = (reference_session(folder, hf, r) for r in ("head@2", "tail@2"))
    split = Stack([head, tail])
    assert greedy(split, EarlyExitDrafter(split, {2: head}, {2: tail}, 2), prompt, n) == ref


def test_speculative_decoding_with_the_draft_ml_program(hf_models, coreml_bundles):
    folder = coreml_bundles["llama-gqa-tied"]
    target, draft = hf_models["llama-gqa-tied"], hf_models[DRAFT_FOR["llama-gqa-tied"]]
    prompt = [int(i) for i in np.random.default_rng(6).integers(1, 2048, 9)]
    with torch.no_grad():
        ref = target.generate(
            torch.tensor([prompt]), max_new_tokens=10, min_new_tokens=10, do_sample=False
        )[0, len(prompt) :].tolist()
    drafter = ModelDrafter(Stack([reference_session(folder, draft, "draft")]))
    verifier = Stack([reference_session(folder, target, "full")])
    assert greedy(verifier, drafter, prompt, 10) == ref


def test_loading_core_ml_packages_off_macos_or_from_a_bundle_without_them(coreml_bundles, bundles):
    if sys.platform != "darwin":
        with pytest.raises(BundleError, match="macOS 15"):
            edgespec.load(coreml_bundles["gpt2"], coreml=True)
    with pytest.raises(BundleError, match="no Core ML packages.*--coreml"):
        edgespec.load(bundles["gpt2"], coreml=True)
