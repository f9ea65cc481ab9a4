"""The OpenAI conversations' verifier: a row of the server's KV pool, verified by its worker.

`PoolVerifier` is a `Verifier` (runtime/round.py) for one conversation slot of the chat
engine. It reserves one row of the server's `KVPool` for as long as the server runs (the
conversation's target cache, kept between requests) and a `ServerSession` over it, so its
rounds are split sessions' rounds in all but transport: posted to the server's `Worker`,
verified by `session.verify_rounds` in the same batched forwards as the split sessions'
rounds and each other's, accepted there with the same rule, and the row truncated to the
accepted prefix there (a failed round leaves it as it was). The target's graphs are the
server's: the OpenAI endpoints hold no copy of their own.

The one decode loop (`runtime/decode.py`) drives it from the engine's request thread:
`prefill` keeps the longest prefix of the prompt the row already holds and prefills the
rest in chunks between other sessions' rounds (as a START does); `submit` posts the round
and returns at once, so a drafter that drafts ahead keeps drafting while it is verified.
Every change to the row runs on the worker thread.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Generator
from dataclasses import dataclass
from time import perf_counter

import numpy as np

from edgespec.protocol import Result, Verify
from edgespec.runtime.graphs.kv_cache import KVPool
from edgespec.runtime.graphs.session import GraphSession
from edgespec.runtime.round import Proposal, Start, Verdict
from edgespec.runtime.sampling import SamplingParams, next_token
from edgespec.runtime.stats import RoundStats
from edgespec.serve.session import ServerSession, acceptance_rng, fill
from edgespec.serve.worker import Worker


@dataclass
class Posted:
    """A round on the worker; its verdict once the worker answers."""

    future: concurrent.futures.Future
    start: float
    drafts: list[int]  # the drafts posted: all of the proposal's

    @property
    def sent(self) -> int:
        return len(self.drafts)

    def done(self) -> bool:
        return self.future.done()

    def result(self) -> Verdict:
        r: Result = self.future.result()
        tokens = [*self.drafts[: r.accepted], r.token]
        return Verdict(r.accepted, tokens, perf_counter() - self.start)


@dataclass
class RowFeatures:
    """A pool row's features as `runtime.drafters.eagle.FeatureSource` (written by the worker)."""

    pool: KVPool
    slot: int

    @property
    def feature_width(self) -> int:
        f = self.pool.features
        return 0 if f is None else f.shape[-1]

    @property
    def features(self) -> np.ndarray:
        assert self.pool.features is not None
        return self.pool.features[self.slot]

    @property
    def length(self) -> int:
        return int(self.pool.lengths[self.slot])


class PoolVerifier:
    def __init__(
        self,
        worker: Worker,
        pool: KVPool,
        stages: list[GraphSession],
        chunk: int = 0,
        budget: float = 0.0,
        session: ServerSession | None = None,
    ) -> None:
        """A conversation's own reserved row; or, with `session`, a split session's row (its
        stream: `serve.streaming`), which the session's connection owns and frees."""
        self.worker, self.pool, self.stages = worker, pool, stages
        self.chunk, self.budget = chunk, budget  # prefill steps, as the server's STARTs
        self.max_positions = pool.capacity
        if session is None:
            slot = pool.reserve()
            session = ServerSession(slot, SamplingParams(), acceptance_rng(None), [], 0)
        self.session = session

    @property
    def slot(self) -> int:
        assert self.session.slot is not None
        return self.session.slot

    def prefill(self, start: Start) -> tuple[int, RoundStats]:
        began, prompt, s = perf_counter(), start.prompt, self.session
        s.params, s.capacity = start.params, start.capacity
        s.rng, s.constraint = acceptance_rng(start.params.seed), start.constraint
        job = (resume, (self.pool, self.stages, s, prompt, start.cached, self.chunk, self.budget))
        kept = self.worker.post("steps", job).result()
        seconds = perf_counter() - began
        stats = RoundStats(
            "prefill", 1, len(prompt) - kept, seconds, verify_seconds=seconds, cached_tokens=kept
        )
        return s.seq[-1], stats

    def max_drafts(self, seq: list[int]) -> int:
        return self.max_positions - len(seq)

    def feature_source(self) -> RowFeatures:
        """The target's features of this conversation's row (a feature head reads them)."""
        return RowFeatures(self.pool, self.slot)

    def submit(
        self, seq: list[int], proposal: Proposal, params: SamplingParams, rng: np.random.Generator
    ) -> Posted:
        if proposal.tail is not None:  # its head's KV would be in a cache that is not the row
            raise ValueError(
                "an early-exit drafter cannot draft into a pool row: draft from head@k alone"
            )
        msg = Verify(len(seq), list(proposal.tokens), proposal.q)
        posted = self.worker.post("round", (self.session, msg))
        return Posted(posted, perf_counter(), list(msg.drafts))

    def keep(self, n: int) -> None:
        """Only the session's first `n` committed tokens remain (its row: their first n - 1
        positions), on the worker: a stream that ends at a stop id drops the tokens its last
        round produced after it, as the device does."""
        self.worker.post("call", (_keep, (self.pool, self.session, n))).result()

    def truncate(self, length: int) -> None:
        pass  # the worker truncated the row to the accepted prefix (or rolled a failed round back)

    def close(self) -> None:
        pass  # the row stays with the conversation slot: the next request may share its prefix


def resume(
    pool: KVPool,
    stages: list[GraphSession],
    session: ServerSession,
    prompt: list[int],
    cached: int,
    chunk: int,
    budget: float,
) -> Generator[int, None, int]:
    """On the worker: keep the first `cached` prompt positions the row holds, prefill the rest
    (at least the last prompt token: its logits give the first token), in steps; the session
    then holds prompt + the first token. Returns the positions kept."""
    assert session.slot is not None
    kept = min(cached, len(prompt) - 1, int(pool.lengths[session.slot]))
    pool.truncate(session.slot, kept)
    session.seq = []  # no round may run on the row until it is filled
    ids = np.asarray(prompt[kept:], np.int64)
    logits = yield from fill(pool, stages, session, ids, chunk, budget)
    if session.constraint is not None:
        logits = session.constraint.mask_rows(logits[None], prompt, [])[0]
    session.seq = [*prompt, next_token(logits, session.params, session.rng)]
    return kept


def _keep(pool: KVPool, session: ServerSession, n: int) -> None:
    assert session.slot is not None
    session.seq = session.seq[:n]
    pool.truncate(session.slot, min(n - 1, int(pool.lengths[session.slot])))
