"""Split decoding, device side: draft here, verify on a server, never emit unverified tokens.

`split_decode` is `runtime.decode.decode` with the verifier across a network. One round:
  1. draft    take the tokens drafted while the last round was in flight, top up to γ
  2. send     VERIFY(base, drafts[, q rows]) to the server
  3. ahead    while the answer is in flight, keep drafting as if every draft were accepted
              (PEARL / SpecEdge style): d_{γ+1} guesses the server's next token
  4. accept   the server answers (accepted n, next token t); tokens = d_1..d_n, t
  5. keep     if n = γ and t = d_{γ+1}, the tokens drafted ahead after it are next round's
              drafts; otherwise they are thrown away and the drafter's cache truncated
  6. observe  the policy learns from the round, channel fields included
Faults: a round that is not answered within the timeout, a dropped connection or a server
that went away make the device reconnect (backoff, re-sending the committed sequence so the
server rebuilds its cache); if that fails and the bundle has a local verifier (`full`), the
generation goes on locally (RoundStats.verifier = "local") and the server is tried again
now and then; without one, a `SplitError` says so. Tokens are emitted only once verified.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from time import monotonic, perf_counter

import numpy as np

from edgespec.runtime.decode import _cut_at_stop, finish_reason
from edgespec.runtime.drafters import LookupDrafter
from edgespec.runtime.graph import GraphSession
from edgespec.runtime.kv_cache import KVCache
from edgespec.runtime.policies import DraftLengthPolicy
from edgespec.runtime.sampling import SamplingParams
from edgespec.runtime.speculative import Drafter, speculative_round
from edgespec.runtime.stats import RoundStats, Step
from edgespec.runtime.target import Target
from edgespec.serve import protocol as P
from edgespec.serve.client import Exchange, LinkError, Remote, SplitError


@dataclass
class Budget:
    """A policy view for one propose() call: at most `n` tokens, stops as the policy says."""

    policy: DraftLengthPolicy
    n: int

    @property
    def max_length(self) -> int:
        return self.n

    def next_length(self) -> int:
        return self.n

    def keep_drafting(self, drafted: int, confidence: float) -> bool:
        return self.policy.keep_drafting(drafted, confidence)

    def observe(self, stats: RoundStats) -> None:
        pass


@dataclass
class Ahead:
    """Tokens drafted after the committed sequence but not yet sent."""

    tokens: list[int] = field(default_factory=list)
    q: list[np.ndarray] = field(default_factory=list)
    seconds: float = 0.0


class HeadModel:
    """head@k as a stand-alone draft model (its exit logits, its own cache of layers
    0..k-1): the `exit:K` drafter of split mode, where the target lives on the server."""

    def __init__(self, head: GraphSession) -> None:
        self.head = head
        self.cache: KVCache | None = None
        self.max_positions = head.model.max_position_embeddings

    @property
    def length(self) -> int:
        return self.cache.length if self.cache else 0

    def reset(self, capacity: int) -> None:
        if self.cache is not None and self.cache.capacity >= capacity:
            self.cache.truncate(0)
            return
        m = self.head.model
        self.cache = KVCache.allocate(
            self.head.graph.kv_layers, m.num_kv_heads, m.head_dim, capacity, self.head.kv_dtype
        )

    def resume(self, capacity: int, keep: int) -> int:
        """As `Target.resume`: keep the first `keep` positions, with room for `capacity`."""
        if keep <= 0 or self.cache is None or self.cache.length == 0:
            self.reset(capacity)
            return 0
        self.cache.truncate(min(keep, self.cache.length))
        if self.cache.capacity < capacity:
            self.cache = self.cache.grown(capacity)
        return self.cache.length

    def forward(self, ids: np.ndarray, keep: int = 1) -> np.ndarray:
        assert self.cache is not None
        out = self.head.run(self.cache, self.cache.length, input_ids=ids[None, :], keep=keep)
        self.cache.length += len(ids)
        return out["exit_logits"][0]

    def truncate(self, length: int) -> None:
        if self.cache is not None:
            self.cache.truncate(min(length, self.cache.length))


def split_decode(
    remote: Remote,
    local: Target | None,
    drafter: Drafter,
    policy: DraftLengthPolicy,
    prompt: list[int],
    params: SamplingParams,
    max_new_tokens: int,
    stop_ids: frozenset[int],
    max_positions: int,
) -> Iterator[Step]:
    """Yield one Step per round, like `decode`; the verifier is the server while it answers."""
    rng = np.random.default_rng(params.seed)
    capacity = min(len(prompt) + max_new_tokens, max_positions)
    drafter.begin(prompt, capacity)
    fallback = Fallback(local, capacity)
    t0 = perf_counter()
    try:
        first = remote.start(prompt, capacity, params)
        seq = [*prompt, first.result.token]
        stats = _channel(RoundStats("prefill", 1, len(prompt), perf_counter() - t0), first)
    except LinkError as e:
        seq = [*prompt]
        token, stats = fallback.prefill(seq, params, rng, e)
        seq.append(token)
    step, produced, ahead = Step([seq[-1]], stats), 1, Ahead()
    try:
        while True:
            step.finish_reason = finish_reason(
                step.tokens[-1], produced, max_new_tokens, stop_ids, len(seq) - 1, capacity
            )
            yield step
            if step.finish_reason:
                return
            max_len = min(max_new_tokens - produced - 1, capacity - len(seq))
            new, stats = [], None
            if remote.link is not None:
                try:
                    new, stats, ahead = remote_round(
                        remote, drafter, policy, seq, ahead, max_len, params, rng
                    )
                except LinkError:
                    ahead = Ahead()
                    drafter.commit(len(seq) - 1)  # the lost round's drafts are void
                    fallback.next_retry = 0.0  # reconnect at once (with its retries)
            if stats is None and fallback.retry_due():
                new, stats = resync(remote, seq, capacity, params, fallback)
            if stats is None:
                new, stats = fallback.round(drafter, policy, seq, max_len, params, rng)
            new = _cut_at_stop(new, stop_ids)
            seq += new
            produced += len(new)
            step = Step(new, stats)
    finally:
        remote.end()


def remote_round(
    remote: Remote,
    drafter: Drafter,
    policy: DraftLengthPolicy,
    seq: list[int],
    ahead: Ahead,
    max_len: int,
    params: SamplingParams,
    rng: np.random.Generator,
) -> tuple[list[int], RoundStats, Ahead]:
    """One pipelined round verified by the server (see the module docstring)."""
    start = perf_counter()
    # 1. draft: reuse what was drafted while the last round was in flight, top up to γ
    gamma = max(0, min(policy.next_length(), max_len))
    drafts, qs = ahead.tokens[:gamma], ahead.q[:gamma]
    draft_seconds = ahead.seconds * len(drafts) / max(len(ahead.tokens), 1)
    # forget what was drafted ahead beyond γ (a drafter's cache never holds the last token
    # of the sequence it continues: it feeds that token when it drafts)
    drafter.commit(len(seq) + len(drafts) - 1)
    if len(drafts) < gamma:
        proposal = drafter.propose(
            [*seq, *drafts], gamma - len(drafts), Budget(policy, gamma - len(drafts)), params, rng
        )
        drafts, qs = drafts + proposal.tokens, qs + (proposal.q or [])
        draft_seconds += proposal.seconds + proposal.catchup_seconds
    sampled_q = qs if (not params.greedy and len(qs) == len(drafts) and drafts) else None
    # 2. send
    remote.send(P.Verify(len(seq), drafts, sampled_q))
    # 3. draft ahead while the answer is in flight (not for lookup: it is free and its
    #    n-gram index must only ever see committed tokens)
    nxt = Ahead()
    room = min(gamma + 1, max_len - gamma) if not isinstance(drafter, LookupDrafter) else 0
    while gamma and len(nxt.tokens) < room and not remote.answered():
        p = drafter.propose([*seq, *drafts, *nxt.tokens], 1, Budget(policy, 1), params, rng)
        if not p.tokens:
            break
        nxt.tokens += p.tokens
        nxt.q += p.q or []
        nxt.seconds += p.seconds
    # 4. accept: the server's verdict
    x = remote.receive()
    n, token = x.result.accepted, x.result.token
    if n > len(drafts) or x.result.length != len(seq) + n + 1:
        remote.drop()
        raise LinkError(f"the server's answer does not fit the round: {x.result}")
    # 5. keep the tokens drafted ahead only if they follow what was accepted
    if n == len(drafts) and nxt.tokens and nxt.tokens[0] == token:
        kept = Ahead(
            nxt.tokens[1:], nxt.q[1:], nxt.seconds * (len(nxt.tokens) - 1) / len(nxt.tokens)
        )
    else:
        kept = Ahead()
        drafter.commit(len(seq) + n)
    stats = RoundStats(
        "decode",
        n + 1,
        len(drafts) + 1,
        perf_counter() - start,
        drafted=len(drafts),
        accepted=n,
        draft_seconds=draft_seconds,
        verify_seconds=x.result.server_seconds,
    )
    _channel(stats, x)
    # 6. observe
    policy.observe(stats)
    stats.rtt_estimate = getattr(policy, "rtt", None)
    stats.bandwidth_estimate = getattr(policy, "bandwidth", None)
    return [*drafts[:n], token], stats, kept


def _channel(stats: RoundStats, x: Exchange) -> RoundStats:
    stats.verifier = "remote"
    stats.server_seconds = x.result.server_seconds
    stats.network_seconds = x.network_seconds
    stats.bytes_up, stats.bytes_down = x.bytes_up, x.bytes_down
    return stats


def resync(
    remote: Remote, seq: list[int], capacity: int, params: SamplingParams, fallback: Fallback
) -> tuple[list[int], RoundStats | None]:
    """Reconnect and rebuild the server session from the committed sequence; its answer is
    the next token (a γ = 0 round). On failure: no tokens, and the fallback is told."""
    t0 = perf_counter()
    # right after a failure: the full retries with backoff; later probes: one attempt, so a
    # stalled server costs the device one connect timeout per probe
    attempts = remote.retries + 1 if fallback.next_retry == 0.0 else 1
    try:
        x = remote.start(seq, capacity, params, attempts)
    except LinkError as e:
        fallback.failed(e)
        return [], None
    fallback.recovered()
    stats = RoundStats(
        "decode", 1, len(seq), perf_counter() - t0, verify_seconds=x.result.server_seconds
    )
    return [x.result.token], _channel(stats, x)


@dataclass
class Fallback:
    """The local verifier (the bundle's `full` graph) for when the server cannot answer."""

    target: Target | None
    capacity: int
    retry_after: float = 2.0  # seconds of local decoding before trying the server again
    max_retry_after: float = 60.0
    next_retry: float | None = None  # when to try the server again; None: it is up
    synced: int = 0  # tokens of the sequence the local cache holds
    last_error: str = ""

    def failed(self, error: Exception) -> None:
        self.last_error = str(error)
        if self.target is None:
            raise SplitError(
                f"the server stopped answering ({error}) and this bundle has no local "
                "verifier (`full` graph) to continue with: check the server and the link"
            ) from None
        self.next_retry = monotonic() + self.retry_after
        self.retry_after = min(2 * self.retry_after, self.max_retry_after)
        self.synced = -1  # the local cache must catch up on what the server verified

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


def build_split(
    manifest,
    open_graph,
    server: str | None,
    drafter: str | None,
    draft_policy: str | None,
    token: str | None,
    energy_budget: float | None,
    timeout: float,
    local_fallback: bool,
    device_profile: dict | None = None,
) -> tuple[Remote, Target | None, Drafter, DraftLengthPolicy]:
    """What `Model.load(mode="split")` holds: the server session, the local verifier (when
    the bundle has `full` and fallback is on), the drafter and the draft-length policy
    (`device_profile`: the device's energy table for channel-aware)."""
    from urllib.parse import urlsplit

    from edgespec.runtime.drafters import DraftModelDrafter

    if not server:
        raise SplitError("split mode needs a server: server='ws://HOST:PORT' (--server)")
    url = urlsplit(server)
    if url.scheme not in ("ws", "wss") or not url.netloc:
        raise SplitError(f"server {server!r} is not a ws://HOST:PORT or wss://HOST:PORT address")
    if url.path in ("", "/"):
        server = server.rstrip("/") + "/v1/session"
    roles, exits = manifest.roles, manifest.exit_layers
    spec = drafter or ("draft" if "draft" in roles else f"exit:{exits[-1]}" if exits else "lookup")
    chosen: Drafter
    if spec == "draft":
        chosen = DraftModelDrafter(Target([open_graph("draft")]))
    elif spec == "lookup":
        chosen = LookupDrafter()
    elif spec.startswith("exit:") and spec[5:].isdigit():
        if int(spec[5:]) not in exits:
            raise SplitError(f"drafter {spec!r}: this bundle's exit layers are {exits}")
        chosen = DraftModelDrafter(HeadModel(open_graph(f"head@{spec[5:]}")))  # type: ignore[arg-type]
    else:
        raise SplitError(f"drafter {spec!r} is not one of: draft, exit:K, lookup")
    local = Target([open_graph("full")]) if local_fallback and "full" in roles else None
    policy = split_policy(draft_policy, exits, energy_budget, device_profile)
    fingerprint = manifest.backbone_fingerprint
    if manifest.variant == "shared-backbone":
        from edgespec.backbone import hello

        fingerprint = hello(manifest)  # the server checks its target's lower layers against it
    remote = Remote(server, token, fingerprint, timeout=timeout)
    return remote, local, chosen, policy


def split_policy(
    spec: str | None,
    exits: list[int],
    energy_budget: float | None,
    device_profile: dict | None = None,
) -> DraftLengthPolicy:
    """The policy for split rounds: `channel-aware` by default (where it exists, else
    `auto`); an energy budget goes to make_policy or the policy if either takes one; the
    device profile's energy table prices channel-aware rounds."""
    import inspect

    from edgespec.runtime.policies import make_policy

    kwargs = {}
    if energy_budget is not None and "energy_budget" in inspect.signature(make_policy).parameters:
        kwargs["energy_budget"] = energy_budget
    try:
        name = (spec or "channel-aware").partition(":")[0]
        extra = {"device_profile": device_profile} if name == "channel-aware" else {}
        policy = make_policy(spec or "channel-aware", exits, **kwargs, **extra)
    except ValueError as e:
        if spec is not None:
            raise SplitError(str(e)) from None
        policy = make_policy("auto", exits)
    if energy_budget is not None and not kwargs:
        if not hasattr(policy, "energy_budget"):
            raise SplitError(
                "an energy budget needs a policy that honours it: use draft_policy='channel-aware'"
            )
        policy.energy_budget = energy_budget  # type: ignore[attr-defined]
    return policy
