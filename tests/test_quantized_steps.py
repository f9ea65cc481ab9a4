"""Bundles whose activations are quantized decode the same tokens in every mode.

With int8 activations (MatMulNBits at accuracy level 4) a one-token step and a verify round of
the same tokens used to give different logits: onnxruntime's kernels take another path for a
lone row, which rounds differently by float noise, and int8 activation rounding magnifies that
into whole logits, so prompt lookup left `ar`'s text. Bundles whose blocks are of 32 or 16 (the
GGUF block formats) pad a one-position call's attention in the graph and step one position
wide (tests/test_batch_invariance.py); wider blocks (the int8 / int4 default) record
`step_width` 2 and every target call runs an even number of positions (runtime/graphs/stack.py),
whose rows are bitwise the same whatever the width. Either way every mode's greedy output is
`ar`'s.
"""

from __future__ import annotations

import numpy as np
import pytest

import edgespec
from edgespec.bundle import _from_json, load_manifest
from edgespec.export import export_bundle

gguf = pytest.importorskip("gguf")


MODES = [
    ("lookup", {"draft_policy": "fixed:4"}),
    ("self-spec", {"draft_policy": "fixed:3"}),
    ("self-spec", {"draft_policy": "fixed:1"}),
]


def _prompts(folder, n: int = 12) -> list[list[int]]:
    rng = np.random.default_rng(1)
    vocab = load_manifest(folder).target.vocab_size
    # a repeated stretch gives prompt lookup something to draft from
    return [[*(p := list(rng.integers(3, vocab, 8))), *p[:5]] for _ in range(n)]


def _decode(folder, prompts, mode: str = "ar", **options) -> list[list[int]]:
    model = edgespec.load(folder, mode=mode, **options)
    return [model.generate(p, max_new_tokens=32, ignore_eos=True).tokens for p in prompts]


def test_held_blocks_step_one_position_wide_and_wide_int8_blocks_two(
    held_blocks, int8_export, tmp_path
):
    assert load_manifest(held_blocks).step_width == 1
    assert load_manifest(int8_export).step_width == 2
    float_compute = export_bundle(held_blocks.parent / "m.gguf", tmp_path / "f", accuracy_level=0)
    assert float_compute.step_width == 1


@pytest.mark.parametrize("mode,options", MODES, ids=lambda v: str(v))
def test_every_mode_of_held_int8_blocks_gives_ars_tokens(held_blocks, mode, options):
    prompts = _prompts(held_blocks)
    ar = _decode(held_blocks, prompts)
    assert _decode(held_blocks, prompts, mode, **options) == ar


@pytest.mark.parametrize("bundle", ["held_blocks", "int8_export"])
def test_one_position_calls_give_the_logits_a_verify_round_gives(bundle, request):
    """The guarantee under the modes: a prefill and one-token steps, and a prefill and
    rounds of several tokens (odd and even), give bitwise the same logits for every position."""
    folder = request.getfixturevalue(bundle)
    ids = np.array(_prompts(folder, 1)[0] * 2, np.int64)
    target = edgespec.load(folder).target
    target.reset(64)
    steps = [target.forward(ids[:1], keep=1)] + [target.forward(ids[i : i + 1]) for i in
                                                   range(1, len(ids))]  # fmt: skip
    target.reset(64)
    rounds = [target.forward(ids[:1], keep=1)] + [
        target.forward(ids[i : i + 3], keep=len(ids[i : i + 3])) for i in range(1, len(ids), 3)
    ]
    target.reset(64)
    pairs = [target.forward(ids[:2], keep=2)] + [
        target.forward(ids[i : i + 2], keep=len(ids[i : i + 2])) for i in range(2, len(ids), 2)
    ]
    assert np.array_equal(np.concatenate(steps), np.concatenate(rounds))
    assert np.array_equal(np.concatenate(steps), np.concatenate(pairs))


def test_a_bundle_from_before_the_field_steps_two_wide_when_quantized(held_blocks):
    """Bundles from before `step_width` have no lone-row pad in their graphs: two wide."""
    raw = load_manifest(held_blocks).to_json()
    assert raw.pop("step_width") == 1
    assert _from_json(raw).step_width == 2
    raw["extra"]["gguf"]["weights"] = {"float32: the file's exact dequantized values": 1}
    assert _from_json(raw).step_width == 1
    raw["quantization"] = "int4"
    assert _from_json(raw).step_width == 2
