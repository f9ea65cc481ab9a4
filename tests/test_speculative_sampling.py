"""Sampling losslessness: speculative sampling follows the target's distribution.

Deterministic (fixed seeds) chi-square tests, with a check that the same test does reject a
biased sampler, so they can fail."""

from __future__ import annotations

import numpy as np
import pytest
from speculative_reference import reference_speculative_step

import edgespec
from edgespec.runtime.accept import accept_sampled
from edgespec.runtime.sampling import SamplingParams, probabilities

CHI2_CRITICAL_P001 = {5: 20.52, 7: 24.32, 15: 37.70}  # chi-square quantile at p = 0.001


def chi_square(counts: np.ndarray, p: np.ndarray) -> float:
    expected = p * counts.sum()
    mask = expected > 0
    assert counts[~mask].sum() == 0, "a token of probability zero was produced"
    return float(((counts[mask] - expected[mask]) ** 2 / expected[mask]).sum())


def random_dist(rng: np.random.Generator, v: int, sharp: float = 1.5) -> np.ndarray:
    p = rng.dirichlet(np.ones(v) * sharp)
    return p / p.sum()


def test_fast_path_matches_the_reference_step_for_step():
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=1.0)
    for case in range(1500):
        v, g = 6, int(rng.integers(1, 5))
        p_rows = np.stack([random_dist(rng, v) for _ in range(g + 1)])
        q_rows = [random_dist(rng, v) for _ in range(g)] if case % 3 else None
        drafts = [int(rng.integers(v)) for _ in range(g)]
        seed = int(rng.integers(1 << 30))
        n, token = accept_sampled(
            drafts, q_rows, np.log(p_rows), params, np.random.default_rng(seed)
        )
        ref = reference_speculative_step(p_rows, q_rows, drafts, np.random.default_rng(seed))
        assert [*drafts[:n], token] == ref


@pytest.mark.parametrize("deterministic_draft", [False, True])
def test_emitted_tokens_follow_the_target_distribution(deterministic_draft):
    rng = np.random.default_rng(1)
    v, g, trials = 6, 3, 20000
    p_rows = np.stack([random_dist(rng, v) for _ in range(g + 1)])
    q_rows = [random_dist(rng, v) for _ in range(g)]
    params = SamplingParams(temperature=1.0)
    first, second = np.zeros(v), np.zeros(v)
    for _ in range(trials):
        if deterministic_draft:  # e.g. prompt lookup: fixed drafts, q a point mass
            tokens, q = [2, 0, 5], None
        else:
            tokens, q = [int(rng.choice(v, p=q)) for q in q_rows], q_rows
        n, token = accept_sampled(tokens, q, np.log(p_rows), params, rng)
        out = [*tokens[:n], token]
        first[out[0]] += 1
        if len(out) > 1:
            second[out[1]] += 1
    assert chi_square(first, p_rows[0]) < CHI2_CRITICAL_P001[v - 1]
    assert chi_square(second, p_rows[1]) < CHI2_CRITICAL_P001[v - 1]
    # the test has power: the drafts' own distribution is rejected
    assert chi_square(first, q_rows[0]) > CHI2_CRITICAL_P001[v - 1]


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
