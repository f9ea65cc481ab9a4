"""One WebSocket to a split-decoding server (the transport under `runtime/split/session.py`'s
`Remote`).

`Link` wraps websockets' sync client (imported lazily: the runtime does not need it unless a
device splits) with a reader thread that timestamps every answer as it arrives, so the
decode loop can keep drafting while a round is in flight and still measure the round trip
exactly. A close that says the server is full or restarting is a `ServerBusy` (try again
soon), any other failure a `LinkError`.
"""

from __future__ import annotations

import contextlib
import inspect
import queue
import threading
from dataclasses import dataclass
from time import perf_counter

from edgespec import protocol as P
from edgespec.runtime.errors import LinkError, ServerBusy, SplitError

BUSY_CLOSE_CODES = (1012, 1013)  # service restart (a replica draining), try again later (full)


def _connect_fn():
    try:
        from websockets.sync.client import connect
    except ImportError:
        raise SplitError(
            "split mode needs `pip install edgespec[serve]` (the websockets package is missing)"
        ) from None
    return connect


def frame_bytes(payload: int, masked: bool) -> int:
    """Bytes a WebSocket frame of `payload` bytes takes on the wire (TCP/IP not counted)."""
    header = 2 + (2 if payload >= 126 else 0) + (6 if payload >= 1 << 16 else 0)
    return payload + header + (4 if masked else 0)


@dataclass
class Arrival:
    at: float  # perf_counter() when the reader thread got it
    message: P.Message
    size: int  # bytes on the wire


class Link:
    """One WebSocket to the server's /v1/session."""

    def __init__(self, url: str, token: str | None, open_timeout: float) -> None:
        connect = _connect_fn()
        from websockets.exceptions import InvalidStatus

        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # websockets >= 17 wants a context manager unless told we hold the connection
        extra = {"legacy": True} if "legacy" in inspect.signature(connect).parameters else {}
        try:
            self.ws = connect(
                url,
                additional_headers=headers,
                open_timeout=open_timeout,
                close_timeout=0.5,  # closing a dead link must not stall the device
                ping_interval=None,  # rounds and their timeouts are the liveness check
                compression=None,  # token ids barely compress; keep byte counts honest
                proxy=None,
                max_size=1 << 24,
                # ask for the limits in START's answer, with the trees offer where the
                # server knows it (one that does not picks the plain limits)
                subprotocols=[P.TREES, P.SUBPROTOCOL],
                **extra,
            )
        except InvalidStatus as e:
            status = e.response.status_code
            if status == 401:
                raise SplitError(
                    f"the server at {url} refused the bearer token (HTTP 401): pass the "
                    "server's token (token=..., --token-file FILE)"
                ) from None
            kind = ServerBusy if status == 503 else LinkError
            raise kind(f"the server at {url} answered HTTP {status}") from None
        except Exception as e:  # refused, unreachable, handshake timed out or failed
            raise LinkError(f"cannot connect to {url}: {e}") from None
        self.inbox: queue.SimpleQueue[Arrival | Exception] = queue.SimpleQueue()
        self.reader = threading.Thread(target=self._read, daemon=True, name="edgespec-link")
        self.reader.start()

    def _read(self) -> None:
        from websockets.exceptions import ConnectionClosedOK

        try:
            while True:
                try:
                    data = self.ws.recv()
                except ConnectionClosedOK:
                    break
                at = perf_counter()
                size = len(data)
                try:
                    # a server sends RESULT (PATH), ERROR and TOKENS only; decoding anything
                    # else (a VERIFY's vocabulary-sized q rows) would let a hostile server cost
                    # memory and time
                    if isinstance(data, bytes) and len(data) >= P.HEADER.size:
                        kind = P.HEADER.unpack_from(data)[2]
                        if kind not in (P.RESULT, P.PATH, P.ERROR, P.TOKENS):
                            raise P.ProtocolError(f"message type {kind} is not an answer")
                    msg = P.decode(data)
                except P.ProtocolError as e:
                    self.inbox.put(LinkError(f"the server sent a malformed message: {e}"))
                    return
                self.inbox.put(Arrival(at, msg, frame_bytes(size, masked=False)))
            closed = f"the server closed the connection ({self._close_reason()})"
            self.inbox.put(self._failure(closed))
        except Exception as e:  # connection reset, closed abnormally
            self.inbox.put(self._failure(f"the connection broke: {e}"))

    def _failure(self, text: str) -> LinkError:
        """The link's failure; ServerBusy when the server closed it as full or restarting."""
        rcvd = getattr(self.ws.protocol, "close_rcvd", None)
        return (ServerBusy if rcvd and rcvd.code in BUSY_CLOSE_CODES else LinkError)(text)

    def _close_reason(self) -> str:
        rcvd = getattr(self.ws.protocol, "close_rcvd", None)
        return f"code {rcvd.code}: {rcvd.reason}" if rcvd else "no close frame"

    def send(self, msg: P.Message) -> tuple[float, int]:
        """(send time, bytes on the wire)."""
        data = P.encode(msg)
        t = perf_counter()
        try:
            self.ws.send(data)
        except Exception as e:
            raise self._failure(f"sending failed: {e}") from None
        return t, frame_bytes(len(data), masked=True)

    def poll(self, timeout: float | None) -> Arrival | None:
        """The next answer; None if none came within timeout (0: do not wait)."""
        try:
            item = self.inbox.get(timeout=timeout) if timeout else self.inbox.get_nowait()
        except queue.Empty:
            return None
        if isinstance(item, Exception):
            self.inbox.put(item)  # the link stays broken for every later call
            raise item
        return item

    def close(self) -> None:
        with contextlib.suppress(Exception):  # already dead: nothing to close
            self.ws.close()
