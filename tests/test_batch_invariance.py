"""A row's logits do not depend on how many positions share its call: one-token steps and a
verify round of the same tokens give the same bits, so every mode's greedy output is `ar`'s on
the fast path (int8 activations) without padding one-token steps to two positions.

What makes it so (export/builder.py): MatMulNBits quantizes activations per row and block of
32, so its rows do not see each other; GroupQueryAttention takes another path for a
one-position call than for wider ones, so a graph runs a one-position call's attention as two
positions (`lone_row_pad`). Checked here bit for bit, per block format: a 1-row call against the
same row inside calls of 2..16 rows, for one MatMulNBits layer of every held GGUF block format,
and for whole models (GGUF imports of Q4_0, Q4_1, Q8_0 and F16 blocks, `--quantize int8` exports)
through the runtime's own stack after a prompt in the cache. With blocks over 32 onnxruntime's
one-row MatMulNBits kernel rounds otherwise: such bundles keep `step_width` 2.
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
MODEL_FORMATS = ("Q4_0", "Q4_1", "Q8_0", "F16")


def _layer_session(kind: str, tmp_path, threads: int):
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto
    from test_gguf_import import _raw_blocks

    from edgespec.export.builder import GraphBuilder, WeightStore
    from edgespec.export.gguf_blocks import pack
    from edgespec.runtime.graph import session_options

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


@pytest.mark.parametrize("threads", (1, 2))
@pytest.mark.parametrize("kind", LAYER_FORMATS)
def test_a_held_block_layers_row_is_the_same_alone_and_among_16(kind, threads, tmp_path):
    sess, k = _layer_session(kind, tmp_path, threads)
    x = np.random.default_rng(4).standard_normal((1, 16, k)).astype(np.float32)
    x[..., ::9] *= 6  # outliers, as real activations have
    alone = [sess.run(None, {"x": x[:, i : i + 1]})[0][0, 0] for i in range(16)]
    for width in WIDTHS:
        rows = sess.run(None, {"x": x[:, :width]})[0][0]
        for i in range(width):
            assert np.array_equal(rows[i], alone[i]), f"{kind}: row {i} of {width} differs"


def _steps_and_rounds(folder, threads: int, step_width: int = 1) -> None:
    target = edgespec.load(folder, mode="ar", threads=threads).target
    assert target.step_width == step_width  # 1: no padded one-token steps
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


@pytest.fixture(scope="module", params=MODEL_FORMATS)
def gguf_bundle(request, tmp_path_factory):
    from tests.gguf_files import write_gguf

    root = tmp_path_factory.mktemp(f"inv-{request.param}")
    write_gguf(root / "m.gguf", "llama", request.param)
    export_bundle(root / "m.gguf", root / "b")
    return root / "b"


@pytest.mark.parametrize("threads", (1, 2))
def test_one_token_steps_give_a_verify_rounds_rows_bit_for_bit(gguf_bundle, threads):
    _steps_and_rounds(gguf_bundle, threads)


def test_an_int8_export_at_blocks_of_32_steps_one_position_wide(checkpoints, tmp_path):
    out = tmp_path / "b"
    export_bundle(checkpoints["llama-gqa-tied"], out, quantize="int8", block_size=32)
    _steps_and_rounds(out, 1)


def test_wider_blocks_step_two_positions_wide_and_stay_invariant(int8_export):
    """onnxruntime's one-row MatMulNBits kernel rounds otherwise with blocks over 32 (the
    int8 / int4 default of 128): such bundles keep even-width calls."""
    _steps_and_rounds(int8_export, 1, step_width=2)


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
        _steps_and_rounds(tmp_path / "b", 1)
