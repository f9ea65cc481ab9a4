"""The device's side of server streaming: the server decodes on its own, the device listens.

A round the policy places on the server ("stream", `Plan.where`) sends STREAM once (the
committed length and how many tokens the generation may still take); the server then
decodes with its own best mode and sends each of its rounds' tokens as TOKENS, with no
round trip between them. Every decode-loop round takes what has arrived (at least one TOKENS
message) as one verdict: `Verdict.tokens` holds the server's tokens (those before the last:
`Verdict.streamed`). While it waits for the next TOKENS, the device feeds the streamed
tokens to its own `full` graph in chunks (`FallbackVerifier.follow`), so it can take
decoding back at any token: a round placed elsewhere sends STOP and reads to the FINAL
TOKENS (every token the server decoded before it is committed: both sides then hold the same
sequence), then VERIFY rounds or local rounds go on. A server that gets busy sheds the
stream: its last TOKENS are FINAL and SHED, the round says so (`ChannelStats.server_busy`)
and the next round is placed elsewhere, from the token after them. A STREAM refused with
ERROR 429 ("verify only") is answered by a plain split round instead and says so
(`ChannelStats.server_busy`); a link that fails mid-stream is a failed round like any other:
reconnect and resync, or decode locally.

Owned lengths: `ServerStream.length` is the server session's committed length as the TOKENS
said (their `length` must equal it plus their ids, else the link is dropped); the decode
loop's `seq` catches up with it as each round's verdict is committed.
"""

from __future__ import annotations

from time import perf_counter

from edgespec import protocol as P
from edgespec.runtime.errors import LinkError, SplitError
from edgespec.runtime.split.session import Remote
from edgespec.runtime.split.websocket import Arrival
from edgespec.runtime.stats import ChannelStats


class StreamsFull(SplitError):
    """The server streams no more sessions now ("verify only"): draft on the device."""


class ServerStream:
    """One stream on `session`'s link: open (STREAM), read (TOKENS), stop (STOP)."""

    def __init__(self, session: Remote) -> None:
        self.session = session
        self.active = False  # STREAM sent, its FINAL TOKENS not read yet
        self.stopping = False  # STOP sent
        self.length = 0
        self.bytes_up = 0  # not yet counted in a round's stats
        self.early: Arrival | None = None
        self.shed = False  # the last FINAL TOKENS: the server got busy and handed it back

    def open(self, base: int, most: int) -> None:
        r = self.session
        if r.link is None:
            raise LinkError("no link to stream on")
        r.round += 1
        _, self.bytes_up = r.link.send(P.Stream(base, most, round=r.round))
        self.active, self.stopping, self.length, self.early = True, False, base, None
        self.shed = False

    def stop(self) -> None:
        if self.active and not self.stopping and self.session.link is not None:
            _, up = self.session.link.send(P.Stop())
            self.bytes_up += up
            self.stopping = True

    def reset(self) -> None:
        self.active = self.stopping = False
        self.early = None

    def ready(self) -> bool:
        """Whether a message waits (never blocks)."""
        if self.early is None and self.session.link is not None:
            self.early = self.session.link.poll(0)
        return self.early is not None

    def _next(self, wait: float) -> Arrival:
        arrival, self.early = self.early, None
        link = self.session.link
        if arrival is None and link is not None:
            arrival = link.poll(wait)
        if arrival is None:
            self.session.drop()
            self.reset()
            raise LinkError(f"the stream sent nothing for {wait:g}s")
        return arrival

    def read(self, until_final: bool, idle=None) -> tuple[list[int], ChannelStats]:
        """The tokens that arrived (at least one message's; `until_final`: up to the FINAL
        one), and the channel as they saw it. `idle()` runs while nothing has arrived (it
        returns False when it has nothing left to do)."""
        start = perf_counter()
        ids: list[int] = []
        down, server = 0, 0.0
        while True:
            while not ids and idle is not None and not self.ready() and idle():
                pass
            if ids and not until_final and not self.ready():
                break
            arrival = self._next(self.session.timeout)
            msg = arrival.message
            if isinstance(msg, P.Error):
                self.reset()
                if msg.code == P.BUSY:
                    raise StreamsFull(f"server: {msg.text}")
                self.session.drop()
                raise LinkError(f"server: {msg.text}")
            if not isinstance(msg, P.Tokens) or msg.length != self.length + len(msg.ids):
                self.session.drop()
                self.reset()
                raise LinkError(f"the server's stream does not follow the session: {msg!r}")
            self.length = msg.length
            held = self.session.held
            self.session.held = [*held, *msg.ids] if held is not None else None
            ids += msg.ids
            down += arrival.size
            server += msg.server_seconds
            if msg.final:
                self.reset()
                self.shed = msg.shed
                break
        wall = perf_counter() - start
        up, self.bytes_up = self.bytes_up, 0
        return ids, ChannelStats(max(0.0, wall - server), server, up, down)
