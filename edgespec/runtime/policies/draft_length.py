"""Draft-length policies: how many tokens to draft each round (and, for DEL, from which exit).

Every policy answers two questions: `plan(source)` (this round's `Plan`: the most tokens to
draft, the exit layer, the confidence under which drafting stops; `source` names the drafter
that will propose, a chain's member) and `observe(stats)` (learn from the finished round);
`channel_estimates()` says what it has learned of a split channel, for the round's stats.
The decode loop asks `plan()` once per round and tells the drafter; drafters never consult
the policy. `PerSource` prices a chain's members apart (`lookup+draft`). Names such as
"fixed:4", "confidence:0.4", "acceptance", "auto", "dynamic-exit" are parsed by
`registry.make_policy`; "channel-aware" (split decoding: RTT, bandwidth and an energy budget
in the round cost) lives in `channel.py`.

The adaptive ones maximise expected accepted tokens per second, N(γ) / T(γ): N from
per-position acceptance measured online (drafts are accepted in runs, not independently),
T(γ) = γ·t_draft + the verify-plus-overhead line of recent rounds; see `estimates.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from edgespec.runtime.policies.estimates import MAX_DRAFT, PRIORS, CostModel, Priors
from edgespec.runtime.round import DraftLengthPolicy, Plan
from edgespec.runtime.stats import RoundStats

# (round trip s, uplink bytes/s) of a policy that does not model a channel
NO_CHANNEL: tuple[float | None, float | None] = (None, None)


@dataclass
class FixedLength:
    length: int

    @property
    def max_length(self) -> int:
        return self.length

    def plan(self, source: str | None = None) -> Plan:
        return Plan(self.length)

    def observe(self, stats: RoundStats) -> None:
        pass

    def channel_estimates(self) -> tuple[float | None, float | None]:
        return NO_CHANNEL


@dataclass
class Confidence:
    """Stop drafting once the drafter's top probability falls below `threshold` (Kangaroo,
    SpecDec++): a low-confidence draft token is likely to be rejected and costs a draft step."""

    threshold: float
    max_length: int = MAX_DRAFT

    def plan(self, source: str | None = None) -> Plan:
        return Plan(self.max_length, min_confidence=self.threshold)

    def observe(self, stats: RoundStats) -> None:
        pass

    def channel_estimates(self) -> tuple[float | None, float | None]:
        return NO_CHANNEL


@dataclass
class Acceptance:
    """γ maximising expected tokens per second from the online acceptance estimate."""

    max_length: int = MAX_DRAFT
    cost: CostModel = field(default_factory=CostModel)

    def plan(self, source: str | None = None) -> Plan:
        return Plan(self.cost.best_length(self.max_length)[0])

    def observe(self, stats: RoundStats) -> None:
        self.cost.observe(stats)

    def channel_estimates(self) -> tuple[float | None, float | None]:
        return NO_CHANNEL


@dataclass
class Auto:
    """Speculate only when it wins. γ = 0 (one plain target step) is a candidate like any
    other, priced by its own measured round time; when plain decoding is the better bet the
    policy still probes a short draft now and then (every `probe_gap`, twice that, ... up to
    `max_probe_gap` plain rounds, backing off while probes keep losing clearly) so speculation
    switches back on when the text gets predictable again. While speculation is priced within
    `clearly_losing` of plain decoding, probes stay every `probe_gap` rounds: plain rounds
    teach nothing about acceptance, and a few slow or unlucky rounds (the first rounds of a
    generation after other models ran) could otherwise leave `auto` stepping plainly for
    hundreds of rounds where drafting paid. Each generation starts its probes afresh and keeps
    only `carried_rounds` of the acceptance measured before it (one model answers unrelated
    prompts: a question that lost says little about a summary), and
    a probe that drafted nothing (a model-free drafter found nothing to propose) is still
    owed. The constants are the cost model's `Priors`."""

    max_length: int = MAX_DRAFT
    cost: CostModel = field(default_factory=CostModel)
    _gap: int = 0  # plain rounds before the next probe (0: the first gap, `probe_gap`)
    _plain_rounds: int = 0
    _probe: bool | None = None  # a probe is out: whether it lengthens the gap once it drafts

    def plan(self, source: str | None = None) -> Plan:
        return Plan(self._length())

    def _length(self) -> int:
        if self.cost.t_draft is None:
            return min(2, self.max_length)  # learn α and the draft cost first
        if 0 not in self.cost.round_time:
            return 0  # then what a plain step costs here
        p = self.cost.priors
        g, rate = self.cost.best_length(self.max_length, min_length=1)
        plain = self.cost.rate(0)
        if rate > plain:
            self._gap = p.probe_gap
            return g
        self._gap = self._gap or p.probe_gap
        self._plain_rounds += 1
        if self._plain_rounds >= self._gap:
            self._plain_rounds = 0
            self._probe = rate < p.clearly_losing * plain
            return g
        return 0

    def new_generation(self) -> None:
        """A new text: probes start again at probe_gap, the last text's acceptance weighs less."""
        self._gap = self._plain_rounds = 0
        self.cost.acceptance.carry(self.cost.priors.carried_rounds)

    def observe(self, stats: RoundStats) -> None:
        if stats.index == 1:  # a new generation's first round
            self.new_generation()
        self.cost.observe(stats)
        if self._probe is not None and stats.phase == "decode":
            # a model-free drafter that found nothing to propose drafted nothing: that probe
            # taught nothing and cost a plain step, so it is still owed (the next round), and
            # only a probe that drafted backs the gap off
            if stats.drafted == 0:
                self._plain_rounds = self._gap or self.cost.priors.probe_gap
            elif self._probe:
                self._gap = min(2 * self._gap, self.cost.priors.max_probe_gap)
            self._probe = None

    def channel_estimates(self) -> tuple[float | None, float | None]:
        return NO_CHANNEL


@dataclass
class PerSource:
    """An adaptive policy per member of a drafter chain (`lookup+draft`), each learning only
    from the rounds its member drafted. One policy over the chain mixed two drafters that
    differ in both price and acceptance: prompt lookup's drafts cost nothing and pay best
    long, the draft model's cost a step each and pay best at 3-4. Priced as one, the model's
    rounds drafted ~6 where 4 paid 5% more. `main` plans for the chain's last member (and
    for any source not in `apart`)."""

    main: DraftLengthPolicy
    apart: dict[str, DraftLengthPolicy]

    @property
    def max_length(self) -> int:
        return self.main.max_length

    def plan(self, source: str | None = None) -> Plan:
        return self.apart.get(source or "", self.main).plan(source)

    def observe(self, stats: RoundStats) -> None:
        if stats.index == 1:  # a new generation: every member's, not only the one that drafted
            for member in (self.main, *self.apart.values()):
                getattr(member, "new_generation", lambda: None)()
        self.apart.get(stats.source or "", self.main).observe(stats)

    def channel_estimates(self) -> tuple[float | None, float | None]:
        return self.main.channel_estimates()


@dataclass
class DynamicExit:
    """DEL: per exit layer an acceptance/cost model; each round drafts from the exit and with
    the γ that promise the most tokens per second. Exits not tried recently get a probe round
    so a changing text can move the choice."""

    exits: list[int]
    max_length: int = MAX_DRAFT
    probe_every: int = 24
    priors: Priors = PRIORS  # each exit's cost model's constants
    costs: dict[int, CostModel] = field(default_factory=dict)  # per exit, built from `priors`
    exit_layer: int = 0
    _round: int = 0

    def __post_init__(self) -> None:
        if not self.exits:
            raise ValueError("dynamic-exit needs a bundle with exit layers (--exit-layers)")
        self.costs = {k: CostModel(priors=self.priors) for k in self.exits}
        self.exit_layer = self.exits[0]

    def plan(self, source: str | None = None) -> Plan:
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

    def channel_estimates(self) -> tuple[float | None, float | None]:
        return NO_CHANNEL


def cost_models(policy: object) -> list[CostModel]:
    """The cost models an adaptive policy prices rounds with (a chain's members' too)."""
    if isinstance(policy, PerSource):
        return [c for p in (policy.main, *policy.apart.values()) for c in cost_models(p)]
    if isinstance(policy, DynamicExit):
        return list(policy.costs.values())
    cost = policy.cost if isinstance(policy, Auto | Acceptance) else None
    return [cost] if cost is not None else []


def set_priors(policy: object, priors: Priors) -> None:
    """Price with `priors` from now on (an A/B of the estimators on a policy as a bundle
    built it): a copying drafter's models (prompt lookup) keep their state prior."""
    for cost in cost_models(policy):
        own = priors.copying() if cost.priors.is_copying else priors
        cost.priors = cost.acceptance.priors = own
