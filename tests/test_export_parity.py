"""Export parity: the exported graphs compute what the transformers model computes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import ARCHS, EXIT_LAYER

import edgespec
from edgespec.bundle import load_manifest
from edgespec.runtime.graphs.protocol import Feed


def hf_logits(hf, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.from_numpy(ids)[None]).logits[0].numpy()


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("verifier", ["full", f"exit:{EXIT_LAYER}"])
def test_logits_match_transformers_through_prefill_and_decode(arch, verifier, bundles, hf_models):
    """Prefill of 9 tokens then 6 single-token steps (through the KV cache) and a 3-token
    chunk: every position's logits equal transformers' uncached forward on the same ids."""
    model = edgespec.load(bundles[arch], verifier=verifier)
    target = model.target
    ids = np.random.default_rng(3).integers(0, 2048, 18)
    target.reset(32)
    got = [target.forward(ids[:9], keep=9)]
    for t in ids[9:15]:
        got.append(target.forward(np.array([t]), keep=1))
    got.append(target.forward(ids[15:18], keep=3))
    ref = hf_logits(hf_models[arch], ids)
    np.testing.assert_allclose(np.concatenate(got), ref, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_head_exit_logits_equal_norm_and_lm_head_of_layer_k(arch, bundles, hf_models):
    """head@k's exit logits are the final norm + LM head applied to layer k's hidden state."""
    model = edgespec.load(bundles[arch], verifier=f"exit:{EXIT_LAYER}")
    head = model.target.stages[0]
    ids = np.random.default_rng(4).integers(0, 2048, 7)
    model.target.reset(16)
    out = head.run(model.target.cache, 0, Feed(input_ids=ids[None], keep=7))
    hf = hf_models[arch]
    with torch.no_grad():
        states = hf(torch.from_numpy(ids)[None], output_hidden_states=True).hidden_states
        base = hf.model if hasattr(hf, "model") else hf.transformer
        norm = base.norm if hasattr(base, "norm") else base.ln_f
        ref_exit = hf.lm_head(norm(states[EXIT_LAYER]))[0].numpy()
    np.testing.assert_allclose(out["hidden"][0], states[EXIT_LAYER][0].numpy(), atol=1e-4)
    np.testing.assert_allclose(out["exit_logits"][0], ref_exit, atol=2e-4, rtol=1e-4)


def test_manifest_records_the_model_and_graph_contracts(bundles, checkpoints):
    m = load_manifest(bundles["llama-gqa-tied"])
    assert m.target.num_layers == 4 and m.target.num_kv_heads == 2 and m.target.head_dim == 16
    assert m.roles == ["full", f"head@{EXIT_LAYER}", f"tail@{EXIT_LAYER}"]
    assert m.graph(f"tail@{EXIT_LAYER}").kv_layers == [2, 3]
    assert {i.name for i in m.graph("full").inputs} >= {"input_ids", "seqlens_k", "past_key.0"}
    assert m.extra["export_check"]["argmax_agreement"] == 1.0
    assert m.backbone_fingerprint.startswith("sha256:")


def test_roles_share_one_weights_file(bundles, checkpoints):
    """head@k + tail@k reuse full's tensors: the bundle stores each weight once."""
    folder = bundles["llama-untied"]
    params = sum(
        p.numel()
        for p in __import__("safetensors.torch")
        .torch.load_file(str(checkpoints["llama-untied"] / "model.safetensors"))
        .values()
    )
    size = (folder / "weights.bin").stat().st_size
    assert size < params * 4 * 1.1 + 2 * 256 * 8 * 4 + 4096 * 40  # + rotary tables + alignment
    assert all((folder / f).stat().st_size < 200_000 for f in ("full.onnx", "head_at_2.onnx"))


def test_fp16_bundle_runs_and_agrees(checkpoints, tmp_path, hf_models):
    from edgespec.export import export_bundle

    export_bundle(checkpoints["qwen2"], tmp_path / "b", dtype="fp16")
    model = edgespec.load(tmp_path / "b")
    ids = np.random.default_rng(5).integers(0, 2048, 10)
    model.target.reset(16)
    got = model.target.forward(ids, keep=10)
    ref = hf_logits(hf_models["qwen2"], ids)
    np.testing.assert_allclose(got, ref, atol=0.05 * np.abs(ref).max())


def test_export_prints_nothing_and_reports_each_step_to_on_progress(checkpoints, tmp_path, capfd):
    from edgespec.export import ExportConfig, export_bundle

    steps: list[str] = []
    config = ExportConfig(exit_layers=[EXIT_LAYER], on_progress=steps.append)
    export_bundle(checkpoints["gpt2"], tmp_path / "b", config)
    out, err = capfd.readouterr()
    assert "export:" not in out + err and "exit adapter" not in out + err
    assert steps[0].startswith("loading ") and steps[-1] == "done"
    assert f"building head@{EXIT_LAYER} graph" in steps
    assert "checking the exported graph against transformers" in steps


def test_draft_model_is_exported_into_the_bundle(checkpoints, tmp_path):
    from edgespec.export import export_bundle

    m = export_bundle(checkpoints["llama-gqa-tied"], tmp_path / "d", draft=checkpoints["qwen2"])
    assert "draft" in m.roles and m.draft is not None and m.draft.model_type == "qwen2"
    assert load_manifest(tmp_path / "d").graph("draft").model == "draft"
