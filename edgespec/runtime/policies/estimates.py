"""What a round drafting γ tokens is expected to yield and to cost, learned online: the
estimators the adaptive draft-length policies (`draft_length.py`) maximise N(γ) / T(γ) with.

  AcceptanceModel   N(γ), expected tokens of a round, from per-position acceptance
  CostModel         T(γ), a round's seconds (draft steps + a verify-plus-overhead line), and
                    the γ with the most expected tokens per second
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, cast

from edgespec.runtime.stats import RoundStats

MAX_DRAFT = 12  # the longest draft any adaptive policy plans (and the per-position tables' size)


@dataclass(frozen=True)
class Priors:
    """The estimators' constants, in one place. Heuristic defaults, not values tuned for one
    model: each was kept because an A/B on this project's benchmarks moved a row by more than
    the run's spread (docs/tuning.md has the histories). Benchmarks pass variants of this
    dataclass (`dataclasses.replace(PRIORS, shrink=3.0)`), never patch module state."""

    # -- acceptance, N(γ) ----------------------------------------------------------------------
    acceptance: float = 0.6  # a typical decent drafter's acceptance, before any round
    acceptance_decay: float = 0.04  # forgetting per drafting round: text changes in ~25 rounds
    # pseudo-rounds of the all-positions acceptance in each position's estimate: a far
    # position is judged only when every draft before it passed, so alone it is noise
    shrink: float = 5.0
    # pseudo-rounds of the pooled estimate in the after-a-full-round / after-a-cut ones of
    # positions 2..; position 1 keeps few, so a stretch of misses shortens the next round at once
    state_prior: float = 8.0
    state_prior_first: float = 2.0
    # -- cost, T(γ) ----------------------------------------------------------------------------
    time_decay: float = 0.15  # EWMA weight of a new round in each γ's round time
    fit_decay: float = 0.03  # forgetting per round of the verify line and t_draft (~30 rounds)
    # the line's slope is shrunk as if by rounds adding Σw(γ - γ̄)² = ridge: decisive while few
    # rounds varied γ, negligible once many have
    ridge: float = 2.0
    slow: float = 1.5  # a round this much slower than its price is clipped: another process ran
    # pseudo-rounds of the line in each γ's own price: a verify's time steps where the kernels
    # change tiling, which no line follows
    table_prior: float = 4.0
    # a generation's first rounds run cold after the app idled (weights back from memory):
    # they are priced at their time over how slow that place of a generation runs
    warm_rounds: int = 16
    cold_decay: float = 0.2  # EWMA weight of a generation's round in its place's slowness
    calibrated_rounds: float = 3.0  # the weight of a calibrated round time, in live rounds
    # the weight of calibrated acceptance, in drafting rounds: enough that `auto` starts
    # plain where drafting loses, little enough that the live text overrides it in ~10 rounds
    calibrated_acceptance: float = 8.0
    # a new generation keeps at most this many rounds' weight of the acceptance measured
    # before it: one model answers unrelated prompts, and through a server, SmolLM2's JSON
    # extraction after summaries and a chat drafted on their acceptance and decoded at 0.8x
    # `ar` where alone it ran at 1.0x
    carried_rounds: float = 8.0
    # -- auto's switch to plain decoding -------------------------------------------------------
    probe_gap: int = 4  # plain rounds before the first probe when speculation loses
    max_probe_gap: int = 128  # the longest stretch of plain rounds between probes
    # probes back off (the gap doubles) only while drafting is priced under this share of
    # plain decoding: a few unlucky rounds must not leave `auto` plain for hundreds of rounds
    clearly_losing: float = 0.9
    # -- placement (split mode: split rounds, server streaming or local decoding) --------------
    placement_learn: int = 3  # split rounds to learn: the link's estimates need 2 sizes
    placement_probe: int = 3  # rounds each other place runs when it is measured (or re-measured)
    placement_reprobe: int = 256  # rounds between looks at the place measured longest ago
    # ... and a look is taken only when its price (its rounds at the place's expected speed,
    # plus a round trip) is at most this share of the decoding time since that place last ran:
    # a device much faster than a far server must not spend a third of its time asking it
    placement_reprobe_share: float = 0.02
    placement_busy: int = 64  # rounds without asking to stream after a "verify only"
    # a place must be priced this much faster to move there: a run's spread is several %,
    # and a move costs (a STOP's round trip, or the local cache catching up)
    placement_margin: float = 0.1
    stream_decay: float = 0.3  # forgetting per streamed round of its tokens/s

    def with_values(self, values: Mapping[str, object]) -> Priors:
        """A variant with some fields set (text read as numbers); unknown names are refused
        with the known ones (benchmarks' `--variants shrink=3,ridge=1`)."""
        known = {f.name: f for f in fields(self)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"Priors has no field {unknown[0]!r}: the fields are {sorted(known)}")
        typed: dict[str, Any] = {
            k: (int if known[k].type == "int" else float)(float(cast(float, v)))
            for k, v in values.items()
        }
        return replace(self, **typed)

    @property
    def is_copying(self) -> bool:
        return self.state_prior == self.state_prior_first

    def copying(self) -> Priors:
        """For a copying drafter (prompt lookup): its drafts pass whole or not at all, so
        how the last round ended says most, at every position."""
        return replace(self, state_prior=self.state_prior_first)


PRIORS = Priors()


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
class AcceptanceModel:
    """N(γ), the expected tokens of a round drafting γ, from acceptance measured online.

    Per-position acceptance (a discrete hazard): h(k) = P(draft k accepted | drafts 1..k-1
    accepted), counted over recent rounds (exponentially forgotten per drafting round), so
    N(γ) = 1 + Σ_{k≤γ} Π_{j≤k} h(j). A round that drafted γ and accepted a tells exactly what
    every shorter draft would have accepted, so rounds at any γ inform every shorter one,
    whatever mixture of γ the policy used. Drafts are accepted in runs (a repetitive stretch
    accepts long drafts whole, a novel one almost none), so h grows with k on real text, and
    a run tends to go on: h is counted separately after a round accepted whole and after one
    cut short (shrunk towards the pooled count). One per-token α fitted at the γ being
    drafted (what edgespec did before) predicts too few tokens for longer drafts and kept
    `auto` drafting 3-4 where 5-6 paid best. Positions beyond those measured are priced like
    the acceptance over all positions (each h(k) is shrunk towards it with `shrink`
    pseudo-rounds: a position reached twice says little on its own)."""

    priors: Priors = PRIORS
    after_full: bool = False  # the last drafting round accepted all its drafts
    # (drafts reached, drafts accepted) per position 1..MAX_DRAFT: over all rounds, and
    # after a round accepted whole / cut short
    _all: tuple[list[float], list[float]] = field(default_factory=lambda: _counts())
    _after: dict[bool, tuple[list[float], list[float]]] = field(
        default_factory=lambda: {True: _counts(), False: _counts()}
    )

    def seed(self, tokens_per_round: Mapping[int, float], rounds: float) -> None:
        """Start from a calibration: N(1..g) measured, worth `rounds` rounds drafting g."""
        last, survive = 1.0, 1.0
        for k in sorted(tokens_per_round):
            if not 1 <= k <= MAX_DRAFT:
                continue
            share = min(max(tokens_per_round[k] - last, 0.0), survive)  # P(drafts 1..k pass)
            last = tokens_per_round[k]
            for reached, passed in (self._all, *self._after.values()):
                reached[k] += rounds * survive
                passed[k] += rounds * share
            survive = share

    def carry(self, rounds: float) -> None:
        """A new generation: keep at most `rounds` rounds' weight of what was measured (its
        text may be unlike the last one's), and no run going on."""
        for reached, passed in (self._all, *self._after.values()):
            if reached[1] > rounds:
                scale = rounds / reached[1]
                reached[:] = [r * scale for r in reached]
                passed[:] = [x * scale for x in passed]
        self.after_full = False

    def observe(self, drafted: int, accepted: int) -> None:
        """One round that drafted `drafted` tokens and had `accepted` of them accepted."""
        drafted, accepted = min(drafted, MAX_DRAFT), min(accepted, drafted, MAX_DRAFT)
        if drafted <= 0:
            return
        keep = 1 - self.priors.acceptance_decay
        tried = min(accepted + 1, drafted)  # drafts the verifier got to judge
        for table in (self._all, self._after[self.after_full]):
            reached, passed = table
            for k in range(1, MAX_DRAFT + 1):
                reached[k] = reached[k] * keep + (k <= tried)
                passed[k] = passed[k] * keep + (k <= accepted)
        self.after_full = accepted == drafted

    def expected(self, gamma: int, pooled: bool = False) -> float:
        """N(γ): expected tokens of a round drafting γ (accepted drafts + the target's one),
        given how the last round ended (runs: after a round accepted whole, the next one is
        likelier to be, too); `pooled`: over all rounds, whatever came before."""
        return self.curve(gamma, pooled)[gamma]

    def curve(self, longest: int, pooled: bool = False) -> list[float]:
        """[N(0), N(1), .., N(longest)] in one pass (the policies price every γ each round)."""
        reached, passed = self._all
        reached_s, passed_s = self._all if pooled else self._after[self.after_full]
        p = self.priors
        overall = (sum(passed) + 2 * p.acceptance) / (sum(reached) + 2)  # all positions
        survive, tokens = 1.0, [1.0]
        for k in range(1, longest + 1):
            if k <= MAX_DRAFT:  # beyond: every further draft survives like the last
                h = (passed[k] + p.shrink * overall) / (reached[k] + p.shrink)
                prior = p.state_prior_first if k == 1 else p.state_prior
                survive *= (passed_s[k] + prior * h) / (reached_s[k] + prior)
            tokens.append(tokens[-1] + survive)
        return tokens

    @property
    def alpha(self) -> float:
        """The per-token acceptance of a geometric model with the same N(4) (for reports)."""
        return alpha_for(self.expected(4, pooled=True), 4)


@dataclass
class CostModel:
    """Online estimates for one drafter: how many tokens a round drafting γ yields, N(γ)
    (`AcceptanceModel`), and what it costs, T(γ); the policies maximise N(γ) / T(γ).

    T(γ) = γ·t_draft + rest(γ): t_draft is measured per drafted token (weighted like the
    line, so a few slow rounds do not reprice every γ for the next hundred); rest (verifying
    γ + 1 positions and the round's own overhead) is a line a + b·γ over speculative rounds,
    fitted by exponentially weighted least squares with its slope shrunk towards 0 while few
    rounds varied γ (an unmeasured slope is noise, and a noisy slope priced every longer γ
    out), corrected per γ by that γ's own recent rounds (shrunk towards the line by
    `table_prior` pseudo-rounds and forgotten like it: a verify's time has steps where the
    kernels change tiling, which no line follows). A plain step (γ = 0) is priced by its own
    measurements, never by the line: a speculative round has costs a plain step does not (a
    draft call, a wider verify). The line under the table: every round refines the price of
    every γ, and one slow round (a scheduler hiccup) cannot leave one γ looking expensive
    for long, as its weight fades whether or not the policy tries that γ again; a round over
    `slow` times its price is clipped for the same reason. A generation's first
    `warm_rounds` rounds are priced at their time over how slow that place of a generation
    runs (`_cold`, learned from rounds of a γ that later rounds priced): after the app idled
    they run cold, and priced as they ran they made the γ that opened a generation look dear
    for most of it."""

    acceptance: AcceptanceModel = field(default_factory=AcceptanceModel)
    t_draft: float | None = None  # seconds per drafted token
    round_time: dict[int, float] = field(default_factory=dict)  # γ -> EWMA seconds, as seen
    rounds: int = 0
    _sums: list[float] = field(default_factory=lambda: [0.0] * 5)  # Σw, Σwγ, Σwr, Σwγ², Σwγr
    _seen: dict[int, int] = field(default_factory=dict)  # γ -> rounds measured
    # γ -> (Σw, Σw·rest) of that γ's own rounds, forgotten like the line
    _table: dict[int, tuple[float, float]] = field(default_factory=dict)
    # exponentially weighted (seconds drafting, tokens drafted), forgotten like the line
    _drafting: tuple[float, float] = (0.0, 0.0)
    priors: Priors = PRIORS
    _warm: set[int] = field(default_factory=set)  # γ priced past warm_rounds, or calibrated
    # round index -> how much slower than its price a round at that place of a generation runs
    _cold: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.acceptance.priors is not self.priors and self.acceptance.priors is PRIORS:
            self.acceptance.priors = self.priors  # one set of priors for the whole estimate
        weight = self.priors.calibrated_rounds
        for g, t in self.round_time.items():  # calibrated: worth a few live rounds each
            self._seen[g] = int(weight)
            self._warm.add(g)
            if g > 0:
                self._age()
                self._fit(g, t - g * (self.t_draft or 0.0), weight=weight)
        if self.t_draft is not None:  # calibrated: worth a few rounds of drafts
            self._drafting = (4 * weight * self.t_draft, 4 * weight)

    def observe(self, s: RoundStats, draft_steps: int | None = None) -> None:
        """`draft_steps`: the steps the round's draft time bought, where not one per drafted
        token (a model drafter's tree: one per depth, its side leaves free)."""
        p = self.priors
        self.rounds += 1
        self._age()
        draft = s.draft_seconds  # clipped like round times below: a hiccup, not a price
        g = s.drafted
        seconds = s.seconds - s.catchup_seconds  # a one-off, not a cost of this γ
        if 0 < s.index <= p.warm_rounds:
            if g in self._warm:  # how slow this place of a generation runs
                slow = min(max(seconds / self.cost(g), 1 / 3), 3.0)  # 3x: a hiccup, not cold
                self._cold[s.index] = _ewma(self._cold.get(s.index, slow), slow, p.cold_decay)
            factor = self._cold.get(s.index, 1.0)
            seconds, draft = seconds / factor, draft / factor
        else:
            self._warm.add(g)
        if s.drafted:
            draft = self._learn_drafting(draft_steps or s.drafted, s.accepted, draft)
        if self.round_time:  # a round much slower than expected is noise, not a price
            seconds = min(seconds, p.slow * self.cost(g))
        # a running mean over the first rounds of a γ, then an EWMA: the first measurement
        # (maybe a noisy one) does not linger, which matters for rarely run γ = 0 steps
        n = self._seen[g] = self._seen.get(g, 0) + 1
        old = self.round_time.get(g)
        weight = max(p.time_decay, 1 / n)
        self.round_time[g] = seconds if old is None else _ewma(old, seconds, weight)
        if g > 0:
            self._fit(g, seconds - min(draft, seconds))

    def observe_drafting(self, s: RoundStats) -> None:
        """Learn only acceptance and the draft time from a round whose other costs are
        priced elsewhere (split decoding: the channel policy prices the wait for the server)."""
        self._age()
        if s.drafted:
            self._learn_drafting(s.drafted, s.accepted, s.draft_seconds)

    def _learn_drafting(self, drafted: int, accepted: int, seconds: float) -> float:
        """Acceptance and t_draft from one drafting round; returns the draft time counted."""
        self.acceptance.observe(drafted, accepted)
        if self.t_draft is not None:
            seconds = min(seconds, self.priors.slow * drafted * self.t_draft)
        self._drafting = (self._drafting[0] + seconds, self._drafting[1] + drafted)
        self.t_draft = self._drafting[0] / self._drafting[1]
        return seconds

    def expected(self, gamma: int) -> float:
        return self.acceptance.expected(gamma)

    @property
    def alpha(self) -> float:
        return self.acceptance.alpha

    def _age(self) -> None:
        """Forget a little of what drafting was measured to cost (the line and t_draft keep
        their values, their weight fades), once a round, plain rounds too: after a stretch of
        plain steps the next probe's fresh times outweigh old ones, e.g. the slow first rounds
        of a generation after other models ran, which otherwise kept speculation priced out
        for hundreds of rounds."""
        keep = 1 - self.priors.fit_decay
        self._sums = [v * keep for v in self._sums]
        self._table = {g: (w * keep, total * keep) for g, (w, total) in self._table.items()}
        self._drafting = (self._drafting[0] * keep, self._drafting[1] * keep)

    def _fit(self, gamma: int, seconds: float, weight: float = 1.0) -> None:
        """One round's verify-plus-overhead into the line and into its γ's own estimate."""
        w, total = self._table.get(gamma, (0.0, 0.0))
        self._table[gamma] = (w + weight, total + weight * seconds)
        w, x, y, xx, xy = self._sums
        g = float(gamma)
        self._sums = [w + weight, x + weight * g, y + weight * seconds]
        self._sums += [xx + weight * g * g, xy + weight * g * seconds]

    def _line(self) -> tuple[float, float] | None:
        """(a, b) of rest(γ) = a + b·γ for γ ≥ 1 (the round less its drafting), or None
        before any speculative round."""
        w, x, y, xx, xy = self._sums
        if w <= 0:
            return None
        mean_g, mean_t = x / w, y / w
        spread = max(xx - x * mean_g, 0.0)  # Σw(γ - γ̄)²
        slope = max((xy - x * mean_t) / (spread + self.priors.ridge), 0.0)
        return mean_t - slope * mean_g, slope

    def cost(self, gamma: int) -> float:
        """Estimated seconds of a round drafting γ tokens. γ = 0: measured plain steps (the
        line's intercept only while none was measured). γ ≥ 1: γ draft steps plus the line
        corrected by that γ's own rounds; a plain step plus γ draft steps while no
        speculative round was measured."""
        return self._cost(gamma, self._line())

    def _cost(self, gamma: int, line: tuple[float, float] | None) -> float:
        if gamma == 0 and 0 in self.round_time:
            return self.round_time[0]
        draft = gamma * (self.t_draft or 0.0)
        if line is not None:
            w, total = self._table.get(gamma, (0.0, 0.0))
            prior = self.priors.table_prior
            rest = (total + prior * (line[0] + line[1] * gamma)) / (w + prior)
            return max(draft + rest, 1e-9)
        return max(draft + next(iter(self.round_time.values()), 0.0), 1e-9)

    def rate(self, gamma: int) -> float:
        """Expected tokens per second when drafting γ per round."""
        return self.expected(gamma) / self.cost(gamma)

    def best_length(self, max_length: int, min_length: int = 1) -> tuple[int, float]:
        """(γ, expected tokens per second) maximising N(γ) / T(γ)."""
        if self.t_draft is None or not self.round_time:
            return min(4, max_length), 0.0
        tokens = self.acceptance.curve(max_length)
        line = self._line()
        best = (min_length, -1.0)
        for g in range(min_length, max_length + 1):
            rate = tokens[g] / self._cost(g, line)
            if rate > best[1]:
                best = (g, rate)
        return best


def _counts() -> tuple[list[float], list[float]]:
    return [0.0] * (MAX_DRAFT + 1), [0.0] * (MAX_DRAFT + 1)


def _ewma(old: float, new: float, decay: float) -> float:
    return old + decay * (new - old)
