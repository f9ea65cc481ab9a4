"""Every supported model family exports and decodes as transformers computes it.

Per family (tiny random configs that switch on the family's features: sliding windows of 16
crossed by ~60-position generations, soft-caps, q/k norms, post norms, partial rotary, NoPE
layers, multipliers, biases, head_dim != hidden / heads): the exported graphs give
transformers' logits through prefill, cached steps and chunks; head@k's exit logits are the
family's own final norm, LM head and soft-cap of layer k; greedy output in every local mode,
on the dynamic and on the static graphs, is transformers' greedy output token for token;
seeded sampling is the same on both; int8 bundles compute the fake-quantized model and decode
losslessly; the shared-backbone edge bundle's head matches transformers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from family_configs import FAMILIES, SMALL, family_prompt
from test_quantize import fake_quantized

import edgespec
from edgespec.export import ExportError, export_bundle
from edgespec.runtime.graphs.protocol import Feed

N_NEW = 40
MODES = [
    ("ar", {}),
    ("ar", {"verifier": "exit:2"}),
    ("spec", {"draft_policy": "fixed:3"}),
    ("self-spec", {"draft_policy": "fixed:3", "exit_layer": 1}),
    ("self-spec", {"draft_policy": "dynamic-exit"}),
    ("lookup", {"draft_policy": "fixed:5"}),
    ("suffix", {"draft_policy": "fixed:4"}),
    ("recycle", {"draft_policy": "fixed:3"}),
]


def hf_logits(hf, ids) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.as_tensor(np.asarray(ids))[None]).logits[0].float().numpy()


@pytest.fixture(scope="session")
def family_references(family_hf) -> dict[str, list[int]]:
    """transformers' greedy continuation of the prompt, checked free of near-ties (a top-2
    logit gap below float noise would make token-for-token equality a coin toss)."""
    out = {}
    for name, hf in family_hf.items():
        prompt = family_prompt()
        with torch.no_grad():
            ids = hf.generate(
                torch.tensor([prompt]),
                max_new_tokens=N_NEW,
                min_new_tokens=N_NEW,
                do_sample=False,
                pad_token_id=0,
            )[0].tolist()
        top2 = np.sort(hf_logits(hf, ids[:-1])[len(prompt) - 1 :], axis=-1)[:, -2:]
        gap = float((top2[:, 1] - top2[:, 0]).min())
        assert gap > 1e-4, f"{name}: near-tie in the reference (top-2 gap {gap:.2g}); reseed"
        assert len(set(ids[len(prompt) :])) >= 4, f"{name}: degenerate reference"
        out[name] = ids[len(prompt) :]
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("verifier", ["full", "exit:2"])
def test_logits_match_transformers_across_the_sliding_window(
    family, verifier, family_bundles, family_hf
):
    """Prefill 20, then 20 cached one-token steps, then a chunk of 8: every position's
    logits equal transformers' uncached forward (positions 16+ see a clipped window)."""
    target = edgespec.load(family_bundles[family], verifier=verifier).target
    ids = np.random.default_rng(3).integers(0, 2048, 48)
    target.reset(64)
    got = [target.forward(ids[:20], keep=20)]
    got += [target.forward(ids[i : i + 1], keep=1) for i in range(20, 40)]
    got.append(target.forward(ids[40:], keep=8))
    np.testing.assert_allclose(
        np.concatenate(got), hf_logits(family_hf[family], ids), atol=2e-4, rtol=1e-4
    )


def family_exit_logits(hf, hidden: torch.Tensor) -> np.ndarray:
    """The family's own output transform of a hidden state: final norm, LM head, then the
    final soft-cap (Gemma 2) or logits scaling (Granite), as its forward applies them."""
    cfg = hf.config
    with torch.no_grad():
        logits = hf.lm_head(hf.model.norm(hidden))
        if getattr(cfg, "final_logit_softcapping", None):
            cap = cfg.final_logit_softcapping
            logits = torch.tanh(logits / cap) * cap
        if getattr(cfg, "logits_scaling", None):
            logits = logits / cfg.logits_scaling
    return logits[0].numpy()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_exit_logits_are_the_familys_own_head_at_layer_k(family, family_bundles, family_hf):
    model = edgespec.load(family_bundles[family], verifier="exit:2")
    head = model.target.stages[0]
    ids = np.random.default_rng(4).integers(0, 2048, 30)
    model.target.reset(32)
    out = head.run(model.target.cache, 0, Feed(input_ids=ids[None], keep=30))
    hf = family_hf[family]
    with torch.no_grad():
        states = hf(torch.from_numpy(ids)[None], output_hidden_states=True).hidden_states
    np.testing.assert_allclose(out["hidden"][0], states[2][0].numpy(), atol=2e-4, rtol=1e-4)
    ref = family_exit_logits(hf, states[2])
    np.testing.assert_allclose(out["exit_logits"][0], ref, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("mode, options", MODES, ids=str)
@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_greedy_equals_transformers_in_every_mode(
    family, mode, options, static, family_bundles, family_references
):
    model = edgespec.load(family_bundles[family], mode=mode, static=static, **options)
    got = model.generate(family_prompt(), max_new_tokens=N_NEW, ignore_eos=True)
    assert got.tokens == family_references[family]
    assert got.stats.decode_tokens == N_NEW - 1


@pytest.mark.parametrize("family", list(FAMILIES))
def test_seeded_sampling_is_the_same_on_static_and_dynamic_graphs(family, family_bundles):
    kw = dict(max_new_tokens=24, temperature=1.0, top_p=0.9, seed=4, ignore_eos=True)
    got = [
        edgespec.load(family_bundles[family], mode="spec", draft_policy="fixed:3", static=s)
        .generate(family_prompt(), **kw)
        .tokens
        for s in (True, False)
    ]
    assert got[0] == got[1]


@pytest.fixture(scope="session")
def int8_bundles(family_checkpoints, tmp_path_factory) -> dict[str, Path]:
    """int8 weights, float compute (accuracy_level 0). At the default level 4 onnxruntime's
    one-row and many-row MatMulNBits kernels differ by float noise (~1e-6), which now and
    then flips an int8 activation rounding (logit jumps of 0.01-0.09): the tiny Mistral's
    int8 `spec` output left its `ar` output at token 29, where the two candidates were 0.006
    apart — below that noise, so not a losslessness bug of the families."""
    root = tmp_path_factory.mktemp("family_int8")
    out = {}
    for name, (target, draft) in family_checkpoints.items():
        out[name] = root / name
        export_bundle(
            target,
            out[name],
            draft=draft,
            quantize="int8",
            accuracy_level=0,
            exit_layers=[2],
        )
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_int8_bundle_computes_the_fake_quantized_model(
    family, family_checkpoints, family_hf, tmp_path
):
    """Float compute on the int8 weights equals transformers with the same weights
    fake-quantized (every Linear), over a prompt that crosses the window."""
    ids = np.random.default_rng(6).integers(0, 2048, 40)
    ref = hf_logits(fake_quantized(family_hf[family], "int8"), ids)
    out = tmp_path / "int8"
    export_bundle(family_checkpoints[family][0], out, quantize="int8", accuracy_level=0)
    target = edgespec.load(out).target
    target.reset(48)
    got = [target.forward(ids[:20], keep=20)]
    got += [target.forward(ids[i : i + 1], keep=1) for i in range(20, 40)]
    np.testing.assert_allclose(np.concatenate(got), ref, atol=3e-4, rtol=1e-4)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_int8_bundle_decodes_losslessly_in_every_mode(family, int8_bundles):
    """Every mode's greedy output is the int8 target's own (verifying several positions at
    once gives each the logits a one-token step gives it)."""
    folder = int8_bundles[family]
    kw = dict(max_new_tokens=N_NEW, ignore_eos=True)
    ar = edgespec.load(folder).generate(family_prompt(), **kw).tokens
    for mode, options in [
        ("spec", {"draft_policy": "fixed:3"}),
        ("self-spec", {"draft_policy": "fixed:3"}),
        ("lookup", {"draft_policy": "fixed:5"}),
    ]:
        got = edgespec.load(folder, mode=mode, **options).generate(family_prompt(), **kw)
        assert got.tokens == ar, mode


@pytest.mark.parametrize(
    "family, method", [("qwen3", "int4"), ("gemma3", "int4"), ("gemma3", "qdq-int8")]
)
def test_int4_and_qdq_bundles_decode_losslessly(family, method, family_checkpoints, tmp_path):
    export_bundle(
        family_checkpoints[family][0],
        tmp_path / method,
        quantize=method,
        exit_layers=[2],
    )
    kw = dict(max_new_tokens=N_NEW, ignore_eos=True)
    ar = edgespec.load(tmp_path / method).generate(family_prompt(), **kw).tokens
    for mode in ("self-spec", "lookup"):
        got = edgespec.load(tmp_path / method, mode=mode).generate(family_prompt(), **kw)
        assert got.tokens == ar, mode


@pytest.mark.parametrize("family", list(FAMILIES))
def test_shared_backbone_edge_bundle_exports_the_familys_head(family, family_checkpoints, tmp_path):
    m = export_bundle(
        family_checkpoints[family][0],
        tmp_path / "edge",
        variant="shared-backbone",
        backbone_layers=2,
    )
    assert m.roles == ["head@2"] and m.extra["export_check"]["max_abs_hidden_diff"] < 1e-4


@pytest.mark.parametrize(
    "model_type, change, message",
    [
        ("gemma3_text", {"use_bidirectional_attention": True}, "use_bidirectional_attention=True"),
        ("qwen3", {"hidden_act": "gelu"}, "hidden_act='gelu'"),
        (
            "phi3",
            {"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}},
            "partial_rotary_factor=0.5",
        ),
        ("qwen3_moe", {}, "architecture 'qwen3_moe' is not supported"),
    ],
)
def test_unimplemented_features_are_refused_before_any_file_is_written(
    model_type, change, message, tmp_path
):
    from transformers import AutoConfig

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    AutoConfig.for_model(model_type, **dict(SMALL, vocab_size=2048), **change).save_pretrained(ckpt)
    out = tmp_path / "out"
    with pytest.raises(ExportError, match=message.replace("(", r"\(").replace(")", r"\)")):
        export_bundle(ckpt, out)
    assert not out.exists()  # not even an empty folder


def test_a_checkpoint_that_needs_remote_code_is_refused_by_name(tmp_path):
    import json

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    config = {"model_type": "my_llm", "auto_map": {"AutoConfig": "configuration_my.MyConfig"}}
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(ExportError, match="trust_remote_code"):
        export_bundle(ckpt, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_sharded_bf16_checkpoint_is_converted_on_export(family_checkpoints, family_hf, tmp_path):
    """A bf16 checkpoint in several safetensors shards exports to fp32 graphs that compute
    what transformers computes from the same (bf16-rounded) weights."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = family_checkpoints["gemma3"][0]
    hf = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    hf.save_pretrained(tmp_path / "bf16", max_shard_size="200KB")
    AutoTokenizer.from_pretrained(src).save_pretrained(tmp_path / "bf16")
    assert len(list((tmp_path / "bf16").glob("*.safetensors"))) > 1
    m = export_bundle(tmp_path / "bf16", tmp_path / "out")
    assert m.extra["export_check"]["argmax_agreement"] == 1.0
    rounded = AutoModelForCausalLM.from_pretrained(tmp_path / "bf16", dtype=torch.float32).eval()
    ids = np.random.default_rng(5).integers(0, 2048, 24)
    target = edgespec.load(tmp_path / "out").target
    target.reset(32)
    got = target.forward(ids, keep=24)
    np.testing.assert_allclose(got, hf_logits(rounded, ids), atol=2e-4, rtol=1e-4)


@pytest.fixture(scope="module", params=["qwen3", "gemma3"])
def family_server(request, family_bundles, tmp_path_factory):
    from split_server import start_server

    server = start_server(family_bundles[request.param], tmp_path_factory.mktemp("server"))
    yield request.param, server
    server.stop()


def test_split_decoding_against_a_real_server_equals_transformers(
    family_server, family_bundles, family_checkpoints, family_references, tmp_path
):
    """A real `edgespec serve` of the family's bundle verifies drafts from the local draft
    model, the early exit, prompt lookup, and a shared-backbone edge bundle of the target."""
    from split_server import TOKEN

    family, server = family_server
    edge = tmp_path / "edge"
    export_bundle(
        family_checkpoints[family][0],
        edge,
        variant="shared-backbone",
        backbone_layers=2,
    )
    runs = [
        (family_bundles[family], {"drafter": "draft", "draft_policy": "fixed:3"}),
        (family_bundles[family], {"drafter": "exit:2", "draft_policy": "fixed:4"}),
        (family_bundles[family], {"drafter": "lookup", "draft_policy": "fixed:5"}),
        (edge, {"draft_policy": "fixed:3"}),
    ]
    for bundle, options in runs:
        model = edgespec.load(
            bundle,
            mode="split",
            server=server.url,
            token=TOKEN,
            threads=1,
            late_after=10.0,
            **options,
        )
        out = model.generate(family_prompt(), max_new_tokens=N_NEW, ignore_eos=True)
        assert out.tokens == family_references[family], options
        assert out.stats.remote_rounds > 1 and out.stats.local_rounds == 0


def test_longrope_bundle_stops_where_its_rotary_table_is_exact(tmp_path):
    """LongRoPE switches every position's angles once the sequence passes
    original_max_position_embeddings, which no fixed table expresses: the bundle's context
    ends there, and up to it the logits are transformers'."""
    from transformers import AutoModelForCausalLM

    from edgespec.export.builtin import write_checkpoint

    model_type, dims = FAMILIES["phi3"]
    dims = dict(dims, original_max_position_embeddings=64)
    dims.pop("tie_word_embeddings")
    dims["rope_parameters"] = {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
        "short_factor": [1.0 + 0.1 * i for i in range(8)],
        "long_factor": [2.0 + 0.5 * i for i in range(8)],
    }
    ckpt = write_checkpoint(tmp_path / "ckpt", model_type, tie=False, **dims)
    m = export_bundle(ckpt, tmp_path / "out")
    assert m.target.max_position_embeddings == 64  # of the config's 256
    ids = np.random.default_rng(0).integers(0, 2048, 60)
    target = edgespec.load(tmp_path / "out").target
    target.reset(64)
    got = [target.forward(ids[:30], keep=30)]
    got += [target.forward(ids[i : i + 1], keep=1) for i in range(30, 60)]
    ref = hf_logits(AutoModelForCausalLM.from_pretrained(ckpt).eval(), ids)
    np.testing.assert_allclose(np.concatenate(got), ref, atol=2e-4, rtol=1e-4)
    out = edgespec.load(tmp_path / "out").generate([int(i) for i in ids[:40]], max_new_tokens=40)
    assert out.finish_reason == "context"
