"""Core ML export: ML programs built straight from `DecoderWeights` with coremltools' MIL
builder — no torch tracing of the Hugging Face model, so no torch/coremltools version pairing.

Each role (full, head@k, tail@k, draft) becomes one `.mlpackage`: an ML program for iOS 18 /
macOS 15 (the first targets with Core ML states), fp16 compute, fixed shapes (W new
positions per call, C + W cache slots) so the Neural Engine can run it, and the KV cache
held inside the model as states that it updates in place:

  inputs   input_ids [1, W] int32 (tail@k: hidden [1, W, H] float32)
           position_ids [1, W] int32
           attention_mask [1, 1, W, C + W] float32, additive over cache *slots* after this
                                          call's write (row i attends slots < offset + i + 1)
           write_offset [1] int32         the cache length before the call: the W new
                                          keys/values go to slots [offset, offset + W)
  states   key_cache_{i}, value_cache_{i} [1, kv_heads, C + W, head_dim] float16
  outputs  logits [1, W, vocab] float32 (head@k: exit_logits, and hidden [1, W, H])

C + W slots let any cache length up to C take a full padded write of W. RMSNorm is the
LayerNorm of [x, -x] (mean 0, so it equals RMSNorm), which stays in range in fp16 where
a plain sum of squares overflows. Guarantees: conversion succeeds and the saved packages'
input/output/state specs are what the manifest records (tested). Numerics are NOT checked
here: Core ML predictions need macOS, and this module was built and tested on Linux.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edgespec.bundle import CoreMLPackage, TensorSpec
from edgespec.export.decoder import DecoderWeights, LayerWeights, Norm
from edgespec.export.static import MASKED, StaticShape

__all__ = ["MASKED", "build_program", "package_specs", "write_coreml_package"]


def _roles_layers(role: str, n: int) -> tuple[str, int, int]:
    kind, _, k = role.partition("@")
    first, last = (int(k), n) if kind == "tail" else (0, int(k) if kind == "head" else n)
    return kind, first, last


def write_coreml_package(
    weights: DecoderWeights, role: str, model: str, out: Path, shape: StaticShape
) -> CoreMLPackage:
    """Convert `role` to `coreml_{role}.mlpackage` in `out`; its manifest entry."""
    import coremltools as ct

    prog = build_program(weights, role, shape)
    mlmodel = ct.convert(
        prog,
        convert_to="mlprogram",
        minimum_deployment_target=ct.target.iOS18,
        compute_precision=ct.precision.FLOAT16,
        skip_model_load=True,  # Linux cannot load Core ML models; macOS loads at run time
    )
    path = "coreml_" + role.replace("@", "_at_") + ".mlpackage"
    mlmodel.save(str(out / path))
    _, first, last = _roles_layers(role, len(weights.layers))
    inputs, outputs, states = package_specs(out / path)
    return CoreMLPackage(
        role=role,
        path=path,
        model=model,
        kv_layers=list(range(first, last)),
        inputs=inputs,
        outputs=outputs,
        states=states,
    )


def package_specs(path: Path) -> tuple[list[TensorSpec], list[TensorSpec], list[TensorSpec]]:
    """(inputs, outputs, states) as the saved package's model description declares them."""
    import coremltools as ct

    desc = ct.utils.load_spec(str(path)).description
    names = {65568: "float32", 65552: "float16", 131104: "int32"}

    def spec(feature: Any, kind: str) -> TensorSpec:
        arr = feature.type.stateType.arrayType if kind == "state" else feature.type.multiArrayType
        return TensorSpec(feature.name, names[arr.dataType], [int(d) for d in arr.shape])

    return (
        [spec(f, "input") for f in desc.input],
        [spec(f, "output") for f in desc.output],
        [spec(f, "state") for f in desc.state],
    )


def build_program(w: DecoderWeights, role: str, shape: StaticShape) -> Any:
    """The MIL program of `role` in fp32, before conversion (fp16 is applied by ct.convert)."""
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import Function, Program, types

    kind, first, last = _roles_layers(role, len(w.layers))
    c, width = shape.max_context, shape.verify_width
    a = w.attn
    hidden_size = w.embed.shape[1]
    slots = c + width
    specs: dict[str, Any] = {}
    if kind == "tail":
        specs["hidden"] = mb.placeholder(shape=(1, width, hidden_size), dtype=types.fp32)
    else:
        specs["input_ids"] = mb.placeholder(shape=(1, width), dtype=types.int32)
    specs["position_ids"] = mb.placeholder(shape=(1, width), dtype=types.int32)
    specs["attention_mask"] = mb.placeholder(shape=(1, 1, width, slots), dtype=types.fp32)
    specs["write_offset"] = mb.placeholder(shape=(1,), dtype=types.int32)
    for i in range(first, last):
        for name in (f"key_cache_{i}", f"value_cache_{i}"):
            specs[name] = mb.state_tensor_placeholder(
                shape=(1, a.num_kv_heads, slots, a.head_dim), dtype=types.fp16
            )

    with Function(specs, opset_version=ct.target.iOS18) as func:
        ins = func.inputs
        pos = ins["position_ids"]
        if kind == "tail":
            x = ins["hidden"]
        else:
            x = mb.gather(x=_f32(w.embed), indices=ins["input_ids"], axis=0)
            if w.embed_scale != 1.0:
                x = mb.mul(x=x, y=np.float32(w.embed_scale))
            if w.pos_embed is not None:
                x = mb.add(x=x, y=mb.gather(x=_f32(w.pos_embed), indices=pos, axis=0))
        layers = w.layers[first:last]
        rotary = {
            name: tuple(
                mb.reshape(
                    x=mb.gather(x=_f32(t), indices=pos, axis=0),
                    shape=[1, width, 1, t.shape[1]],
                )
                for t in tables
            )
            for name, tables in (("global", w.rotary), ("local", w.rotary_local))
            if tables is not None and any(lw.rope == name for lw in layers)
        }
        group = a.num_heads // a.num_kv_heads
        masks = {
            window: mb.tile(x=_window_mask(mb, ins["attention_mask"], pos, window, shape),
                            reps=[1, 1, group, 1])
            for window in {lw.window for lw in layers}
        }  # fmt: skip
        for i in range(first, last):
            lw = w.layers[i]
            h = _norm(mb, x, lw.attn_norm) if lw.attn_norm is not None else x
            states = (ins[f"key_cache_{i}"], ins[f"value_cache_{i}"])
            rope = rotary.get(lw.rope) if lw.rope is not None else None
            att = _attention(
                mb, types, h, lw, w, shape, masks[lw.window], rope, states, ins["write_offset"]
            )
            att = _linear(mb, att, lw.o_w, lw.o_b)
            if lw.post_attn_norm is not None:
                att = _norm(mb, att, lw.post_attn_norm)
            x = mb.add(x=x, y=att)
            h = _norm(mb, x, lw.mlp_norm) if lw.mlp_norm is not None else x
            m = _mlp(mb, h, lw, w.activation)
            if lw.post_mlp_norm is not None:
                m = _norm(mb, m, lw.post_mlp_norm)
            x = mb.add(x=x, y=m)
        outputs = []
        if kind == "head":
            outputs.append(mb.identity(x=x, name="hidden"))
        h = _norm(mb, x, w.final_norm)
        logits = _linear(mb, h, w.lm_head.T, w.lm_head_b)
        if w.final_softcap is not None:
            logits = _softcap(mb, logits, w.final_softcap)
        outputs.append(mb.identity(x=logits, name="exit_logits" if kind == "head" else "logits"))
        func.set_outputs(outputs)
    prog = Program()
    prog.add_function("main", func)
    return prog


def _f32(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array, dtype=np.float32)


def _linear(mb: Any, x: Any, weight: np.ndarray, bias: np.ndarray | None) -> Any:
    """x @ weight (+ bias), weight stored [in, out] as in DecoderWeights."""
    b = _f32(bias) if bias is not None else np.zeros(weight.shape[1], np.float32)
    return mb.linear(x=x, weight=_f32(weight.T), bias=b)


def _norm(mb: Any, x: Any, norm: Norm) -> Any:
    if norm.beta is not None:
        return mb.layer_norm(
            x=x, axes=[-1], gamma=_f32(norm.gamma), beta=_f32(norm.beta), epsilon=norm.eps
        )
    # RMSNorm(x) = LayerNorm([x, -x])[:H]: the doubled vector has mean 0 and the same mean
    # square, and Core ML's layer_norm is safe in fp16 where sum(x^2) overflows
    size = norm.gamma.shape[0]
    both = mb.concat(values=[x, mb.mul(x=x, y=np.float32(-1.0))], axis=-1)
    normed = mb.layer_norm(x=both, axes=[-1], epsilon=norm.eps)
    first, _ = mb.split(x=normed, split_sizes=[size, size], axis=-1)
    return mb.mul(x=first, y=_f32(norm.gamma))


def _rope(mb: Any, x: Any, rotary: tuple[Any, Any], half: int, head_dim: int) -> Any:
    """Rotate the first 2 * half dims of each head; the rest (partial rotary) pass through."""
    cos, sin = rotary
    rest = head_dim - 2 * half
    x1, x2, *tail = mb.split(x=x, split_sizes=[half, half] + ([rest] if rest else []), axis=-1)
    first = mb.sub(x=mb.mul(x=x1, y=cos), y=mb.mul(x=x2, y=sin))
    second = mb.add(x=mb.mul(x=x2, y=cos), y=mb.mul(x=x1, y=sin))
    return mb.concat(values=[first, second, *tail], axis=-1)


def _softcap(mb: Any, x: Any, cap: float) -> Any:
    return mb.mul(x=mb.tanh(x=mb.real_div(x=x, y=np.float32(cap))), y=np.float32(cap))


def _window_mask(mb: Any, mask: Any, pos: Any, window: int | None, shape: StaticShape) -> Any:
    """The runtime's mask over cache slots, plus MASKED on slots `window` or more positions
    before the query (slot j holds position j)."""
    if window is None:
        return mask
    slots = shape.max_context + shape.verify_width
    q = mb.reshape(x=mb.cast(x=pos, dtype="fp32"), shape=[1, 1, shape.verify_width, 1])
    k = np.arange(slots, dtype=np.float32).reshape(1, 1, 1, slots)
    far = mb.greater_equal(x=mb.sub(x=q, y=k), y=np.float32(window))
    extra = mb.select(cond=far, a=np.float32(MASKED), b=np.float32(0.0))
    return mb.add(x=mask, y=extra)


def _head_norm(mb: Any, t: Any, norm: Norm | None, heads: int, hd: int, width: int) -> Any:
    """q or k [1, W, heads, hd] after its RMSNorm: per head, or over the whole projection."""
    if norm is None:
        return t
    if norm.gamma.shape[0] == hd:
        return _norm(mb, t, norm)
    flat = _norm(mb, mb.reshape(x=t, shape=[1, width, heads * hd]), norm)
    return mb.reshape(x=flat, shape=[1, width, heads, hd])


def _attention(
    mb: Any,
    types: Any,
    h: Any,
    lw: LayerWeights,
    w: DecoderWeights,
    shape: StaticShape,
    mask: Any,
    rotary: tuple[Any, Any] | None,
    states: tuple[Any, Any],
    offset: Any,
) -> Any:
    a = w.attn
    heads, kv, hd, width = a.num_heads, a.num_kv_heads, a.head_dim, shape.verify_width
    group = heads // kv
    qkv = _linear(mb, h, lw.qkv_w, lw.qkv_b)
    q, k, v = mb.split(x=qkv, split_sizes=[heads * hd, kv * hd, kv * hd], axis=-1)
    q = mb.reshape(x=q, shape=[1, width, heads, hd])
    k = mb.reshape(x=k, shape=[1, width, kv, hd])
    v = mb.reshape(x=v, shape=[1, width, kv, hd])
    q = _head_norm(mb, q, lw.q_norm, heads, hd, width)
    k = _head_norm(mb, k, lw.k_norm, kv, hd, width)
    if rotary is not None:
        half = (w.rotary_local if lw.rope == "local" else w.rotary)[0].shape[1]  # type: ignore[index]
        q, k = _rope(mb, q, rotary, half, hd), _rope(mb, k, rotary, half, hd)
    # write the W new keys/values into the state at [offset, offset + W), then read it all
    zero = np.array([0], np.int32)
    begin = mb.concat(values=[zero, zero, offset, zero], axis=0)
    end = mb.concat(
        values=[
            np.array([1, kv], np.int32),
            mb.add(x=offset, y=np.int32(width)),
            np.array([hd], np.int32),
        ],
        axis=0,
    )
    cached = []
    for state, new in zip(states, (k, v), strict=True):
        new = mb.cast(x=mb.transpose(x=new, perm=[0, 2, 1, 3]), dtype="fp16")
        updated = mb.slice_update(x=mb.read_state(input=state), update=new, begin=begin, end=end)
        mb.coreml_update_state(state=state, value=updated)
        cached.append(mb.cast(x=mb.read_state(input=state), dtype="fp32"))
    keys, values = cached
    # query heads of one KV head side by side (GQA without repeating the cache)
    q = mb.reshape(x=mb.transpose(x=q, perm=[0, 2, 1, 3]), shape=[1, kv, group * width, hd])
    scale = a.scale if a.scale is not None else hd**-0.5
    scores = mb.matmul(x=mb.mul(x=q, y=np.float32(scale)), y=keys, transpose_y=True)
    if a.softcap is not None:
        scores = _softcap(mb, scores, a.softcap)
    probs = mb.softmax(x=mb.add(x=scores, y=mask), axis=-1)
    out = mb.reshape(x=mb.matmul(x=probs, y=values), shape=[1, heads, width, hd])
    out = mb.transpose(x=out, perm=[0, 2, 1, 3])
    return mb.reshape(x=out, shape=[1, width, heads * hd])


def _mlp(mb: Any, h: Any, lw: LayerWeights, activation: str) -> Any:
    up = _linear(mb, h, lw.up_w, lw.up_b)
    if activation == "silu":
        inter = lw.down_w.shape[0]
        gate, up = mb.split(x=up, split_sizes=[inter, inter], axis=-1)
        inner = mb.mul(x=mb.mul(x=gate, y=mb.sigmoid(x=gate)), y=up)
    elif activation == "gelu_tanh":
        inner = mb.gelu(x=up, mode="TANH_APPROXIMATION")
    elif activation == "gelu_tanh_gated":
        inter = lw.down_w.shape[0]
        gate, up = mb.split(x=up, split_sizes=[inter, inter], axis=-1)
        inner = mb.mul(x=mb.gelu(x=gate, mode="TANH_APPROXIMATION"), y=up)
    else:
        raise ValueError(f"unknown activation {activation}")
    return _linear(mb, inner, lw.down_w, lw.down_b)
