"""Split decoding's failover, device side: what the device knows of its server session
and the local verifier it falls back on.

`RemoteState`: the server's capacity for this generation (from the limits the server
announced at START), whether the server can go no further (`done`: the rest is local, or
the generation stops with finish_reason "server_context"), and a round that is late and
still awaited (its answer is taken only if it continues what the device committed since).
`Fallback`: the bundle's `full` graph, verifying rounds locally when the server cannot,
with probes of the server at growing intervals (`resync` rebuilds the server's session
from the committed tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from time import monotonic, perf_counter

import numpy as np

from edgespec.runtime.policies import DraftLengthPolicy
from edgespec.runtime.sampling import SamplingParams
from edgespec.runtime.speculative import Drafter, speculative_round
from edgespec.runtime.stats import RoundStats
from edgespec.runtime.target import Target
from edgespec.serve.client import Exchange, LinkError, Remote, ServerLimit, SplitError


@dataclass
class RemoteState:
    """What the device knows of its server session: the server's capacity for it (from
    the limits announced at START), whether the server can go no further (`done`), and a
    round that is late (`late`: (base, drafts) sent) and still awaited."""

    capacity: int  # the device's own
    server_capacity: int = 0
    done: bool = False
    late: tuple[int, list[int]] | None = None

    def started(self, remote: Remote, length: int) -> None:
        limit = remote.limits.max_context if remote.limits else self.capacity
        self.server_capacity = max(min(self.capacity, limit), length + 1)

    def room(self, length: int) -> int:
        """Positions a round after `length` tokens may add on the server (< 0: none)."""
        return self.server_capacity - length

    def give_up(self, remote: Remote, fallback: Fallback, error: Exception | None) -> None:
        """The server cannot hold this generation any further: the rest is local."""
        self.done, self.late = True, None
        remote.end()
        remote.drop()
        if fallback.target is not None:
            fallback.next_retry = None
            fallback.last_error = str(error) if error else "the server's context is full"

    def wait(self, remote: Remote, seq: list[int]) -> tuple[list[int], RoundStats] | None:
        """No local verifier: wait for the late round up to the timeout."""
        try:
            return _take(remote.receive(), remote.sent_drafts, len(seq))
        except LinkError:
            return None

    def settle(
        self, remote: Remote, seq: list[int], params: SamplingParams, fallback: Fallback
    ) -> tuple[list[int], RoundStats] | None:
        """A late round's answer, if it came and is still useful (it continues exactly what
        the device committed since: greedy, any consistent answer; sampling, only if nothing
        was committed since). Leaves `late` set while the answer may still come."""
        assert self.late is not None
        base, drafts = self.late
        try:
            waited = perf_counter() - remote.pending[0] if remote.pending else 0.0
            if not remote.answered() and waited <= remote.timeout:
                return None  # still awaited
            x = remote.receive()  # here, or LinkError: past the timeout
        except (LinkError, SplitError) as e:
            self.late = None
            fallback.failed(e, keep_cache=True)  # probe the server again later
            return None
        self.late = None
        n, token = x.result.accepted, x.result.token
        answer = [*drafts[:n], token]
        committed = seq[base:]
        consistent = x.result.length == base + n + 1 and (
            not committed or (params.greedy and answer[: len(committed)] == committed)
        )
        if consistent and len(answer) >= len(committed):
            fallback.recovered()
            if len(answer) == len(committed):
                return None  # in step again; the next round goes to the server
            new, stats = _take(x, drafts, base)
            return new[len(committed) :], stats
        # the server's session no longer matches: rebuild it from the committed tokens
        remote.drop()
        fallback.next_retry = 0.0
        return None


def _take(x: Exchange, drafts: list[int], base: int) -> tuple[list[int], RoundStats]:
    """The tokens and stats of a remote round's answer that came late."""
    n = x.result.accepted
    stats = RoundStats(
        "decode",
        n + 1,
        len(drafts) + 1,
        x.arrived_at - x.sent_at,
        drafted=len(drafts),
        accepted=n,
        verify_seconds=x.result.server_seconds,
    )
    return [*drafts[:n], x.result.token], with_channel(stats, x)


def with_channel(stats: RoundStats, x: Exchange) -> RoundStats:
    stats.verifier = "remote"
    stats.server_seconds = x.result.server_seconds
    stats.network_seconds = x.network_seconds
    stats.bytes_up, stats.bytes_down = x.bytes_up, x.bytes_down
    return stats


def resync(
    remote: Remote,
    seq: list[int],
    capacity: int,
    params: SamplingParams,
    fallback: Fallback,
    link: RemoteState,
) -> tuple[list[int], RoundStats] | None:
    """Reconnect and rebuild the server session from the committed sequence; its answer is
    the next token (a γ = 0 round). On failure: None, and the fallback is told."""
    t0 = perf_counter()
    # right after a failure: the full retries with backoff; later probes: one attempt,
    # bounded by the device's own deadline, so a stalled server costs little per probe
    probe = fallback.next_retry != 0.0
    attempts = 1 if probe else remote.retries + 1
    try:
        x = remote.start(
            seq, capacity, params, attempts, max(1.0, remote.late_after()) if probe else None
        )
    except ServerLimit as e:
        link.give_up(remote, fallback, e)
        return None
    except LinkError as e:
        fallback.failed(e)
        return None
    link.started(remote, len(seq))
    fallback.recovered()
    stats = RoundStats(
        "decode", 1, len(seq), perf_counter() - t0, verify_seconds=x.result.server_seconds
    )
    return [x.result.token], with_channel(stats, x)


@dataclass
class Fallback:
    """The local verifier (the bundle's `full` graph) for when the server cannot answer."""

    target: Target | None
    capacity: int
    retry_after: float = 2.0  # seconds of local decoding before trying the server again
    max_retry_after: float = 60.0
    next_retry: float | None = None  # when to try the server again; None: it is up
    synced: int = -1  # tokens of the sequence the local cache holds (-1: not allocated)
    last_error: str = ""

    def failed(self, error: Exception, keep_cache: bool = False) -> None:
        self.last_error = str(error)
        if self.target is None:
            raise SplitError(
                f"the server stopped answering ({error}) and this bundle has no local "
                "verifier (`full` graph) to continue with: check the server and the link"
            ) from None
        self.next_retry = monotonic() + self.retry_after
        self.retry_after = min(2 * self.retry_after, self.max_retry_after)
        if not keep_cache:  # the local cache must catch up on what the server verified
            self.synced = -1

    def recovered(self) -> None:
        self.next_retry, self.retry_after = None, 2.0

    def retry_due(self) -> bool:
        return self.next_retry is not None and monotonic() >= self.next_retry

    def prefill(
        self, seq: list[int], params: SamplingParams, rng: np.random.Generator, error: Exception
    ) -> tuple[int, RoundStats]:
        from edgespec.runtime.sampling import next_token

        self.failed(error)
        assert self.target is not None
        t0 = perf_counter()
        self.target.reset(self.capacity)
        logits = self.target.forward(np.asarray(seq, np.int64), keep=1)[-1]
        self.synced = len(seq)
        seconds = perf_counter() - t0
        return next_token(logits, params, rng), RoundStats(
            "prefill", 1, len(seq), seconds, verify_seconds=seconds
        )

    def round(
        self,
        drafter: Drafter,
        policy: DraftLengthPolicy,
        seq: list[int],
        max_len: int,
        params: SamplingParams,
        rng: np.random.Generator,
    ) -> tuple[list[int], RoundStats]:
        """One local speculative round (after catching the local cache up with seq)."""
        assert self.target is not None
        t0 = perf_counter()
        if self.synced < 0:
            self.target.reset(self.capacity)
            self.synced = 0
        if self.synced < len(seq) - 1:
            self.target.forward(np.asarray(seq[self.synced : len(seq) - 1], np.int64), keep=0)
        catchup = perf_counter() - t0
        new, stats = speculative_round(self.target, drafter, policy, seq, max_len, params, rng)
        self.synced = len(seq) + len(new) - 1
        stats.seconds += catchup
        stats.catchup_seconds += catchup
        stats.verifier = "local"
        return new, stats
