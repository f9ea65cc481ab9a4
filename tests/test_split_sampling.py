"""Split decoding with sampling follows the target's distribution: the 2nd to 4th tokens of
generations drafted on the device (with q rows sent to the server, and tokens drafted ahead
while rounds are in flight) match the exact marginals of the target's own sampling — also
when the drafter samples from a support cut to 3 of the 16 ids (the sparse q path), and when
the server decodes on its own and streams (its own draft model, sampled there)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from split_server import TOKEN, start_server
from test_speculative_sampling import CHI2_CRITICAL_P001, chi_square

import edgespec
from edgespec.runtime.draft_q import DraftSupport
from edgespec.runtime.round import Plan
from edgespec.runtime.sampling import SamplingParams, probabilities

PARAMS = SamplingParams(temperature=1.0, top_p=0.95)
PROMPT = [3, 7, 1, 3, 7]


def marginals(bundle) -> list[np.ndarray]:
    """The exact marginals of tokens 2, 3 and 4 (the first comes from the prefill)."""
    t = edgespec.load(bundle, threads=1).target

    def dist(ids: list[int]) -> np.ndarray:
        t.reset(16)
        return probabilities(t.forward(np.array(ids), keep=1)[-1], PARAMS)

    p1 = dist(PROMPT)
    out = [np.zeros(16), np.zeros(16), np.zeros(16)]
    for a in np.flatnonzero(p1):
        pa = dist([*PROMPT, a])
        out[0] += p1[a] * pa
        for b in np.flatnonzero(pa):
            pb = dist([*PROMPT, a, b])
            out[1] += p1[a] * pa[b] * pb
            for c in np.flatnonzero(pb):
                out[2] += p1[a] * pa[b] * pb[c] * dist([*PROMPT, a, b, c])
    return out


def sample_counts(model, generations: int) -> list[np.ndarray]:
    """How often each id came 2nd, 3rd and 4th over seeded generations of 5 tokens."""
    counts = [np.zeros(16), np.zeros(16), np.zeros(16)]
    for seed in range(generations):
        out = model.generate(
            PROMPT, max_new_tokens=5, temperature=1.0, top_p=0.95, seed=seed, ignore_eos=True
        )
        assert out.stats.local_rounds == 0
        for i in range(3):
            counts[i][out.tokens[i + 1]] += 1
    return counts


@pytest.mark.parametrize(
    "drafter, support",
    [("draft", DraftSupport()), ("draft", DraftSupport(top_k=3, top_p=0.9)), ("lookup", None)],
)
def test_split_sampling_follows_the_target_distribution(
    tiny_vocab_bundle, tmp_path, drafter, support
):
    want = marginals(tiny_vocab_bundle)
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
        counts = sample_counts(model, 1200)
    finally:
        server.stop()
    for c, p in zip(counts, want, strict=True):
        assert chi_square(c, p) < CHI2_CRITICAL_P001[15]


class StreamOnly:
    """Every decode round placed on the server's stream."""

    def plan(self, source: str | None = None) -> Plan:
        return Plan(0, where="stream")

    def observe(self, stats) -> None:
        assert stats.phase == "prefill" or stats.verifier == "stream"

    def channel_estimates(self) -> tuple[float | None, float | None]:
        return None, None


def test_streamed_sampling_follows_the_target_distribution(tiny_vocab_bundle, tmp_path):
    want = marginals(tiny_vocab_bundle)
    # the server streams with its own draft model (speculative sampling there)
    server = start_server(tiny_vocab_bundle, tmp_path, TOKEN, "--mode", "spec")
    try:
        model = edgespec.load(
            tiny_vocab_bundle, mode="split", server=server.url, token=TOKEN, threads=1,
            late_after=10.0,
        )  # fmt: skip
        model.policy = StreamOnly()
        before = server.health()["streaming"]["tokens"]
        counts = sample_counts(model, 1200)
        # the server counts a stream's tokens after sending them: wait for the last count
        deadline, streamed = time.monotonic() + 30, 0
        while (streamed := server.health()["streaming"]["tokens"] - before) < 1200 * 4:
            assert time.monotonic() < deadline, streamed
            time.sleep(0.05)
        assert streamed == 1200 * 4
    finally:
        server.stop()
    for c, p in zip(counts, want, strict=True):
        assert chi_square(c, p) < CHI2_CRITICAL_P001[15]
    # the test has power: the 4th token's counts are not the 2nd token's marginal
    assert chi_square(counts[2], want[0]) > CHI2_CRITICAL_P001[15]
