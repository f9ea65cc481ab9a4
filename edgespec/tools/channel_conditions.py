"""What a channel is: the link conditions of the emulator and the traces that vary them.

`ChannelConfig` (RTT, bandwidth, jitter, loss; checked on construction), `Trace` (a
time-varying channel read from a CSV `time_s,rtt_ms,bandwidth_mbit[,loss]`, looping or
holding its last row; `at(t, base)` gives the conditions in force at time t) and
`parse_address`. Bad values are a `ChannelError` naming the value and the fix. Stdlib only.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, replace
from pathlib import Path

from edgespec.errors import EdgespecError


class ChannelError(EdgespecError, ValueError):
    """A channel cannot be set up as given; the message says what to change."""


@dataclass(frozen=True)
class ChannelConfig:
    """One channel state, the same for both directions. bandwidth_mbit None: unlimited."""

    rtt_ms: float = 0.0
    bandwidth_mbit: float | None = None
    jitter_ms: float = 0.0
    loss: float = 0.0  # probability that a segment is lost (and retransmitted)
    rto_min_ms: float = 200.0  # Linux's minimum retransmission timeout

    def __post_init__(self) -> None:
        checks = [
            (math.isfinite(self.rtt_ms) and self.rtt_ms >= 0, f"rtt_ms {self.rtt_ms} must be >= 0"),
            (
                self.bandwidth_mbit is None
                or (math.isfinite(self.bandwidth_mbit) and self.bandwidth_mbit > 0),
                f"bandwidth_mbit {self.bandwidth_mbit} must be > 0 (leave it out for unlimited)",
            ),
            (
                math.isfinite(self.jitter_ms) and self.jitter_ms >= 0,
                f"jitter_ms {self.jitter_ms} must be >= 0",
            ),
            (0 <= self.loss < 1, f"loss {self.loss} must be a probability in [0, 1)"),
            (self.rto_min_ms >= 0, f"rto_min_ms {self.rto_min_ms} must be >= 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise ChannelError(message)

    @property
    def bytes_per_s(self) -> float | None:
        return None if self.bandwidth_mbit is None else self.bandwidth_mbit * 1e6 / 8

    @property
    def rto_s(self) -> float:
        return max(self.rto_min_ms, self.rtt_ms + 4 * self.jitter_ms) / 1000

    def describe(self) -> str:
        bw = "unlimited" if self.bandwidth_mbit is None else f"{self.bandwidth_mbit:g} Mbit/s"
        return f"rtt {self.rtt_ms:g} ms, jitter {self.jitter_ms:g} ms, {bw}, loss {self.loss:g}"


@dataclass(frozen=True)
class TraceRow:
    time_s: float
    rtt_ms: float
    bandwidth_mbit: float
    loss: float | None = None  # None: the base config's loss


@dataclass(frozen=True)
class Trace:
    """A time-varying channel: `at(t, base)` is the config in force t seconds in."""

    rows: tuple[TraceRow, ...]
    loop: bool = True

    def __post_init__(self) -> None:
        if not self.rows:
            raise ChannelError("the trace has no rows: give at least one time_s,rtt_ms,bandwidth")
        times = [r.time_s for r in self.rows]
        if times[0] < 0 or any(b <= a for a, b in zip(times, times[1:], strict=False)):
            raise ChannelError(f"trace times must start at >= 0 and increase, got {times}")
        for r in self.rows:  # refuse bad values now, not mid-run
            ChannelConfig(r.rtt_ms, r.bandwidth_mbit, 0.0, r.loss or 0.0)

    @classmethod
    def from_csv(cls, path: str | Path, loop: bool = True) -> Trace:
        """Rows `time_s,rtt_ms,bandwidth_mbit[,loss]`; a header line and # comments allowed."""
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as e:
            raise ChannelError(f"cannot read trace {p}: {e.strerror or e}") from None
        rows: list[TraceRow] = []
        for n, fields in enumerate(csv.reader(text.splitlines()), start=1):
            fields = [f.strip() for f in fields]
            if not fields or not any(fields) or fields[0].startswith("#"):
                continue
            if not rows and not _is_number(fields[0]):
                continue  # header
            if len(fields) not in (3, 4) or not all(_is_number(f) for f in fields):
                raise ChannelError(
                    f"trace {p} line {n}: expected time_s,rtt_ms,bandwidth_mbit[,loss] "
                    f"(numbers), got {','.join(fields)!r}"
                )
            v = [float(f) for f in fields]
            try:
                rows.append(TraceRow(v[0], v[1], v[2], v[3] if len(v) == 4 else None))
                ChannelConfig(v[1], v[2], 0.0, v[3] if len(v) == 4 else 0.0)
            except ChannelError as e:
                raise ChannelError(f"trace {p} line {n}: {e}") from None
        if not rows:
            raise ChannelError(f"trace {p} is empty: expected rows time_s,rtt_ms,bandwidth_mbit")
        return cls(tuple(rows), loop)

    @property
    def period(self) -> float:
        times = [r.time_s for r in self.rows]
        return times[-1] + (times[-1] - times[-2] if len(times) > 1 else max(times[-1], 1.0))

    def row_at(self, t: float) -> TraceRow:
        if self.loop:
            t %= self.period
        current = self.rows[0]
        for r in self.rows:
            if r.time_s > t:
                break
            current = r
        return current

    def at(self, t: float, base: ChannelConfig) -> ChannelConfig:
        r = self.row_at(t)
        return replace(
            base,
            rtt_ms=r.rtt_ms,
            bandwidth_mbit=r.bandwidth_mbit,
            loss=base.loss if r.loss is None else r.loss,
        )


def _is_number(s: str) -> bool:
    try:
        return math.isfinite(float(s))
    except ValueError:
        return False


def parse_address(text: str) -> tuple[str, int]:
    """'HOST:PORT' -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ChannelError(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:8701)")
    return host.strip("[]"), int(port)
