"""What a round drafting γ tokens is expected to yield and to cost, learned online: the
estimators the adaptive draft-length policies (`policies.py`) maximise N(γ) / T(γ) with.

  AcceptanceModel   N(γ), expected tokens of a round, from per-position acceptance
  CostModel         T(γ), a round's seconds (draft steps + a verify-plus-overhead line), and
                    the γ with the most expected tokens per second
"""

from __future__ import annotations

from dataclasses import dataclass, field

from edgespec.runtime.stats import RoundStats

MAX_DRAFT = 12
# the round-time line's slope is shrunk towards 0 as if by rounds adding Σw(γ - γ̄)² = RIDGE
# (8 rounds at γ̄ ± 0.5): decisive while few rounds varied γ, negligible once many have. It was
# a fixed share of the spread (slope = cov / (var + 0.25)), which halved the slope of a policy
# that settled at two neighbouring γ however many rounds it had seen: every longer γ looked
# cheap, and `auto` drafted 3.2 on the trained pair where 2 paid 9% more (stop 27)
RIDGE = 2.0
# pseudo-rounds of the pooled acceptance in the after-a-full-round / after-a-cut estimates
# of positions 2.. (was 2, see SHRINK), and of position 1, kept at 2: after a stretch of
# misses the next round must shorten at once (at 8 it still drafted 9 after 12 misses)
STATE_PRIOR = 8.0
STATE_PRIOR_FIRST = 2.0
# pseudo-rounds of the all-positions acceptance in each position's estimate. A position past
# the γ a policy settled at is judged only when every draft before it passes, so its estimate
# rests on a few early rounds; at 1, one early rejection at position 2 halved h(2) and kept
# `auto` at γ = 1 for 30 rounds at α = 0.9 (3 from stop 28). Stop 29: `auto` picks a long γ
# when the estimates of its far positions happen to be high, so at the γ it picked they ran
# high: on the trained pair, rounds `auto` drafted 4 or 5 in were predicted 9-13% more tokens
# than they gave (in a replay of the real trace, the position drafted last the most: 0.53
# predicted, 0.35 passed), with the round times right within 2%. Shrinking harder (SHRINK
# 3 -> 5, STATE_PRIOR 2 -> 8) takes noise out of those estimates: bench_policy replays, mean
# auto / best fixed γ (worst cell), 256 tokens 0.9935 (0.957) -> 0.9976 (0.966), 512 0.9920
# (0.970) -> 0.9947 (0.976), 2,000 1.0084 (0.982) -> 1.0094 (0.987), real traces 0.9876
# (0.976) -> 0.9906 (0.974)
SHRINK = 5.0
# a round (or its drafting) more than this times slower than predicted is clipped to it: most
# likely another process took the CPU. At 3x, one round at 2.8x its price early in a
# generation (a few rounds measured) tripled the line's slope and kept `auto` at γ = 1 for
# ~25 rounds where 5 paid (bench_policy, 256-token replays at α = 0.9: 0.938 -> 0.949 of the
# best fixed γ; 2,000 tokens: 0.981-0.985 -> 0.985-0.993)
SLOW = 1.5
# pseudo-rounds of the line in each γ's own verify-plus-overhead estimate (see CostModel).
# A verify's time is not linear in its width: on the trained pair the fp32 target verified
# 6 positions in 2.02 ms and 7 in 2.34 (onnxruntime's matmul kernels change tiling), so a
# line through rounds at γ 4-6 priced γ = 5 3.5% high and γ = 6 low, and `auto` drafted 6 in
# a fifth of its rounds where 5 paid 5% more per token. bench_auto, both in one run (stop 32;
# fixed rows γ 2-4 and 6): `auto` with the int4 draft 0.926x -> 1.009x the best fixed row,
# self-spec@2 0.962x -> 1.017x, spec 0.932x -> 0.941x. (Stop 30 tried the same on the 360M
# shape's oracle runs and saw no difference there.)
TABLE_PRIOR = 4.0
# a generation's first rounds run cold where a model's weights fit the caches: after the app
# idled (a user reading the last reply, another model running) they come back from memory,
# and on the trained pair rounds 1-9 ran 1.7x .. 1.1x a steady round, rounds to ~16 a few %
# slow. Priced as they were, those times made whichever γ opened a generation look dear for
# most of it (prices forget over ~30 rounds, a generation's length) and `auto` moved off its
# best γ. So a round among a generation's first WARM_ROUNDS is priced at its time divided by
# how slow rounds at that place run (`CostModel._cold`, learned from the rounds of γ priced by
# later rounds). Where nothing runs cold (the 360M shape: its weights never fit) the factors
# stay near 1 and every round prices as before. Stop 33, `auto` against the best fixed γ held
# out (bench_gamma; the oracle on the 360M shape), this against the old pricing in the same
# turns: int4 draft 0.985 / 0.968 and 0.999 / 0.995, spec 0.981 / 0.981, self-spec@2 0.984 /
# 0.993, the best mode 1.014 / 1.018; oracle at α = 0.9 1.018 / 0.999 (int4 draft) and 0.977 /
# 0.960 (self-spec@8). Leaving those rounds unpriced instead gained as much on the trained
# pair but cost the oracle's α = 0.9 cells 2% (a third of its rounds unpriced).
WARM_ROUNDS = 16
COLD_DECAY = 0.2  # EWMA weight of a generation's round in its place's slowness (~5 replies)


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
    the acceptance over all positions (each h(k) is shrunk towards it with SHRINK
    pseudo-rounds: a position reached twice says little on its own)."""

    prior: float = 0.6  # acceptance of a typical decent drafter, before any round
    decay: float = 0.04  # forgetting per drafting round (~25 rounds)
    after_full: bool = False  # the last drafting round accepted all its drafts
    # pseudo-rounds of the pooled estimate in the after-full / after-cut ones, positions 2..
    # (None: STATE_PRIOR). A copying drafter (prompt lookup) keeps STATE_PRIOR_FIRST: its
    # drafts pass whole or not at all, so how the last round ended says most
    state_prior: float | None = None
    # (drafts reached, drafts accepted) per position 1..MAX_DRAFT: over all rounds, and
    # after a round accepted whole / cut short
    _all: tuple[list[float], list[float]] = field(default_factory=lambda: _counts())
    _after: dict[bool, tuple[list[float], list[float]]] = field(
        default_factory=lambda: {True: _counts(), False: _counts()}
    )

    def observe(self, drafted: int, accepted: int) -> None:
        """One round that drafted `drafted` tokens and had `accepted` of them accepted."""
        drafted, accepted = min(drafted, MAX_DRAFT), min(accepted, drafted, MAX_DRAFT)
        if drafted <= 0:
            return
        keep = 1 - self.decay
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
        overall = (sum(passed) + 2 * self.prior) / (sum(reached) + 2)  # all positions
        later = STATE_PRIOR if self.state_prior is None else self.state_prior
        survive, tokens = 1.0, [1.0]
        for k in range(1, longest + 1):
            if k <= MAX_DRAFT:  # beyond: every further draft survives like the last
                h = (passed[k] + SHRINK * overall) / (reached[k] + SHRINK)
                prior = STATE_PRIOR_FIRST if k == 1 else later
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
    TABLE_PRIOR pseudo-rounds and forgotten like it: a verify's time has steps where the
    kernels change tiling, which no line follows). A plain step (γ = 0) is priced by its own
    measurements, never by the line: a speculative round has costs a plain step does not (a
    draft call, a wider verify). The line under the table: every round refines the price of
    every γ, and one slow round (a scheduler hiccup) cannot leave one γ looking expensive
    for long, as its weight fades whether or not the policy tries that γ again; a round over
    SLOW times its price is clipped for the same reason."""

    acceptance: AcceptanceModel = field(default_factory=AcceptanceModel)
    decay: float = 0.15  # EWMA weight of a new round in the per-γ round times
    t_draft: float | None = None  # seconds per drafted token
    round_time: dict[int, float] = field(default_factory=dict)  # γ -> EWMA seconds, as seen
    rounds: int = 0
    fit_decay: float = 0.03  # forgetting per round of the line and t_draft (~30 rounds)
    _sums: list[float] = field(default_factory=lambda: [0.0] * 5)  # Σw, Σwγ, Σwr, Σwγ², Σwγr
    _seen: dict[int, int] = field(default_factory=dict)  # γ -> rounds measured
    # γ -> (Σw, Σw·rest) of that γ's own rounds, forgotten like the line
    _table: dict[int, tuple[float, float]] = field(default_factory=dict)
    # exponentially weighted (seconds drafting, tokens drafted), forgotten like the line
    _drafting: tuple[float, float] = (0.0, 0.0)
    warm_rounds: int | None = None  # a generation's rounds priced as cold (None: WARM_ROUNDS)
    _warm: set[int] = field(default_factory=set)  # γ priced past WARM_ROUNDS, or calibrated
    # round index -> how much slower than its price a round at that place of a generation runs
    _cold: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for g, t in self.round_time.items():  # calibrated: worth a few live rounds each
            self._seen[g] = 3
            self._warm.add(g)
            if g > 0:
                self._age()
                self._fit(g, t - g * (self.t_draft or 0.0), weight=3.0)
        if self.t_draft is not None:  # calibrated: worth a few rounds of drafts
            self._drafting = (12 * self.t_draft, 12.0)

    def observe(self, s: RoundStats) -> None:
        self.rounds += 1
        self._age()
        draft = s.draft_seconds  # clipped like round times below: a hiccup, not a price
        g = s.drafted
        seconds = s.seconds - s.catchup_seconds  # a one-off, not a cost of this γ
        if 0 < s.index <= (WARM_ROUNDS if self.warm_rounds is None else self.warm_rounds):
            if g in self._warm:  # how slow this place of a generation runs (see WARM_ROUNDS)
                slow = min(max(seconds / self.cost(g), 1 / 3), 3.0)  # 3x: a hiccup, not cold
                self._cold[s.index] = _ewma(self._cold.get(s.index, slow), slow, COLD_DECAY)
            factor = self._cold.get(s.index, 1.0)
            seconds, draft = seconds / factor, draft / factor
        else:
            self._warm.add(g)
        if s.drafted:
            self.acceptance.observe(s.drafted, s.accepted)
            if self.t_draft is not None:
                draft = min(draft, SLOW * s.drafted * self.t_draft)
            self._drafting = (self._drafting[0] + draft, self._drafting[1] + s.drafted)
            self.t_draft = self._drafting[0] / self._drafting[1]
        if self.round_time:  # a round much slower than expected is noise, not a price
            seconds = min(seconds, SLOW * self.cost(g))
        # a running mean over the first rounds of a γ, then an EWMA: the first measurement
        # (maybe a noisy one) does not linger, which matters for rarely run γ = 0 steps
        n = self._seen[g] = self._seen.get(g, 0) + 1
        old = self.round_time.get(g)
        self.round_time[g] = seconds if old is None else _ewma(old, seconds, max(self.decay, 1 / n))
        if g > 0:
            self._fit(g, seconds - min(draft, seconds))

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
        keep = 1 - self.fit_decay
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
        slope = max((xy - x * mean_t) / (spread + RIDGE), 0.0)
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
            rest = (total + TABLE_PRIOR * (line[0] + line[1] * gamma)) / (w + TABLE_PRIOR)
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
