"""The draft distributions drafters sample from and send: exact top-k, and the fast path
from logits agrees with the plain definition (truncate the tempered distribution)."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.runtime.draft_q import SCALE, DraftSupport, from_logits, top_ids, truncate
from edgespec.runtime.sampling import SamplingParams, probabilities


@pytest.mark.parametrize(
    "values",
    [
        np.random.default_rng(0).standard_normal(151_936).astype(np.float32),
        np.arange(151_936, dtype=np.float32),  # sorted: a strided sample sees a biased slice
        np.repeat(np.float32(1.0), 5000),  # all tied
        np.r_[np.zeros(10_000), np.ones(3)].astype(np.float32),  # fewer large than k
    ],
)
def test_top_ids_are_exactly_the_k_largest(values):
    for k in (1, 3, 64, 500):
        got = top_ids(values, k)
        assert len(got) == min(k, len(values)) == len(set(got.tolist()))
        kth = np.sort(values)[::-1][len(got) - 1]
        assert values[got].min() == kth and np.all(np.diff(values[got]) <= 0)


@pytest.mark.parametrize(
    "params, support",
    [
        (SamplingParams(0.8), DraftSupport()),
        (SamplingParams(1.0, top_p=0.9), DraftSupport(top_k=32, top_p=0.95)),
        (SamplingParams(0.7, top_k=20), DraftSupport()),
        (SamplingParams(1.2, top_k=200, top_p=0.8), DraftSupport(top_k=50)),
    ],
)
def test_from_logits_is_the_truncated_tempered_distribution(params, support):
    rng = np.random.default_rng(1)
    for _ in range(5):
        logits = (rng.standard_normal(3000) * 4).astype(np.float32)
        q, confidence = from_logits(logits, params, support)
        want = truncate(probabilities(logits, params), support)
        assert q.check(3000) is None and int(q.counts.sum()) == SCALE
        assert set(q.ids.tolist()) == set(want.ids.tolist())
        assert np.abs(q.dense(3000) - want.dense(3000)).max() <= 2 / SCALE
        before_top_p = SamplingParams(params.temperature, top_k=params.top_k)
        assert confidence == pytest.approx(probabilities(logits, before_top_p).max(), rel=1e-5)
