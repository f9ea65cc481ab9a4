"""One generation on the server: its slot of the KV pool, committed tokens and acceptance rng.

`prefill()` checks a START, then takes a free slot and prefills the prompt (or, after a
reconnect, the client's whole committed sequence) into it alone, in chunks the worker
interleaves with other sessions' rounds, then samples the next token; a START with keep > 0
resumes the connection's session instead: its row is truncated to `keep` positions (a length
change) and only the new ids are prefilled; `verify_rounds()` runs the
rounds of several sessions that arrived together: each is checked, the target scores every
[last, d_1..d_γ] in shared forwards (`batching.forward_rounds`; a token tree alone:
`serve.tree_rounds`), each row's drafts are
accepted with the same rule the device's local verifier uses (`runtime/verify/accept.py`), and
each row is truncated to its accepted prefix in `finally`, so a failing round never leaves a
cache half-advanced. A bad round fails alone: its error goes to its own session, and if a
shared forward fails, the rounds are retried one by one so only the culprit fails.
`release()` gives the slot back. Plain functions; the worker thread calls them all.
"""

from __future__ import annotations

from collections.abc import Container, Generator
from dataclasses import dataclass, field
from time import perf_counter

import numpy as np

from edgespec.protocol import (
    BAD_REQUEST,
    GONE,
    OUT_OF_SYNC,
    UNAVAILABLE,
    ProtocolError,
    Result,
    Start,
    Verify,
)
from edgespec.runtime.grammar.constraints import Constraint
from edgespec.runtime.graphs.kv_cache import KVPool
from edgespec.runtime.graphs.session import GraphSession
from edgespec.runtime.sampling import SamplingParams, next_token
from edgespec.runtime.verify.accept import accept
from edgespec.serve.batching import forward_alone, forward_rounds
from edgespec.serve.tree_rounds import TreeStages, verify_tree

MIN_CHUNK = 16  # positions: smaller prefill chunks cost more in per-forward overhead


class CannotResume(ProtocolError):
    """A START that resumes a session the connection does not hold (410), or keeps more
    positions than its cache holds (409): answered, the connection stays open and the session
    as it was, and the device starts afresh."""


@dataclass
class ServerSession:
    slot: int | None  # its row of the pool; None once released
    params: SamplingParams
    rng: np.random.Generator
    seq: list[int]  # committed tokens; the cache holds all but the last
    capacity: int
    rounds: int = 0
    # the grammar the output follows (the OpenAI endpoints' response_format): every row this
    # session's rounds are accepted on is masked by it
    constraint: Constraint | None = None


@dataclass
class BatchStats:
    """What the worker ran: rounds per batch and rounds per forward (histograms), and how
    the OpenAI conversations' rounds (rows the pool reserved) shared forwards."""

    batches: dict[int, int] = field(default_factory=dict)
    forwards: dict[int, int] = field(default_factory=dict)
    openai_rounds: int = 0
    openai_rounds_shared: int = 0  # of those: in a forward with other rounds
    mixed_forwards: int = 0  # forwards that ran OpenAI and split sessions' rounds together
    tree_rounds: int = 0  # token-tree rounds (each its own forward: `serve.tree_rounds`)

    def add(self, rounds: int, forwards: list[list[int]], openai: Container[int] = ()) -> None:
        self.batches[rounds] = self.batches.get(rounds, 0) + 1
        for slots in forwards:
            n, mine = len(slots), sum(s in openai for s in slots)
            self.forwards[n] = self.forwards.get(n, 0) + 1
            self.openai_rounds += mine
            self.openai_rounds_shared += mine if n > 1 else 0
            self.mixed_forwards += 0 < mine < n

    def report(self) -> dict:
        rounds = sum(k * v for k, v in self.batches.items())
        served = sum(k * v for k, v in self.forwards.items())
        return {
            "batches": {str(k): v for k, v in sorted(self.batches.items())},
            "rounds_per_forward": {str(k): v for k, v in sorted(self.forwards.items())},
            "mean_batch": rounds / max(sum(self.batches.values()), 1),
            "mean_rounds_per_forward": served / max(sum(self.forwards.values()), 1),
            "largest_batch": max(self.batches, default=0),
            "openai_rounds": self.openai_rounds,
            "openai_rounds_shared": self.openai_rounds_shared,
            "mixed_forwards": self.mixed_forwards,
            "tree_rounds": self.tree_rounds,
        }


def prefill(
    pool: KVPool,
    stages: list[GraphSession],
    msg: Start,
    max_context: int,
    held: list[ServerSession] | None = None,
    chunk: int = 0,
    budget: float = 0.0,
    resume: ServerSession | None = None,
    constraint: Constraint | None = None,
) -> Generator[int, None, tuple[ServerSession, Result]]:
    """A new session for msg.ids, with the first token after them, as steps: each `next()`
    prefills at most `chunk` positions (0: all at once) and yields how many it did, so the
    worker can run other sessions' rounds between chunks; with a `budget` (seconds), each
    chunk is sized from the last one's speed to take about that long (at least MIN_CHUNK
    positions): a round waiting behind a chunk waits about `budget`, whatever the model.
    With msg.keep > 0 the session is `resume` (the connection's), cut to its first keep
    positions and continued with msg.ids; CannotResume if it cannot be. `constraint`: the
    START's grammar, built by the caller; it masks the first token and every round after.
    The generator returns (session, first Result). Everything that can refuse the request
    is built before the slot is taken; the session is appended to `held` as soon as it owns
    one (so a handler that is gone by the time it ends can free it), and the slot is freed
    if any step fails or the generator is closed early."""
    t0 = perf_counter()
    total = msg.keep + len(msg.ids)
    if not msg.ids:
        raise ProtocolError("START carries no token ids: send the prompt's ids", BAD_REQUEST)
    if total >= max_context:
        raise ProtocolError(
            f"the sequence is {total} tokens but this server's context is {max_context}: "
            f"send at most {max_context - 1}",
            BAD_REQUEST,
        )
    try:
        params = SamplingParams(msg.temperature, msg.top_p, msg.top_k, msg.seed)
        rng = acceptance_rng(msg.seed)
    except (ValueError, TypeError) as e:
        raise ProtocolError(f"START: {e}", BAD_REQUEST) from None
    # room for the prompt and the requested new tokens, within what the server allows
    capacity = max(min(msg.capacity, max_context), total + 1)
    ids = np.asarray(msg.ids, np.int64)
    if msg.keep:
        session = _resumable(pool, resume, msg.keep)
        slot = session.slot
        assert slot is not None
        pool.truncate(slot, msg.keep)
        session.seq = [*session.seq[: msg.keep], *msg.ids]
        session.params, session.rng, session.capacity = params, rng, capacity
    else:
        slot = pool.acquire()
        if slot is None:
            raise ProtocolError(
                "the server is full (no free KV slot): try again later", UNAVAILABLE
            )
        session = ServerSession(slot, params, rng, [*msg.ids], capacity)
        if held is not None:
            held.append(session)
    session.constraint = constraint
    try:
        logits = yield from fill(pool, stages, session, ids, chunk, budget)
        if constraint is not None:
            logits = constraint.mask_rows(logits[None], session.seq, [])[0]
        session.seq.append(next_token(logits, params, rng))
    except BaseException:  # GeneratorExit included: a prefill cut short frees its slot
        release(pool, session)
        raise
    seconds = perf_counter() - t0
    return session, Result(0, session.seq[-1], len(session.seq), seconds)


def _resumable(pool: KVPool, s: ServerSession | None, keep: int) -> ServerSession:
    """The connection's session, if its cache holds at least `keep` positions."""
    if s is None or s.slot is None:
        raise CannotResume(
            f"START keep={keep}: this connection holds no session to resume (none started "
            "on it, ended, evicted or timed out): START with keep 0 and the whole sequence",
            GONE,
        )
    cached = int(pool.lengths[s.slot])
    if keep > cached:
        raise CannotResume(
            f"START keep={keep}: this session's cache holds {cached} positions: START with "
            "keep 0 and the whole sequence",
            OUT_OF_SYNC,
        )
    return s


def acceptance_rng(seed: int | None) -> np.random.Generator:
    """The acceptance draws of a session: a stream of its own. Seeded like the device's, its
    uniforms would equal the ones that sampled the drafts, and the two would be correlated
    (a biased output)."""
    return np.random.default_rng(None if seed is None else [seed, 0x5E4E4])


def fill(
    pool: KVPool,
    stages: list[GraphSession],
    session: ServerSession,
    ids: np.ndarray,
    chunk: int,
    budget: float,
) -> Generator[int, None, np.ndarray]:
    """Append `ids` (at least one) to the session's row in steps of at most `chunk`
    positions sized to take about `budget` seconds (see `prefill`), yielding each step's
    count; returns the last position's logits."""
    step = chunk if chunk > 0 else len(ids)
    if budget > 0 and chunk > 0:
        step = min(step, MIN_CHUNK)  # the first chunk measures this model's speed
    lo = 0
    while True:
        if session.slot is None:  # released between chunks: the device went away
            raise ProtocolError("the session was closed during its prefill", BAD_REQUEST)
        t = perf_counter()
        part = ids[lo : lo + step]
        logits = forward_alone(stages, pool, session.slot, part)
        lo += len(part)
        took = perf_counter() - t
        if budget > 0 and chunk > 0 and took > 0:  # attention grows with the position
            step = int(min(chunk, max(MIN_CHUNK, len(part) * budget / took)))
        yield len(part)
        if lo >= len(ids):
            return logits[-1]


def start(
    pool: KVPool,
    stages: list[GraphSession],
    msg: Start,
    max_context: int,
    held: list[ServerSession] | None = None,
) -> tuple[ServerSession, Result]:
    """`prefill` in one step (benchmarks and tests that need no interleaving)."""
    steps = prefill(pool, stages, msg, max_context, held)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def release(pool: KVPool, s: ServerSession) -> None:
    if s.slot is not None:
        pool.release(s.slot)
        s.slot = None


def release_all(pool: KVPool, held: list[ServerSession]) -> None:
    """Free every slot in `held` (run on the worker, after the jobs queued before it)."""
    for s in held:
        release(pool, s)
    held.clear()


def check(s: ServerSession, msg: Verify) -> np.ndarray:
    """The ids this round feeds: [last committed, drafts...]; a round that cannot run raises."""
    base, g = len(s.seq), len(msg.drafts)
    if s.slot is None:
        raise ProtocolError("this session was closed: START again", BAD_REQUEST)
    if msg.base != base:
        raise ProtocolError(
            f"VERIFY after {msg.base} tokens, but this session holds {base}: the device and "
            "the server are out of step; start a new session (START with the committed tokens)",
            OUT_OF_SYNC,
        )
    if base + g > s.capacity:
        raise ProtocolError(
            f"this round would fill {base + g} positions, beyond the session's context of "
            f"{s.capacity}: draft fewer tokens or start with a larger capacity",
            BAD_REQUEST,
        )
    return np.asarray([s.seq[-1], *msg.drafts], np.int64)


Outcome = tuple[Result | None, Exception | None]


def verify_rounds(
    pool: KVPool,
    stages: list[GraphSession],
    rounds: list[tuple[ServerSession, Verify]],
    stats: BatchStats | None = None,
    tree_stages: TreeStages | None = None,
) -> list[Outcome]:
    """One outcome per round (a Result, or the error for that round's session only); a
    token tree's round runs alone on the graphs `tree_stages()` opens (None: the bundle
    has none, it is refused)."""
    t0 = perf_counter()
    out: list[Outcome] = [(None, None)] * len(rounds)
    ready: list[int] = []
    seen: set[int] = set()
    for k, (s, msg) in enumerate(rounds):
        try:
            check(s, msg)
            if s.slot in seen:  # a session has one round in flight; never two rows the same
                raise ProtocolError("two rounds of one session at once: wait for the answer")
            seen.add(s.slot)  # type: ignore[arg-type]
            if msg.parents is None:
                ready.append(k)
                continue
            out[k] = (verify_tree(pool, tree_stages, s, msg, t0), None)
            if stats is not None:
                stats.tree_rounds += 1
        except Exception as e:  # this round's session only
            out[k] = (None, e)
    groups = [ready] if ready else []
    while groups:
        group = groups.pop()
        try:
            logits = _forward(pool, stages, [rounds[k] for k in group], stats)
        except Exception as e:
            if len(group) == 1:
                out[group[0]] = (None, e)
            else:  # find the culprit: every round alone
                groups += [[k] for k in group]
            continue
        for k, row in zip(group, logits, strict=True):
            try:
                out[k] = (_accept(pool, *rounds[k], row, t0), None)
            except Exception as e:
                out[k] = (None, e)
    return out


def _forward(
    pool: KVPool,
    stages: list[GraphSession],
    rounds: list[tuple[ServerSession, Verify]],
    stats: BatchStats | None,
) -> list[np.ndarray]:
    """The logits of each round's ids; on failure every row is back at its length before."""
    work = [(s.slot, check(s, msg)) for s, msg in rounds]
    done = False
    try:
        logits, forwards = forward_rounds(stages, pool, work)  # type: ignore[arg-type]
        done = True
    finally:
        if not done:
            for s, _ in rounds:
                pool.truncate(s.slot, len(s.seq) - 1)  # type: ignore[arg-type]
    if stats is not None:
        stats.add(len(rounds), forwards, pool.reserved)
    return logits


def _accept(pool: KVPool, s: ServerSession, msg: Verify, logits: np.ndarray, t0: float) -> Result:
    """Accept a prefix of msg.drafts, append it and the target's next token."""
    base = len(s.seq)
    valid = base - 1  # what stays valid in the cache if acceptance raises
    try:
        if s.constraint is not None:
            logits = s.constraint.mask_rows(logits, s.seq, msg.drafts)
        n, token = accept(msg.drafts, msg.q, logits, s.params, s.rng)
        valid = base + n
    finally:
        assert s.slot is not None
        pool.truncate(s.slot, valid)
    s.seq += [*msg.drafts[:n], token]
    s.rounds += 1
    return Result(n, token, len(s.seq), perf_counter() - t0)
