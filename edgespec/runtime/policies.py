"""Draft-length policies: how many tokens to draft each round (and, for DEL, from which exit).

Every policy answers two questions: `plan()` (this round's `Plan`: the most tokens to draft,
the exit layer, the confidence under which drafting stops) and `observe(stats)` (learn from
the finished round). The decode loop asks `plan()` once per round and tells the drafter;
drafters never consult the policy. Names such as "fixed:4", "confidence:0.4", "acceptance",
"auto", "dynamic-exit" are parsed by `registry.make_policy`; "channel-aware" (split decoding:
RTT, bandwidth and an energy budget in the round cost) lives in `channel_policy.py`.

The adaptive ones maximise expected accepted tokens per second. With per-token acceptance
α, a round drafting γ tokens yields N(γ) = (1 - α^(γ+1)) / (1 - α) tokens on average and
costs T(γ) = γ·t_draft + t_verify(γ + 1); α, t_draft and t_verify are measured online.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from edgespec.runtime.round import Plan
from edgespec.runtime.stats import RoundStats

MAX_DRAFT = 12


class DraftLengthPolicy(Protocol):
    max_length: int

    def plan(self) -> Plan: ...

    def observe(self, stats: RoundStats) -> None: ...


@dataclass
class FixedLength:
    length: int

    @property
    def max_length(self) -> int:
        return self.length

    def plan(self) -> Plan:
        return Plan(self.length)

    def observe(self, stats: RoundStats) -> None:
        pass


@dataclass
class Confidence:
    """Stop drafting once the drafter's top probability falls below `threshold` (Kangaroo,
    SpecDec++): a low-confidence draft token is likely to be rejected and costs a draft step."""

    threshold: float
    max_length: int = MAX_DRAFT

    def plan(self) -> Plan:
        return Plan(self.max_length, min_confidence=self.threshold)

    def observe(self, stats: RoundStats) -> None:
        pass


def expected_tokens(alpha: float, gamma: int) -> float:
    """E[tokens per round] when each draft is accepted with probability alpha."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def alpha_for(tokens: float, gamma: float) -> float:
    """The per-token acceptance α at which drafting γ yields `tokens` per round on average
    (the inverse of `expected_tokens` in α, by bisection; γ may be fractional)."""
    tokens = min(max(tokens, 1.0), gamma + 1.0)
    lo, hi = 0.0, 0.999
    for _ in range(40):
        mid = (lo + hi) / 2
        if (1.0 - mid ** (gamma + 1)) / (1.0 - mid) < tokens:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass
class CostModel:
    """Online estimates for one drafter: per-token acceptance α (EWMA), the cost of one draft
    token, the wall time of a plain step (γ = 0) and of a speculative round as a line in γ,
    round(γ) ≈ a + b·γ for γ ≥ 1 (verifying γ + 1 positions, drafting γ tokens and any
    per-round overhead of the mode), fitted by exponentially weighted least squares over
    recent speculative rounds. A line rather than a table per γ: every round refines the
    price of every γ, and one slow round (a scheduler hiccup) cannot leave one γ looking
    expensive forever because the policy never tries it again.

    A plain step is priced by its own measurements, never by the line's intercept: a
    speculative round has costs a plain step does not (a draft call, a wider verify), so
    the line through γ ≥ 1 overprices γ = 0 (by ~50% on a small CPU model) and would make
    speculation look better than it is. The line forgets per speculative round, so a long
    stretch of plain steps leaves what speculation costs as it was last seen.

    α is fitted to what rounds yield, not counted per draft: drafts are accepted in runs (a
    repetitive stretch accepts long drafts whole, a novel one almost none), so the share of
    drafts accepted (63% at γ = 4 on code) predicts 2.3 tokens per round where 3.5 come, and
    priced speculation out of rounds it wins. α is the value for which
    (1 − α^(γ+1)) / (1 − α) equals the EWMA of tokens per round at the EWMA of γ: exact for
    independent drafts, and it matched the tokens per round measured at γ = 2..8 within 7%."""

    alpha: float = 0.6  # prior: typical acceptance of a decent drafter
    decay: float = 0.15
    t_draft: float | None = None  # seconds per drafted token
    round_time: dict[int, float] = field(default_factory=dict)  # γ -> EWMA seconds, as seen
    rounds: int = 0
    fit_decay: float = 0.03  # forgetting per speculative round of the line (~30 rounds)
    _sums: list[float] = field(default_factory=lambda: [0.0] * 5)  # Σw, Σwγ, Σwt, Σwγ², Σwγt
    _seen: dict[int, int] = field(default_factory=dict)  # γ -> rounds measured
    _yield: tuple[float, float] | None = None  # EWMA (tokens per round, drafts per round)

    def __post_init__(self) -> None:
        for g, t in self.round_time.items():  # calibrated: worth a few live rounds each
            self._seen[g] = 3
            if g > 0:
                self._fit(g, t, weight=3.0)

    def observe(self, s: RoundStats) -> None:
        self.rounds += 1
        if s.drafted:
            if self._yield is None:  # the prior, as if seen at this round's γ
                self._yield = (expected_tokens(self.alpha, s.drafted), float(s.drafted))
            tokens, drafts = self._yield
            tokens = _ewma(tokens, s.accepted + 1.0, self.decay)
            drafts = _ewma(drafts, float(s.drafted), self.decay)
            self._yield = (tokens, drafts)
            self.alpha = alpha_for(tokens, drafts)
            per_token = s.draft_seconds / s.drafted
            self.t_draft = (
                per_token if self.t_draft is None else _ewma(self.t_draft, per_token, self.decay)
            )
        g = s.drafted
        seconds = s.seconds - s.catchup_seconds  # a one-off, not a cost of this γ
        if self.round_time:  # a round 3x slower than expected is noise, not a price
            seconds = min(seconds, 3 * self.cost(g))
        # a running mean over the first rounds of a γ, then an EWMA: the first measurement
        # (maybe a noisy one) does not linger, which matters for rarely run γ = 0 steps
        n = self._seen[g] = self._seen.get(g, 0) + 1
        old = self.round_time.get(g)
        self.round_time[g] = seconds if old is None else _ewma(old, seconds, max(self.decay, 1 / n))
        if g > 0:
            self._fit(g, seconds)

    def _fit(self, gamma: int, seconds: float, weight: float = 1.0) -> None:
        keep = 1 - self.fit_decay
        w, x, y, xx, xy = (v * keep for v in self._sums)
        g = float(gamma)
        self._sums = [w + weight, x + weight * g, y + weight * seconds]
        self._sums += [xx + weight * g * g, xy + weight * g * seconds]

    def _line(self) -> tuple[float, float] | None:
        """(a, b) of round(γ) = a + b·γ for γ ≥ 1, or None while the speculative rounds seen
        span too few γ."""
        w, x, y, xx, xy = self._sums
        if w <= 0:
            return None
        mean_g, mean_t = x / w, y / w
        spread = xx / w - mean_g**2
        if spread < 0.1:
            return None
        slope = max((xy / w - mean_g * mean_t) / spread, 0.0)
        return mean_t - slope * mean_g, slope

    def cost(self, gamma: int) -> float:
        """Estimated seconds of a round drafting γ tokens. γ = 0: measured plain steps (the
        line's intercept only while none was measured). γ ≥ 1: the fitted line; before there
        is one, the nearest measured γ ≥ 1 plus (or minus) draft steps, or a plain step plus γ
        draft steps while no speculative round was measured."""
        if gamma == 0 and 0 in self.round_time:
            return self.round_time[0]
        line = self._line()
        if line is not None:
            return max(line[0] + line[1] * gamma, 1e-9)
        spec = [g for g in self.round_time if g > 0] or list(self.round_time)
        nearest = min(spec, key=lambda g: (abs(g - gamma), -g))
        estimate = self.round_time[nearest] + (gamma - nearest) * (self.t_draft or 0.0)
        return max(estimate, 1e-9)

    def rate(self, gamma: int) -> float:
        """Expected tokens per second when drafting γ per round."""
        return expected_tokens(min(self.alpha, 0.999), gamma) / self.cost(gamma)

    def best_length(self, max_length: int, min_length: int = 1) -> tuple[int, float]:
        """(γ, expected tokens per second) maximising N(γ) / T(γ)."""
        if self.t_draft is None or not self.round_time:
            return min(4, max_length), 0.0
        return max(
            ((g, self.rate(g)) for g in range(min_length, max_length + 1)), key=lambda pair: pair[1]
        )


def _ewma(old: float, new: float, decay: float) -> float:
    return old + decay * (new - old)


@dataclass
class Acceptance:
    """γ maximising expected tokens per second from the online acceptance estimate."""

    max_length: int = MAX_DRAFT
    cost: CostModel = field(default_factory=CostModel)

    def plan(self) -> Plan:
        return Plan(self.cost.best_length(self.max_length)[0])

    def observe(self, stats: RoundStats) -> None:
        self.cost.observe(stats)


@dataclass
class Auto:
    """Speculate only when it wins. γ = 0 (one plain target step) is a candidate like any
    other, priced by its own measured round time; when plain decoding is the better bet the
    policy still probes a short draft now and then (every 4, 8, ... up to 128 plain rounds,
    backing off while probes keep losing) so speculation switches back on when the text gets
    predictable again."""

    max_length: int = MAX_DRAFT
    cost: CostModel = field(default_factory=CostModel)
    max_gap: int = 128
    _gap: int = 4
    _plain_rounds: int = 0

    def plan(self) -> Plan:
        return Plan(self._length())

    def _length(self) -> int:
        if self.cost.t_draft is None:
            return min(2, self.max_length)  # learn α and the draft cost first
        if 0 not in self.cost.round_time:
            return 0  # then what a plain step costs here
        g, rate = self.cost.best_length(self.max_length, min_length=1)
        if rate > self.cost.rate(0):
            self._gap = 4
            return g
        self._plain_rounds += 1
        if self._plain_rounds >= self._gap:
            self._plain_rounds = 0
            self._gap = min(2 * self._gap, self.max_gap)
            return g
        return 0

    def observe(self, stats: RoundStats) -> None:
        self.cost.observe(stats)


@dataclass
class DynamicExit:
    """DEL: per exit layer an acceptance/cost model; each round drafts from the exit and with
    the γ that promise the most tokens per second. Exits not tried recently get a probe round
    so a changing text can move the choice."""

    exits: list[int]
    max_length: int = MAX_DRAFT
    probe_every: int = 24
    costs: dict[int, CostModel] = field(default_factory=dict)
    exit_layer: int = 0
    _round: int = 0

    def __post_init__(self) -> None:
        if not self.exits:
            raise ValueError("dynamic-exit needs a bundle with exit layers (--exit-layers)")
        self.costs = {k: CostModel() for k in self.exits}
        self.exit_layer = self.exits[0]

    def plan(self) -> Plan:
        return Plan(self._length(), exit_layer=self.exit_layer)

    def _length(self) -> int:
        self._round += 1
        untried = [k for k in self.exits if self.costs[k].rounds < 2]
        if untried:
            self.exit_layer = untried[0]
            return 4
        choices = {k: self.costs[k].best_length(self.max_length) for k in self.exits}
        if self._round % self.probe_every == 0:  # probe the exit least recently measured
            self.exit_layer = min(self.exits, key=lambda k: self.costs[k].rounds)
        else:
            self.exit_layer = max(choices, key=lambda k: choices[k][1])
        return choices[self.exit_layer][0]

    def observe(self, stats: RoundStats) -> None:
        k = stats.exit_layer if stats.exit_layer is not None else self.exit_layer
        self.costs[k].observe(stats)
