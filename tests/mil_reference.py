"""A slow, obviously-correct numpy interpreter of the MIL ops edgespec's Core ML export uses.

Core ML cannot run predictions on Linux, so the tests check the ML programs that
edgespec/export/coreml.py builds (before ct.convert lowers them to fp16) by evaluating them
op by op here, with Core ML states as numpy arrays updated in place. It is a test oracle
for the program's logic (masking, state writes, rotary, GQA grouping, the RMSNorm identity),
not a stand-in for Core ML's own kernels.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def _layer_norm(x, axes, gamma=None, beta=None, epsilon=1e-5):
    axes = tuple(int(a) for a in np.atleast_1d(axes))
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    y = (x - mean) / np.sqrt(var + epsilon)
    return y * (1 if gamma is None else gamma) + (0 if beta is None else beta)


def _slice_update(x, update, begin, end, **_):
    out = x.copy()
    out[tuple(slice(int(b), int(e)) for b, e in zip(begin, end, strict=True))] = update
    return out


def _matmul(x, y, transpose_x=False, transpose_y=False):
    if transpose_x:
        x = np.swapaxes(x, -1, -2)
    if transpose_y:
        y = np.swapaxes(y, -1, -2)
    return x @ y


def _softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


CASTS = {"fp16": np.float16, "fp32": np.float32, "int32": np.int32}
OPS: dict[str, Any] = {
    "gather": lambda x, indices, axis=0, **_: np.take(x, indices, axis=int(axis)),
    "add": lambda x, y: x + y,
    "sub": lambda x, y: x - y,
    "mul": lambda x, y: x * y,
    "concat": lambda values, axis, interleave=False: np.concatenate(values, axis=int(axis)),
    "split": lambda x, split_sizes, axis: np.split(x, np.cumsum(split_sizes)[:-1], int(axis)),
    "reshape": lambda x, shape: x.reshape([int(d) for d in shape]),
    "transpose": lambda x, perm: x.transpose([int(p) for p in perm]),
    "tile": lambda x, reps: np.tile(x, [int(r) for r in reps]),
    "layer_norm": _layer_norm,
    "linear": lambda x, weight, bias=None: x @ weight.T + (0 if bias is None else bias),
    "matmul": _matmul,
    "softmax": lambda x, axis: _softmax(x, int(axis)),
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "tanh": lambda x: np.tanh(x),
    "real_div": lambda x, y: x / y,
    "greater_equal": lambda x, y: x >= y,
    "select": lambda cond, a, b: np.where(cond, a, b),
    "gelu": lambda x, mode: _gelu_tanh(x),
    "cast": lambda x, dtype: x.astype(CASTS[str(dtype)]),
    "identity": lambda x: x,
    "slice_update": _slice_update,
}


def run_program(
    prog: Any, inputs: dict[str, np.ndarray], states: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Evaluate `prog`'s main function; `states` (name -> array) are updated in place."""
    func = prog.functions["main"]
    env: dict[str, Any] = dict(inputs)

    def value(v: Any) -> Any:
        if isinstance(v, list | tuple):
            return [value(x) for x in v]
        if v.name in env:
            return env[v.name]
        assert v.val is not None, f"no value for {v.name}"
        return np.asarray(v.val) if not isinstance(v.val, str) else v.val

    for op in func.operations:
        if op.op_type == "const":
            env[op.outputs[0].name] = op.outputs[0].val
            continue
        if op.op_type == "read_state":
            env[op.outputs[0].name] = states[op.inputs["input"].name].copy()
            continue
        if op.op_type == "coreml_update_state":
            states[op.inputs["state"].name][...] = value(op.inputs["value"])
            env[op.outputs[0].name] = states[op.inputs["state"].name]
            continue
        args = {k: value(v) for k, v in op.inputs.items()}
        result = OPS[op.op_type](**args)
        outs = result if isinstance(result, list) else [result]
        for var, r in zip(op.outputs, outs, strict=True):
            env[var.name] = r
    return {v.name: env[v.name] for v in func.outputs}
