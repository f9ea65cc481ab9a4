"""A row's logits do not depend on how many positions share its call: one-token steps and a
verify round of the same tokens give the same bits, so every mode's greedy output is `ar`'s on
the fast path (int8 activations) without padding one-token steps to two positions where the
machine's kernels allow it.

What makes it so (export/builder.py): MatMulNBits quantizes activations per row and block of
32, so its rows do not see each other; GroupQueryAttention takes another path for a
one-position call than for wider ones, so a graph runs a one-position call's attention as two
positions (`lone_row_pad`). Checked here bit for bit, per block format: one MatMulNBits layer of
every held GGUF block format gives a row the same bits inside calls of 2..16 rows, and, where
the machine's one-row kernel rounds as the wide one (AVX-512; on AVX2 4-bit blocks of 32 do
not), alone too; whole models (GGUF imports of Q4_0, Q4_1, Q8_0 and F16 blocks and of a file
of mixed types, `--quantize int8` exports) through the runtime's own stack after a prompt in
the cache, at the step width the runtime settled on for this machine
(`stack.settle_step_width`: 1 exactly where a lone row agrees). With blocks over 32
onnxruntime's one-row MatMulNBits kernel rounds otherwise everywhere: such bundles keep
`step_width` 2.
"""

from __future__ import annotations

import numpy as np
import pytest

import edgespec
from edgespec.bundle import load_manifest
from edgespec.export import export_bundle

gguf = pytest.importorskip("gguf")

WIDTHS = range(2, 17)
LAYER_FORMATS = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
MODEL_FORMATS = ("Q4_0", "Q4_1", "Q8_0", "F16", "mixed")
# "mixed": Q5_0 with v, k and up of other types (fused into 8-bit blocks, as a Q4_K_M file's)
MIXED = {"attn_v": "Q8_0", "attn_k": "Q4_0", "ffn_up": "Q4_1"}


def _layer_session(kind: str, tmp_path, threads: int):
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto
    from test_gguf_import import _raw_blocks

    from edgespec.export.builder import GraphBuilder, WeightStore
    from edgespec.export.gguf_blocks import pack
    from edgespec.runtime.graphs.session import session_options

    rows, k = 96, 512
    held = pack(_raw_blocks(kind, rows, k, np.random.default_rng(3)), kind, k)
    store = WeightStore(tmp_path / "w.bin")
    gb = GraphBuilder(store=store, dtype=np.dtype(np.float32), accuracy_level=4)
    x = gb.add_input("x", TensorProto.FLOAT, [1, "s", k])
    gb.add_output(gb.linear(x, "lin", held), "y", TensorProto.FLOAT, [1, "s", rows])
    store.close()
    onnx.save(gb.model("t"), str(tmp_path / "m.onnx"))
    return ort.InferenceSession(
        str(tmp_path / "m.onnx"), session_options(threads), ["CPUExecutionProvider"]
    ), k


def _layer_rows(kind: str, tmp_path, threads: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """One layer's rows for 16 positions: each alone, and inside calls of 2..16."""
    sess, k = _layer_session(kind, tmp_path, threads)
    x = np.random.default_rng(4).standard_normal((1, 16, k)).astype(np.float32)
    x[..., ::9] *= 6  # outliers, as real activations have
    alone = [sess.run(None, {"x": x[:, i : i + 1]})[0][0, 0] for i in range(16)]
    return alone, [sess.run(None, {"x": x[:, :width]})[0][0] for width in WIDTHS]


@pytest.mark.parametrize("threads", (1, 2))
@pytest.mark.parametrize("kind", LAYER_FORMATS)
def test_a_held_block_layers_row_is_the_same_among_2_to_16(kind, threads, tmp_path):
    alone, wide = _layer_rows(kind, tmp_path, threads)
    for width, rows in zip(WIDTHS, wide, strict=True):
        for i in range(width):
            assert np.array_equal(rows[i], wide[-1][i]), f"{kind}: row {i} of {width} differs"
    if kind in ("Q8_0", "Q5_0", "Q6_K", "Q2_K", "Q3_K"):  # 8-bit and 4-bit blocks of 16
        assert all(np.array_equal(a, r) for a, r in zip(alone, wide[-1], strict=True))


def _lone_row_agrees(kind: str, tmp_path) -> bool:
    alone, wide = _layer_rows(kind, tmp_path, 1)
    return all(np.array_equal(a, r) for a, r in zip(alone, wide[-1], strict=True))


def _steps_and_rounds(folder, threads: int, expect: int | None = None, **load) -> int:
    """Asserts one-token steps give a verify round's rows; returns the target's step width."""
    target = edgespec.load(folder, mode="ar", threads=threads, **load).target
    assert expect is None or target.step_width == expect
    rng = np.random.default_rng(6)
    vocab = load_manifest(folder).target.vocab_size
    prompt, new = rng.integers(3, vocab, 11), rng.integers(3, vocab, 16)
    target.reset(64)
    target.forward(prompt, keep=1)
    alone = [target.forward(new[i : i + 1], keep=1)[0] for i in range(16)]
    for width in WIDTHS:
        target.reset(64)
        target.forward(prompt, keep=1)
        rows = target.forward(new[:width], keep=width)
        for i in range(width):
            assert np.array_equal(rows[i], alone[i]), f"row {i} of a {width}-wide call differs"
    return target.step_width


@pytest.fixture(scope="module", params=MODEL_FORMATS)
def gguf_bundle(request, tmp_path_factory):
    from tests.gguf_files import write_gguf

    root = tmp_path_factory.mktemp(f"inv-{request.param}")
    mixed = request.param == "mixed"
    write_gguf(root / "m.gguf", "llama", "Q5_0" if mixed else request.param,
               mix=MIXED if mixed else None)  # fmt: skip
    export_bundle(root / "m.gguf", root / "b")
    return request.param, root / "b"


@pytest.mark.parametrize("threads", (1, 2))
def test_one_token_steps_give_a_verify_rounds_rows_bit_for_bit(gguf_bundle, threads, tmp_path):
    """At the width the runtime settled on: 1 (no padded one-token steps) exactly where this
    machine's kernels give a lone row of the file's blocks a wide call's bits."""
    kind, folder = gguf_bundle
    agrees = kind == "F16" or _lone_row_agrees("Q5_0" if kind == "mixed" else kind, tmp_path)
    assert _steps_and_rounds(folder, threads) == (1 if agrees else 2)


def test_an_int8_export_at_blocks_of_32_steps_one_position_wide(checkpoints, tmp_path):
    out = tmp_path / "b"
    export_bundle(checkpoints["llama-gqa-tied"], out, quantize="int8", block_size=32)
    _steps_and_rounds(out, 1)


def test_wider_blocks_step_two_positions_wide_and_stay_invariant(int8_export):
    """onnxruntime's one-row MatMulNBits kernel rounds otherwise with blocks over 32 (the
    int8 / int4 default of 128): such bundles keep even-width calls."""
    _steps_and_rounds(int8_export, 1, expect=2)


def test_without_the_pad_a_lone_rows_attention_takes_another_path(tmp_path, monkeypatch):
    """The power control: a graph exported without `lone_row_pad` does part from its verify
    rounds here, so the tests above can fail."""
    from functools import partial

    from edgespec.export import builder, sink
    from tests.gguf_files import write_gguf

    write_gguf(tmp_path / "m.gguf", "llama", "Q4_1")
    monkeypatch.setattr(sink, "GraphBuilder", partial(builder.GraphBuilder, pad_lone_rows=False))
    export_bundle(tmp_path / "m.gguf", tmp_path / "b")
    with pytest.raises(AssertionError, match="differs"):
        _steps_and_rounds(tmp_path / "b", 1, step_width=1)  # asked for: not settled


def test_no_graph_takes_4_bit_zero_points(checkpoints, tmp_path):
    """onnxruntime's AVX2 one-row int8 kernel for 4-bit blocks with zero points is reported
    wrong on CPUs without AVX-512 (onnxruntime #29853): no graph edgespec writes runs it. The
    file's 4-bit blocks and `--quantize int4`'s asymmetric ones are held around the op's
    default zero point 8, what their zero points leave added as a centre term."""
    import onnx

    export_bundle(checkpoints["llama-gqa-tied"], tmp_path / "b", quantize="int4")
    models = [onnx.load(str(tmp_path / "b" / "full.onnx"), load_external_data=False)]
    for kind in ("Q4_1", "Q4_K", "Q2_K", "Q3_K"):
        (tmp_path / kind).mkdir()
        _layer_session(kind, tmp_path / kind, 1)
        models.append(onnx.load(str(tmp_path / kind / "m.onnx"), load_external_data=False))
    nbits = [n for m in models for n in m.graph.node if n.op_type == "MatMulNBits"]
    assert len(nbits) > 4
    for node in nbits:
        bits = next(a.i for a in node.attribute if a.name == "bits")
        assert bits == 8 or len(node.input) < 4 or not node.input[3], node.name
