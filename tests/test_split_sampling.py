"""Split decoding with sampling follows the target's distribution: the 2nd to 4th tokens of
generations drafted on the device (with q rows sent to the server, and tokens drafted ahead
while rounds are in flight) match the exact marginals of the target's own sampling — also
when the drafter samples from a support cut to 3 of the 16 ids (the sparse q path)."""

from __future__ import annotations

import numpy as np
import pytest
from split_server import TOKEN, start_server
from test_speculative_sampling import CHI2_CRITICAL_P001, chi_square

import edgespec
from edgespec.runtime.draft_q import DraftSupport
from edgespec.runtime.sampling import SamplingParams, probabilities


@pytest.mark.parametrize(
    "drafter, support",
    [("draft", DraftSupport()), ("draft", DraftSupport(top_k=3, top_p=0.9)), ("lookup", None)],
)
def test_split_sampling_follows_the_target_distribution(
    tiny_vocab_bundle, tmp_path, drafter, support
):
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
            late_after=10.0,  # only a failed link moves rounds here: local_rounds is counted
            **({"draft_support": support} if support else {}),
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
