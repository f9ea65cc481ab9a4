"""onnxruntime-web (wasm) given onnxruntime's native numerics for MatMulNBits with
`accuracy_level` 4 (`js/src/int8_activations.ts`).

Native onnxruntime (the Python runtime, onnxruntime-node) quantizes such a node's activations
to int8 per block (MLAS CompInt8); onnxruntime-web's wasm kernel multiplies the float
activations. One-node graphs (4- and 8-bit, blocks of 32 and 16, K a whole number of blocks
or not, opset 17 and 21) get activations built to land on the rounding's edges (values at
(k + 1/2) * amax / 127, a float ulp either side): the Python runtime's onnxruntime gives Y; in
Node, onnxruntime-web runs the graph as it is (Y differs: the test can fail) and with the
load-time edit (Y equal, bit for bit). The weights are one-hot, so Y is the dequantized
activations themselves and every element's rounding is checked; random weights check the
product. It skips without node (js/ needs Node >= 20).
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_js_conformance import JS, NODE, build_js  # noqa: E402

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

CASES = [  # bits, block, K, opset, one-hot weights
    (4, 32, 256, 21, True),
    (4, 16, 256, 17, True),
    (8, 32, 256, 21, True),
    (8, 16, 256, 17, True),
    (4, 32, 80, 21, True),  # K not a whole number of blocks: MLAS pads the last with zeros
    (4, 32, 576, 21, False),  # the real model's hidden size, random weights and zero points
]
M = 8


def graph(path: Path, bits: int, block: int, k: int, opset: int, one_hot: bool, rng) -> int:
    from onnx import TensorProto, helper, numpy_helper

    blocks = -(-k // block)
    n = k if one_hot else 64
    if one_hot:  # column j takes input j alone, times 1: Y = the kernel's view of A
        q = np.zeros((n, blocks * block), np.uint8)
        q[np.arange(n), np.arange(n)] = 1
        zero = np.zeros((n, blocks), np.uint8)
        scales = np.ones((n, blocks), np.float32)
    else:
        q = rng.integers(0, 2**bits, (n, blocks * block), dtype=np.uint8)
        zero = rng.integers(0, 2**bits, (n, blocks), dtype=np.uint8)
        scales = rng.uniform(0.001, 0.02, (n, blocks)).astype(np.float32)
    q = q.reshape(n, blocks, block)
    packed = q if bits == 8 else q[..., 0::2] | (q[..., 1::2] << 4)
    if bits == 4:
        zero = np.concatenate([zero, np.zeros((n, blocks % 2), np.uint8)], axis=1)
        zero = zero[:, 0::2] | (zero[:, 1::2] << 4)
    node = helper.make_node(
        "MatMulNBits", ["A", "B", "S", "Z"], ["Y"], domain="com.microsoft",
        K=k, N=n, bits=bits, block_size=block, accuracy_level=4,
    )  # fmt: skip
    inits = [numpy_helper.from_array(a, name) for a, name in
             [(packed, "B"), (scales.reshape(-1), "S"), (zero.reshape(-1), "Z")]]  # fmt: skip
    g = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [M, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [M, n])], inits,
    )  # fmt: skip
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)]
    onnx.save(helper.make_model(g, ir_version=9, opset_imports=opsets), path)
    return n


def edgy_activations(k: int, block: int, rng) -> np.ndarray:
    """Blocks whose values sit on (or an ulp off) the midpoints between int8 levels."""
    a = np.empty((M, k), np.float32)
    for m in range(M):
        for start in range(0, k, block):
            amax = np.float32(rng.uniform(0.01, 10))
            levels = rng.integers(-127, 127, block) + 0.5
            v = (levels * np.float64(amax) / 127).astype(np.float32)
            nudge = rng.integers(-1, 2, block)
            toward = np.where(nudge > 0, np.float32(np.inf), np.float32(-np.inf))
            v = np.where(nudge == 0, v, np.nextafter(v, toward))
            v[0] = amax * rng.choice([-1, 1])
            a[m, start:start + block] = v[: min(block, k - start)]  # fmt: skip
    a[0, :block] = 0  # a block of zeros: scale 0
    return a


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[tuple[np.ndarray, dict]]:
    build_js()
    root = tmp_path_factory.mktemp("int8")
    rng = np.random.default_rng(0)
    cases, expected = [], []
    for i, (bits, block, k, opset, one_hot) in enumerate(CASES):
        model, data = root / f"g{i}.onnx", root / f"a{i}.bin"
        graph(model, bits, block, k, opset, one_hot, rng)
        a = edgy_activations(k, block, rng)
        a.tofile(data)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
        expected.append(session.run(None, {"A": a})[0])
        cases.append({"model": str(model), "input": str(data), "dims": [M, k]})
    (root / "cases.json").write_text(json.dumps(cases))
    run = subprocess.run(
        [NODE, str(JS / "int8_check.mjs"), str(root / "cases.json"), str(root / "out.json")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return list(zip(expected, json.loads((root / "out.json").read_text()), strict=True))


def decode(b64: str, like: np.ndarray) -> np.ndarray:
    return np.frombuffer(base64.b64decode(b64), np.float32).reshape(like.shape)


def test_the_wasm_kernel_alone_computes_in_float(results):
    for (bits, block, k, _, one_hot), (native, web) in zip(CASES, results, strict=True):
        plain = decode(web["plain"], native)
        assert (plain != native).any(), (bits, block, k)
        if one_hot:  # wasm hands the float activations straight through
            assert (np.abs(plain - native) > 0).mean() > 0.5


def test_the_edited_graph_quantizes_as_native_does(results):
    for (bits, block, k, _, one_hot), (native, web) in zip(CASES, results, strict=True):
        edited = decode(web["edited"], native)
        if one_hot:  # every activation's int8 level and scale, bit for bit
            np.testing.assert_array_equal(edited, native, err_msg=f"{bits}-bit block {block} K {k}")
        else:  # the same products; only fp32 summation order differs
            np.testing.assert_allclose(edited, native, rtol=0, atol=1e-5 * np.abs(native).max())
            assert np.abs(decode(web["plain"], native) - native).max() > 100 * np.abs(edited - native).max()
