"""Checkpoints as users bring them: each family's transformers default configuration and the
config shapes of real hub checkpoints (tests/family_configs.py: DEFAULTS, HUB_SHAPES), exported
with a plain `export_bundle`, compute transformers' logits and decode its greedy output.

The hand-picked configs of test_families.py switch features on; these leave every field a
user's config.json may omit at the library's default (rope base and type, windows,
multipliers, layer types, tied heads), which is where a family table that reads the wrong
field, or reads none, goes wrong. A greedy mismatch is reported with transformers' top-2 logit
gap at the first difference: a real near-tie (a gap below float noise) is reported as such,
anything wider is a failure.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from family_configs import DEFAULT_SIZES, DEFAULTS, HUB_SHAPES

import edgespec
from edgespec.export import export_bundle

PROMPT = "def fill(text, width=70"
N_NEW = 24
NEAR_TIE = 1e-4  # a top-2 gap below this is float noise between two correct computations
CONFIGS = {f"default-{k}": (mt, dict(DEFAULT_SIZES, **v)) for k, (mt, v) in DEFAULTS.items()}
CONFIGS.update(HUB_SHAPES)


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """name -> (checkpoint, bundle), built once for the module (seed 0, plain export)."""
    from transformers import AutoConfig

    from edgespec.export.builtin import write_checkpoint

    root = tmp_path_factory.mktemp("family_defaults")
    out = {}
    for name, (model_type, dims) in CONFIGS.items():
        dims = dict(dims)
        default_tie = AutoConfig.for_model(model_type, pad_token_id=0).tie_word_embeddings
        tie = dims.pop("tie_word_embeddings", default_tie)
        ckpt = write_checkpoint(root / name, model_type, seed=0, tie=tie, **dims)
        export_bundle(ckpt, root / f"{name}.bundle")
        out[name] = (ckpt, root / f"{name}.bundle")
    return out


def _hf(ckpt: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(ckpt).eval()


def _logits(hf, ids) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.as_tensor(np.asarray(ids))[None]).logits[0].float().numpy()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_match_transformers_through_prefill_cached_steps_and_a_chunk(name, exported):
    ckpt, bundle = exported[name]
    ids = np.random.default_rng(3).integers(0, 2048, 48)
    target = edgespec.load(bundle).target
    target.reset(64)
    got = [target.forward(ids[:20], keep=20)]
    got += [target.forward(ids[i : i + 1], keep=1) for i in range(20, 40)]
    got.append(target.forward(ids[40:], keep=8))
    np.testing.assert_allclose(np.concatenate(got), _logits(_hf(ckpt), ids), atol=2e-4, rtol=1e-4)


def first_difference(got: list[int], ref: list[int], hf, prompt: list[int]) -> tuple[int, float]:
    """(index of the first differing token, transformers' top-2 logit gap there)."""
    i = next(i for i, (a, b) in enumerate(zip(got, ref, strict=False)) if a != b)
    top2 = np.sort(_logits(hf, prompt + ref[:i])[-1])[-2:]
    return i, float(top2[1] - top2[0])


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_24_tokens_equal_transformers_or_the_difference_is_a_reported_near_tie(
    name, exported
):
    from transformers import AutoTokenizer

    ckpt, bundle = exported[name]
    hf = _hf(ckpt)
    prompt = AutoTokenizer.from_pretrained(ckpt)(PROMPT)["input_ids"]
    with torch.no_grad():
        ref = hf.generate(
            torch.tensor([prompt]),
            max_new_tokens=N_NEW,
            min_new_tokens=N_NEW,
            do_sample=False,
            pad_token_id=0,
        )[0].tolist()[len(prompt) :]
    got = edgespec.load(bundle).generate(PROMPT, max_new_tokens=N_NEW, ignore_eos=True).tokens
    if got == ref:
        return
    i, gap = first_difference(got, ref, hf, prompt)
    if gap < NEAR_TIE:
        pytest.xfail(f"near-tie at token {i}: transformers' top-2 logit gap {gap:.2g}")
    pytest.fail(f"first difference at token {i}; transformers' top-2 gap there is {gap:.3g}")
