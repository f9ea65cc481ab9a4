"""The placement policy decides where split mode decodes fastest (split rounds, server
streaming, local decoding) from what costs no round trip (its own local speed, the START's
round trip and the server's streaming offer), measures a place before trusting its guess,
keeps off streaming while the server is busy, and keeps within an energy budget."""

from __future__ import annotations

from dataclasses import replace

import pytest

from edgespec.runtime.policies.estimates import PRIORS
from edgespec.runtime.policies.placement import Placement
from edgespec.runtime.registry import make_policy
from edgespec.runtime.stats import RoundStats


class World:
    """Round stats as a device would see them: a 50 ms link, drafts accepted at ~70%, and
    streamed and local rounds at the given speeds (tokens/s)."""

    def __init__(self, stream_rate: float, local_rate: float) -> None:
        self.stream_rate, self.local_rate = stream_rate, local_rate
        self.round = 0

    def stats(self, where: str, gamma: int, busy: bool = False) -> RoundStats:
        self.round += 1
        accepted = int(0.7 * gamma)
        if where == "stream" and not busy:
            n = 4
            return RoundStats(
                "decode", n, 1, n / self.stream_rate, verifier="stream", bytes_down=40
            )
        if where == "local":
            n = accepted + 1
            return RoundStats(
                "decode",
                n,
                gamma + 1,
                0.001 * gamma + n / self.local_rate,
                drafted=gamma,
                accepted=accepted,
                draft_seconds=0.001 * gamma,
                verifier="local",
            )
        draft, net, server = 0.004 * gamma, 0.05 + 0.0001 * gamma, 0.003
        s = RoundStats(
            "decode",
            accepted + 1,
            gamma + 1,
            draft + net + server,
            drafted=gamma,
            accepted=accepted,
            draft_seconds=draft,
            verifier="remote",
            network_seconds=net,
            server_seconds=server,
            bytes_up=27 + 4 * gamma,
            bytes_down=28,
        )
        s.server_busy = busy
        return s

    def start(self, offer: float | None = None, busy: bool = False) -> RoundStats:
        """The prefill's stats: the START's round trip and the server's streaming offer
        (None: the server's stream rate; 0: it has not streamed yet)."""
        s = RoundStats("prefill", 1, 20, 0.06, verifier="remote", network_seconds=0.05)
        s.stream_rate = self.stream_rate if offer is None else offer
        s.server_busy = busy
        return s


def run(policy: Placement, world: World, rounds: int, busy: bool = False) -> list[str]:
    where = []
    for _ in range(rounds):
        plan = policy.plan()
        where.append(plan.where)
        if plan.where == "stream":
            assert plan.length == 0  # the server decodes: the device drafts nothing
        stats = world.stats(plan.where, plan.length, busy and plan.where == "stream")
        policy.observe(stats)
    return where


def placement(**options) -> Placement:
    policy = make_policy("placement", **options)
    assert isinstance(policy, Placement)
    return policy


def test_it_decides_from_its_own_speed_and_the_start_answer_without_probing_the_link():
    world = World(stream_rate=300, local_rate=40)
    policy = placement()
    policy.observe(world.start())
    where = run(policy, world, 30)
    probe = PRIORS.placement_probe
    assert where[:probe] == ["local"] * probe  # its own speed: no round trip
    assert set(where[probe:]) == {"stream"}  # the offer beats it: no split round to learn


def test_a_calibrated_device_decides_at_its_first_round():
    world = World(stream_rate=60, local_rate=300)
    policy = placement()
    for _ in range(3):  # as `edgespec bench --calibrate` seeds it: round times known
        policy.local.observe(world.stats("local", 2))
    policy.observe(world.start())
    assert run(policy, world, 20) == ["local"] * 20


def test_a_server_that_has_not_streamed_is_probed_once():
    world = World(stream_rate=300, local_rate=40)
    policy = placement()
    policy.observe(world.start(offer=0.0))
    where = run(policy, world, 30)
    probe = PRIORS.placement_probe
    assert where[probe : 2 * probe] == ["stream"] * probe
    assert set(where[2 * probe :]) == {"stream"}


def test_a_guess_is_measured_before_it_is_trusted():
    # a split round is guessed from the START's round trip and the server's speed: here the
    # link is slower than that one answer said, and the measured price sends the device home
    world = World(stream_rate=300, local_rate=80)
    policy = placement()
    policy.observe(world.start(busy=True))  # a fast server, but with no room to stream
    policy.rtt = 0.001  # the guess favours split
    where = run(policy, world, 30)
    assert "split" in where
    assert where[-10:] == ["local"] * 10, policy.rates()


@pytest.mark.parametrize(
    "stream_rate, local_rate, best",
    [(300, 40, "stream"), (20, 300, "local"), (10, 12, "split")],
)
def test_the_fastest_place_wins(stream_rate, local_rate, best):
    world = World(stream_rate, local_rate)
    policy = placement()
    policy.observe(world.start())
    where = run(policy, world, 40)
    assert where[-10:] == [best] * 10, policy.rates()


def test_without_a_start_answer_every_place_is_measured():
    where = run(placement(), World(stream_rate=300, local_rate=40), 30)
    probe, learn = PRIORS.placement_probe, PRIORS.placement_learn
    assert where[: 2 * probe + learn] == ["local"] * probe + ["stream"] * probe + ["split"] * learn
    assert set(where[2 * probe + learn :]) == {"stream"}


def test_a_busy_server_is_not_asked_to_stream_for_a_while():
    policy = placement(priors=replace(PRIORS, placement_busy=20))
    where = run(policy, World(stream_rate=300, local_rate=40), 12, busy=True)
    # the first refusal ends the stream probes: nothing is streamed while it is busy
    assert "stream" not in where[PRIORS.placement_probe + 1 :]


def test_a_server_with_no_room_to_stream_at_start_is_not_asked_to():
    world = World(stream_rate=300, local_rate=40)
    policy = placement()
    policy.observe(world.start(busy=True))
    assert "stream" not in run(policy, world, 30)


def test_an_energy_budget_leaves_out_the_places_over_it():
    # local is fastest, but a SoC busy at 3 W for 1/300 s a token is 10 mJ/token; the radio
    # waiting at 1.3 W for 1/200 s a token is 6.5 mJ
    world = World(stream_rate=200, local_rate=300)
    fast = placement()
    fast.observe(world.start())
    assert run(fast, world, 40)[-5:] == ["local"] * 5
    frugal = placement(energy_budget=0.008)
    frugal.observe(world.start())
    where = run(frugal, world, 40)
    assert where[-20:] == ["stream"] * 20


def test_placement_is_a_split_mode_policy():
    with pytest.raises(ValueError, match="energy budget"):
        make_policy("auto", energy_budget=0.1)
    assert placement(energy_budget=0.2).energy_budget == 0.2
    assert make_policy("placement:0.3").energy_budget == 0.3


def test_a_streams_start_up_round_trip_does_not_price_the_stream():
    world = World(stream_rate=300, local_rate=40)
    policy = placement()
    policy.observe(world.start(offer=0.0))
    run(policy, world, PRIORS.placement_probe)  # its own speed first
    assert policy.plan().where == "stream"
    first = world.stats("stream", 0)
    first.seconds += 0.5  # the STREAM's round trip and the server's queue
    policy.observe(first)
    run(policy, world, 3)
    assert policy.rates()["stream"] == pytest.approx(300)


def test_a_far_slow_place_is_looked_at_for_a_small_share_of_the_time():
    """A device much faster than its server's stream keeps decoding here; re-measuring the
    other places (a round trip and a few rounds there) costs at most about
    `placement_reprobe_share` of its time, however long the generation, yet it still looks."""
    world = World(stream_rate=150.0, local_rate=900.0)
    policy = placement()
    policy.observe(world.start())
    seconds = {"local": 0.0, "elsewhere": 0.0}
    looks = 0
    for i in range(6000):
        plan = policy.plan()
        stats = world.stats(plan.where, plan.length)
        policy.observe(stats)
        if i >= 100:  # past the first measurements
            seconds["local" if plan.where == "local" else "elsewhere"] += stats.seconds
            looks += plan.where != "local"
    share = seconds["elsewhere"] / (seconds["local"] + seconds["elsewhere"])
    assert looks > 0  # the link and the server are still looked at now and then
    assert share <= 2 * policy.priors.placement_reprobe_share, share
