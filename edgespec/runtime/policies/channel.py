"""`channel-aware` draft length for split decoding (FlexSpec): draft here, verify on a server.

Each round drafts γ tokens locally (γ·t_draft), sends them (bytes_up(γ)), waits for the
server (one round trip, serialization, its verify time t_verify(γ)) and gets the verdict
(bytes_down). With per-token acceptance α a round yields N(γ) = (1 - α^(γ+1)) / (1 - α)
tokens and costs

    T(γ) = γ·t_draft + RTT + bytes_up(γ)/uplink + bytes_down(γ)/downlink + t_verify(γ)

N(γ) and t_draft are the ones every adaptive policy uses (`estimates.CostModel`: per-position
acceptance, draft seconds per token); this policy adds only the channel's round time and
energy. It picks γ ∈ [0, max_length] maximising N(γ)/T(γ) — γ = 0 (the server generates one
token per round trip) included — subject to an energy budget per generated token,

    E(γ)/N(γ) <= budget,  E(γ) = γ·J_draft + J_tx·bytes_up + J_rx·bytes_down
                                 + P_wait·(T(γ) - γ·t_draft)   (radio on, waiting)

and when no γ fits, the γ with the least energy per token (`over_budget` says so; a client
may then switch to device-only decoding).

Everything is learned online from the `RoundStats` the split client fills in: acceptance and
t_draft by the cost model; the link by
regressing `network_seconds` on (bytes_up, bytes_down) — slopes (seconds per byte =
1/bandwidth) from the differences between rounds of different sizes (`OnlineLinear`), the
intercept (RTT) from a fast EWMA of what the slopes leave — so a change of RTT shows within
a few rounds and one of bandwidth within a few tens;
t_verify(γ) and the message sizes by the same regression on γ. Sizes vary because the policy
keeps probing: every `dither_every`-th round drafts the better neighbour of the optimum, and
while γ = 0 wins it still drafts a short probe now and then (backing off) to track α.

Energy budget: `registry.make_policy("channel-aware:0.5")` or `make_policy("channel-aware",
energy_budget=0.5)`, in joules per generated token (device side); no budget: fastest γ.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import cast

from edgespec.runtime.policies.estimates import MAX_DRAFT, PRIORS, CostModel, Priors
from edgespec.runtime.round import Plan
from edgespec.runtime.stats import RoundStats


@dataclass
class EnergyModel:
    """Device-side energy of one split round. Defaults: a phone-class SoC on LTE (radio
    figures from Huang et al., MobiSys 2012: uplink ≈ 0.44 µJ/bit, downlink ≈ 0.05 µJ/bit
    above a ≈ 1.3 W connected-state base; an LLM drafting on big CPU cores / GPU ≈ 3 W)."""

    draft_power_w: float = 3.0  # while drafting: J per draft token = this × measured t_draft
    joules_per_draft_token: float | None = None  # fixed figure instead (a device profile's)
    tx_joules_per_byte: float = 3.5e-6
    rx_joules_per_byte: float = 0.4e-6
    wait_power_w: float = 1.3  # radio connected and SoC idle while the server answers

    @classmethod
    def from_profile(cls, profile: Mapping[str, object] | None) -> EnergyModel:
        """From a device profile dict: its "energy" table (or the dict itself) may set any
        field above by name; unknown keys are refused so a typo does not go unnoticed."""
        if not profile:
            return cls()
        table = profile.get("energy", profile)
        if not isinstance(table, Mapping):
            raise ValueError(f"device profile 'energy' must be a table, got {table!r}")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(table) - names)
        if unknown:
            raise ValueError(f"unknown energy settings {unknown}: known are {sorted(names)}")
        return cls(**{k: float(cast(float, v)) for k, v in table.items()})

    def draft_joules(self, t_draft: float) -> float:
        if self.joules_per_draft_token is not None:
            return self.joules_per_draft_token
        return self.draft_power_w * t_draft


@dataclass
class OnlineLinear:
    """y ≈ a + b·x for a few features x, learned online, robust to level shifts.

    Slopes b from consecutive rounds' differences, Δy ≈ b·Δx, by exponentially weighted
    least squares (decay `slow`, ridge toward `prior`): a level shift of y (the RTT
    changing) is then one outlying difference, not a trend, and that difference's residual
    is clipped at `clip` × the running scale of residuals (at least `min_clip`). The first
    difference, and one 8x larger than any recent (a new regime of message sizes), is not
    clipped: it restarts the scale and the intercept. The intercept a is a fast
    EWMA (decay `fast`) of y - b·x, so a level shift is followed within a few rounds while
    the slopes keep a longer memory. Features that never vary leave their slopes at `prior`."""

    n: int
    fast: float = 0.25
    slow: float = 0.05
    ridge: float = 1.0  # in units of (feature)²·rounds
    prior: Sequence[float] | None = None
    clip: float = 3.0
    scale_rate: float = 0.3  # how fast the residual scale follows (up quickly: a real change)
    min_clip: float = float("inf")  # no clipping unless set (y in seconds: a few ms)
    nonnegative: bool = True
    a: float | None = None
    b: list[float] = field(default_factory=list)
    _cxx: list[list[float]] = field(default_factory=list)
    _cxy: list[float] = field(default_factory=list)
    _last: tuple[list[float], float] | None = None
    _scale: float | None = None  # None until the first difference: that one is not clipped
    _span: float = 0.0  # the largest |Δx| seen (decaying): the regime the scale was learned in

    def __post_init__(self) -> None:
        self.b = list(self.prior or [0.0] * self.n)
        self._cxy = [0.0] * self.n
        self._cxx = [[0.0] * self.n for _ in range(self.n)]

    def observe(self, x: Sequence[float], y: float) -> None:
        x = [float(v) for v in x]
        first = False  # a first slope (of a regime): the intercept restarts from it
        if self._last is not None and _jumped(y, self._last[1]):
            # y itself changed regime (token ids, then sampling's q rows: 400x the bytes):
            # a difference across the change is no slope, and the old slopes no guide
            self._last, self._scale, self.a = None, None, None
            self._cxy = [0.0] * self.n
            self._cxx = [[0.0] * self.n for _ in range(self.n)]
        if self._last is not None:
            dx = [xi - li for xi, li in zip(x, self._last[0], strict=True)]
            if any(dx):
                expected = sum(bi * d for bi, d in zip(self.b, dx, strict=True))
                residual = y - self._last[1] - expected
                size = sum(abs(d) for d in dx)
                if self._scale is None or size > 8 * self._span:
                    # first difference, or far bigger messages than any before (greedy ids,
                    # then sampling's q rows): a new regime, trust it and restart the scale
                    bound, self._scale = float("inf"), abs(residual)
                    first = True
                else:
                    bound = max(self.clip * self._scale, self.min_clip)
                    self._scale += self.scale_rate * (abs(residual) - self._scale)
                self._span = max(size, (1 - self.slow) * self._span)
                dy = expected + min(max(residual, -bound), bound)
                keep = 1 - self.slow
                for i in range(self.n):
                    self._cxy[i] = keep * self._cxy[i] + dx[i] * dy
                    for j in range(self.n):
                        self._cxx[i][j] = keep * self._cxx[i][j] + dx[i] * dx[j]
                self.b = self._solve()
        self._last = (x, y)
        level = y - sum(bi * xi for bi, xi in zip(self.b, x, strict=True))
        restart = self.a is None or first
        self.a = level if restart else self.a + self.fast * (level - self.a)

    def _solve(self) -> list[float]:
        prior = list(self.prior or [0.0] * self.n)
        m = [
            [self._cxx[i][j] + (self.ridge if i == j else 0.0) for j in range(self.n)]
            for i in range(self.n)
        ]
        v = [self._cxy[i] + self.ridge * prior[i] for i in range(self.n)]
        b = _solve(m, v)
        return [max(0.0, bi) for bi in b] if self.nonnegative else b

    def predict(self, x: Sequence[float]) -> float:
        return (self.a or 0.0) + sum(bi * xi for bi, xi in zip(self.b, x, strict=True))


def _jumped(y: float, last: float) -> bool:
    """y is more than 8x (or under 1/8 of) the last, both well above zero."""
    low, high = sorted((abs(y), abs(last)))
    return high > 8 * max(low, 1e-12) and high > 0 and low > 0


def _solve(m: list[list[float]], v: list[float]) -> list[float]:
    """Gaussian elimination for the tiny (1x1, 2x2) positive-definite systems above."""
    n = len(v)
    m = [row[:] + [v[i]] for i, row in enumerate(m)]
    for i in range(n):
        for k in range(i + 1, n):
            f = m[k][i] / m[i][i]
            for j in range(i, n + 1):
                m[k][j] -= f * m[i][j]
    out = [0.0] * n
    for i in reversed(range(n)):
        out[i] = (m[i][n] - sum(m[i][j] * out[j] for j in range(i + 1, n))) / m[i][i]
    return out


@dataclass
class Choice:
    """What the policy chose and why (for stats and benchmarks)."""

    length: int
    tokens_per_s: float  # expected
    joules_per_token: float  # expected
    over_budget: bool = False
    probe: bool = False


@dataclass
class ChannelAware:
    """The FlexSpec draft-length policy for split decoding (see the module docstring)."""

    max_length: int = MAX_DRAFT
    energy_budget: float | None = None  # J per generated token; None: no constraint
    energy: EnergyModel = field(default_factory=EnergyModel)
    dither_every: int = 4  # every n-th round drafts optimum ± 1 so message sizes vary
    probe_gap: int = 4  # γ = 0 rounds before a probe; doubles while probes lose, up to max
    max_probe_gap: int = 32
    cost: CostModel = field(default_factory=CostModel)  # N(γ) and t_draft, as `auto` has them
    # network_seconds ≈ RTT + bytes_up/uplink + bytes_down/downlink (seconds per byte)
    link: OnlineLinear = field(
        default_factory=lambda: OnlineLinear(2, fast=0.4, ridge=4.0, min_clip=0.002)
    )
    verify: OnlineLinear = field(default_factory=lambda: OnlineLinear(1, ridge=0.5, min_clip=0.002))
    up_bytes: OnlineLinear = field(
        default_factory=lambda: OnlineLinear(1, fast=0.5, slow=0.6, ridge=0.1, prior=[4.0])
    )
    down_bytes: OnlineLinear = field(
        default_factory=lambda: OnlineLinear(1, fast=0.5, slow=0.6, ridge=0.1)
    )
    last: Choice | None = None
    _round: int = 0
    _remote_rounds: int = 0
    _gap: int = 4
    _plain_rounds: int = 0

    def __post_init__(self) -> None:
        if self.energy_budget is not None and not self.energy_budget > 0:
            raise ValueError(f"energy budget {self.energy_budget} must be > 0 J/token")
        self._gap = self.probe_gap

    # -- estimates the client reports in RoundStats -------------------------------------------
    @property
    def rtt(self) -> float | None:
        """Round trip (s): the part of network time that does not grow with message size."""
        return self.link.a

    @property
    def bandwidth(self) -> float | None:
        """Uplink (bytes/s); inf while no size-dependent delay has been seen."""
        return None if self.link.a is None else _rate(self.link.b[0])

    def channel_estimates(self) -> tuple[float | None, float | None]:
        return self.rtt, self.bandwidth

    @property
    def remote_rounds(self) -> int:
        """Rounds the server verified, as observed: the link's estimates change only then."""
        return self._remote_rounds

    @property
    def alpha(self) -> float:
        """Per-token acceptance of a geometric model with the cost model's N(4) (reports)."""
        return self.cost.alpha

    @property
    def t_draft(self) -> float | None:
        """Seconds per draft token, as the cost model measured them."""
        return self.cost.t_draft

    # -- the model ------------------------------------------------------------------------------
    def round_seconds(self, gamma: int) -> float:
        """Predicted T(γ)."""
        up, down = self.up_bytes.predict([gamma]), self.down_bytes.predict([gamma])
        wait = self.link.predict([up, down]) + self.verify.predict([gamma])
        return max(gamma * (self.t_draft or 0.0) + max(wait, 0.0), 1e-9)

    def round_joules(self, gamma: int) -> float:
        """Predicted device energy E(γ) of one round."""
        t_draft = self.t_draft or 0.0
        up, down = self.up_bytes.predict([gamma]), self.down_bytes.predict([gamma])
        e = self.energy
        wait = self.round_seconds(gamma) - gamma * t_draft
        return (
            gamma * e.draft_joules(t_draft)
            + e.tx_joules_per_byte * max(up, 0.0)
            + e.rx_joules_per_byte * max(down, 0.0)
            + e.wait_power_w * wait
        )

    def evaluate(self, gamma: int) -> Choice:
        n = self.cost.expected(gamma)
        joules = self.round_joules(gamma) / n
        over = self.energy_budget is not None and joules > self.energy_budget
        return Choice(gamma, n / self.round_seconds(gamma), joules, over)

    def best(self) -> Choice:
        """argmax N/T over the γ within the energy budget; else the least energy per token."""
        options = [self.evaluate(g) for g in range(self.max_length + 1)]
        fits = [c for c in options if not c.over_budget]
        if fits:
            return max(fits, key=lambda c: c.tokens_per_s)
        return min(options, key=lambda c: c.joules_per_token)

    # -- the DraftLengthPolicy protocol -------------------------------------------------------
    def plan(self, source: str | None = None) -> Plan:
        return Plan(self._length())

    def _length(self) -> int:
        self._round += 1
        if self._remote_rounds < 2 or self.t_draft is None:
            # learn first: two rounds of different sizes give the link's first slope
            self.last = Choice(min(4 if self._remote_rounds == 0 else 1, self.max_length), 0, 0)
            self.last.probe = True
            return self.last.length
        choice = self.best()
        g = choice.length
        if g == 0:  # keep tracking α (and the draft cost) with a short probe now and then
            self._plain_rounds += 1
            if self._plain_rounds >= self._gap:
                self._plain_rounds, self._gap = 0, min(2 * self._gap, self.max_probe_gap)
                g = min(1, self.max_length)  # one draft: the cheapest look at α
        else:
            self._gap, self._plain_rounds = self.probe_gap, 0
            if self.dither_every and self._round % self.dither_every == 0:
                near = [self.evaluate(n) for n in (g - 1, g + 1) if 1 <= n <= self.max_length]
                near = [c for c in near if choice.over_budget or not c.over_budget]
                if near:  # the better neighbour: cheap, and the message size varies
                    g = max(near, key=lambda c: c.tokens_per_s).length
        self.last = choice if g == choice.length else Choice(g, 0.0, 0.0, probe=True)
        return g

    def observe(self, stats: RoundStats) -> None:
        if stats.phase != "decode":
            return  # a prefill's timing is not a round's
        self.cost.observe_drafting(stats)
        if stats.verifier != "remote":
            return  # a round verified locally (the link was down) says nothing of the link
        self._remote_rounds += 1
        g = stats.drafted
        self.up_bytes.observe([g], stats.bytes_up)
        self.down_bytes.observe([g], stats.bytes_down)
        self.verify.observe([g], stats.server_seconds)
        self.link.observe([stats.bytes_up, stats.bytes_down], stats.network_seconds)


def _rate(seconds_per_byte: float) -> float:
    return 1.0 / seconds_per_byte if seconds_per_byte > 0 else float("inf")


def parse_channel_aware(
    arg: str,
    energy_budget: float | None = None,
    device_profile: Mapping[str, object] | None = None,
    priors: Priors = PRIORS,
) -> ChannelAware:
    """ "channel-aware[:BUDGET]" (J/token); an explicit `energy_budget` wins over the string."""
    budget = float(arg) if arg else None
    if energy_budget is not None:
        budget = energy_budget
    energy = EnergyModel.from_profile(device_profile)
    return ChannelAware(energy_budget=budget, energy=energy, cost=CostModel(priors=priors))
