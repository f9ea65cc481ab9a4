"""Draft-length policies choose what the cost model says is fastest, and adapt."""

from __future__ import annotations

import pytest

from edgespec.runtime.policies.draft_length import (
    Acceptance,
    Auto,
    Confidence,
    DynamicExit,
    PerSource,
)
from edgespec.runtime.policies.estimates import PRIORS, expected_tokens
from edgespec.runtime.registry import make_policy
from edgespec.runtime.stats import RoundStats


def rounds(
    policy,
    accepted: int,
    drafted: int,
    t_draft: float,
    t_verify: float,
    n: int = 40,
    exit_layer: int | None = None,
    source: str | None = None,
) -> None:
    for _ in range(n):
        policy.observe(
            RoundStats(
                "decode",
                accepted + 1,
                drafted + 1,
                t_draft * drafted + t_verify,  # the whole round's wall time
                drafted,
                accepted,
                t_draft * drafted,
                t_verify,
                exit_layer=exit_layer,
                source=source,
            )
        )


def test_expected_tokens_formula():
    assert expected_tokens(0.0, 5) == 1.0
    assert abs(expected_tokens(0.5, 2) - 1.75) < 1e-12
    assert expected_tokens(1.0, 4) == 5.0


def test_acceptance_drafts_long_when_drafts_are_accepted_and_cheap():
    p = Acceptance()
    rounds(p, accepted=6, drafted=6, t_draft=0.001, t_verify=0.02)
    assert p.cost.alpha > 0.95 and p.plan().length >= 10


def test_acceptance_drafts_short_when_drafts_are_rejected():
    p = Acceptance()
    rounds(p, accepted=0, drafted=4, t_draft=0.005, t_verify=0.02)
    assert p.cost.alpha < 0.1 and p.plan().length == 1


def test_acceptance_recovers_when_the_text_gets_easier():
    p = Acceptance()
    rounds(p, accepted=0, drafted=2, t_draft=0.002, t_verify=0.02)
    short = p.plan().length
    rounds(p, accepted=short, drafted=short, t_draft=0.002, t_verify=0.02, n=60)
    assert p.plan().length > short


def test_confidence_stops_below_threshold():
    p = Confidence(0.4)
    assert p.plan().keep_drafting(0.9) and not p.plan().keep_drafting(0.3)


def test_dynamic_exit_settles_on_the_exit_with_the_best_rate():
    p = DynamicExit([2, 4])
    rounds(p, accepted=0, drafted=4, t_draft=0.002, t_verify=0.01, exit_layer=2)
    rounds(p, accepted=4, drafted=4, t_draft=0.004, t_verify=0.01, exit_layer=4)
    chosen = [(p.plan().length, p.exit_layer)[1] for _ in range(20)]
    assert chosen.count(4) >= 19  # one probe of the other exit at most


def test_dynamic_exit_prices_every_exit_with_the_priors_it_is_given():
    from dataclasses import replace

    from edgespec.runtime.policies.estimates import PRIORS

    priors = replace(PRIORS, probe_gap=PRIORS.probe_gap + 1)
    p = make_policy("dynamic-exit", [4, 2], priors=priors)
    assert isinstance(p, DynamicExit) and p.exits == [2, 4]
    assert all(c.priors is priors for c in p.costs.values())
    assert all(c.priors is PRIORS for c in DynamicExit([2]).costs.values())


def test_policy_strings():
    assert make_policy("fixed:3").plan().length == 3
    assert make_policy("confidence:0.5").plan().keep_drafting(0.6)
    assert isinstance(make_policy("dynamic-exit", [2]), DynamicExit)


def test_auto_turns_speculation_off_when_it_loses_and_probes_with_backoff():
    p = Auto()
    rounds(p, accepted=0, drafted=2, t_draft=0.004, t_verify=0.021, n=12)  # drafts rejected
    rounds(p, accepted=0, drafted=0, t_draft=0.0, t_verify=0.020, n=3)  # plain steps
    chosen = []
    for _ in range(60):  # every probe's drafts rejected
        chosen.append(p.plan().length)
        rounds(p, accepted=0, drafted=chosen[-1], t_draft=0.004, t_verify=0.02, n=1)
    probes = [i for i, g in enumerate(chosen) if g > 0]
    assert chosen.count(0) >= 55  # plain decoding nearly always
    assert probes and all(b - a > 4 for a, b in zip(probes, probes[1:], strict=False))
    gaps = [b - a for a, b in zip(probes, probes[1:], strict=False)]
    assert gaps == sorted(gaps) and gaps[-1] > gaps[0]  # backing off


def test_a_probe_that_drafted_nothing_is_still_owed_and_does_not_back_off():
    # a model-free drafter (prompt lookup, suffix) finds nothing to propose on most rounds:
    # its probe is a plain step that taught nothing, so the next round probes again
    p = Auto()
    rounds(p, accepted=0, drafted=2, t_draft=0.0001, t_verify=0.021, n=12)
    rounds(p, accepted=0, drafted=0, t_draft=0.0, t_verify=0.020, n=3)
    chosen = []
    for i in range(40):
        chosen.append(p.plan().length)
        found = chosen[-1] if i >= 30 else 0  # the drafter finds something from round 30
        plain = 0.020 if not found else 0.021  # an empty probe costs a plain step
        rounds(p, accepted=0, drafted=found, t_draft=0.0001, t_verify=plain, n=1)
    first = chosen.index(next(g for g in chosen if g > 0))
    assert first <= 4 and all(g > 0 for g in chosen[first:31])  # owed until it drafts
    assert chosen[31:34] == [0, 0, 0]  # the probe that drafted: a plain stretch again


def test_each_generation_starts_its_probes_afresh():
    p = Auto()
    rounds(p, accepted=0, drafted=2, t_draft=0.004, t_verify=0.021, n=12)
    rounds(p, accepted=0, drafted=0, t_draft=0.0, t_verify=0.020, n=3)
    for _ in range(400):  # a long losing generation: probes backed off to the longest gap
        g = p.plan().length
        rounds(p, accepted=0, drafted=g, t_draft=0.004, t_verify=0.02 + 0.001 * g, n=1)
    assert p._gap == PRIORS.max_probe_gap
    first = RoundStats("decode", 1, 1, 0.02, index=1)  # the next prompt's first round
    p.observe(first)
    chosen = [p.plan().length for _ in range(PRIORS.probe_gap)]
    assert chosen[-1] > 0 and chosen[:-1] == [0] * (PRIORS.probe_gap - 1)


def test_a_new_generation_keeps_little_of_the_last_texts_acceptance():
    """After a long text whose drafts all passed, the next prompt's rounds weigh the old
    acceptance as `carried_rounds` rounds: a few misses of the new text shorten the drafts
    (through a server, a JSON extraction after summaries drafted long and lost)."""
    fresh, carried = Auto(), Auto()
    for p in (fresh, carried):
        rounds(p, accepted=8, drafted=8, t_draft=0.0001, t_verify=0.03, n=200)
    long = carried.cost.acceptance.expected(8)
    reached = carried.cost.acceptance._all[0]
    assert reached[1] > 3 * PRIORS.carried_rounds  # ~1 / acceptance_decay rounds
    carried.observe(RoundStats("decode", 1, 9, 0.02, drafted=8, accepted=0, index=1))
    fresh.observe(RoundStats("decode", 1, 9, 0.02, drafted=8, accepted=0, index=5))
    assert carried.cost.acceptance._all[0][1] <= PRIORS.carried_rounds + 1
    assert carried.cost.acceptance.expected(8) < fresh.cost.acceptance.expected(8) < long
    assert not carried.cost.acceptance.after_full
    # a chain's members (`lookup+eagle`): the first round is one member's, both start anew
    lookup, head = Auto(), Auto()
    for p in (lookup, head):
        rounds(p, accepted=8, drafted=8, t_draft=0.0001, t_verify=0.03, n=200)
    chain = PerSource(head, {"lookup": lookup})
    chain.observe(RoundStats("decode", 1, 9, 0.02, drafted=8, accepted=0, index=1,
                             source="lookup"))  # fmt: skip
    assert head.cost.acceptance._all[0][1] <= PRIORS.carried_rounds


def test_auto_turns_speculation_back_on_when_drafts_get_accepted():
    p = Auto()
    rounds(p, accepted=0, drafted=2, t_draft=0.004, t_verify=0.021, n=12)
    rounds(p, accepted=0, drafted=0, t_draft=0.0, t_verify=0.020, n=3)
    assert p.plan().length == 0
    rounds(p, accepted=2, drafted=2, t_draft=0.004, t_verify=0.021, n=30)  # probes succeed
    assert p.plan().length >= 2


def test_auto_speculates_when_it_wins_from_the_start():
    p = Auto()
    assert p.plan().length == 2  # learns the drafter first
    rounds(p, accepted=2, drafted=2, t_draft=0.001, t_verify=0.02, n=3)
    assert p.plan().length == 0  # then measures one plain step
    rounds(p, accepted=0, drafted=0, t_draft=0.0, t_verify=0.02, n=1)
    assert p.plan().length >= 3


def test_auto_prices_plain_steps_by_their_own_time_not_the_speculative_line():
    # speculative rounds carry a fixed overhead (draft call, wider verify): 3 ms + 0.5 ms/γ;
    # a plain step takes 2 ms. At this acceptance speculation loses, though a line through
    # all rounds would price the plain step near its intercept (~2.6 ms) and call it a win.
    p = Auto()
    for g in (1, 2, 3, 4, 1, 2):
        rounds(p, accepted=1, drafted=g, t_draft=0.0005, t_verify=0.003, n=1)
        rounds(p, accepted=0, drafted=g, t_draft=0.0005, t_verify=0.003, n=2)
    rounds(p, accepted=0, drafted=0, t_draft=0.0, t_verify=0.002, n=3)
    assert 0.15 < p.cost.alpha < 0.5
    assert abs(p.cost.cost(0) - 0.002) < 1e-6
    assert [p.plan().length for _ in range(3)] == [0, 0, 0]


def test_a_burst_of_slow_rounds_before_a_plain_stretch_does_not_price_speculation_out():
    # the rounds that made auto stop speculating were slow (another process took the CPU);
    # after a long plain stretch, speculation is still priced by all recent speculative
    # rounds, not by the last slow ones at one γ, so a probe can switch it back on
    p = Auto()
    for g in (1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4):
        rounds(p, accepted=g, drafted=g, t_draft=0.0005, t_verify=0.003, n=2)
    rounds(p, accepted=0, drafted=3, t_draft=0.0015, t_verify=0.009, n=4)  # 3x slower
    rounds(p, accepted=0, drafted=0, t_draft=0.0, t_verify=0.002, n=200)
    assert p.cost.cost(3) < 1.5 * 0.0045


def test_alpha_is_fitted_to_the_tokens_rounds_yield():
    from edgespec.runtime.policies.estimates import CostModel, alpha_for

    for alpha in (0.2, 0.6, 0.9):
        assert abs(alpha_for(expected_tokens(alpha, 4), 4) - alpha) < 1e-6
    # runs of acceptance: half the rounds accept all 4 drafts, half none -> 3 tokens per round,
    # which a per-draft count (4/6 = 67% accepted per trial) would price at 2.4
    cost = CostModel()
    for i in range(60):
        n = 4 if i % 2 else 0
        cost.observe(
            RoundStats("decode", n + 1, 5, 0.005, drafted=4, accepted=n, draft_seconds=0.001)
        )
    assert abs(expected_tokens(cost.alpha, 4) - 3.0) < 0.35


def test_a_round_tells_exactly_what_every_shorter_draft_would_have_accepted():
    from edgespec.runtime.policies.estimates import CostModel

    cost = CostModel()
    for _ in range(80):  # every round drafts 6 and the third draft is always wrong
        cost.observe(RoundStats("decode", 3, 7, 0.01, drafted=6, accepted=2, draft_seconds=0.006))
    assert abs(cost.expected(1) - 2.0) < 0.05
    assert abs(cost.expected(2) - 3.0) < 0.05
    assert abs(cost.expected(6) - 3.0) < 0.1  # drafting past the wrong one buys nothing


def test_auto_drafts_long_inside_a_run_of_accepted_drafts_and_short_after_a_miss():
    # stretches of 12 rounds that accept every draft, then 12 that accept none (code, then
    # prose): a per-token α fitted over both (~0.5) would draft 1-2 everywhere
    p = Auto()
    lengths = []
    for i in range(240):
        g = p.plan().length
        lengths.append(g)
        n = g if (i // 12) % 2 == 0 else 0
        t = 0.001 * g + 0.01
        p.observe(RoundStats("decode", n + 1, g + 1, t, g, n, 0.001 * g, 0.01))
    inside = [g for i, g in enumerate(lengths) if i > 120 and (i // 12) % 2 == 0 and i % 12 > 1]
    assert sum(inside) / len(inside) >= 8
    assert p.plan().length <= 2  # the last stretch missed


def test_after_a_round_accepted_whole_auto_expects_the_run_to_go_on():
    from edgespec.runtime.policies.estimates import CostModel

    cost = CostModel()
    for i in range(120):  # stretches of 10 rounds accepting all 4 drafts, then 10 accepting 0
        n = 4 if (i // 10) % 2 == 0 else 0
        cost.observe(
            RoundStats("decode", n + 1, 5, 0.01, drafted=4, accepted=n, draft_seconds=0.004)
        )
    assert cost.acceptance.after_full is False  # the last stretch rejected
    after_cut = cost.expected(4)
    cost.observe(RoundStats("decode", 5, 5, 0.01, drafted=4, accepted=4, draft_seconds=0.004))
    assert cost.expected(4) > after_cut + 2


def test_auto_drafts_again_after_slow_first_rounds_priced_drafting_out():
    """The first rounds of a generation after other models ran can be slow: they priced
    drafting out, and plain rounds taught `auto` nothing new, so it stepped plainly for
    hundreds of rounds where drafting was 20% faster. Plain rounds now age what drafting was
    measured to cost, so the next probes' fresh times decide."""
    import random

    shares = []
    for seed in range(8):
        rng, p, drafted = random.Random(seed), Auto(), []
        for i in range(400):
            g = p.plan().length
            n = 0
            while n < g and rng.random() < 0.6:  # N(2) ≈ 1.96 tokens in 16 ms: 1.2x plain
                n += 1
            t = (0.010 + 0.003 * g) * (2 if i < 30 and g else 1)  # 30 slow rounds first
            p.observe(RoundStats("decode", n + 1, g + 1, t, g, n, 0.003 * g, 0.010))
            drafted.append(g > 0)
        shares.append(sum(drafted[100:]) / 300)
    assert sum(shares) / len(shares) >= 0.6  # was 0.19: 6 of 8 runs stuck in plain steps


def test_a_cheap_drafter_of_a_chain_drafts_longer_than_the_costly_one():
    """Per member: free, often-right lookup drafts go long; the model's, each a step, stay
    short. Both sets of rounds fed to one policy would price them alike."""
    p = PerSource(Auto(), {"lookup": Auto()})
    for _ in range(3):
        rounds(p, accepted=8, drafted=8, t_draft=0.0, t_verify=0.002, n=10, source="lookup")
        rounds(p, accepted=2, drafted=3, t_draft=0.001, t_verify=0.002, n=10, source="draft")
        rounds(p, accepted=0, drafted=0, t_draft=0.0, t_verify=0.0018, n=1, source="draft")
        rounds(p, accepted=0, drafted=0, t_draft=0.0, t_verify=0.0018, n=1, source="lookup")
    assert p.plan("lookup").length >= 8
    assert p.plan("draft").length <= 4
    assert p.plan(None).length == p.plan("draft").length  # the chain's last member: main


def test_a_policy_settled_at_neighbouring_lengths_learns_the_full_verify_slope():
    """Rounds at γ = 2 and 3 only: their spread is small, but after many of them the slope is
    measured, and must not stay shrunk (shrunk by half it priced γ = 4 as cheap as 3 and kept
    `auto` drafting 3.2 on the trained pair where 2 paid 9% more)."""
    from edgespec.runtime.policies.estimates import CostModel

    cost = CostModel()
    for i in range(80):
        g = 2 + i % 2
        rest = 0.0020 + 0.00035 * g  # each verified position costs 16% of a plain step
        cost.observe(RoundStats("decode", 3, g + 1, rest + g * 0.0005, g, 2, g * 0.0005, rest))
    slope = cost._line()[1]
    assert 0.75 * 0.00035 < slope <= 0.00035  # the old shrink: half of it, however many rounds
    true = 0.0020 + 0.00035 * 4 + 4 * 0.0005
    assert abs(cost.cost(4) - true) < 0.04 * true


def test_each_drafted_length_is_priced_by_its_own_rounds_where_the_verify_time_steps():
    """The trained pair's fp32 verify cost 2.02 ms for 6 positions and 2.34 for 7 (the matmul
    kernels change tiling). A line through rounds at γ 4-6 priced γ = 5 3.5% high and γ = 6
    low, and `auto` drafted 6 in a fifth of its rounds where 5 paid 5% more per token."""
    from edgespec.runtime.policies.estimates import CostModel

    def rest(g: int) -> float:
        return 0.0017 + 0.00006 * g + (0.0003 if g >= 6 else 0.0)

    cost = CostModel()
    for i in range(300):
        g = 4 + i % 3
        cost.observe(RoundStats("decode", 4, g + 1, rest(g) + g * 0.00018, g, 3, g * 0.00018))
    for g in (4, 5, 6):
        assert abs(cost.cost(g) / (rest(g) + g * 0.00018) - 1) < 0.015


def test_a_generations_cold_first_rounds_are_priced_as_the_warm_rounds_they_would_be():
    """After an app idles its weights come back from memory: on the trained pair a
    generation's rounds 1-9 ran 1.7x .. 1.1x a steady round. Priced as they were, they made
    the γ that opened each generation look dear for most of it, and `auto` moved off its
    best γ."""
    from dataclasses import replace

    from edgespec.runtime.policies.estimates import PRIORS, CostModel

    def steady(g: int) -> float:
        return 0.0017 + 0.00006 * g + g * 0.00018

    def generations(cost: CostModel) -> None:
        for _ in range(20):  # the slowness of each place is learned over a few replies
            for i in range(1, 41):
                g = 5 if i <= 8 else 4 + i % 3
                slow = 1.0 + 0.7 * max(0, 17 - i) / 16  # 1.7x at round 1 .. 1.0x from 17
                draft = g * 0.00018 * slow
                cost.observe(RoundStats("decode", 4, g + 1, steady(g) * slow, g, 3, draft, index=i))

    warm, cold = CostModel(), CostModel(priors=replace(PRIORS, warm_rounds=0))
    generations(warm)
    generations(cold)
    for g in (4, 5, 6):
        assert abs(warm.cost(g) / steady(g) - 1) < 0.015
    assert cold.cost(5) / steady(5) > 1.04  # the cold rounds priced as they ran
    assert warm.acceptance.curve(8) == cold.acceptance.curve(8)  # every round taught it


def test_early_rounds_price_as_they_run_where_nothing_runs_cold():
    """Where a generation's first rounds run as fast as later ones (a model too big for the
    caches), and in an app whose replies all end within WARM_ROUNDS rounds, every round
    prices as it ran: here the machine turns 30% slower and the prices follow."""
    from edgespec.runtime.policies.estimates import CostModel

    for length in (12, 40):
        cost = CostModel()
        for reply in range(30):
            slower = 1.3 if reply >= 15 else 1.0
            for i in range(1, length + 1):
                cost.observe(RoundStats("decode", 4, 5, 0.003 * slower, 4, 3, 0.0008, index=i))
        assert cost.cost(4) == pytest.approx(0.0039, rel=0.03)


def test_greedy_drafting_stops_after_a_token_drafted_below_the_confidence_threshold():
    # greedy drafting skips the softmax unless the plan has a confidence stop; with one, a
    # draft whose top probability is under the threshold is the last of the round
    import numpy as np

    from edgespec.runtime.drafters.base import draft_tokens
    from edgespec.runtime.round import Plan
    from edgespec.runtime.sampling import SamplingParams

    vocab = 4096
    sure, unsure = np.zeros(vocab, np.float32), np.zeros(vocab, np.float32)
    sure[7] = 30.0  # p(7) ~ 1
    unsure[9] = 1.0  # p(9) ~ e / (e + 4095): far below 0.5
    calls: list[list[int]] = []

    def step(ids: list[int]) -> np.ndarray:
        calls.append(ids)
        return unsure if len(calls) == 2 else sure

    rng, greedy = np.random.default_rng(0), SamplingParams()
    tokens, _, _ = draft_tokens(step, [1], Plan(5, min_confidence=0.5), greedy, rng)
    assert tokens == [7, 9]
    calls.clear()
    tokens, _, _ = draft_tokens(step, [1], Plan(5), greedy, rng)
    assert tokens == [7, 9, 7, 7, 7]
