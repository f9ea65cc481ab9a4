"""Static (fixed-shape, standard-op) graphs for NPUs: what they contain, and that decoding on
them is token for token what transformers and the dynamic graphs produce in every mode."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner
from conftest import ARCHS, DRAFT_FOR

import edgespec
from edgespec.bundle import BundleError, load_manifest, static_width
from edgespec.cli import main
from edgespec.export import ExportError, export_bundle
from edgespec.export.static import check_static
from edgespec.runtime.model import InputError

MAX_CONTEXT = 96
WIDTH = 4  # small, so prompts, lookup drafts (γ = 5) and prefill all span several chunks
WIDTHS = [1, WIDTH]  # decode steps run the W = 1 graphs, the rest the W = 4 ones
N_NEW = 40
MODES = [
    ("ar", {}),
    ("ar", {"verifier": "exit:2"}),
    ("spec", {"draft_policy": "fixed:3"}),
    ("spec", {"draft_policy": "acceptance", "drafter": "lookup+draft"}),
    ("self-spec", {"draft_policy": "fixed:3", "exit_layer": 1}),
    ("self-spec", {"draft_policy": "dynamic-exit"}),
    ("lookup", {"draft_policy": "fixed:5"}),
]


@pytest.fixture(scope="module")
def static_bundles(checkpoints, tmp_path_factory) -> dict[str, Path]:
    """Per architecture: a draft, exits 1 and 2, and static variants of every graph."""
    root = tmp_path_factory.mktemp("static_bundles")
    out = {}
    for name, ckpt in checkpoints.items():
        out[name] = root / name
        export_bundle(
            ckpt,
            out[name],
            draft=checkpoints[DRAFT_FOR[name]],
            exit_layers=[1, 2],
            static=True,
            max_context=MAX_CONTEXT,
            verify_width=WIDTHS,
        )
    return out


def prompt_ids() -> list[int]:
    """23 ids with repeats (so lookup drafts): the prefill spans 6 chunks of W = 4."""
    ids = [int(i) for i in np.random.default_rng(3).integers(1, 2048, 12)]
    return ids + ids[:6] + ids[2:7]


@pytest.fixture(scope="module")
def references(hf_models) -> dict[str, list[int]]:
    prompt = prompt_ids()
    out = {}
    for arch, hf in hf_models.items():
        with torch.no_grad():
            ids = hf.generate(
                torch.tensor([prompt]),
                max_new_tokens=N_NEW,
                min_new_tokens=N_NEW,
                do_sample=False,
                pad_token_id=0,
            )
        out[arch] = ids[0, len(prompt) :].tolist()
    return out


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("mode, options", MODES, ids=str)
def test_static_greedy_equals_transformers_and_the_dynamic_graphs(
    arch, mode, options, static_bundles, references
):
    static = edgespec.load(static_bundles[arch], mode=mode, static=True, **options)
    got = static.generate(prompt_ids(), max_new_tokens=N_NEW, ignore_eos=True)
    assert got.tokens == references[arch]
    dynamic = edgespec.load(static_bundles[arch], mode=mode, **options)
    assert (
        dynamic.generate(prompt_ids(), max_new_tokens=N_NEW, ignore_eos=True).tokens == got.tokens
    )
    assert got.stats.decode_tokens == N_NEW - 1


def test_static_graphs_use_only_standard_ops_and_fixed_shapes(static_bundles):
    folder = static_bundles["llama-gqa-tied"]
    m = load_manifest(folder)
    assert m.static is not None and m.static.max_context == MAX_CONTEXT
    assert m.static.verify_widths == WIDTHS
    for role in m.roles:
        assert sorted(m.static.graphs_for(role)) == WIDTHS
    for g in m.static.graphs:
        model = onnx.load(str(folder / g.file), load_external_data=False)
        assert check_static(model) == [], g.file
        assert {o.domain for o in model.opset_import} == {""}
        for spec in (*g.inputs, *g.outputs):
            assert all(isinstance(d, int) and d > 0 for d in spec.shape), spec
        kv = [s for s in g.outputs if s.name.startswith("new_key.")]
        assert len(kv) == len(g.kv_layers) and kv[0].shape == [1, 2, static_width(g), 16]
    assert m.extra["static_check"]["argmax_agreement"] == 1.0
    onnx.checker.check_model(str(folder / g.file), full_check=True)


def test_static_graphs_run_as_written_without_onnxruntime_fusions(static_bundles):
    """With every graph optimisation off, onnxruntime runs the file's own standard ops (no
    fused contrib kernels) and gets the logits the optimised session gets."""
    import onnxruntime as ort

    from edgespec.runtime.graphs.session import session_options

    folder = static_bundles["llama-gqa-tied"]
    g = load_manifest(folder).static.graphs_for("full")[WIDTH]  # type: ignore[union-attr]
    feeds = {
        t.name: np.zeros(t.shape, np.dtype(t.dtype)) for t in g.inputs if t.name != "attention_mask"
    }
    feeds["input_ids"][0] = prompt_ids()[:WIDTH]
    feeds["position_ids"][0] = np.arange(WIDTH)
    mask = np.full((1, 1, WIDTH, MAX_CONTEXT + WIDTH), -30000.0, np.float32)
    mask[0, 0, :, MAX_CONTEXT:] = np.where(np.tri(WIDTH, dtype=bool), 0.0, -30000.0)
    feeds["attention_mask"] = mask
    logits = []
    for level in (
        ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    ):
        opts = session_options(None)  # the process-wide pool the runtime made
        opts.graph_optimization_level = level
        sess = ort.InferenceSession(str(folder / g.file), opts, ["CPUExecutionProvider"])
        logits.append(sess.run(["logits"], feeds)[0])
    np.testing.assert_allclose(logits[0], logits[1], atol=1e-4)
    target = edgespec.load(folder, static=True).target
    target.reset(8)
    want = target.forward(np.array(prompt_ids()[:WIDTH], np.int64), keep=WIDTH)
    np.testing.assert_allclose(logits[0][0], want, atol=1e-4)


def test_the_static_check_flags_contrib_ops_and_dynamic_dims(bundles):
    """The check is not vacuous: the dynamic graphs fail it on both counts."""
    dynamic = onnx.load(str(bundles["llama-gqa-tied"] / "full.onnx"), load_external_data=False)
    problems = check_static(dynamic)
    assert any("GroupQueryAttention" in p for p in problems)
    assert any("domain 'com.microsoft'" in p for p in problems)
    h = onnx.helper
    x = h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 4])
    y = h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 4])
    graph = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    standard_but_dynamic = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    assert any(
        "x has a dynamic shape ['batch', 4]" in p for p in check_static(standard_but_dynamic)
    )


def test_static_prefill_in_chunks_gives_the_dynamic_logits(static_bundles):
    """A prompt of 2W + 3 positions, chunked and padded, scores like one dynamic call; a
    rejected draft rolled back by truncate leaves no trace."""
    folder = static_bundles["qwen2"]
    ids = np.array(prompt_ids()[: 2 * WIDTH + 3], np.int64)
    dyn, sta = (edgespec.load(folder, static=s).target for s in (False, True))
    dyn.reset(32)
    sta.reset(32)
    assert sta.cache is not None and sta.cache.capacity == MAX_CONTEXT  # the fixed size
    want = dyn.forward(ids, keep=len(ids))
    np.testing.assert_allclose(sta.forward(ids[:5], keep=5), want[:5], atol=1e-4)
    sta.forward(np.array([77, 78, 79], np.int64), keep=3)  # drafted, then rejected
    sta.truncate(5)
    np.testing.assert_allclose(sta.forward(ids[5:], keep=len(ids) - 5), want[5:], atol=1e-4)


def test_static_variants_reuse_the_bundles_weights(static_bundles, checkpoints, tmp_path):
    plain = tmp_path / "plain"
    export_bundle(
        checkpoints["gpt2"],
        plain,
        draft=checkpoints[DRAFT_FOR["gpt2"]],
        exit_layers=[1, 2],
        verify=False,
    )
    size = lambda b: (b / "weights.bin").stat().st_size  # noqa: E731
    assert size(static_bundles["gpt2"]) == size(plain)
    assert load_manifest(plain).static is None


def test_prompt_plus_new_tokens_beyond_the_static_context_is_refused(static_bundles):
    model = edgespec.load(static_bundles["gpt2"], static=True)
    with pytest.raises(InputError, match="max context of 96.*lower max_new_tokens to 73"):
        model.generate(prompt_ids(), max_new_tokens=74)
    assert len(model.generate(prompt_ids(), max_new_tokens=73, ignore_eos=True).tokens) == 73


def test_a_bundle_without_static_graphs_asked_to_run_static_says_how_to_export(bundles):
    with pytest.raises(BundleError, match="no static graphs.*--static --max-context"):
        edgespec.load(bundles["gpt2"], static=True)


def test_static_export_options_are_checked(checkpoints, tmp_path):
    ckpt = checkpoints["llama-gqa-tied"]  # 256 positions
    for kwargs, match in (
        ({"max_context": 512}, "beyond the model's 256 positions"),
        ({"max_context": 4, "verify_width": 8}, "smaller than --verify-width"),
        ({"verify_width": 0, "max_context": 64}, "at least 1"),
        ({"max_context": 64, "quantize": "int8"}, "fp32 or fp16"),
    ):
        with pytest.raises(ExportError, match=match):
            export_bundle(ckpt, tmp_path / "b", static=True, **kwargs)


def test_fp16_static_graphs_export_and_decode(checkpoints, tmp_path):
    out = tmp_path / "fp16"
    export_bundle(
        checkpoints["qwen2"],
        out,
        dtype="fp16",
        static=True,
        max_context=64,
        verify_width=4,
    )
    m = load_manifest(out)
    assert m.static is not None
    full = m.static.graphs_for("full")[4]
    assert {i.dtype for i in full.inputs if i.name.startswith("past_")} == {"float16"}
    assert m.extra["static_check"]["argmax_agreement"] >= 0.9
    got = edgespec.load(out, static=True).generate(prompt_ids(), max_new_tokens=20)
    assert len(got.tokens) >= 1


def test_cli_exports_and_generates_static(checkpoints, tmp_path):
    runner = CliRunner()
    out = tmp_path / "b"
    r = runner.invoke(
        main,
        [
            "export",
            str(checkpoints["gpt2"]),
            "--out",
            str(out),
            "--static",
            "--max-context",
            "64",
            "--verify-width",
            "4",
        ],
    )
    assert r.exit_code == 0, r.output
    r = runner.invoke(main, ["generate", str(out), "-p", "def f(x):", "-n", "8", "--static"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(main, ["inspect", str(out)])
    assert "max context 64, verify widths 4: full" in r.output
    r = runner.invoke(main, ["generate", str(out), "-p", "def f(x):", "-n", "200", "--static"])
    assert r.exit_code == 1 and "beyond the static graphs' max context of 64" in r.output


@pytest.mark.parametrize("mode", ["ar", "spec"])
def test_seeded_sampling_on_static_graphs_reproduces_the_dynamic_graphs(mode, static_bundles):
    """Same seed, same logits up to float noise: the same sampled tokens (incl. speculative
    sampling's accept/resample draws)."""
    kw = dict(max_new_tokens=24, temperature=1.0, top_p=0.9, seed=4, ignore_eos=True)
    policy = {"draft_policy": "fixed:3"} if mode == "spec" else {}
    got = [
        edgespec.load(static_bundles["qwen2"], mode=mode, static=s, **policy)
        .generate(prompt_ids(), **kw)
        .tokens
        for s in (True, False)
    ]
    assert got[0] == got[1]


def test_each_chunk_runs_on_the_narrowest_graph_that_takes_it(static_bundles, monkeypatch):
    from edgespec.runtime.graphs import static as runtime_static

    widths: list[int] = []
    real = runtime_static._FixedWidth.__call__

    def counted(self, cache, past, chunk):
        widths.append(self.width)
        return real(self, cache, past, chunk)

    monkeypatch.setattr(runtime_static._FixedWidth, "__call__", counted)
    target = edgespec.load(static_bundles["llama-untied"], static=True).target
    target.reset(32)
    target.forward(np.arange(1, 12), keep=1)  # 11 positions: 4 + 4 + 3 (padded to 4)
    target.forward(np.array([5]), keep=1)  # one decode step: the W = 1 graph
    target.forward(np.array([6, 7]), keep=2)  # a verification of 2: W = 4, padded
    assert widths == [4, 4, 4, 1, 4]


def test_manifests_from_before_static_and_core_ml_still_load(bundles, tmp_path):
    import json
    import shutil

    old = tmp_path / "old"
    shutil.copytree(bundles["gpt2"], old)
    raw = json.loads((old / "manifest.json").read_text())
    del raw["static"], raw["coreml"]  # what earlier exports wrote: neither key
    (old / "manifest.json").write_text(json.dumps(raw))
    m = load_manifest(old)
    assert m.static is None and m.coreml is None and m.schema_version == 1
    assert len(edgespec.load(old).generate([1, 2, 3], max_new_tokens=3).tokens) >= 1


def test_a_device_profile_that_needs_static_shapes_runs_the_static_graphs(
    static_bundles, bundles, references, tmp_path, monkeypatch
):
    """An NPU-style profile (static_shapes: true) picks the static graphs by itself; a bundle
    without them is refused with the re-export command."""
    from edgespec.runtime.graphs.static import StaticGraphSession

    profiles = tmp_path / "devices"
    profiles.mkdir()
    (profiles / "npu.json").write_text(
        '{"name": "cpu-as-npu", "providers": ["CPUExecutionProvider"], "static_shapes": true}'
    )
    monkeypatch.setenv("EDGESPEC_DEVICES", str(profiles))
    model = edgespec.load(static_bundles["qwen2"], device="cpu-as-npu")
    assert isinstance(model.target.stages[0], StaticGraphSession)
    got = model.generate(prompt_ids(), max_new_tokens=N_NEW, ignore_eos=True)
    assert got.tokens == references["qwen2"]
    with pytest.raises(BundleError, match="no static graphs.*--static"):
        edgespec.load(bundles["qwen2"], device="cpu-as-npu")


@pytest.mark.parametrize("mode, options", MODES, ids=str)
def test_static_graphs_bound_again_each_call_decode_the_same_tokens(
    mode, options, static_bundles, references
):
    """What a provider with memory of its own (CUDA, DirectML) needs: onnxruntime copies a
    bound host input at bind time, so the in-place inputs are bound again before each run."""
    model = edgespec.load(static_bundles["llama-gqa-tied"], mode=mode, static=True, **options)
    for session in model.graphs.opened.values():
        for call in session.calls:
            call._rebind = True
    got = model.generate(prompt_ids(), max_new_tokens=N_NEW, ignore_eos=True)
    assert got.tokens == references["llama-gqa-tied"]
