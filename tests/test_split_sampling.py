"""Split decoding with sampling follows the target's distribution: the 2nd to 4th tokens of
generations drafted on the device (with q rows sent to the server, and tokens drafted ahead
while rounds are in flight) match the exact marginals of the target's own sampling."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from split_server import TOKEN, start_server
from test_speculative_sampling import CHI2_CRITICAL_P001, chi_square

import edgespec
from edgespec.runtime.sampling import SamplingParams, probabilities


@pytest.fixture(scope="module")
def tiny_vocab_bundle(tmp_path_factory) -> Path:
    """A 16-token model and a different 16-token draft: exact distributions are computable."""
    from edgespec.export import export_bundle
    from edgespec.export.builtin import write_checkpoint

    root = tmp_path_factory.mktemp("tiny_vocab_split")
    dims = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    target = write_checkpoint(root / "t", "llama", seed=1, vocab_size=16, **dims)
    draft = write_checkpoint(root / "d", "llama", seed=2, vocab_size=16, **dims)
    export_bundle(target, root / "b", draft=draft, exit_layers=[1], progress=False)
    return root / "b"


@pytest.mark.parametrize("drafter", ["draft", "lookup"])
def test_split_sampling_follows_the_target_distribution(tiny_vocab_bundle, tmp_path, drafter):
    params = SamplingParams(temperature=1.0, top_p=0.95)
    prompt = [3, 7, 1, 3, 7]
    t = edgespec.load(tiny_vocab_bundle, threads=1).target

    def dist(ids: list[int]) -> np.ndarray:
        t.reset(16)
        return probabilities(t.forward(np.array(ids), keep=1)[-1], params)

    # exact marginals of tokens 2, 3 and 4 (the first comes from the prefill)
    p1 = dist(prompt)
    marginals = [np.zeros(16), np.zeros(16), np.zeros(16)]
    for a in np.flatnonzero(p1):
        pa = dist([*prompt, a])
        marginals[0] += p1[a] * pa
        for b in np.flatnonzero(pa):
            pb = dist([*prompt, a, b])
            marginals[1] += p1[a] * pa[b] * pb
            for c in np.flatnonzero(pb):
                marginals[2] += p1[a] * pa[b] * pb[c] * dist([*prompt, a, b, c])

    server = start_server(tiny_vocab_bundle, tmp_path)
    try:
        # fixed:1 with 5 tokens: each round has room to draft ahead of the one in flight
        model = edgespec.load(
            tiny_vocab_bundle,
            mode="split",
            server=server.url,
            token=TOKEN,
            threads=1,
            drafter=drafter,
            draft_policy="fixed:1",
        )
        counts = [np.zeros(16), np.zeros(16), np.zeros(16)]
        for seed in range(1200):
            out = model.generate(
                prompt, max_new_tokens=5, temperature=1.0, top_p=0.95, seed=seed, ignore_eos=True
            )
            assert out.stats.local_rounds == 0
            for i in range(3):
                counts[i][out.tokens[i + 1]] += 1
    finally:
        server.stop()
    for c, p in zip(counts, marginals, strict=True):
        assert chi_square(c, p) < CHI2_CRITICAL_P001[15]
