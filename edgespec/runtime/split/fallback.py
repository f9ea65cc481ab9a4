"""Verifiers across a network: the split-decoding server, and the fallback to local graphs.

`RemoteVerifier` (`verifier.py`) sends each round to the server (VERIFY with the
drafts and, when sampling, the sparse distributions they were drawn from) and answers with a
`Pending` that the decode loop polls while it drafts ahead. The server applies the
acceptance rule and keeps its own cache in step, so `truncate` has nothing to do here. A
START (re)builds the server's session from the committed tokens: on the first round, and
after a reconnect (resync). With `hold` (a conversation), a generation ends with PAUSE
instead of END and the next prefill resumes the server's session: only the prompt past what
its cache shares is sent.

`FallbackVerifier` holds both: rounds go to the server while it answers. When a round is not
answered within the timeout, the connection drops or the server went away (`LinkError`
after the link's retries), the same round is verified by the bundle's own target graphs
(RoundStats.verifier = "local"), and the server is tried again now and then (a resync: the
next round drafts nothing and the server's START answer is its token): every `retry_after`
seconds (2) while it answers but refuses the session (`ServerBusy`: full, or a replica
restarting), at growing intervals (2, 4, ... 60 s) while it does not answer at all.
Without local graphs a `SplitError` says so. Tokens are emitted only once verified, by one
side or the other.

Limits: the server announces its context and request size in START's answer (a server that
does not negotiate `edgespec.limits` does not: then an ERROR 413/422 teaches the same). Rounds
stay within them: `max_drafts` caps γ by the session's room and by how many drafts a VERIFY
within the request size carries with q rows at their largest (the drafter's support), and a
round that would still not fit is shortened (`protocol.fit`: trailing drafts dropped, the
decode loop recommits its drafter), never sent. When the sequence outgrows the server's
context the rest is local, or, without local graphs, `max_drafts` answers -1 and the
generation ends with finish_reason "server_context".

Late rounds: a round not answered within `Remote.late_after()` (4x the EWMA round trip, at
least its floor) is verified locally at once while its answer is still awaited; the answer,
when it comes, puts the server back in use only if it matches what the device committed
(else the server's session is rebuilt from the committed tokens by a resync). A deadline at
the timeout (`late_after` >= `timeout`) is no lateness: such a round has failed, and the
device reconnects (possibly to another replica) before verifying anything here. Probes of a
server that went quiet are bounded by that same deadline (at least 1 s).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from time import monotonic, perf_counter

import numpy as np

from edgespec.runtime.errors import LinkError, RoundLate, ServerBusy, ServerLimit, SplitError
from edgespec.runtime.round import Done, Pending, Proposal, Start, Verdict
from edgespec.runtime.sampling import SamplingParams
from edgespec.runtime.split.listen import ServerStream, StreamsFull
from edgespec.runtime.split.verifier import InFlight
from edgespec.runtime.split.verifier import RemoteVerifier as RemoteVerifier
from edgespec.runtime.stats import ChannelStats, RoundStats
from edgespec.runtime.verify.local import LocalVerifier


@dataclass
class _Guarded:
    """A remote round that, if the link fails, is resynced or verified locally instead."""

    pending: InFlight
    fallback: FallbackVerifier
    seq: list[int]
    params: SamplingParams
    rng: np.random.Generator

    @property
    def sent(self) -> int:
        return self.pending.sent

    @property
    def proposal(self) -> Proposal:  # what was sent: what a local round verifies instead
        return self.pending.proposal

    def done(self) -> bool:
        try:
            return self.pending.done()
        except LinkError:
            return True  # no use waiting: the verdict comes from elsewhere

    def result(self) -> Verdict:
        f = self.fallback
        late = f.server.session.late_after() if f.local is not None else None
        if late is not None and late >= f.server.session.timeout:
            late = None  # late only at the timeout: a failed round, reconnected first
        try:
            return self.pending.result(late)
        except RoundLate:  # verify here now; the answer may still put the server back in use
            f.went_late(self.pending)
            return f.local_round(self.seq, self.proposal, self.params, self.rng)
        except ServerLimit as e:  # an older server that announced no limits
            f.give_up(e)
            if f.local is None:
                raise
            return f.local_round(self.seq, self.proposal, self.params, self.rng)
        except LinkError as e:
            return f.recover(e, self.seq, self.proposal, self.params, self.rng)


@dataclass
class StreamRound:
    """A round placed on the server's stream (or one that takes decoding back from it)."""

    fallback: FallbackVerifier
    seq: list[int]
    proposal: Proposal
    params: SamplingParams
    rng: np.random.Generator

    @property
    def sent(self) -> int:
        return len(self.proposal.tokens)  # void if the server streamed: the verdict says 0

    def done(self) -> bool:
        stream = self.fallback.stream
        return not stream.active or stream.ready()

    def result(self) -> Verdict:
        f, stream = self.fallback, self.fallback.stream
        try:
            if not stream.active:  # its STREAM could not be sent: the link is gone
                raise LinkError("the stream could not start")
            ids, channel = stream.read(self.proposal.where != "stream", lambda: f.follow(self.seq))
        except StreamsFull:  # the round as a VERIFY, answered now
            try:
                out = f.server.submit(self.seq, self.proposal, self.params, self.rng).result()
            except LinkError as e:
                out = f.recover(e, self.seq, self.proposal, self.params, self.rng)
            out.channel = replace(out.channel or ChannelStats(0.0, 0.0, 0, 0), server_busy=True)
            return out
        except LinkError as e:
            return f.recover(e, self.seq, self.proposal, self.params, self.rng)
        channel = replace(channel, server_busy=stream.shed)
        return Verdict(0, list(ids), channel.server_seconds, "stream", channel=channel)


class FallbackVerifier:
    """The server while it answers, else the bundle's own graphs (see the module docstring)."""

    def __init__(
        self,
        server: RemoteVerifier,
        local: LocalVerifier | None,
        retry_after: float = 2.0,  # seconds of local decoding before trying the server again
        max_retry_after: float = 60.0,
    ) -> None:
        self.server, self.local = server, local
        self.max_positions = server.max_positions
        self.first_retry = self.retry_after = retry_after
        self.max_retry_after = max_retry_after
        self.next_retry: float | None = None  # when to try the server again; None: it is up
        self.synced = -1  # tokens of the sequence the local cache holds (-1: none yet)
        self.capacity = 0
        self.last_error = ""
        self.reconnects = 0
        self.server_done = False  # the server can go no further: the rest is local
        self.late: InFlight | None = None  # a round verified here, its answer still awaited
        self.stream = ServerStream(server.session)  # the server decoding on its own
        self.behind = False  # rounds placed here while the server was up: it lacks them
        self.last_where = "split"  # where the last round was placed (the next prefill goes
        # there too: a device that decodes here also prefills here, with no round trip)
        self.follow_chunk = 32  # streamed tokens fed to the local graphs per idle step (0: off)

    # -- failure and recovery ----------------------------------------------------------------
    def _down(self, error: Exception) -> None:
        self.last_error = str(error)
        if self.local is None:
            raise SplitError(
                f"the server stopped answering ({error}) and this bundle has no local "
                "verifier (`full` graph) to continue with: check the server and the link"
            ) from None
        if isinstance(error, ServerBusy):  # up but full (or restarting): a slot may free soon
            self.retry_after = self.first_retry
        self.next_retry = monotonic() + self.retry_after
        if not isinstance(error, ServerBusy):  # silent or unreachable: probe less and less
            self.retry_after = min(2 * self.retry_after, self.max_retry_after)

    def give_up(self, error: Exception | None) -> None:
        """The server cannot hold this generation any further: the rest is local (or, with
        no local graphs, the generation ends: `max_drafts` answers -1)."""
        self.server_done, self.late, self.next_retry = True, None, None
        self.last_error = str(error) if error else "the server's context is full"
        self.server.close()
        self.server.session.drop()

    def went_late(self, pending: InFlight) -> None:
        self.late = pending

    def _settle(self, seq: list[int]) -> None:
        """The late round's answer, if here: the server is back in use if it answered what
        the device committed for that round (and nothing since); else its session is
        rebuilt from the committed tokens (a resync); past the timeout it is down."""
        pending = self.late
        assert pending is not None
        session = pending.session
        try:
            sent = session.pending[0] if session.pending else 0.0
            if not session.answered() and perf_counter() - sent <= session.timeout:
                return  # still awaited
            verdict = pending.result()
        except (LinkError, SplitError) as e:
            self.late = None
            session.drop()
            self._down(e)
            return
        self.late = None
        if seq[pending.base :] == verdict.tokens:
            self.next_retry, self.retry_after = None, self.first_retry
        else:  # e.g. sampled differently here, or more committed since: rebuild
            session.drop()
            self.next_retry = monotonic()

    def _reconnect(
        self, seq: list[int], params: SamplingParams, attempts: int, wait: float | None = None
    ) -> Verdict | None:
        """A new server session holding seq; its verdict is the next token (None: failed)."""
        try:
            verdict = self.server.resync(seq, params, attempts, wait)
        except ServerLimit as e:
            self.give_up(e)
            if self.local is None:
                raise
            return None
        except LinkError as e:
            self._down(e)
            return None
        self.next_retry, self.retry_after = None, self.first_retry
        self.reconnects += 1
        return verdict

    def recover(
        self,
        error: Exception,
        seq: list[int],
        proposal: Proposal,
        params: SamplingParams,
        rng: np.random.Generator,
    ) -> Verdict:
        """The round's link failed: reconnect at once (the link's full retries; the round's
        drafts are void), or verify the round here."""
        self.last_error = str(error)
        self.server.session.drop()
        verdict = self._reconnect(seq, params, self.server.session.retries + 1)
        return verdict or self.local_round(seq, proposal, params, rng)

    def _retry_due(self) -> bool:
        return self.next_retry is not None and monotonic() >= self.next_retry

    # -- the Verifier protocol ---------------------------------------------------------------
    def prefill(self, start: Start) -> tuple[int, RoundStats]:
        prompt, capacity, constraint = start.prompt, start.capacity, start.constraint
        self.capacity, self.synced, self.next_retry = capacity, -1, None
        self.server_done, self.late, self.behind = False, None, False
        self.stream.reset()
        self.server.capacity = capacity
        if self.local is not None:  # verifying here after a failure masks alike
            self.local.constraint = constraint
        afresh = replace(start, cached=0)  # the local graphs hold nothing of an earlier turn
        if self.last_where == "local" and self.local is not None and constraint is None:
            self.behind = True  # the server holds none of this generation yet
            self.server.started(len(prompt))  # its room, as a START would set it
            token, stats = self.local.prefill(afresh)
            self.synced, stats.verifier = len(prompt), "device"
            return token, stats
        try:
            return self.server.prefill(afresh)
        except ServerLimit as e:
            if self.local is None:
                raise
            self.give_up(e)
        except LinkError as e:
            self._down(e)
        assert self.local is not None
        token, stats = self.local.prefill(afresh)
        self.synced = len(prompt)
        return token, stats

    def max_drafts(self, seq: list[int]) -> int:
        if self.late is not None:
            self._settle(seq)
        if not self.server_done and self.late is None:
            if self._retry_due():
                return 0  # a resync round: the server's START answer is the next token
            if self.next_retry is None:
                room = self.server.max_drafts(seq)
                if room >= 0:
                    return room
                self.give_up(None)  # the server's context is full
        if self.local is None and self.server_done:
            return -1  # nothing can verify past here: the generation ends
        return self.capacity - len(seq)

    def submit(
        self, seq: list[int], proposal: Proposal, params: SamplingParams, rng: np.random.Generator
    ) -> Pending:
        g = len(proposal.tokens)
        self.last_where = proposal.where
        if self.stream.active:  # this round reads it (and stops it if placed elsewhere)
            return self.stream_round(seq, proposal, params, rng)
        elsewhere = self.server_done or self.late is not None or proposal.where == "local"
        if elsewhere and self.local is not None:
            placed = self._server_up()  # decoded here by choice, not for want of a server
            self.behind = self.behind or placed
            verdict = self.local_round(seq, proposal, params, rng)
            verdict.verifier = "device" if placed else "local"
            return Done(verdict, g)
        if self.behind and self._server_up():  # back from local rounds: send what it lacks
            self.behind = False
            try:
                return Done(self.server.resync(seq, params, 1, resume=True), g)
            except (LinkError, ServerLimit) as e:
                return Done(self.recover(e, seq, proposal, params, rng), g)
        # a grammar's forced tokens (or any drafts) go in a VERIFY: the server's own stream
        # would not know them
        if proposal.where == "stream" and not proposal.tokens and self._server_up():
            return self.stream_round(seq, proposal, params, rng)
        if self.next_retry is None:
            try:
                pending = self.server.submit(seq, proposal, params, rng)
            except LinkError as e:
                return Done(self.recover(e, seq, proposal, params, rng), g)
            return _Guarded(pending, self, seq, params, rng)
        if self._retry_due() and not proposal.tokens:
            # a probe while decoding locally: one attempt, bounded by the device's own
            # deadline, so a stalled server costs the device little per probe
            wait = max(1.0, self.server.session.late_after())
            verdict = self._reconnect(seq, params, 1, wait)
            if verdict is not None:
                return Done(verdict, g)
        return Done(self.local_round(seq, proposal, params, rng), g)

    def stream_round(
        self, seq: list[int], proposal: Proposal, params: SamplingParams, rng: np.random.Generator
    ) -> StreamRound:
        """Start (or stop) the stream as the round's placement asks; the round reads it."""
        stream = self.stream
        try:
            if not stream.active:
                stream.open(len(seq), max(1, self.capacity - len(seq)))
            elif proposal.where != "stream":
                stream.stop()
        except LinkError:
            stream.reset()
            self.server.session.drop()  # the round's result recovers (reconnect, or local)
        return StreamRound(self, seq, proposal, params, rng)

    def _server_up(self) -> bool:
        return not self.server_done and self.late is None and self.next_retry is None

    def follow(self, seq: list[int]) -> bool:
        """While a stream is awaited: feed the local graphs one chunk of the committed tokens
        they lack, so decoding can come back here at any token; False if none is due."""
        if self.local is None or self.follow_chunk <= 0:
            return False
        have = max(self.synced, 0)
        if len(seq) - 1 - have < self.follow_chunk:
            return False
        upto = have + self.follow_chunk
        self.synced = self.local.catch_up(seq[: upto + 1], self.capacity, self.synced)
        return True

    def local_round(
        self, seq: list[int], proposal: Proposal, params: SamplingParams, rng: np.random.Generator
    ) -> Verdict:
        """Verify the round on the local graphs, after catching their cache up with seq."""
        assert self.local is not None
        start, behind = perf_counter(), self.synced < len(seq) - 1
        self.synced = self.local.catch_up(seq, self.capacity, self.synced)
        catchup = perf_counter() - start
        verdict = self.local.submit(seq, proposal, params, rng).result()
        if behind:  # fed tokens decoded elsewhere: a one-off, not priced as this round's γ
            verdict.catchup_seconds += catchup
        else:
            verdict.verify_seconds += catchup
        self.synced = len(seq) + verdict.accepted
        return verdict

    def truncate(self, length: int) -> None:
        if self.local is not None and self.synced >= 0:
            self.synced = min(self.synced, length)
            self.local.truncate(length)

    def close(self) -> None:
        if self.stream.active:  # tokens still come: END stops it, the link is not reused
            self.stream.reset()
            self.server.session.end()
            self.server.session.drop()
        if self.server.connected:
            self.server.close()
