"""Server streaming for split sessions: the server decodes on its own and streams the tokens.

A device that finds streaming faster than drafting (a lone device on a slow link, a weak
device) sends STREAM; its session then decodes with the server's best mode for the bundle
(the OpenAI endpoints' mode: a draft model, early exit or lookup on the server, `auto` γ),
with the one decode loop (`runtime.decode.decode_rounds`) the endpoints use: the
drafter runs on a thread of its own and every verify round is posted to the server's worker,
so streamed rounds share batched forwards with the split sessions' VERIFY rounds and each
other's. Each round's tokens go out at once as TOKENS; the last is marked FINAL (its `most`
reached, an end-of-text token (the round's tokens after it are dropped, as a local
generation drops them), the session's context full, or a STOP from the device, seen after
the round that runs when it arrives). The session's committed tokens
(`ServerSession.seq`) grow with every round exactly as the TOKENS say, so after the FINAL
one device and server hold the same sequence and VERIFY rounds may follow.

`Streams` bounds how many sessions stream at once (`--max-streams`, 0: verify only): beyond
that a STREAM gets ERROR 429 and the device drafts itself, so the server's capacity goes to
split devices, whose rounds cost it no drafting. While the server is busy (`Streams.busy`:
`--stream-below` sessions open) it refuses new streams and sheds running ones: a stream's
next round goes out FINAL and SHED, and its device takes decoding back from that token.
`Streams.offer()` is what START's answer tells a device: the tokens/s a stream ran at
lately (an EWMA over streamed rounds, each round's tokens over its wall time: queueing
behind other sessions' rounds included) and how many streams it would start now. Drafters
and policies (each with its own small cache) are kept between streams, one per running
stream at most.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from time import perf_counter

import numpy as np

from edgespec import protocol as P
from edgespec.runtime.decode import Budget, decode_rounds
from edgespec.runtime.registry import Decoder, build
from edgespec.serve.pool_verifier import PoolVerifier
from edgespec.serve.session import ServerSession

log = logging.getLogger("edgespec.serve")


@dataclass
class Stream:
    """One session's running stream (its thread) and the device's STOP."""

    thread: threading.Thread
    stop: threading.Event = field(default_factory=threading.Event)


class Streams:
    """How many sessions stream at once, and the drafters they decode with."""

    RATE_DECAY = 0.2  # EWMA weight of a streamed round in the advertised tokens/s

    def __init__(self, limit: int, new_decoder: Callable[[], Decoder] | None) -> None:
        self.limit, self.new_decoder = limit, new_decoder
        self.running = 0
        self.refused = 0
        self.shed = 0
        self.tokens = 0
        self.rate = 0.0  # tokens/s of one stream lately (0: none measured)
        self.busy: Callable[[], bool] = lambda: False
        self.free: list[Decoder] = []
        self.lock = threading.Lock()

    @classmethod
    def for_model(cls, limit: int, model) -> Streams:
        """Drafters like the OpenAI endpoints' model's (`serve.chat_engine.load_model`)."""
        return cls(limit, lambda: build(model.graphs, model.config))

    def refusal(self) -> str | None:
        """Why a new stream cannot start now (None: it can)."""
        if self.new_decoder is None or self.limit == 0:
            return "verify only: this server does not stream (--max-streams 0)"
        if self.running >= self.limit:
            return (
                f"verify only: the server streams {self.limit} sessions at once; draft on "
                "the device (split rounds) and ask again later"
            )
        if self.busy():
            return "verify only: the server is busy; draft on the device and ask again later"
        return None

    def offer(self) -> tuple[float, int]:
        """(tokens/s a stream ran at lately, streams it would start now)."""
        room = 0 if self.refusal() is not None else self.limit - self.running
        return self.rate, room

    def observe(self, tokens: int, seconds: float) -> None:
        """One streamed round: its tokens over its wall time."""
        if seconds > 0:
            now = tokens / seconds
            self.rate = now if self.rate == 0 else self.rate + self.RATE_DECAY * (now - self.rate)

    def take(self) -> Decoder:
        with self.lock:
            self.running += 1
            if self.free:
                return self.free.pop()
        assert self.new_decoder is not None
        return self.new_decoder()

    def give_back(self, decoder: Decoder) -> None:
        with self.lock:
            self.running -= 1
            self.free.append(decoder)

    def report(self) -> dict[str, int]:
        return {"streams": self.running, "streams_refused": self.refused,
                "streams_shed": self.shed, "tokens": self.tokens}  # fmt: skip


def run_stream(
    verifier: PoolVerifier,
    decoder: Decoder,
    session: ServerSession,
    most: int,
    stop_ids: frozenset[int],
    stop: threading.Event,
    send: Callable[[P.Tokens], bool],
    streams: Streams | None = None,
) -> int:
    """Decode after `session.seq` until `most` tokens, an end of text, the session's context,
    `stop` or `streams` busy (shed), sending each round's tokens (`send` returns False when
    the device is gone). Runs on a thread of its own; the rounds are the one decode loop's
    (`runtime.decode.decode_rounds`), every verify a round on the worker. Returns the tokens
    streamed."""
    params = session.params
    rng = np.random.default_rng(None if params.seed is None else [params.seed, 0x57E4])
    seq = list(session.seq)
    decoder.drafter.begin(seq[:-1], session.capacity)  # a drafter feeds the last token itself
    budget = Budget(most, stop_ids, session.capacity)
    steps = decode_rounds(verifier, decoder.drafter, decoder.policy, seq, params, rng, budget)
    produced, t0 = 0, perf_counter()
    try:
        for step in steps:
            seq += step.tokens
            produced += len(step.tokens)
            if step.finish_reason == "eos" and len(session.seq) > len(seq):
                verifier.keep(len(seq))  # the round's tokens after its stop id are not sent
            if seq != session.seq:  # the worker's session moved on its own: never send that
                raise RuntimeError("a streamed session changed outside its stream")
            final = step.finish_reason is not None or stop.is_set()
            shed = not final and streams is not None and streams.busy()
            seconds = perf_counter() - t0
            if streams is not None:
                streams.observe(len(step.tokens), seconds)
                streams.shed += shed
            if not send(P.Tokens(step.tokens, len(seq), seconds, final, shed)) or final or shed:
                return produced
            t0 = perf_counter()
    finally:
        steps.close()
    raise RuntimeError("the stream ended without a round")  # start_stream checks for room


def start_stream(
    streams: Streams,
    verifier: PoolVerifier,
    session: ServerSession,
    msg: P.Stream,
    stop_ids: frozenset[int],
    send: Callable[[P.Tokens], bool],
    on_error: Callable[[Exception], None],
) -> Stream:
    """Check a STREAM against the session, then start its thread; ProtocolError if it
    cannot run (ERROR 429 when the server streams no more sessions now)."""
    if session.slot is None:
        raise P.ProtocolError("STREAM before START: start the session first")
    if msg.base != len(session.seq):
        raise P.ProtocolError(
            f"STREAM after {msg.base} tokens, but this session holds {len(session.seq)}: "
            "the device and the server are out of step; START with the committed tokens",
            P.OUT_OF_SYNC,
        )
    if session.constraint is not None:  # its drafter would not follow the grammar
        streams.refused += 1
        raise P.ProtocolError(
            "verify only: a session with a grammar is not streamed; draft on the device", P.BUSY
        )
    if msg.most < 1:
        raise P.ProtocolError("STREAM of 0 tokens: ask for at least one", P.BAD_REQUEST)
    if len(session.seq) - 1 >= session.capacity:
        raise P.ProtocolError(
            f"STREAM after {len(session.seq)} tokens: the session's context is full "
            f"({session.capacity} positions); START a new session to continue",
            P.BAD_REQUEST,
        )
    reason = streams.refusal()
    if reason is not None:
        streams.refused += 1
        raise P.ProtocolError(reason, P.BUSY)
    decoder = streams.take()
    stop = threading.Event()

    def body() -> None:
        try:
            streams.tokens += run_stream(
                verifier, decoder, session, msg.most, stop_ids, stop, send, streams
            )
        except Exception as e:  # this session's problem only
            if session.slot is not None:
                log.exception("a stream failed")
                on_error(e)
        finally:
            streams.give_back(decoder)

    thread = threading.Thread(target=body, name="edgespec-stream", daemon=True)
    out = Stream(thread, stop)
    thread.start()
    return out
