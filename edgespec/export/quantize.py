"""Weight quantization at export: what `--quantize` asked for, and static QDQ int8.

* `int8` / `int4`: block-wise weights for the `MatMulNBits` contrib op (com.microsoft), laid
  out by `export/nbits.py`. `accuracy_level` 4 (default) lets the CPU kernel quantize the
  activations to int8 per row and block; 0 computes in float on the dequantized weights.
  Both keep every row's result independent of the other rows in the call, which lossless
  speculative decoding needs: verifying γ+1 positions at once must give each position the
  logits a one-token step gives it. (`DynamicQuantizeMatMul`, used for int8 before, scales
  the activations per call over all rows, so a verify call changed the target's logits and
  speculative modes diverged from `ar` on int8 bundles.)
* `qdq-int8`: static QDQ int8 (what NPUs run): the fp32 graph is built first, then
  `onnxruntime.quantization.quantize_static` inserts QuantizeLinear/DequantizeLinear pairs
  around every MatMul (the LM head too, built as a MatMul: OpenVINO rejects a QDQ Gemm and
  Reshape of the float head when no logits are kept), with activation ranges calibrated by
  running real prompt ids through the graph; the quantized weights then go to the bundle's
  shared weights file like every other tensor. The contrib ops (GroupQueryAttention, fused
  norms) stay float.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from edgespec.export.feeds import prefill_feed, proto_inputs
from edgespec.export.nbits import BLOCK_SIZES, WEIGHT_ONLY, embedding_format

QUANTIZATIONS = ("int8", "int4", "qdq-int8")
# Calibration text for qdq-int8 when the caller gives none: a little code and prose, so the
# ranges cover the token mix an on-device assistant sees.
CALIBRATION_PROMPTS = (
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fib",
    "The quick brown fox jumps over the lazy dog. Once upon a time, in a small village,",
    "import numpy as np\n\nclass Buffer:\n    def __init__(self, size: int) -> None:\n",
    "Question: what is the capital of France?\nAnswer: The capital of France is Paris, which",
    "for i in range(10):\n    print(i, i * i)\n# Summing a list of numbers in Python: total =",
    "In 1969, the Apollo 11 mission landed the first humans on the Moon. Neil Armstrong said",
)


@dataclass(frozen=True)
class QuantConfig:
    """What `--quantize` asked for, and how (recorded in the manifest's extra)."""

    method: str  # one of QUANTIZATIONS
    block_size: int | None = None  # int8/int4; None: the method's default (WEIGHT_ONLY)
    accuracy_level: int = 4  # int8/int4: 0 = float compute, 4 = int8 activations (fastest)
    calibration_prompts: tuple[str, ...] = CALIBRATION_PROMPTS  # qdq-int8

    def __post_init__(self) -> None:
        if self.method not in QUANTIZATIONS:
            raise ValueError(
                f"--quantize {self.method!r} is not supported; choose one of "
                f"{', '.join(QUANTIZATIONS)} (or leave it out for float weights)"
            )
        if self.block_size is None and self.method in WEIGHT_ONLY:
            object.__setattr__(self, "block_size", WEIGHT_ONLY[self.method].block_size)
        if self.method in WEIGHT_ONLY and self.block_size not in BLOCK_SIZES:
            raise ValueError(
                f"block size {self.block_size} is not supported; choose one of "
                f"{', '.join(map(str, BLOCK_SIZES))}"
            )
        if self.accuracy_level not in (0, 1, 2, 3, 4):
            raise ValueError(f"accuracy level must be 0..4, got {self.accuracy_level}")
        if self.method == "qdq-int8" and not any(p.strip() for p in self.calibration_prompts):
            raise ValueError("qdq-int8 needs at least one non-empty calibration prompt")

    def describe(self) -> dict:
        if self.method in WEIGHT_ONLY:
            f = WEIGHT_ONLY[self.method]
            return {
                "method": self.method,
                "op": "MatMulNBits",
                "bits": f.bits,
                "block_size": self.block_size,
                "accuracy_level": self.accuracy_level,
                "weights": ("asymmetric" if f.zero_points else "symmetric") + " per block",
                # each matrix: the largest supported block <= block_size that divides its K
                "blocks": "largest dividing K",
                "embedding_bits": embedding_format(self.method).bits,
            }
        return {
            "method": "qdq-int8",
            "ops": ["MatMul"],
            "weights": "int8 symmetric per channel",
            "activations": "uint8 per tensor, MinMax-calibrated",
            "calibration_prompts": len(self.calibration_prompts),
        }


# -- qdq-int8 (static, calibrated) ----------------------------------------------------------
def calibration_feeds(
    model: onnx.ModelProto,
    prompts: Sequence[Sequence[int]],
    hidden: Sequence[np.ndarray] | None = None,
) -> list[dict[str, np.ndarray]]:
    """One prefill feed per prompt for a bundle graph: its ids, or for tail@k the hidden
    states head@k computed from them (`hidden`, one [1, S, H] array per prompt)."""
    inputs = proto_inputs(model)  # a tail graph without `hidden`: prefill_feed says so
    return [
        prefill_feed(inputs, ids, hidden[n] if hidden is not None else None)
        for n, ids in enumerate(prompts)
    ]


def qdq_quantize(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> onnx.ModelProto:
    """Static QDQ int8 of `model` (weights in memory), calibrated on `feeds`.

    Runs in a child process: onnxruntime's calibrator opens sessions with per-session thread
    pools, which onnxruntime refuses once a process has the global pool that the edgespec
    runtime (and the export check) set up."""
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "float.onnx", Path(tmp) / "qdq.onnx"
        save_copy(model, src)
        np.savez(
            Path(tmp) / "feeds.npz",
            **{f"{i}/{k}": v for i, f in enumerate(feeds) for k, v in f.items()},
        )
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        cmd = [sys.executable, "-m", "edgespec.export.quantize", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise RuntimeError(f"qdq-int8 quantization failed:\n{done.stderr[-2000:]}")
        return onnx.load(str(dst))  # loads the external data into memory


def _quantize_static_in(folder: Path) -> None:
    """The child process of `qdq_quantize`: float.onnx + feeds.npz -> qdq.onnx."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    stored = np.load(folder / "feeds.npz")
    feeds: dict[int, dict[str, np.ndarray]] = {}
    for key in stored.files:
        i, name = key.split("/", 1)
        feeds.setdefault(int(i), {})[name] = stored[key]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.rest = iter(feeds[i] for i in sorted(feeds))

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.rest, None)

    # symbolic shape inference types the contrib ops' outputs (GroupQueryAttention, fused
    # norms); without it the quantizer cannot tell their outputs are float and leaves the
    # MatMuls after them with float activations
    quant_pre_process(
        str(folder / "float.onnx"),
        str(folder / "typed.onnx"),
        skip_optimization=True,
        save_as_external_data=True,
        external_data_location="typed.bin",
    )
    quantize_static(
        str(folder / "typed.onnx"),
        str(folder / "qdq.onnx"),
        Reader(),
        quant_format=QuantFormat.QDQ,
        op_types_to_quantize=["MatMul"],
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        calibrate_method=CalibrationMethod.MinMax,
        use_external_data_format=True,
        extra_options={"WeightSymmetric": True, "ActivationSymmetric": False},
    )


class QdqCalibration:
    """Quantizes a bundle's float graphs one by one, in export order (full, then head@k
    before tail@k, whose calibration input is head@k's hidden states on the same prompts).

    head@k + tail@k must compute exactly what full computes (self-spec verifies with them),
    but calibrating them separately gives ranges a float rounding apart, and one flipped
    activation rounding changes the logits; so their activation scales and zero points are
    copied from full's for the layers they share (checked to agree to 1e-3 first)."""

    def __init__(self, prompt_ids: list[list[int]]) -> None:
        self.prompt_ids = prompt_ids
        self.hidden: dict[str, list[np.ndarray]] = {}
        self.full: list[tuple[np.ndarray, np.ndarray]] | None = None  # full's (scale, zero)

    def quantize(self, model: onnx.ModelProto, role: str) -> onnx.ModelProto:
        kind, _, k = role.partition("@")
        hidden = self.hidden.get(k) if kind == "tail" else None
        feeds = calibration_feeds(model, self.prompt_ids, hidden)
        if kind == "head":
            self.hidden[k] = run_output(model, feeds, "hidden")
        quantized = qdq_quantize(model, feeds)
        if role == "full":
            self.full = [(_array(s), _array(z)) for s, z in activation_qparams(quantized)]
        elif kind in ("head", "tail") and self.full is not None:
            own = activation_qparams(quantized)
            # head@k: its layers are full's first ones (its exit head keeps its own ranges);
            # tail@k: its layers and final head are full's last ones
            tail = self.full[-len(own) :]
            pairs = (
                zip(own[:-2], self.full, strict=False)
                if kind == "head"
                else zip(own, tail, strict=True)
            )
            for (scale, zero), (full_scale, full_zero) in pairs:
                if not np.allclose(_array(scale), full_scale, rtol=1e-3):
                    raise RuntimeError(f"qdq-int8: {role}'s activation ranges do not match full's")
                scale.CopyFrom(onnx.numpy_helper.from_array(full_scale, scale.name))
                zero.CopyFrom(onnx.numpy_helper.from_array(full_zero, zero.name))
        return quantized


def activation_qparams(model: onnx.ModelProto) -> list[tuple[onnx.TensorProto, onnx.TensorProto]]:
    """The (scale, zero point) initializers of every QuantizeLinear, in node order."""
    inits = {i.name: i for i in model.graph.initializer}
    return [
        (inits[n.input[1]], inits[n.input[2]])
        for n in model.graph.node
        if n.op_type == "QuantizeLinear"
    ]


def _array(t: onnx.TensorProto) -> np.ndarray:
    return onnx.numpy_helper.to_array(t).copy()


def run_output(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]], name: str) -> list:
    import onnxruntime as ort

    from edgespec.runtime.graphs.session import session_options

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.onnx"
        save_copy(model, path)
        sess = ort.InferenceSession(str(path), session_options(None), ["CPUExecutionProvider"])
        return [sess.run([name], f)[0] for f in feeds]


def save_copy(model: onnx.ModelProto, path: Path) -> None:
    """Save with external data next to `path`, leaving `model` itself in memory (onnx.save
    rewrites the tensors it externalizes in place)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    onnx.save(copy, str(path), save_as_external_data=True, location=path.stem + ".bin")


def externalize(model: onnx.ModelProto, store, min_bytes: int = 1024) -> onnx.ModelProto:
    """Move `model`'s large initializers into the bundle's shared weights file (`store`)."""
    inits = model.graph.initializer
    for i, init in enumerate(inits):
        array = onnx.numpy_helper.to_array(init)
        if array.nbytes >= min_bytes:
            inits[i].CopyFrom(store.tensor(init.name, array))
    return model


if __name__ == "__main__":
    _quantize_static_in(Path(sys.argv[1]))
