"""Shared-backbone edge bundles (FlexSpec-style): one frozen edge draft, an evolving target.

A tiny target, an "evolved" copy whose upper layers (2, 3) and final norm were changed, a
copy with a changed lower layer and one with another tokenizer. The edge bundle cut from
the original at k = 2 must decode losslessly, over real servers, against the original and
the evolved target, and be refused with a reason against the other two.
"""

from __future__ import annotations

import shutil

import pytest
from click.testing import CliRunner
from split_server import TOKEN, free_port, start_server

import edgespec
from edgespec.backbone import depth_fingerprint
from edgespec.bundle import load_manifest
from edgespec.cli import main
from edgespec.runtime.errors import SplitError
from edgespec.runtime.model import InputError

K = 2
N = 32
PROMPTS = ("def fibonacci(n):\n    if n < 2:\n        return n\n", "import os\nx = ")
DIMS = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)


def _variant(src, dst, change) -> None:
    """A copy of checkpoint `src` with `change(model)` applied to its weights."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(src).eval()
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in change(model):
            p.add_(torch.randn(p.shape, generator=gen) * p.std() * 0.5)
    model.save_pretrained(dst)
    AutoTokenizer.from_pretrained(src).save_pretrained(dst)


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    """Checkpoints and bundles: edge (shared-backbone, k=2) and four cloud targets."""
    from edgespec.export import export_bundle
    from edgespec.export.builtin import train_tokenizer, write_checkpoint

    root = tmp_path_factory.mktemp("backbone")
    original = write_checkpoint(root / "original", "llama", seed=3, **DIMS)

    def upper(m):
        return [*m.model.layers[K:].parameters(), m.model.norm.weight]

    _variant(original, root / "evolved", upper)
    _variant(original, root / "lower", lambda m: [m.model.layers[0].mlp.down_proj.weight])
    shutil.copytree(original, root / "tokenizer")
    train_tokenizer(root / "tokenizer", vocab_size=1024)  # same weights, other vocabulary
    bundles = {"edge": root / "b-edge"}
    export_bundle(original, bundles["edge"], variant="shared-backbone", backbone_layers=K)
    for name in ("original", "evolved", "lower", "tokenizer"):
        bundles[name] = root / f"b-{name}"
        export_bundle(root / name, bundles[name])
    return bundles


@pytest.fixture(scope="module")
def servers(family, tmp_path_factory):
    started = {}
    try:
        for name in ("original", "evolved", "lower", "tokenizer"):
            started[name] = start_server(family[name], tmp_path_factory.mktemp(f"srv-{name}"))
        yield started
    finally:
        for s in started.values():
            s.stop()


def _split(edge, url, **options):
    return edgespec.load(edge, mode="split", server=url, token=TOKEN, threads=1, **options)


def test_edge_bundle_holds_only_the_frozen_draft(family):
    edge, cloud = load_manifest(family["edge"]), load_manifest(family["original"])
    assert edge.roles == [f"head@{K}"] and edge.variant == "shared-backbone"
    assert edge.backbone_layers == K and edge.graph(f"head@{K}").kv_layers == [0, 1]
    assert edge.backbone == cloud.backbone  # cut from this very target
    assert edge.extra["export_check"]["max_abs_hidden_diff"] < 1e-4
    edge_bytes = (family["edge"] / edge.weights_file).stat().st_size
    cloud_bytes = (family["original"] / cloud.weights_file).stat().st_size
    assert edge_bytes < 0.8 * cloud_bytes  # layers 2, 3 stay on the server


def test_evolved_target_shares_the_backbone_only_up_to_the_changed_layer(family):
    edge, evolved = load_manifest(family["edge"]), load_manifest(family["evolved"])
    assert depth_fingerprint(edge.backbone, K) == depth_fingerprint(evolved.backbone, K)
    assert depth_fingerprint(edge.backbone, K + 1) != depth_fingerprint(evolved.backbone, K + 1)
    lower = load_manifest(family["lower"])
    assert depth_fingerprint(edge.backbone, 1) != depth_fingerprint(lower.backbone, 1)
    assert edge.backbone["tokenizer"] != load_manifest(family["tokenizer"]).backbone["tokenizer"]


@pytest.mark.parametrize("target", ["original", "evolved"])
def test_old_edge_bundle_decodes_losslessly_against_both_targets(family, servers, target):
    ar = edgespec.load(family[target], threads=1)
    model = _split(family["edge"], servers[target].url, draft_policy="fixed:3")
    assert model.drafter is not None and model.target is None  # no local verifier
    for prompt in PROMPTS:
        want = ar.generate(prompt, max_new_tokens=N, ignore_eos=True).tokens
        out = model.generate(prompt, max_new_tokens=N, ignore_eos=True)
        assert out.tokens == want
        assert out.stats.remote_rounds > 1 and out.stats.drafted > 0


def test_the_evolved_target_really_decodes_differently(family):
    outs = {
        name: edgespec.load(family[name], threads=1)
        .generate(PROMPTS[0], max_new_tokens=N, ignore_eos=True)
        .tokens
        for name in ("original", "evolved")
    }
    assert outs["original"] != outs["evolved"]


@pytest.mark.parametrize(
    "target, reason",
    [("lower", "lower 2 layers or the embeddings"), ("tokenizer", "tokenizer differs")],
)
def test_server_refuses_an_incompatible_edge_bundle_with_the_reason(
    family, servers, target, reason
):
    model = _split(family["edge"], servers[target].url)
    with pytest.raises(SplitError, match=f"403.*{reason}"):
        model.generate(PROMPTS[0], max_new_tokens=4)
    assert servers[target].health()["status"] == "ok"  # and keeps serving others


def test_inspect_compat_reports_compatible_and_incompatible_targets(family):
    runner = CliRunner()
    edge = str(family["edge"])
    ok = runner.invoke(main, ["inspect", "--compat", edge, str(family["evolved"])])
    assert ok.exit_code == 0 and "compatible" in ok.output and "upper layers" in ok.output
    for name, reason in (("lower", "lower 2 layers"), ("tokenizer", "tokenizer differs")):
        bad = runner.invoke(main, ["inspect", "--compat", edge, str(family[name])])
        assert bad.exit_code == 1 and "INCOMPATIBLE" in bad.output and reason in bad.output
    swapped = runner.invoke(main, ["inspect", "--compat", edge, edge])
    assert swapped.exit_code == 1 and "itself an edge bundle" in swapped.output
    shown = runner.invoke(main, ["inspect", edge])
    assert shown.exit_code == 0 and "shared-backbone, backbone layers 2" in shown.output


def test_export_cloud_bundle_reports_compatibility_with_an_edge_bundle(family, tmp_path):
    src = load_manifest(family["evolved"]).source["model"]
    args = ["export", src, "--out", str(tmp_path / "cloud"), "--no-verify"]
    r = CliRunner().invoke(main, [*args, "--check-compat", str(family["edge"])])
    assert r.exit_code == 0, r.output
    assert "compatible:" in r.output and "2 of its upper layers retrained" in r.output


def test_edge_bundle_cannot_decode_without_a_server(family):
    with pytest.raises(InputError, match="shared-backbone edge bundle.*mode='split'"):
        edgespec.load(family["edge"], mode="ar")
    model = _split(family["edge"], f"ws://127.0.0.1:{free_port()}")
    model.remote.retries, model.remote.backoff = 1, 0.05
    with pytest.raises(SplitError, match="no local verifier"):
        model.generate(PROMPTS[0], max_new_tokens=4)


def test_shared_backbone_export_options_are_checked(family, tmp_path):
    from edgespec.export import ExportError, export_bundle

    src = load_manifest(family["original"]).source["model"]
    cases = [
        (dict(variant="shared-backbone"), "needs --backbone-layers"),
        (dict(variant="shared-backbone", backbone_layers=4), "out of range"),
        (dict(backbone_layers=2), "needs --variant shared-backbone"),
        (dict(variant="shared-backbone", backbone_layers=2, draft=src), "drop --draft"),
    ]
    for options, message in cases:
        with pytest.raises(ExportError, match=message):
            export_bundle(src, tmp_path / "x", overwrite=True, **options)
    assert not (tmp_path / "x" / "manifest.json").exists()
