"""Verifiers across a network: the split-decoding server, and the fallback to local graphs.

`RemoteVerifier` sends each round to the server (VERIFY with the drafts and, when sampling,
the rows they were drawn from) and answers with a `Pending` that the decode loop polls while
it drafts ahead; the server applies the acceptance rule and keeps its own cache in step, so
`truncate` has nothing to do here. A START (re)builds the server's session from the
committed tokens: on the first round, and after a reconnect (resync).

`FallbackVerifier` holds both: rounds go to the server while it answers. When a round is not
answered within the timeout, the connection drops or the server went away (`LinkError`
after the link's retries), the same round is verified by the bundle's own target graphs
(RoundStats.verifier = "local"), and the server is tried again now and then (a resync: the
next round drafts nothing and the server's START answer is its token). Without local graphs
a `SplitError` says so. Tokens are emitted only once verified, by one side or the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from time import monotonic, perf_counter

import numpy as np

from edgespec import protocol as P
from edgespec.runtime.errors import LinkError, SplitError
from edgespec.runtime.link import Exchange, Remote
from edgespec.runtime.local import LocalVerifier
from edgespec.runtime.round import Done, Pending, Proposal, Verdict
from edgespec.runtime.sampling import SamplingParams
from edgespec.runtime.stats import RoundStats


def _channel(x: Exchange) -> dict[str, float]:
    return {
        "server_seconds": x.result.server_seconds,
        "network_seconds": x.network_seconds,
        "bytes_up": x.bytes_up,
        "bytes_down": x.bytes_down,
    }


def _verdict(x: Exchange, resync: bool = False) -> Verdict:
    r = x.result
    return Verdict(r.accepted, r.token, r.server_seconds, "remote", resync, _channel(x))


@dataclass
class _InFlight:
    """A VERIFY sent to the server; its answer is checked against the round."""

    remote: Remote
    base: int
    drafted: int

    def done(self) -> bool:
        return self.remote.answered()

    def result(self) -> Verdict:
        x = self.remote.receive()
        n = x.result.accepted
        if n > self.drafted or x.result.length != self.base + n + 1:
            self.remote.drop()
            raise LinkError(f"the server's answer does not fit the round: {x.result}")
        return _verdict(x)


class RemoteVerifier:
    """The target on a server (`edgespec serve`), one session per generation."""

    def __init__(self, remote: Remote, max_positions: int) -> None:
        self.remote, self.max_positions = remote, max_positions
        self.capacity = 0

    @property
    def connected(self) -> bool:
        return self.remote.link is not None

    def prefill(
        self, prompt: list[int], capacity: int, params: SamplingParams, rng: np.random.Generator
    ) -> tuple[int, RoundStats]:
        start = perf_counter()
        self.capacity = capacity
        x = self.remote.start(prompt, capacity, params)
        stats = RoundStats("prefill", 1, len(prompt), perf_counter() - start)
        return x.result.token, _verdict(x).fill(stats)

    def resync(self, seq: list[int], params: SamplingParams, attempts: int) -> Verdict:
        """Reconnect and rebuild the server session from the committed sequence; its answer
        is the token after it (a round of γ = 0)."""
        x = self.remote.start(seq, self.capacity, params, attempts)
        return _verdict(x, resync=True)

    def max_drafts(self, seq: list[int]) -> int:
        return self.capacity - len(seq)

    def submit(
        self, seq: list[int], proposal: Proposal, params: SamplingParams, rng: np.random.Generator
    ) -> _InFlight:
        q = proposal.q if proposal.kind == "sampled" and proposal.tokens else None
        self.remote.send(P.Verify(len(seq), proposal.tokens, q))
        return _InFlight(self.remote, len(seq), len(proposal.tokens))

    def truncate(self, length: int) -> None:
        pass  # the server truncates its own cache to what it accepted

    def close(self) -> None:
        self.remote.end()


@dataclass
class _Guarded:
    """A remote round that, if the link fails, is resynced or verified locally instead."""

    pending: _InFlight
    fallback: FallbackVerifier
    seq: list[int]
    proposal: Proposal
    params: SamplingParams
    rng: np.random.Generator

    def done(self) -> bool:
        try:
            return self.pending.done()
        except LinkError:
            return True  # no use waiting: the verdict comes from elsewhere

    def result(self) -> Verdict:
        try:
            return self.pending.result()
        except LinkError as e:
            return self.fallback.recover(e, self.seq, self.proposal, self.params, self.rng)


class FallbackVerifier:
    """The server while it answers, else the bundle's own graphs (see the module docstring)."""

    def __init__(
        self,
        remote: RemoteVerifier,
        local: LocalVerifier | None,
        retry_after: float = 2.0,  # seconds of local decoding before trying the server again
        max_retry_after: float = 60.0,
    ) -> None:
        self.remote, self.local = remote, local
        self.max_positions = remote.max_positions
        self.first_retry = self.retry_after = retry_after
        self.max_retry_after = max_retry_after
        self.next_retry: float | None = None  # when to try the server again; None: it is up
        self.synced = -1  # tokens of the sequence the local cache holds (-1: none yet)
        self.capacity = 0
        self.last_error = ""
        self.reconnects = 0

    # -- failure and recovery ----------------------------------------------------------------
    def _down(self, error: Exception) -> None:
        self.last_error = str(error)
        if self.local is None:
            raise SplitError(
                f"the server stopped answering ({error}) and this bundle has no local "
                "verifier (`full` graph) to continue with: check the server and the link"
            ) from None
        self.next_retry = monotonic() + self.retry_after
        self.retry_after = min(2 * self.retry_after, self.max_retry_after)

    def _reconnect(self, seq: list[int], params: SamplingParams, attempts: int) -> Verdict | None:
        """A new server session holding seq; its verdict is the next token (None: failed)."""
        try:
            verdict = self.remote.resync(seq, params, attempts)
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
        self.remote.remote.drop()
        verdict = self._reconnect(seq, params, self.remote.remote.retries + 1)
        return verdict or self.local_round(seq, proposal, params, rng)

    def _retry_due(self) -> bool:
        return self.next_retry is not None and monotonic() >= self.next_retry

    # -- the Verifier protocol ---------------------------------------------------------------
    def prefill(
        self, prompt: list[int], capacity: int, params: SamplingParams, rng: np.random.Generator
    ) -> tuple[int, RoundStats]:
        self.capacity, self.synced, self.next_retry = capacity, -1, None
        self.remote.capacity = capacity
        try:
            return self.remote.prefill(prompt, capacity, params, rng)
        except LinkError as e:
            self._down(e)
        assert self.local is not None
        token, stats = self.local.prefill(prompt, capacity, params, rng)
        self.synced = len(prompt)
        return token, stats

    def max_drafts(self, seq: list[int]) -> int:
        if self._retry_due():
            return 0  # a resync round: the server's START answer is the next token
        return self.remote.max_drafts(seq)

    def submit(
        self, seq: list[int], proposal: Proposal, params: SamplingParams, rng: np.random.Generator
    ) -> Pending:
        if self.next_retry is None:
            try:
                pending = self.remote.submit(seq, proposal, params, rng)
            except LinkError as e:
                return Done(self.recover(e, seq, proposal, params, rng))
            return _Guarded(pending, self, seq, proposal, params, rng)
        if self._retry_due() and not proposal.tokens:
            # a probe while decoding locally: one attempt, so a stalled server costs the
            # device one connect timeout per probe
            verdict = self._reconnect(seq, params, 1)
            if verdict is not None:
                return Done(verdict)
        return Done(self.local_round(seq, proposal, params, rng))

    def local_round(
        self, seq: list[int], proposal: Proposal, params: SamplingParams, rng: np.random.Generator
    ) -> Verdict:
        """Verify the round on the local graphs, after catching their cache up with seq."""
        assert self.local is not None
        start = perf_counter()
        self.synced = self.local.catch_up(seq, self.capacity, self.synced)
        catchup = perf_counter() - start
        verdict = self.local.submit(seq, proposal, params, rng).result()
        verdict.verify_seconds += catchup
        self.synced = len(seq) + verdict.accepted
        return verdict

    def truncate(self, length: int) -> None:
        if self.local is not None and self.synced >= 0:
            self.synced = min(self.synced, length)
            self.local.truncate(length)

    def close(self) -> None:
        if self.remote.connected:
            self.remote.close()
