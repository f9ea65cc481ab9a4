"""`placement`: where split mode decodes each round, by measured throughput (and energy).

Three places a round can run (`Plan.where`):

  split   the device drafts γ tokens, the server verifies them: γ and its price N(γ)/T(γ)
          are the `channel-aware` policy's (this policy holds one and asks it)
  stream  the server decodes on its own with its best mode and streams (no round trip
          between tokens): priced by the tokens per second its streamed rounds delivered
  local   the device's own graphs verify (the `auto` policy's γ): priced by that policy's
          cost model, `CostModel.rate` at its best γ

The first rounds learn: `placement_probe` rounds local, as many streamed, then
`placement_learn` split rounds (the link's first estimates); after that every round goes to the
fastest place, switching only for a price `placement_margin` better than the current one's
(a run's spread is not a reason to move), and every `placement_reprobe` rounds the place
measured longest ago gets `placement_probe` rounds again (a link or a load that changed).
A server that answers "verify only" (`RoundStats.server_busy`) is not asked to stream again
for `placement_busy` rounds. With an energy budget (J per generated token, device side),
a place whose predicted J/token is over it is left out (split: the channel-aware policy's
E(γ)/N(γ); stream: the radio waiting and receiving, `EnergyModel.wait_power_w` and
`rx_joules_per_byte`; local: the SoC busy at `draft_power_w` the whole time); if none fits,
the least energy per token wins. The policy object lives as long as its model, so what it
learned carries over to the next generation. The constants are the cost model's `Priors`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from edgespec.runtime.channel_policy import ChannelAware
from edgespec.runtime.estimates import MAX_DRAFT, PRIORS, Priors
from edgespec.runtime.policies import Auto
from edgespec.runtime.round import Plan, Where
from edgespec.runtime.stats import RoundStats

PLACES: tuple[Where, ...] = ("split", "stream", "local")


@dataclass
class Placement:
    split: ChannelAware
    local: Auto
    energy_budget: float | None = None
    priors: Priors = PRIORS
    where: Where = "split"
    # streamed rounds: exponentially weighted (tokens, seconds, bytes down)
    _stream: tuple[float, float, float] = (0.0, 0.0, 0.0)
    _round: int = 0
    _busy_until: int = 0
    _measured: dict[str, int] = field(default_factory=dict)  # place -> last round it ran
    _queue: list[Where] = field(default_factory=list)  # probes still to run, in order
    _learned: bool = False

    def __post_init__(self) -> None:
        p = self.priors
        self._queue = [  # the cheapest to learn first: no round trip, then one, then many
            *(["local"] * p.placement_probe),
            *(["stream"] * p.placement_probe),
            *(["split"] * p.placement_learn),
        ]

    # -- prices -------------------------------------------------------------------------------
    def rates(self) -> dict[str, float | None]:
        """Expected tokens per second of each place (None: not measured)."""
        split = self.split.best().tokens_per_s if self._measured.get("split") else None
        tokens, seconds, _ = self._stream
        stream = tokens / seconds if seconds > 0 and self._measured.get("stream") else None
        local = None
        cost = self.local.cost
        if self._measured.get("local") and cost.round_time:
            g, rate = cost.best_length(MAX_DRAFT) if cost.t_draft is not None else (0, 0.0)
            local = max(rate, cost.rate(0) if 0 in cost.round_time else 0.0)
        return {"split": split, "stream": stream, "local": local}

    def joules_per_token(self, where: str, rate: float) -> float:
        e = self.split.energy
        if where == "split":
            return self.split.best().joules_per_token
        if where == "stream":
            tokens, _, down = self._stream
            per_token = down / tokens if tokens else 0.0
            return e.wait_power_w / rate + e.rx_joules_per_byte * per_token
        return e.draft_power_w / rate

    def best(self) -> Where:
        rates = {w: r for w, r in self.rates().items() if r is not None and r > 0}
        if self._round < self._busy_until:
            rates.pop("stream", None)
        if not rates:
            return "split"
        if self.energy_budget is not None:
            joules = {w: self.joules_per_token(w, r) for w, r in rates.items()}
            fits = {w: r for w, r in rates.items() if joules[w] <= self.energy_budget}
            if not fits:
                return min(joules, key=lambda w: joules[w])  # type: ignore[return-value]
            rates = fits
        fastest = max(rates, key=lambda w: rates[w])
        now = rates.get(self.where)
        if now is not None and rates[fastest] <= now * (1 + self.priors.placement_margin):
            return self.where
        return fastest  # type: ignore[return-value]

    # -- the DraftLengthPolicy protocol -------------------------------------------------------
    def plan(self, source: str | None = None) -> Plan:
        self._round += 1
        p = self.priors
        if self._learned and self._round % p.placement_reprobe == 0:
            stalest = min(PLACES, key=lambda w: self._measured.get(w, 0))
            if stalest != self.where:
                self._queue = [stalest] * p.placement_probe
        while self._queue and self._queue[0] == "stream" and self._round < self._busy_until:
            self._queue.pop(0)
        if self._queue:
            self.where = self._queue.pop(0)
        else:
            self._learned = True
            self.where = self.best()
        if self.where == "stream":
            return Plan(0, where="stream")
        plan = (self.local if self.where == "local" else self.split).plan(source)
        return Plan(plan.length, plan.exit_layer, plan.min_confidence, self.where)

    def observe(self, stats: RoundStats) -> None:
        self.split.observe(stats)  # it learns the link from remote rounds only
        if stats.phase != "decode":
            return
        if stats.server_busy:
            self._busy_until = self._round + self.priors.placement_busy
        place = {"remote": "split", "stream": "stream", "local": "local", "device": "local"}.get(
            stats.verifier
        )
        if place is None:
            return
        self._measured[place] = self._round
        if place == "local":
            self.local.observe(stats)
        elif place == "stream":
            keep = 1 - self.priors.stream_decay
            tokens, seconds, down = self._stream
            self._stream = (
                keep * tokens + stats.new_tokens,
                keep * seconds + stats.seconds,
                keep * down + stats.bytes_down,
            )

    def channel_estimates(self) -> tuple[float | None, float | None]:
        return self.split.channel_estimates()
