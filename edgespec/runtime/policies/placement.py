"""`placement`: where split mode decodes each round, priced from what is cheap to know.

Three places a round can run (`Plan.where`):

  split   the device drafts γ tokens, the server verifies them: γ and its price N(γ)/T(γ)
          are the `channel-aware` policy's (this policy holds one and asks it)
  stream  the server decodes on its own with its best mode and streams (no round trip
          between tokens): priced by the tokens per second its streamed rounds delivered
  local   the device's own graphs verify (the `auto` policy's γ): priced by that policy's
          cost model, `CostModel.rate` at its best γ

Before a place has run it is priced from what costs no round trip: the device's local speed
(calibrated, `edgespec bench --calibrate`, or measured in `placement_probe` local rounds: they
need no server), the link's round trip as the START's answer took it, and the server's
streaming offer in that answer (`RoundStats.stream_rate`: tokens/s its streams ran at lately; 0
while it has streamed nothing). A split round is guessed as a local round of the same γ plus
that round trip. So the first decision needs no learning rounds on the link: only a place with
no price at all (a server that has not streamed yet) is probed, and a place the guesses send a
round to is measured there (`placement_learn` split rounds, `placement_probe` others) before
its measured price replaces the guess (a stream's by its steady rounds: not the first, which
carries the STREAM's round trip). After that every round goes to the fastest place, switching
only for a price `placement_margin` better than the current one's (a run's spread is not a
reason to move), and every `placement_reprobe` rounds the place measured longest ago gets
`placement_probe` rounds again (a link or a load that changed), if that look costs at most
`placement_reprobe_share` of the decoding time since the place last ran (a slow place is looked
at less often). A server that says it is busy (a "verify only" answer, no room to stream at
START, or a stream it shed: `RoundStats.server_busy`) is not asked to stream for
`placement_busy` rounds. With an energy budget (J per generated token, device side), a place
whose predicted J/token is over it is left out (split: the channel-aware policy's E(γ)/N(γ);
stream: the radio waiting and receiving, `EnergyModel.wait_power_w` and `rx_joules_per_byte`;
local: the SoC busy at `draft_power_w` the whole time); if none fits, the least energy per
token wins. The policy object lives as long as its model, so what it learned carries over to
the next generation. The constants are the cost model's `Priors`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from edgespec.runtime.policies.channel import ChannelAware
from edgespec.runtime.policies.draft_length import Auto
from edgespec.runtime.policies.estimates import MAX_DRAFT, PRIORS, Priors
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
    _queue: list[Where] = field(default_factory=list)  # rounds still to run there, in order
    rtt: float | None = None  # seconds: the last START's round trip, less the server's work
    offer: float = 0.0  # tokens/s the server's streams ran at, as it said (0: not known)
    _split_cache: tuple[int, float] | None = None  # (split rounds seen, its price then)
    _clock: float = 0.0  # seconds of decode rounds so far
    _measured_at: dict[str, float] = field(default_factory=dict)  # place -> _clock then
    _per_round: float = 1.0  # tokens per decode round (EWMA)
    _streamed: bool = False  # the last decode round was a streamed one placed there

    # -- prices -------------------------------------------------------------------------------
    def _local_rate(self) -> float | None:
        cost = self.local.cost
        if not cost.round_time:  # neither calibrated nor measured
            return None
        g, rate = cost.best_length(MAX_DRAFT) if cost.t_draft is not None else (0, 0.0)
        return max(rate, cost.rate(0) if 0 in cost.round_time else 0.0)

    def _split_guess(self) -> float | None:
        """A split round priced as drafting here, the round trip, and the server verifying
        as fast as the device does, or as it streams a token if that is faster."""
        cost = self.local.cost
        if self.rtt is None or not cost.round_time:
            return None
        t_draft = cost.t_draft or 0.0
        lengths = range(MAX_DRAFT + 1) if cost.t_draft is not None else [0]
        best = 0.0
        for g in lengths:
            verify = cost.cost(g) - g * t_draft
            if self.offer > 0:
                verify = min(verify, 1 / self.offer)
            best = max(best, cost.expected(g) / (g * t_draft + self.rtt + verify))
        return best

    def rates(self) -> dict[str, float | None]:
        """Expected tokens per second of each place: measured, else guessed (None: neither)."""
        tokens, seconds, _ = self._stream
        if self._measured.get("stream") and seconds > 0:
            stream: float | None = tokens / seconds
        else:
            stream = self.offer or None
        split = self._split_rate() if self._measured.get("split") else None
        return {
            "split": split if split is not None else self._split_guess(),
            "stream": stream,
            "local": self._local_rate(),
        }

    def _split_rate(self) -> float:
        """The channel-aware policy's best N(γ)/T(γ), priced again only after a split round
        (pricing every γ costs about as much as a small model's decode step)."""
        seen = self.split.remote_rounds
        if self._split_cache is None or self._split_cache[0] != seen:
            self._split_cache = (seen, self.split.best().tokens_per_s)
        return self._split_cache[1]

    def joules_per_token(self, where: str, rate: float) -> float:
        e = self.split.energy
        if where == "split":
            if not self._measured.get("split"):
                return e.wait_power_w / rate  # a guess: the radio waiting, drafting aside
            return self.split.best().joules_per_token
        if where == "stream":
            tokens, _, down = self._stream
            per_token = down / tokens if tokens else 0.0
            return e.wait_power_w / rate + e.rx_joules_per_byte * per_token
        return e.draft_power_w / rate

    def _busy(self) -> bool:
        return self._round < self._busy_until

    def best(self) -> Where:
        rates = {w: r for w, r in self.rates().items() if r is not None and r > 0}
        if self._busy():
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

    def _since(self, where: str) -> float:
        return self._clock - self._measured_at.get(where, 0.0)

    def _look_price(self, where: str) -> float:
        """Seconds that `placement_probe` rounds at `where` are expected to take."""
        rate = self.rates().get(where)
        rounds = self.priors.placement_probe
        if not rate:
            return 0.0  # unpriced: looking is the only way to know
        return rounds * self._per_round / rate + (self.rtt or 0.0) * (where != "local")

    def _learn(self, where: Where) -> list[Where]:
        n = self.priors.placement_learn if where == "split" else self.priors.placement_probe
        return [where] * n

    # -- the DraftLengthPolicy protocol -------------------------------------------------------
    def plan(self, source: str | None = None) -> Plan:
        self._round += 1
        p = self.priors
        if not self._queue:
            if self._local_rate() is None:  # the cheapest to learn: no round trip
                self._queue = self._learn("local")
            elif not self._measured.get("stream") and not self.offer and not self._busy():
                self._queue = self._learn("stream")  # no price from the server either
            elif self.rates()["split"] is None:  # no START answer seen: no round trip known
                self._queue = self._learn("split")
            elif self._round % p.placement_reprobe == 0:
                due = [
                    w
                    for w in PLACES
                    if w != self.where
                    and not (w == "stream" and self._busy())
                    and self._look_price(w) <= self._since(w) * p.placement_reprobe_share
                ]
                if due:
                    stalest = min(due, key=lambda w: self._measured.get(w, 0))
                    self._queue = [stalest] * p.placement_probe
        while self._queue and self._queue[0] == "stream" and self._busy():
            self._queue.pop(0)
        if self._queue:
            self.where = self._queue.pop(0)
        else:
            self.where = self.best()
            if not self._measured.get(self.where):  # a guess: measure it before trusting it
                self._queue = self._learn(self.where)[1:]
        if self.where == "stream":
            return Plan(0, where="stream")
        plan = (self.local if self.where == "local" else self.split).plan(source)
        return Plan(plan.length, plan.exit_layer, plan.min_confidence, self.where)

    def observe(self, stats: RoundStats) -> None:
        self.split.observe(stats)  # it learns the link from remote rounds only
        if stats.verifier == "remote" and (stats.phase == "prefill" or stats.reconnected):
            self.rtt = stats.network_seconds  # a START's round trip: the link as it is now
        if stats.stream_rate is not None:  # and the server's streaming offer in its answer
            self.offer = stats.stream_rate
        if stats.server_busy:
            self._busy_until = self._round + self.priors.placement_busy
        if stats.phase != "decode":
            self._streamed = False  # a new generation: its stream starts anew
            return
        place = {"remote": "split", "stream": "stream", "local": "local", "device": "local"}.get(
            stats.verifier
        )
        if place is None:
            return
        self._measured[place] = self._round
        self._clock += stats.seconds
        self._measured_at[place] = self._clock
        self._per_round += 0.1 * (stats.new_tokens - self._per_round)
        # a stream's first round carries its STREAM's round trip, and a round placed
        # elsewhere that reads a stream's last tokens carries the STOP's: switching costs
        # (the margin's business), not the stream's speed
        steady = self.where == "stream" and self._streamed
        self._streamed = place == "stream" and self.where == "stream"
        if place == "local":
            self.local.observe(stats)
        elif place == "stream" and steady:
            keep = 1 - self.priors.stream_decay
            tokens, seconds, down = self._stream
            self._stream = (
                keep * tokens + stats.new_tokens,
                keep * seconds + stats.seconds,
                keep * down + stats.bytes_down,
            )

    def channel_estimates(self) -> tuple[float | None, float | None]:
        return self.split.channel_estimates()
