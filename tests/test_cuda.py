"""Every decoding mode on onnxruntime's CUDA execution provider gives the CPU provider's greedy
tokens. Runs only where CUDA is available (onnxruntime-gpu and an NVIDIA GPU); skipped elsewhere."""

from __future__ import annotations

import pytest

import edgespec
from edgespec.devices import available

pytestmark = pytest.mark.skipif(
    "cuda" not in available(), reason="no CUDA execution provider here (onnxruntime-gpu + GPU)"
)

MODES = [
    ("ar", {}),
    ("spec", {"draft_policy": "fixed:3"}),
    ("self-spec", {"exit_layer": 2, "draft_policy": "fixed:3"}),
    ("lookup", {"draft_policy": "fixed:3"}),
]


@pytest.mark.parametrize("mode,options", MODES, ids=[m for m, _ in MODES])
def test_cuda_greedy_tokens_equal_the_cpu_providers(spec_bundles, mode, options):
    bundle = spec_bundles["llama-gqa-tied"]
    prompt = "def f(x):\n    return"
    cpu = edgespec.load(bundle, mode=mode, device="cpu", **options)
    gpu = edgespec.load(bundle, mode=mode, device="cuda", **options)
    want = cpu.generate(prompt, max_new_tokens=24, ignore_eos=True).tokens
    got = gpu.generate(prompt, max_new_tokens=24, ignore_eos=True).tokens
    assert got == want
