"""Bundles for onnxruntime < 1.32 (onnxruntime-gpu's newest release is 1.31): their attention
has no query_seqlens input (which batched verify rounds need) and decodes the same tokens; a
bundle that needs it, on an onnxruntime without it, is refused with what to do."""

from __future__ import annotations

import pytest
from conftest import DRAFT_FOR, SPEC_EXITS
from split_server import TOKEN, start_server

import edgespec
from edgespec.bundle import BundleError, load_manifest
from edgespec.runtime import graph

ARCH = "llama-gqa-tied"
PROMPT = "def f(x):\n    return"
MODES = [
    ("ar", {}),
    ("spec", {"draft_policy": "fixed:3"}),
    ("self-spec", {"exit_layer": 2, "draft_policy": "fixed:3"}),
]


@pytest.fixture(scope="module")
def unbatched(checkpoints, tmp_path_factory):
    from edgespec.export import export_bundle

    out = tmp_path_factory.mktemp("older_ort") / ARCH
    draft = checkpoints[DRAFT_FOR[ARCH]]
    export_bundle(checkpoints[ARCH], out, draft=draft, exit_layers=SPEC_EXITS, batched_verify=False)
    return out


def generate(bundle, mode="ar", **options):
    model = edgespec.load(bundle, mode=mode, **options)
    return model.generate(PROMPT, max_new_tokens=24, ignore_eos=True).tokens


@pytest.mark.parametrize("mode,options", MODES, ids=[m for m, _ in MODES])
def test_a_bundle_for_older_onnxruntime_decodes_the_batched_bundles_tokens(
    spec_bundles, unbatched, mode, options
):
    assert not any(
        i.name == "query_seqlens" for g in load_manifest(unbatched).graphs for i in g.inputs
    )
    assert generate(unbatched, mode, **options) == generate(spec_bundles[ARCH], mode, **options)


def test_a_verifier_server_runs_a_bundle_for_older_onnxruntime_round_by_round(
    spec_bundles, unbatched, tmp_path
):
    server = start_server(unbatched, tmp_path, TOKEN)
    try:
        got = generate(unbatched, "split", server=server.url, token=TOKEN, draft_policy="fixed:3")
    finally:
        server.stop()
    assert got == generate(spec_bundles[ARCH])


def test_a_bundle_that_needs_a_newer_onnxruntime_is_refused_saying_what_to_do(
    checkpoints, spec_bundles, monkeypatch, tmp_path
):
    bundle = spec_bundles[ARCH]
    if graph.ort_takes_query_seqlens():  # pretend to be an older onnxruntime
        monkeypatch.setattr(graph, "ort_takes_query_seqlens", lambda: False)
    else:  # a real older onnxruntime: a bundle made for a newer one (not checked here)
        from edgespec.export import export_bundle

        bundle = tmp_path / "batched"
        export_bundle(checkpoints[ARCH], bundle, batched_verify=True, verify=False)
    with pytest.raises(BundleError, match=r"needs onnxruntime >= 1\.32.*--no-batched-verify"):
        edgespec.load(bundle)


@pytest.mark.parametrize(
    "version,takes",
    [("1.31.1", False), ("1.20.0", False), ("1.32.0", True), ("1.33.0+cu130", True)],
)
def test_query_seqlens_is_known_to_come_with_onnxruntime_1_32(version, takes):
    assert graph.ort_takes_query_seqlens(version) is takes
