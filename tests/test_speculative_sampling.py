"""Sampling losslessness: speculative sampling follows the target's distribution.

Deterministic (fixed seeds) chi-square tests, with a check that the same test does reject a
biased sampler, so they can fail."""

from __future__ import annotations

import numpy as np
import pytest
from speculative_reference import reference_speculative_step

import edgespec
from edgespec.runtime.draft_q import DraftSupport, SparseQ, quantize, truncate
from edgespec.runtime.sampling import SamplingParams, probabilities
from edgespec.runtime.verify.accept import accept

CHI2_CRITICAL_P001 = {5: 20.52, 7: 24.32, 15: 37.70}  # chi-square quantile at p = 0.001


def chi_square(counts: np.ndarray, p: np.ndarray) -> float:
    expected = p * counts.sum()
    mask = expected > 0
    assert counts[~mask].sum() == 0, "a token of probability zero was produced"
    return float(((counts[mask] - expected[mask]) ** 2 / expected[mask]).sum())


def random_dist(rng: np.random.Generator, v: int, sharp: float = 1.5) -> np.ndarray:
    p = rng.dirichlet(np.ones(v) * sharp)
    return p / p.sum()


def random_q(rng: np.random.Generator, v: int) -> SparseQ:
    """A draft distribution over a random part of the vocabulary (as a truncated drafter's)."""
    ids = rng.choice(v, int(rng.integers(1, v + 1)), replace=False)
    return quantize(ids, random_dist(rng, len(ids)))


def test_fast_path_matches_the_reference_step_for_step():
    """The sparse q of the fast path, expanded to dense rows, in the slow numpy oracle: the
    same tokens, uniform for uniform."""
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=1.0)
    for case in range(1500):
        v, g = 6, int(rng.integers(1, 5))
        p_rows = np.stack([random_dist(rng, v) for _ in range(g + 1)])
        qs = [random_q(rng, v) for _ in range(g)] if case % 3 else None
        drafts = [qs[i].sample(rng) if qs else int(rng.integers(v)) for i in range(g)]
        seed = int(rng.integers(1 << 30))
        n, token = accept(drafts, qs, np.log(p_rows), params, np.random.default_rng(seed))
        dense = [q.dense(v) for q in qs] if qs else None
        ref = reference_speculative_step(p_rows, dense, drafts, np.random.default_rng(seed))
        assert [*drafts[:n], token] == ref


def test_truncated_quantized_q_is_exactly_what_the_drafter_samples():
    """truncate keeps the top-k (then top-p) ids, its counts sum to SCALE, and draws from
    it follow q(x) = count / SCALE (chi-square), never leaving the support."""
    rng = np.random.default_rng(3)
    full = random_dist(rng, 40, sharp=0.3)
    q = truncate(full, DraftSupport(top_k=8, top_p=0.9))
    assert q.check(40) is None and len(q.ids) <= 8
    assert set(q.ids) <= set(np.argsort(-full)[:8])
    counts = np.zeros(40)
    for _ in range(20000):
        counts[q.sample(rng)] += 1
    assert chi_square(counts, q.dense(40)) < CHI2_CRITICAL_P001[15] * 2  # ≤ 8 cells: loose


def test_sparse_drafts_keep_the_target_distribution():
    """Drafts sampled from top-2 supports (much of q's mass cut away) still give exactly the
    target's distribution, and the test can tell: the drafts' own distribution fails it."""
    rng = np.random.default_rng(2)
    v, g, trials = 6, 2, 20000
    p_rows = np.stack([random_dist(rng, v) for _ in range(g + 1)])
    qs = [truncate(random_dist(rng, v), DraftSupport(top_k=2)) for _ in range(g)]
    params = SamplingParams(temperature=1.0)
    first, second = np.zeros(v), np.zeros(v)
    for _ in range(trials):
        tokens = [q.sample(rng) for q in qs]
        n, token = accept(tokens, qs, np.log(p_rows), params, rng)
        out = [*tokens[:n], token]
        first[out[0]] += 1
        if len(out) > 1:  # the rows do not depend on the prefix: p_rows[1] whatever came first
            second[out[1]] += 1
    assert chi_square(first, p_rows[0]) < CHI2_CRITICAL_P001[v - 1]
    assert chi_square(second, p_rows[1]) < CHI2_CRITICAL_P001[v - 1]
    with pytest.raises(AssertionError, match="probability zero"):  # q_0 covers 2 ids only
        chi_square(first, qs[0].dense(v))


@pytest.mark.parametrize("deterministic_draft", [False, True])
def test_emitted_tokens_follow_the_target_distribution(deterministic_draft):
    rng = np.random.default_rng(1)
    v, g, trials = 6, 3, 20000
    p_rows = np.stack([random_dist(rng, v) for _ in range(g + 1)])
    q_rows = [quantize(np.arange(v), random_dist(rng, v)) for _ in range(g)]
    params = SamplingParams(temperature=1.0)
    first, second = np.zeros(v), np.zeros(v)
    for _ in range(trials):
        if deterministic_draft:  # e.g. prompt lookup: fixed drafts, q a point mass
            tokens, q = [2, 0, 5], None
        else:
            tokens, q = [q.sample(rng) for q in q_rows], q_rows
        n, token = accept(tokens, q, np.log(p_rows), params, rng)
        out = [*tokens[:n], token]
        first[out[0]] += 1
        if len(out) > 1:
            second[out[1]] += 1
    assert chi_square(first, p_rows[0]) < CHI2_CRITICAL_P001[v - 1]
    assert chi_square(second, p_rows[1]) < CHI2_CRITICAL_P001[v - 1]
    # the test has power: the drafts' own distribution is rejected
    assert chi_square(first, q_rows[0].dense(v)) > CHI2_CRITICAL_P001[v - 1]


@pytest.mark.parametrize(
    "mode, options",
    [
        ("spec", {"draft_policy": "fixed:2"}),
        ("self-spec", {"draft_policy": "fixed:2"}),
        ("lookup", {"draft_policy": "fixed:2"}),
    ],
)
def test_generated_tokens_follow_the_target_distribution_end_to_end(
    tiny_vocab_bundle, mode, options
):
    """The 2nd and 3rd generated tokens (the first comes from prefill) of speculative
    sampling have the exact marginals of the target's own sampling, computed by enumeration."""
    params = SamplingParams(temperature=1.0, top_p=0.95)
    prompt = [3, 7, 1, 3, 7]
    ar = edgespec.load(tiny_vocab_bundle)
    t = ar.target

    def dist(ids: list[int]) -> np.ndarray:
        t.reset(16)
        return probabilities(t.forward(np.array(ids), keep=1)[-1], params)

    p1 = dist(prompt)
    p2 = np.zeros(16)
    p3 = np.zeros(16)
    for a in np.flatnonzero(p1):
        p2_given = dist([*prompt, a])
        p2 += p1[a] * p2_given
        for b in np.flatnonzero(p2_given):
            p3 += p1[a] * p2_given[b] * dist([*prompt, a, b])

    model = edgespec.load(tiny_vocab_bundle, mode=mode, **options)
    second, third = np.zeros(16), np.zeros(16)
    for seed in range(1500):
        out = model.generate(
            prompt, max_new_tokens=3, temperature=1.0, top_p=0.95, seed=seed, ignore_eos=True
        ).tokens
        second[out[1]] += 1
        third[out[2]] += 1
    assert chi_square(second, p2) < CHI2_CRITICAL_P001[15]
    assert chi_square(third, p3) < CHI2_CRITICAL_P001[15]
