"""The device's connection to a split-decoding server (the remote verifier's transport).

`Remote` is the server session on one WebSocket (`runtime/split/websocket.py`'s `Link`, whose reader
thread timestamps every answer as it arrives): START (with retries and exponential backoff,
re-sending the committed sequence after a reconnect), VERIFY, END, and PAUSE: the server keeps
the session for the next START to resume (a conversation's next turn: keep what its cache
shares with the new sequence, send the rest). `held`, the session's committed tokens as the
answers built them, is known only while every answer was read on a link still open: else, on
a link the server closed meanwhile, or when it refuses the resume, all the ids are sent.

Failures come in two kinds. `LinkError`: the connection failed, closed, or an answer did not
come within the timeout: retry, reconnect, or fall back to the local verifier. `SplitError`:
the server refused the request (wrong token, incompatible bundle, bad request): retrying
would not help, so the message says what to change. `ServerLimit` (a SplitError): the server
cannot hold this generation (its context or request size): go on locally or stop.

Lateness: `Remote` keeps an EWMA of its rounds' round trips; `late_after()` (4x that, at
least `late_floor`, at most `timeout`) is how long a round may take before the device
treats it as late and goes on locally while the answer is still awaited (`RoundLate`).
The limits the server announces in START's answer (`P.ServerLimits`; older servers send
none) are kept in `limits`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from time import perf_counter, sleep

from edgespec import protocol as P
from edgespec.runtime.errors import LinkError, RoundLate, ServerBusy, ServerLimit, SplitError
from edgespec.runtime.sampling import SamplingParams
from edgespec.runtime.split.websocket import Arrival, Link

ANSWER_TIMEOUT = 10.0  # seconds a device waits for one answer (the one default, CLI included)


class ResumeRefused(LinkError):
    """The server holds no session to resume on this link, or less of it than the device
    thought: START again with the whole sequence (the link itself is fine)."""


@dataclass
class Exchange:
    """One request and its answer, as the channel saw them."""

    result: P.Result
    sent_at: float
    arrived_at: float
    bytes_up: int
    bytes_down: int
    kept: int = 0  # a resumed START: positions of the server's cache that stayed

    @property
    def network_seconds(self) -> float:
        """The round trip less the server's own work: wire, queueing, framing."""
        return max(0.0, self.arrived_at - self.sent_at - self.result.server_seconds)


@dataclass
class Remote:
    """The server session of one generation, surviving reconnects."""

    url: str
    token: str | None = None
    fingerprint: str = ""
    timeout: float = ANSWER_TIMEOUT  # seconds to wait for one answer
    connect_timeout: float = 3.0
    retries: int = 2  # reconnect attempts after a failure, before falling back
    backoff: float = 0.2  # first wait between attempts; doubles each time
    link: Link | None = None
    round: int = 0
    pending: tuple[float, int] | None = None  # (sent_at, bytes_up) of the round in flight
    early: Arrival | None = None  # an answer `answered()` already took off the link
    limits: P.ServerLimits | None = None  # what the server announced at START (or None)
    sent_drafts: list[int] = field(default_factory=list)  # of the VERIFY in flight
    sent_base: int | None = None  # of the VERIFY in flight (None: a START)
    resuming: bool = False  # the START in flight resumes a session
    held: list[int] | None = None  # the server session's committed tokens (None: unknown)
    # the generation's grammar (text, the output's start) that every START carries, or None
    grammar: tuple[str, int] | None = None
    round_seconds: float | None = None  # EWMA of VERIFY round trips
    late_factor: float = 4.0
    late_floor: float = 0.5  # seconds: never late sooner (scheduling jitter, GC pauses)

    @property
    def tree_nodes(self) -> int:
        """The largest token tree the server verifies, as it announced (0: chains only)."""
        return (self.limits.tree_nodes or 0) if self.limits is not None else 0

    @property
    def max_request(self) -> int | None:
        """The largest message (bytes) the server takes, as it announced; None: not known."""
        return self.limits.max_request_bytes if self.limits is not None else None

    def late_after(self) -> float:
        """Seconds after which the round in flight counts as late."""
        if self.round_seconds is None:
            return self.timeout
        return min(self.timeout, max(self.late_floor, self.late_factor * self.round_seconds))

    def start(
        self,
        ids: list[int],
        capacity: int,
        params: SamplingParams,
        attempts: int | None = None,
        wait: float | None = None,
        resume: bool = False,
    ) -> Exchange:
        """(Re)connect and START a session holding `ids`; returns the first answer.
        Tries `attempts` times (default 1 + retries), waiting backoff, 2x backoff, ...;
        `wait` bounds the connect and the answer (a probe of a server that went quiet).
        `resume`: keep what the session the last generation paused shares with `ids` and
        send only the rest (all of them when nothing is known or the server refuses)."""
        if self.limits is not None and len(ids) >= self.limits.max_context:
            raise ServerLimit(
                f"the sequence is {len(ids)} tokens: beyond the server's context "
                f"({self.limits.max_context})"
            )
        if self.link is not None and self.pending is None:
            self._check_kept_link()
        delay, error = self.backoff, None
        for attempt in range(attempts or self.retries + 1):
            if attempt:
                sleep(delay)
                delay *= 2
            try:
                if self.link is None:
                    self.link = Link(self.url, self.token, min(self.connect_timeout, wait or 1e9))
                keep = self._keep(ids) if resume else 0
                try:
                    x = self._start(ids, keep, capacity, params, wait)
                except ResumeRefused:  # evicted, or out of step: all of ids, on the same link
                    x = self._start(ids, 0, capacity, params, wait)
                self.limits = x.result.limits or self.limits
                self.held = [*ids, x.result.token]
                return x
            except LinkError as e:
                self.drop()
                error = e
        assert error is not None
        raise error

    def _start(
        self, ids: list[int], keep: int, capacity: int, params: SamplingParams, wait: float | None
    ) -> Exchange:
        p = params
        msg = P.Start(
            ids[keep:], capacity, p.temperature, p.top_p, p.top_k, p.seed, self.fingerprint, keep
        )
        msg.grammar = self.grammar  # every START of the generation (resyncs too) sends it
        self.send(msg)
        x = self.receive(wait)
        x.kept = keep
        return x

    def _keep(self, ids: list[int]) -> int:
        """How many of `ids` the server's cache holds (it holds `held` but its last token),
        leaving at least one to prefill; 0 when nothing is known."""
        if self.held is None or self.link is None:
            return 0
        cached, n, i = self.held[:-1], min(len(self.held) - 1, len(ids) - 1), 0
        while i < n and cached[i] == ids[i]:
            i += 1
        return i

    def _check_kept_link(self) -> None:
        """Drop a link kept since the last generation if the server has closed it meanwhile:
        anything that came with no round in flight is its ERROR before closing (the idle
        timeout, an eviction, a shutdown)."""
        assert self.link is not None
        try:
            stale = self.link.poll(0)
        except LinkError:
            stale = True
        if stale is not None:
            self.drop()

    def send(self, msg: P.Start | P.Verify) -> None:
        assert self.link is not None
        self.round += 1
        msg.round = self.round
        self.sent_drafts = list(msg.drafts) if isinstance(msg, P.Verify) else []
        self.sent_base = msg.base if isinstance(msg, P.Verify) else None
        self.resuming = isinstance(msg, P.Start) and msg.keep > 0
        self.pending = self.link.send(msg)

    def answered(self) -> bool:
        """Whether the answer to the round in flight is here (never waits)."""
        assert self.link is not None
        if self.early is None:
            self.early = self.link.poll(0)
        return self.early is not None

    def receive(self, wait: float | None = None, late: float | None = None) -> Exchange:
        """The answer to the round in flight, within `wait` (default: timeout) seconds of
        its sending, else LinkError; with `late`, RoundLate once that many seconds passed
        (the round stays in flight: call again)."""
        assert self.link is not None and self.pending is not None
        sent_at = self.pending[0]
        arrival, self.early = self.early, None
        if arrival is None and late is not None:
            arrival = self.link.poll(max(sent_at + late - perf_counter(), 1e-6))
            if arrival is None:
                raise RoundLate(f"no answer within {late:.2f}s")
        if arrival is None:
            left = sent_at + (wait or self.timeout) - perf_counter()
            arrival = self.link.poll(left) if left > 0 else self.link.poll(0)
        if arrival is None:
            self.drop()
            raise LinkError(f"no answer from {self.url} within {wait or self.timeout:g}s")
        msg = arrival.message
        resume_refused = self.resuming and msg.round == self.round
        if isinstance(msg, P.Error) and resume_refused and msg.code in (P.GONE, P.OUT_OF_SYNC):
            self.pending = None  # the answer to this START: the link stays usable
            raise ResumeRefused(f"server: {msg.text}")
        if isinstance(msg, P.Error):
            self.drop()
            if msg.code == P.UNAVAILABLE:  # full or shutting down: it answers, try soon
                raise ServerBusy(f"server: {msg.text}")
            if msg.code in (P.IDLE_TIMEOUT, P.GONE):
                raise LinkError(f"server: {msg.text}")
            if msg.code in (P.TOO_LARGE, P.BAD_REQUEST) and "context" in msg.text:
                raise ServerLimit(f"the server's limit ({msg.code}): {msg.text}")
            if msg.code == P.TOO_LARGE:
                raise ServerLimit(f"the server's limit ({msg.code}): {msg.text}")
            raise SplitError(f"the server refused the round ({msg.code}): {msg.text}")
        if not isinstance(msg, P.Result) or msg.round != self.round:
            self.drop()
            raise LinkError(f"unexpected answer from the server: {msg!r}")
        sent_at, up = self.pending
        self.pending = None
        self._advance(msg)
        seconds = arrival.at - sent_at
        if self.round_seconds is None:
            self.round_seconds = seconds
        else:
            self.round_seconds += 0.2 * (seconds - self.round_seconds)
        return Exchange(msg, sent_at, arrival.at, up, arrival.size)

    def _advance(self, r: P.Result) -> None:
        """`held` after a VERIFY's answer: it plus the accepted drafts and the server's token
        (unknown if the answer does not fit what was sent)."""
        base, held, n, sent = self.sent_base, self.held, r.accepted, self.sent_drafts
        if base is None:
            return  # a START's answer: `start` sets it
        kept = sent[:n] if r.path is None else [sent[i] for i in r.path if i < len(sent)]
        if held is None or not len(held) == base == r.length - n - 1 or len(kept) != n:
            self.held = None
        else:
            self.held = [*held, *kept, r.token]

    def end(self) -> None:
        """Tell the server the generation is over (frees its cache), keep the link."""
        self.held = None
        self._notify(P.End())

    def pause(self) -> None:
        """The generation is over; the server keeps its session for the next `start` to
        resume. END instead while an answer is outstanding (what it holds is not known)."""
        if self.pending is not None or self.held is None:
            self.end()
        else:
            self._notify(P.Pause())

    def _notify(self, msg: P.End | P.Pause) -> None:
        """Send a message the server does not answer; a link that fails is dropped."""
        if self.link is not None:
            try:
                self.link.send(msg)
            except LinkError:
                self.drop()

    def tune_like(self, other: Remote) -> None:
        """Take `other`'s settings (timeouts, retries, lateness) for this link's own session."""
        self.timeout, self.connect_timeout = other.timeout, other.connect_timeout
        self.retries, self.backoff = other.retries, other.backoff
        self.late_factor, self.late_floor = other.late_factor, other.late_floor

    def drop(self) -> None:
        if self.link is not None:
            self.link.close()
        self.link, self.pending, self.early, self.held = None, None, None, None
