"""Draft-length policies: how many tokens to draft each round (and, for DEL, from which exit).

Every policy answers three questions: `next_length()` (the most tokens to draft this
round), `keep_drafting(drafted, confidence)` (stop early?) and `observe(stats)` (learn from
the finished round). Parsed from strings like "fixed:4", "confidence:0.4", "acceptance",
"dynamic-exit" by `make_policy`.

The adaptive ones maximise expected accepted tokens per second. With per-token acceptance
α, a round drafting γ tokens yields N(γ) = (1 - α^(γ+1)) / (1 - α) tokens on average and
costs T(γ) = γ·t_draft + t_verify(γ + 1); α, t_draft and t_verify are measured online.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from edgespec.runtime.generate import RoundStats

MAX_DRAFT = 12


class DraftLengthPolicy(Protocol):
    max_length: int

    def next_length(self) -> int: ...

    def keep_drafting(self, drafted: int, confidence: float) -> bool: ...

    def observe(self, stats: RoundStats) -> None: ...


@dataclass
class FixedLength:
    length: int

    @property
    def max_length(self) -> int:
        return self.length

    def next_length(self) -> int:
        return self.length

    def keep_drafting(self, drafted: int, confidence: float) -> bool:
        return True

    def observe(self, stats: RoundStats) -> None:
        pass


@dataclass
class Confidence:
    """Stop drafting once the drafter's top probability falls below `threshold` (Kangaroo,
    SpecDec++): a low-confidence draft token is likely to be rejected and costs a draft step."""

    threshold: float
    max_length: int = MAX_DRAFT

    def next_length(self) -> int:
        return self.max_length

    def keep_drafting(self, drafted: int, confidence: float) -> bool:
        return confidence >= self.threshold

    def observe(self, stats: RoundStats) -> None:
        pass


def expected_tokens(alpha: float, gamma: int) -> float:
    """E[tokens per round] when each draft is accepted with probability alpha."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


@dataclass
class CostModel:
    """Online estimates of acceptance and timing for one drafter (EWMA)."""

    alpha: float = 0.6  # prior: typical acceptance of a decent drafter
    decay: float = 0.15
    t_draft: float | None = None  # seconds per drafted token
    t_verify: dict[int, float] = field(default_factory=dict)  # width -> seconds
    rounds: int = 0

    def observe(self, s: RoundStats) -> None:
        self.rounds += 1
        if s.drafted:
            # each round is s.accepted Bernoulli successes, then one failure unless all passed
            trials = s.accepted + (1 if s.accepted < s.drafted else 0)
            rate = s.accepted / trials
            weight = 1 - (1 - self.decay) ** trials
            self.alpha += weight * (rate - self.alpha)
            per_token = s.draft_seconds / s.drafted
            self.t_draft = (
                per_token if self.t_draft is None else _ewma(self.t_draft, per_token, self.decay)
            )
        width = s.drafted + 1
        old = self.t_verify.get(width)
        self.t_verify[width] = (
            s.verify_seconds if old is None else _ewma(old, s.verify_seconds, self.decay)
        )

    def verify_time(self, width: int) -> float:
        if width in self.t_verify:
            return self.t_verify[width]
        # unseen width: the nearest measured one (verify cost grows slowly with width)
        nearest = min(self.t_verify, key=lambda w: abs(w - width))
        return self.t_verify[nearest]

    def best_length(self, max_length: int, min_length: int = 1) -> tuple[int, float]:
        """(γ, expected tokens per second) maximising N(γ) / T(γ)."""
        if self.t_draft is None or not self.t_verify:
            return min(4, max_length), 0.0
        alpha = min(self.alpha, 0.999)
        best = (min_length, -1.0)
        for g in range(min_length, max_length + 1):
            rate = expected_tokens(alpha, g) / (g * self.t_draft + self.verify_time(g + 1))
            if rate > best[1]:
                best = (g, rate)
        return best


def _ewma(old: float, new: float, decay: float) -> float:
    return old + decay * (new - old)


@dataclass
class Acceptance:
    """γ maximising expected tokens per second from the online acceptance estimate."""

    max_length: int = MAX_DRAFT
    cost: CostModel = field(default_factory=CostModel)

    def next_length(self) -> int:
        return self.cost.best_length(self.max_length)[0]

    def keep_drafting(self, drafted: int, confidence: float) -> bool:
        return True

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

    def next_length(self) -> int:
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

    def keep_drafting(self, drafted: int, confidence: float) -> bool:
        return True

    def observe(self, stats: RoundStats) -> None:
        k = stats.exit_layer if stats.exit_layer is not None else self.exit_layer
        self.costs[k].observe(stats)


def make_policy(spec: str, exits: list[int] | None = None) -> DraftLengthPolicy:
    """Parse "fixed:4", "confidence:0.4", "acceptance" or "dynamic-exit"."""
    name, _, arg = spec.partition(":")
    policy: DraftLengthPolicy | None = None
    try:
        if name == "fixed" and 0 <= int(arg or 4) <= 64:
            policy = FixedLength(int(arg or 4))
        elif name == "confidence" and 0 <= float(arg or 0.4) <= 1:
            policy = Confidence(float(arg or 0.4))
        elif name == "acceptance" and not arg:
            policy = Acceptance()
        elif name == "dynamic-exit" and not arg:
            policy = DynamicExit(sorted(exits or []))
    except ValueError:
        if name == "dynamic-exit":  # its own message (no exit layers in the bundle)
            raise
    if policy is None:
        raise ValueError(
            f"draft policy {spec!r} is not one of: fixed:N (0..64), confidence:T (0..1), "
            "acceptance, dynamic-exit"
        )
    return policy
