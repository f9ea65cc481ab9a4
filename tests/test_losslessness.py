"""Losslessness: `ar` decoding reproduces transformers' own greedy generation token for token."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import ARCHS, EXIT_LAYER

import edgespec

N_NEW = 40


def hf_greedy(hf, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0
        )
    return out[0, len(ids) :].tolist()


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("verifier", ["full", f"exit:{EXIT_LAYER}"])
def test_greedy_ar_equals_transformers_generate(arch, verifier, bundles, hf_models):
    model = edgespec.load(bundles[arch], verifier=verifier)
    prompt = [int(i) for i in np.random.default_rng(7).integers(1, 2048, 11)]
    got = model.generate(prompt, max_new_tokens=N_NEW, ignore_eos=True)
    ref = hf_greedy(hf_models[arch], prompt, N_NEW)
    assert got.tokens == ref
    assert len(set(ref)) >= 4, "degenerate reference: the test model only repeats itself"
    assert got.finish_reason == "length" and got.stats.decode_tokens == N_NEW - 1


def test_text_prompt_is_tokenized_like_transformers(bundles, hf_models, checkpoints):
    from transformers import AutoTokenizer

    model = edgespec.load(bundles["qwen2"])
    text = "def fibonacci(n):\n    return n if n < 2 else"
    ids = AutoTokenizer.from_pretrained(checkpoints["qwen2"])(text)["input_ids"]
    got = model.generate(text, max_new_tokens=12, ignore_eos=True)
    assert got.prompt_tokens == ids
    assert got.tokens == hf_greedy(hf_models["qwen2"], ids, 12)


def test_stream_yields_the_same_text_as_generate(bundles):
    model = edgespec.load(bundles["llama-gqa-tied"])
    whole = model.generate("import os\n", max_new_tokens=20, ignore_eos=True)
    chunks = list(model.stream("import os\n", max_new_tokens=20, ignore_eos=True))
    assert "".join(c.text for c in chunks) == whole.text
    assert [t for c in chunks for t in c.tokens] == whole.tokens
    assert chunks[-1].finish_reason == "length" and all(
        c.finish_reason is None for c in chunks[:-1]
    )


def test_stops_at_end_of_sequence_unless_told_not_to(bundles):
    model = edgespec.load(bundles["gpt2"])
    prompt = [5, 9, 200, 31]
    free = model.generate(prompt, max_new_tokens=10, ignore_eos=True).tokens
    model.manifest.eos_token_ids = [free[3]]  # make the 4th greedy token an end-of-sequence
    stopped = model.generate(prompt, max_new_tokens=10)
    assert stopped.tokens == free[: free.index(free[3]) + 1] and stopped.finish_reason == "eos"


def test_sampling_is_reproducible_with_a_seed_and_varies_without(bundles):
    model = edgespec.load(bundles["llama-gqa-tied"])
    kw = dict(max_new_tokens=16, temperature=1.0, top_p=0.9, ignore_eos=True)
    a = model.generate([1, 2, 3], seed=11, **kw).tokens
    assert a == model.generate([1, 2, 3], seed=11, **kw).tokens
    assert any(model.generate([1, 2, 3], seed=s, **kw).tokens != a for s in range(12, 16))


def test_generation_stops_at_the_context_limit(bundles):
    model = edgespec.load(bundles["qwen2"])  # max_position_embeddings = 256
    got = model.generate(list(range(1, 251)), max_new_tokens=50, ignore_eos=True)
    assert got.finish_reason == "context" and len(got.tokens) == 256 - 250 + 1


def test_rejected_positions_are_overwritten_after_truncate(bundles):
    """Rollback is a length change: after truncate, new tokens see only the kept prefix."""
    model = edgespec.load(bundles["llama-gqa-tied"])
    t = model.target
    ids = np.arange(1, 13)
    t.reset(32)
    t.forward(ids[:8], keep=1)
    t.forward(np.array([77, 78, 79]), keep=3)  # drafted tokens, then rejected
    t.truncate(8)
    after = t.forward(ids[8:], keep=4)
    t.reset(32)
    fresh = t.forward(ids, keep=4)
    np.testing.assert_allclose(after, fresh, atol=1e-5)


def test_ids_beyond_the_tokenizer_vocab_do_not_break_text(bundles):
    """Models often pad their vocab past the tokenizer's; such ids carry no text."""
    model = edgespec.load(bundles["qwen2"])
    model.tokenizer._id_to_token = {
        i: t for i, t in model.tokenizer._id_to_token.items() if i < 1000
    }  # pretend ids >= 1000 are padding rows
    got = model.generate("def f(x):", max_new_tokens=30, ignore_eos=True)
    assert len(got.tokens) == 30 and any(t >= 1000 for t in got.tokens)
    streamed = "".join(
        c.text for c in model.stream("def f(x):", max_new_tokens=30, ignore_eos=True)
    )
    assert streamed == got.text
