"""Quantized exports: int8/int4 weights (MatMulNBits) and static QDQ int8.

The oracle for weight-only quantization is the transformers model with its Linear weights
fake-quantized exactly as the export quantizes them (`export.quantize.fake_quantize`): with
float compute (accuracy level 0) the bundle must match it to float rounding, which checks the
packed layout; the default level only adds int8 activation rounding. Every quantized bundle
must also stay lossless: each speculative mode's greedy output equals its own `ar` output.
"""

from __future__ import annotations

import copy

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from click.testing import CliRunner
from onnx import helper, numpy_helper

import edgespec
from edgespec.bundle import load_manifest
from edgespec.cli import main
from edgespec.export import ExportError, export_bundle
from edgespec.export.nbits import (
    block_for,
    dequantize_blocks,
    fake_quantize,
    quantize_blocks,
)
from edgespec.runtime.graphs.session import session_options

PROMPT = [5, 9, 200, 31, 7, 1500, 77, 3]


def fake_quantized(hf, method: str, block_size: int | None = None):
    """A copy of a transformers model whose every Linear weight and token embedding table is
    fake-quantized as the export stores them (a tied head is untied: an int4 bundle gathers
    embedding rows from an int8 copy of the table)."""
    model = copy.deepcopy(hf)
    embedding = model.get_input_embeddings()
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) or module is embedding:
            w = module.weight.detach().numpy().T
            fq = fake_quantize(w, method, block_size, embedding=module is embedding)
            module.weight = torch.nn.Parameter(torch.from_numpy(fq.T.copy()))
    return model.eval()


def bundle_logits(folder, ids: np.ndarray) -> np.ndarray:
    """Prefill of 5 positions, then single-token steps through the KV cache."""
    target = edgespec.load(folder).target
    target.reset(32)
    got = [target.forward(ids[:5], keep=5)]
    got += [target.forward(np.array([t]), keep=1) for t in ids[5:]]
    return np.concatenate(got)


def hf_logits(hf, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.from_numpy(ids)[None]).logits[0].numpy()


@pytest.mark.parametrize("bits, zero_points", [(4, False), (4, True), (8, False), (8, True)])
def test_packed_layout_is_what_matmulnbits_computes(bits, zero_points):
    """One MatMulNBits node over our packed weights (and zero points) equals x @ dequantized
    weights, with K not a multiple of the block (padding, an odd number of blocks: the 4-bit
    zero points pad each column to a byte) and several rows."""
    rng = np.random.default_rng(0)
    k, n = 80, 48
    w = rng.standard_normal((k, n)).astype(np.float32)
    w[:, 0] = np.abs(w[:, 0])  # a column with no negative weight: its zero point is 0
    packed, scales, zp = quantize_blocks(w, bits, 32, zero_points)
    assert packed.shape == (n, 3, 32 * bits // 8) and scales.shape == (n * 3,)
    inits = [numpy_helper.from_array(packed, "B"), numpy_helper.from_array(scales, "S")]
    if zero_points:
        assert zp.shape == (n * (2 if bits == 4 else 3),)
        inits.append(numpy_helper.from_array(zp, "Z"))
    else:
        assert zp is None
    node = helper.make_node(
        "MatMulNBits", ["A", "B", "S"] + (["Z"] if zero_points else []), ["Y"],
        domain="com.microsoft", K=k, N=n, bits=bits, block_size=32, accuracy_level=0,
    )  # fmt: skip
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("A", onnx.TensorProto.FLOAT, ["m", k])],
        [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, ["m", n])],
        inits,
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
    x = rng.standard_normal((3, k)).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), session_options(None))
    got = session.run(None, {"A": x})[0]
    deq = dequantize_blocks(packed, scales, k, bits, zp)
    np.testing.assert_allclose(got, x @ deq, atol=1e-4, rtol=1e-5)
    # the rounding is what it claims: within half a step of the float weights (asymmetric:
    # a rounded zero point may push one end of the range a level out, so within a step)
    step = scales.reshape(n, 3)[:, np.arange(k) // 32].T
    assert np.all(np.abs(deq - w) <= step * (1.0 if zero_points else 0.5) + 1e-6)
    # asymmetric blocks spend every level on the block's range: a finer step than symmetric
    if zero_points:
        assert np.all(scales < quantize_blocks(w, bits, 32)[1])


def test_asymmetric_int4_keeps_zero_exact_and_rounds_closer_than_symmetric():
    """Weights of one sign (post-ReLU-like columns, shifted distributions) are where zero
    points pay: the same 16 levels cover half the range. Zero stays exactly zero."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((256, 64)).astype(np.float32) + 1.5
    w[::7] = 0.0
    default = fake_quantize(w, "int4", 64)
    packed, scales, zp = quantize_blocks(w, 4, 64, zero_points=True)
    asym = dequantize_blocks(packed, scales, 256, 4, zp)
    assert np.all(asym[::7] == 0.0)
    assert np.abs(asym - w).mean() < 0.75 * np.abs(dequantize_blocks(
        *quantize_blocks(w, 4, 64)[:2], 256, 4) - w).mean()  # fmt: skip
    np.testing.assert_array_equal(default, asym)  # int4's format is the asymmetric one


def test_a_matrix_whose_rows_do_not_fill_the_block_takes_the_largest_dividing_block():
    """Padding K = 576 (SmolLM2) to blocks of 128 would store 11% zeros in every column."""
    assert block_for(576, 128) == 64 and block_for(896, 128) == 128
    assert block_for(64, 128) == 64 and block_for(80, 32) == 16
    assert block_for(100, 32) == 32  # no supported block divides 100: padded


@pytest.mark.parametrize("method", ["int8", "int4"])
@pytest.mark.parametrize("arch", ["llama-untied", "qwen2"])
def test_weight_only_bundle_computes_the_fake_quantized_model(
    arch, method, checkpoints, hf_models, tmp_path
):
    ids = np.random.default_rng(6).integers(0, 2048, 9)
    ref = hf_logits(fake_quantized(hf_models[arch], method), ids)
    # float compute: equal to the fake-quantized model up to float rounding
    export_bundle(checkpoints[arch], tmp_path / "exact", quantize=method, accuracy_level=0)
    np.testing.assert_allclose(bundle_logits(tmp_path / "exact", ids), ref, atol=3e-4, rtol=1e-4)
    # default (int8 activations per row and block): off by activation rounding only,
    # a relative error of about 1/254 per block, far below the weights' own rounding
    m = export_bundle(checkpoints[arch], tmp_path / "fast", quantize=method)
    got = bundle_logits(tmp_path / "fast", ids)
    fp32 = hf_logits(hf_models[arch], ids)
    act_err = np.abs(got - ref).max()
    weight_err = np.abs(ref - fp32).max()
    assert act_err < 0.05 * np.abs(ref).max()
    if method == "int4":
        assert act_err < weight_err
    assert m.quantization == method
    assert m.extra["quantization"] == {
        "method": method,
        "op": "MatMulNBits",
        "bits": {"int8": 8, "int4": 4}[method],
        "block_size": 128,
        "accuracy_level": 4,
        "weights": {"int8": "symmetric", "int4": "asymmetric"}[method] + " per block",
        "blocks": "largest dividing K",
        "embedding_bits": 8,
    }


def test_int4_bundle_is_smaller_than_int8_smaller_than_fp32(checkpoints, bundles, tmp_path):
    sizes = {"fp32": (bundles["llama-untied"] / "weights.bin").stat().st_size}
    for method in ("int8", "int4"):
        export_bundle(
            checkpoints["llama-untied"], tmp_path / method, quantize=method, exit_layers=[2],
        )  # fmt: skip
        sizes[method] = (tmp_path / method / "weights.bin").stat().st_size
    # every matrix shrinks, the embedding table too (int8 in both: a large share of so tiny
    # a model)
    assert sizes["int4"] < 0.75 * sizes["int8"] and sizes["int8"] < 0.35 * sizes["fp32"]


def test_a_tied_table_is_stored_once_for_the_head_and_the_embedding(checkpoints, tmp_path):
    """The int8 LM head (MatMulNBits) and the embedding gather (GatherBlockQuantized) of a
    tied model read the same bytes of weights.bin, under their own names and shapes; an int4
    bundle gathers from an int8 table of its own (int4 rows cost too much accuracy)."""
    for method, shared in (("int8", True), ("int4", False)):
        export_bundle(checkpoints["llama-gqa-tied"], tmp_path / method, quantize=method)
        graph = onnx.load(str(tmp_path / method / "full.onnx"), load_external_data=False).graph
        where = {
            t.name: {e.key: e.value for e in t.external_data}["offset"]
            for t in graph.initializer
            if t.external_data
        }
        gather = next(n for n in graph.node if n.op_type == "GatherBlockQuantized")
        head = [n for n in graph.node if n.op_type == "MatMulNBits"][-1]
        same = [where[gather.input[i]] == where[head.input[j]] for i, j in ((0, 1), (2, 2))]
        assert same == [shared, shared], method
        assert next(a.i for a in gather.attribute if a.name == "bits") == 8
        assert not any(n.op_type == "Gather" and "embed" in n.input[0] for n in graph.node)


@pytest.mark.parametrize("method, hidden", [("int4", 64), ("int8", 64), ("int4", 40)])
def test_embedding_rows_gathered_from_the_quantized_table_are_its_dequantized_rows(
    method, hidden, tmp_path
):
    """GatherBlockQuantized over the stored table gives exactly the rows the fake-quantized
    reference uses; a hidden size no supported block divides (40) keeps a float table."""
    from edgespec.export.builder import GraphBuilder, WeightStore

    table = np.random.default_rng(3).standard_normal((50, hidden)).astype(np.float32)
    gb = GraphBuilder(WeightStore(tmp_path / "w.bin"), np.dtype(np.float32), quantize=method,
                      block_size=128)  # fmt: skip
    ids = gb.add_input("ids", onnx.TensorProto.INT64, ["s"])
    gb.add_output(gb.embedding(ids, "embed", table), "rows", onnx.TensorProto.FLOAT, ["s", hidden])
    gb.store.close()
    onnx.save(gb.model("g"), str(tmp_path / "g.onnx"))
    session = ort.InferenceSession(str(tmp_path / "g.onnx"), session_options(None))
    picked = np.array([0, 7, 49, 7])
    got = session.run(None, {"ids": picked})[0]
    ops = [n.op_type for n in gb.nodes]
    if hidden % 16:
        assert "GatherBlockQuantized" not in ops
        np.testing.assert_array_equal(got, table[picked])
    else:
        assert "GatherBlockQuantized" in ops
        want = fake_quantize(table.T, method, 128, embedding=True).T[picked]
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.fixture(scope="module")
def quantized_bundles(checkpoints, tmp_path_factory):
    root = tmp_path_factory.mktemp("quantized")
    out = {}
    for method in ("int8", "int4", "qdq-int8"):
        out[method] = root / method
        export_bundle(
            checkpoints["llama-gqa-tied"],
            out[method],
            quantize=method,
            exit_layers=[2],
            # qdq-int8 quantizes each graph in a child process: skip the draft to stay fast
            draft=None if method == "qdq-int8" else checkpoints["qwen2"],
        )
    return out


@pytest.mark.parametrize("method", ["int8", "int4", "qdq-int8"])
def test_quantized_bundle_decodes_losslessly_in_every_mode(method, quantized_bundles):
    """Speculative verification of several positions at once gives each the logits a
    one-token step gives it, so every mode's greedy output is the quantized target's own."""
    folder = quantized_bundles[method]
    ar = edgespec.load(folder).generate(PROMPT, max_new_tokens=24, ignore_eos=True).tokens
    modes = [("self-spec", {}), ("lookup", {}), ("self-spec", {"draft_policy": "fixed:6"})]
    if "draft" in load_manifest(folder).roles:
        modes.append(("spec", {"draft_policy": "fixed:4"}))
    for mode, options in modes:
        model = edgespec.load(folder, mode=mode, **options)
        assert model.generate(PROMPT, max_new_tokens=24, ignore_eos=True).tokens == ar, mode


def test_qdq_bundle_holds_calibrated_qdq_matmuls(quantized_bundles):
    folder = quantized_bundles["qdq-int8"]
    m = load_manifest(folder)
    assert m.quantization == "qdq-int8" and m.extra["quantization"]["calibration_prompts"] == 6
    graph = onnx.load(str(folder / "full.onnx")).graph
    ops = [n.op_type for n in graph.node]
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    # every MatMul's weight and activation pass through QuantizeLinear/DequantizeLinear
    activation_scales = [inits[n.input[1]] for n in graph.node if n.op_type == "QuantizeLinear"]
    assert len(activation_scales) >= ops.count("MatMul") > 0
    assert ops.count("DequantizeLinear") >= 2 * ops.count("MatMul")
    # the ranges come from calibration: positive, not all alike
    assert all(s > 0 for s in activation_scales) and len(set(map(float, activation_scales))) > 4
    # head@k and tail@k share full's quantized tensors in the one weights file
    full_bytes = sum(a.nbytes for a in inits.values())
    assert (folder / "weights.bin").stat().st_size < 1.2 * full_bytes + 2**20


@pytest.mark.parametrize(
    "options, message",
    [
        ({"quantize": "int3"}, "--quantize 'int3' is not supported; choose one of int8, int4"),
        ({"quantize": "int4", "block_size": 48}, "block size 48 is not supported"),
        ({"quantize": "int8", "accuracy_level": 7}, "accuracy level must be 0..4"),
        ({"quantize": "qdq-int8", "dtype": "fp16"}, "qdq-int8 starts from fp32 graphs"),
        ({"quantize": "qdq-int8", "calibration_prompts": [" "]}, "at least one non-empty"),
    ],
)
def test_bad_quantization_options_are_refused(checkpoints, tmp_path, options, message):
    with pytest.raises(ExportError, match=message):
        export_bundle(checkpoints["qwen2"], tmp_path / "x", **options)
    assert not (tmp_path / "x").exists()


def test_cli_refuses_an_unknown_quantization(checkpoints, tmp_path):
    args = ["export", str(checkpoints["qwen2"]), "-o", str(tmp_path / "x"), "--quantize", "int2"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and "'int2' is not one of 'int8', 'int4', 'qdq-int8'" in r.output


def graph_ops(folder, role: str) -> set[str]:
    m = load_manifest(folder)
    path = folder / next(g.file for g in m.graphs if g.role == role)
    return {n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node}


@pytest.mark.parametrize("target_q, draft_q", [(None, "int8"), ("int8", "int4"), ("int8", "none")])
def test_a_draft_quantized_apart_from_its_target_keeps_the_targets_output(
    target_q, draft_q, checkpoints, hf_models, tmp_path
):
    """`draft_quantize` changes only the draft graph's weights: the target's graphs are what
    `quantize` alone exports, and spec's greedy output is the target's own (an fp32 target
    with an int8 draft gives transformers' tokens)."""
    folder = tmp_path / "b"
    m = export_bundle(
        checkpoints["llama-gqa-tied"], folder, draft=checkpoints["qwen2"], quantize=target_q,
        draft_quantize=draft_q,
    )  # fmt: skip
    assert m.quantization == target_q
    assert m.extra["draft_quantization"]["method"] == draft_q
    assert ("MatMulNBits" in graph_ops(folder, "full")) == (target_q is not None)
    assert ("MatMulNBits" in graph_ops(folder, "draft")) == (draft_q != "none")
    ar = edgespec.load(folder).generate(PROMPT, max_new_tokens=24, ignore_eos=True).tokens
    for policy in ("fixed:4", "auto"):
        spec = edgespec.load(folder, mode="spec", draft_policy=policy)
        assert spec.generate(PROMPT, max_new_tokens=24, ignore_eos=True).tokens == ar, policy
    if target_q is None:
        with torch.no_grad():
            ids = torch.tensor([PROMPT])
            out = hf_models["llama-gqa-tied"].generate(
                ids, max_new_tokens=24, min_new_tokens=24, do_sample=False
            )
        assert ar == out[0, len(PROMPT) :].tolist()


def test_a_draft_quantized_as_its_target_records_nothing_apart(checkpoints, tmp_path):
    m = export_bundle(
        checkpoints["llama-gqa-tied"], tmp_path / "b", draft=checkpoints["qwen2"],
        quantize="int8", draft_quantize="int8",
    )  # fmt: skip
    assert "draft_quantization" not in m.extra
    assert "MatMulNBits" in graph_ops(tmp_path / "b", "draft")


@pytest.mark.parametrize(
    "options, message",
    [
        (
            {"draft_quantize": "int8"},
            "--draft-quantize sets a draft's weights: also pass --draft or --eagle-gguf",
        ),
        (
            {"draft_quantize": "int3", "with_draft": True},
            "--draft-quantize 'int3' is not supported; choose one of int8, int4, none",
        ),
        (
            {"draft_quantize": "int8", "quantize": "qdq-int8", "with_draft": True},
            "qdq-int8 calibrates the draft with the target",
        ),
        (
            {"draft_quantize": "int8", "static": True, "with_draft": True},
            "--static/--coreml with int8 weights is not supported",
        ),
    ],
)
def test_bad_draft_quantization_options_are_refused(checkpoints, tmp_path, options, message):
    options = dict(options)
    if options.pop("with_draft", False):
        options["draft"] = checkpoints["qwen2"]
    with pytest.raises(ExportError, match=message):
        export_bundle(checkpoints["llama-gqa-tied"], tmp_path / "x", **options)
    assert not (tmp_path / "x").exists()


def test_cli_exports_and_shows_a_draft_quantized_apart(checkpoints, tmp_path):
    out = tmp_path / "b"
    args = ["export", str(checkpoints["llama-gqa-tied"]), "-o", str(out), "--draft",
            str(checkpoints["qwen2"]), "--draft-quantize", "int8"]  # fmt: skip
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["inspect", str(out)])
    assert r.exit_code == 0, r.output
    assert "fp32 / none" in r.output
    line = next(x for x in r.output.splitlines() if "draft quantization" in x)
    assert "int8" in line and "block_size 128" in line


def test_an_export_whose_check_disagrees_says_so_and_how_to_round_closer():
    from types import SimpleNamespace

    from edgespec.cli.export import agreement_note

    check = {"argmax_agreement": 0.625, "max_abs_logit_diff": 3.8}
    note = agreement_note(SimpleNamespace(extra={"export_check": check}))
    assert "62%" in note and "3.8" in note and "--block-size 32" in note
    same = {"argmax_agreement": 1.0, "max_abs_logit_diff": 1e-5}
    assert agreement_note(SimpleNamespace(extra={"export_check": same})) is None
    assert agreement_note(SimpleNamespace(extra={})) is None
