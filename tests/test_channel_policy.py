"""The channel-aware policy learns the link, the server and the drafter from round stats and
drafts as long as the round trip makes worthwhile, within an energy budget. A simulated
channel and drafter in pure Python (no sockets) feed it RoundStats."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

import pytest

from edgespec.runtime.policies.channel import ChannelAware, EnergyModel, OnlineLinear
from edgespec.runtime.policies.estimates import expected_tokens
from edgespec.runtime.registry import make_policy
from edgespec.runtime.stats import RoundStats


@dataclass(frozen=True)
class Sim:
    """A split round: draft γ locally, send header + γ·per_token bytes, the server verifies."""

    rtt: float = 0.05
    bandwidth: float = 1.25e6  # bytes/s each way (10 Mbit/s)
    alpha: float = 0.8
    t_draft: float = 0.004
    verify_base: float = 0.010
    verify_per_token: float = 0.0005
    header: int = 40
    per_token: int = 4
    down: int = 24
    jitter: float = 0.0

    def round(self, g: int, rng: random.Random) -> RoundStats:
        accepted = 0
        while accepted < g and rng.random() < self.alpha:
            accepted += 1
        up = self.header + g * self.per_token
        net = self.rtt + (up + self.down) / self.bandwidth + rng.uniform(-1, 1) * self.jitter
        server = self.verify_base + self.verify_per_token * g
        return RoundStats(
            "decode",
            accepted + 1,
            g + 1,
            g * self.t_draft + server + net,
            drafted=g,
            accepted=accepted,
            draft_seconds=g * self.t_draft,
            verify_seconds=server,
            verifier="remote",
            network_seconds=net,
            server_seconds=server,
            bytes_up=up,
            bytes_down=self.down,
        )

    def rate(self, g: int) -> float:
        """Expected tokens per second of fixed γ."""
        seconds = (
            g * self.t_draft
            + self.rtt
            + (self.header + g * self.per_token + self.down) / self.bandwidth
            + self.verify_base
            + self.verify_per_token * g
        )
        return expected_tokens(self.alpha, g) / seconds

    def best_fixed(self, max_length: int = 12) -> int:
        return max(range(max_length + 1), key=self.rate)


def drive(policy: ChannelAware, sim: Sim, rounds: int, seed: int = 0) -> tuple[int, float, list]:
    """Run `rounds` rounds with the policy choosing γ: (tokens, seconds, chosen γs)."""
    rng = random.Random(seed)
    tokens, seconds, chosen = 0, 0.0, []
    for _ in range(rounds):
        g = policy.plan().length
        s = sim.round(g, rng)
        policy.observe(s)
        tokens, seconds = tokens + s.new_tokens, seconds + s.seconds
        chosen.append(g)
    return tokens, seconds, chosen


def settled(sim: Sim, rounds: int = 200, **options) -> ChannelAware:
    p = ChannelAware(**options)
    drive(p, sim, rounds)
    return p


def test_long_round_trips_draft_long():
    assert settled(Sim(rtt=0.150)).best().length >= 6


def test_short_round_trips_and_a_fast_server_draft_short():
    quick = Sim(rtt=0.001, verify_base=0.002, alpha=0.6)
    assert settled(quick).best().length <= 1
    assert settled(quick).best().length < settled(Sim(rtt=0.150, alpha=0.6)).best().length


def test_drafts_that_are_never_accepted_let_the_server_generate():
    p = settled(Sim(alpha=0.0))
    assert p.best().length == 0 and p.alpha < 0.05
    _, _, chosen = drive(p, Sim(alpha=0.0), 40)
    assert chosen.count(0) >= 36  # γ = 0 but for rare probes


def test_a_tiny_uplink_drafts_shorter_and_its_bandwidth_is_measured():
    slow = Sim(bandwidth=1000, per_token=8)
    p = settled(slow, rounds=300)
    assert p.best().length < settled(replace(slow, bandwidth=1.25e6)).best().length
    assert p.bandwidth is not None and 700 < p.bandwidth < 1400


@pytest.mark.parametrize("bandwidth", [125_000, 1_250_000, 12_500_000])
def test_big_messages_price_the_link_within_a_few_rounds(bandwidth):
    # sampling sends a q row (16 KiB here) per draft: at 1 Mbit/s a draft costs 130 ms
    sim = Sim(alpha=0.9, bandwidth=bandwidth, per_token=16384)
    p = settled(sim, rounds=8)
    assert p.bandwidth == pytest.approx(bandwidth, rel=0.05)
    assert sim.rate(p.best().length) >= 0.9 * sim.rate(sim.best_fixed())


def test_switching_from_token_ids_to_q_rows_is_priced_at_once():
    sim = Sim(alpha=0.9, bandwidth=125_000)  # greedy: 4 bytes per draft, γ long
    p = settled(sim, rounds=20)
    assert p.best().length >= 8
    drive(p, replace(sim, per_token=16384), 3)  # sampling: 130 ms per draft on the uplink
    assert p.best().length == 0 and p.bandwidth == pytest.approx(125_000, rel=0.05)


def test_rtt_estimate_is_the_fixed_part_of_the_network_time():
    p = settled(Sim(rtt=0.08, bandwidth=50_000, per_token=256, jitter=0.002), rounds=300)
    assert p.rtt is not None and abs(p.rtt - 0.08) < 0.01
    assert p.bandwidth is not None and 30_000 < p.bandwidth < 80_000


def test_choice_follows_a_channel_change_within_a_few_rounds():
    fast, slow = Sim(rtt=0.002, verify_base=0.002, alpha=0.7), Sim(rtt=0.2, alpha=0.7)
    p = settled(fast)
    assert p.best().length <= 1 < slow.best_fixed() - 3
    drive(p, slow, 8)
    assert p.best().length >= slow.best_fixed() - 3
    drive(p, fast, 8)
    assert p.best().length <= fast.best_fixed() + 1


def test_acceptance_recovers_after_a_hard_stretch():
    p = settled(Sim(alpha=0.0))
    assert p.best().length == 0
    drive(p, Sim(alpha=0.9), 120)  # only probes show α has risen
    assert p.best().length >= 4


@pytest.mark.parametrize("sim", [Sim(rtt=0.01), Sim(rtt=0.05), Sim(rtt=0.15, alpha=0.6)])
def test_throughput_is_within_10_percent_of_the_best_fixed_length(sim):
    p = settled(sim, rounds=50)
    tokens, seconds, _ = drive(p, sim, 2000, seed=1)
    assert tokens / seconds >= 0.9 * sim.rate(sim.best_fixed())


def test_energy_budget_is_respected():
    sim = Sim(rtt=0.15, alpha=0.8)
    p = settled(sim)
    fastest = p.best()
    least = min(p.evaluate(g).joules_per_token for g in range(p.max_length + 1))
    budget = (least + fastest.joules_per_token) / 2
    p.energy_budget = budget
    choice = p.best()
    assert choice.joules_per_token <= budget < fastest.joules_per_token
    assert choice.length != fastest.length and choice.tokens_per_s < fastest.tokens_per_s
    tokens, _, chosen = drive(p, sim, 300, seed=2)
    joules = sum(p.round_joules(g) for g in chosen)
    assert joules / tokens <= budget * 1.1  # probes and luck included, on average


def test_impossible_budget_takes_the_least_energy_per_token():
    p = settled(Sim(), energy_budget=1e-6)
    choice = p.best()
    least = min((p.evaluate(g) for g in range(p.max_length + 1)), key=lambda c: c.joules_per_token)
    assert choice.over_budget and choice.length == least.length


def test_a_weak_device_on_a_good_link_lets_the_server_generate():
    weak = Sim(rtt=0.02, t_draft=0.04, alpha=0.7)
    assert settled(weak).best().length == 0


def test_energy_model_from_a_device_profile():
    e = EnergyModel.from_profile({"energy": {"draft_power_w": 5, "joules_per_draft_token": 0.2}})
    assert e.draft_power_w == 5 and e.draft_joules(0.01) == 0.2
    assert EnergyModel.from_profile(None) == EnergyModel()
    assert EnergyModel().draft_joules(0.01) == pytest.approx(0.03)
    with pytest.raises(ValueError, match="unknown energy settings"):
        EnergyModel.from_profile({"draft_power": 5})


def test_policy_strings_and_budgets():
    assert make_policy("channel-aware").energy_budget is None
    assert make_policy("channel-aware:0.5").energy_budget == 0.5
    assert make_policy("channel-aware", energy_budget=0.2).energy_budget == 0.2
    profile = {"energy": {"wait_power_w": 0.5}}
    assert make_policy("channel-aware", device_profile=profile).energy.wait_power_w == 0.5
    with pytest.raises(ValueError, match="must be > 0 J/token"):
        make_policy("channel-aware", energy_budget=-1)
    with pytest.raises(ValueError, match="channel-aware"):
        make_policy("channel-aware:lots")
    with pytest.raises(ValueError, match="needs the channel-aware policy"):
        make_policy("fixed:4", energy_budget=0.5)


def test_local_rounds_and_prefill_do_not_move_the_link_estimates():
    p = settled(Sim(rtt=0.05))
    rtt = p.rtt
    local = replace(Sim().round(3, random.Random(0)), verifier="local", network_seconds=9.0)
    p.observe(local)
    p.observe(replace(local, phase="prefill", verifier="remote"))
    assert p.rtt == rtt


def test_online_linear_separates_intercept_and_slope():
    fit = OnlineLinear(1, ridge=1e-6)
    for i in range(200):
        x = float(i % 7)
        fit.observe([x], 2.0 + 0.5 * x)
    assert fit.a == pytest.approx(2.0, abs=1e-3) and fit.b[0] == pytest.approx(0.5, abs=1e-3)
