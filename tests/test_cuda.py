"""Every decoding mode on onnxruntime's CUDA execution provider: lossless there, and the CPU
provider's greedy tokens. Runs only where CUDA is available (onnxruntime-gpu and an NVIDIA
GPU); skipped elsewhere. `benchmarks/cuda_check.sh` runs this on a GPU machine."""

from __future__ import annotations

import pytest
from split_server import TOKEN, start_server

import edgespec
from edgespec.devices import available

pytestmark = pytest.mark.skipif(
    "cuda" not in available(), reason="no CUDA execution provider here (onnxruntime-gpu + GPU)"
)

PROMPT = "def f(x):\n    return"
N_NEW = 24
MODES = [
    ("ar", {}),
    ("spec", {"draft_policy": "fixed:3"}),
    ("spec", {"draft_policy": "auto"}),
    ("spec", {"drafter": "lookup+draft", "draft_policy": "auto"}),
    ("self-spec", {"exit_layer": 2, "draft_policy": "fixed:3"}),
    ("self-spec", {"draft_policy": "dynamic-exit"}),
    ("self-spec", {"drafter": "lookup+exit", "draft_policy": "fixed:2"}),
    ("lookup", {"draft_policy": "fixed:3"}),
    ("lookup", {"verifier": "exit:2", "draft_policy": "acceptance"}),
]
IDS = [f"{m}-{o.get('drafter', '')}-{o.get('draft_policy', '')}" for m, o in MODES]


@pytest.fixture(scope="module")
def fp16_bundle(checkpoints, tmp_path_factory):
    """llama-gqa-tied in fp16 with its draft and exits: the graphs whose attention runs on
    the GPU (onnxruntime's CUDA GroupQueryAttention takes fp16, not fp32)."""
    from conftest import DRAFT_FOR, SPEC_EXITS

    from edgespec.export import export_bundle

    out = tmp_path_factory.mktemp("cuda") / "fp16"
    draft = checkpoints[DRAFT_FOR["llama-gqa-tied"]]
    export_bundle(
        checkpoints["llama-gqa-tied"], out, draft=draft, exit_layers=SPEC_EXITS, dtype="fp16"
    )
    return out


def tokens(bundle, mode, options, device):
    model = edgespec.load(bundle, mode=mode, device=device, **options)
    return model, model.generate(PROMPT, max_new_tokens=N_NEW, ignore_eos=True).tokens


@pytest.mark.parametrize("mode,options", MODES, ids=IDS)
def test_cuda_greedy_tokens_equal_the_cpu_providers(spec_bundles, mode, options):
    bundle = spec_bundles["llama-gqa-tied"]
    assert tokens(bundle, mode, options, "cuda")[1] == tokens(bundle, mode, options, "cpu")[1]


@pytest.mark.parametrize("mode,options", MODES, ids=IDS)
def test_every_mode_on_cuda_in_fp16_gives_the_targets_greedy_tokens_with_its_cache_on_the_gpu(
    fp16_bundle, mode, options
):
    model, got = tokens(fp16_bundle, mode, options, "cuda")
    assert got == tokens(fp16_bundle, "ar", {}, "cuda")[1]
    used = [s._bound_cache for s in model.graphs.opened.values() if s._bound_cache]
    assert used and all(c.device == ("cuda", 0) for c in used)


def test_fp16_greedy_tokens_on_cuda_equal_the_cpu_providers(fp16_bundle):
    assert tokens(fp16_bundle, "ar", {}, "cuda")[1] == tokens(fp16_bundle, "ar", {}, "cpu")[1]


def test_split_decoding_against_a_verifier_on_cuda_gives_its_greedy_tokens(fp16_bundle, tmp_path):
    server = start_server(fp16_bundle, tmp_path, TOKEN, "--device", "cuda")
    try:
        client = edgespec.load(
            fp16_bundle, mode="split", server=server.url, token=TOKEN, draft_policy="fixed:3"
        )
        got = client.generate(PROMPT, max_new_tokens=N_NEW, ignore_eos=True).tokens
    finally:
        server.stop()
    assert got == tokens(fp16_bundle, "ar", {}, "cuda")[1]
