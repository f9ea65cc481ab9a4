"""Bundles for onnxruntime < 1.32 (onnxruntime-gpu's newest release is 1.31): their attention
has no query_seqlens input (which batched verify rounds need) and decodes the same tokens; a
bundle that needs it, on an onnxruntime without it, is refused with what to do."""

from __future__ import annotations

import pytest
from conftest import DRAFT_FOR, SPEC_EXITS
from split_server import TOKEN, start_server

import edgespec
from edgespec.bundle import BundleError, load_manifest
from edgespec.runtime.graphs import session as graph

ARCH = "llama-gqa-tied"
PROMPT = "def f(x):\n    return"
MODES = [
    ("ar", {}),
    ("spec", {"draft_policy": "fixed:3"}),
    ("self-spec", {"exit_layer": 2, "draft_policy": "fixed:3"}),
]


def export_unbatched(checkpoints, arch, out):
    from edgespec.export import export_bundle

    draft = checkpoints[DRAFT_FOR[arch]]
    export_bundle(checkpoints[arch], out, draft=draft, exit_layers=SPEC_EXITS, batched_verify=False)
    return out


@pytest.fixture(scope="module")
def unbatched(checkpoints, tmp_path_factory):
    return export_unbatched(checkpoints, ARCH, tmp_path_factory.mktemp("older_ort") / ARCH)


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


def test_learned_positions_without_query_seqlens_decode_the_batched_bundles_tokens(
    checkpoints, spec_bundles, tmp_path
):
    """gpt2's position embeddings are gathered at positions computed in the graph, from
    query_seqlens where there is one and from the call's width where there is not."""
    bundle = export_unbatched(checkpoints, "gpt2", tmp_path / "gpt2")
    for mode, options in MODES:
        assert generate(bundle, mode, **options) == generate(spec_bundles["gpt2"], mode, **options)


def test_export_cli_writes_graphs_for_older_onnxruntime_on_request(checkpoints, tmp_path):
    from click.testing import CliRunner

    from edgespec.cli import main

    out = tmp_path / "b"
    r = CliRunner().invoke(
        main, ["export", str(checkpoints[ARCH]), "--out", str(out), "--no-batched-verify"]
    )
    assert r.exit_code == 0, r.output
    assert not any(i.name == "query_seqlens" for g in load_manifest(out).graphs for i in g.inputs)
    assert len(generate(out)) == 24


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
