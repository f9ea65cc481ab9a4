"""The server's connections, below the ASGI app: every one is answered or closed in bounded time.

uvicorn gives most of this as options (`uvicorn_config` sets them); two gaps are closed here
by subclassing its protocols:

* `HeaderTimeoutH11` (HTTP/1.1, h11): a connection must finish its request headers within
  `header_timeout` seconds of connecting or of its previous response, else it gets 408 and
  is closed (uvicorn has no header-read timeout: a slowloris client held a connection
  forever). h11 itself refuses a header block over `h11_max_incomplete_event_size` (400).
* `HandshakeWebSocket` (websockets' sans-I/O protocol): when the upgrade request cannot be
  parsed (a header line over 8 KiB, more than 128 headers), websockets prepares a 431/414
  answer that uvicorn never sent: the client waited forever and SIGTERM then failed on an
  assertion. Here the answer is sent and the connection closed. Also: a denial response
  (the app's 401) counts as a finished handshake (uvicorn logged "returned without completing
  handshake" at ERROR for every wrong token), and shutdown closes a connection whatever its
  state.

Bodies (read timeout, size limit) are bounded in the app (`serve.http`), the whole shutdown
by `timeout_graceful_shutdown`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

MAX_HEADER_BYTES = 16 * 1024  # h11: a request head larger than this is answered 400


class HandshakeWebSocket(WebSocketsSansIOProtocol):
    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if not self.handshake_initiated and self.conn.handshake_exc is not None:
            # websockets refused the upgrade request and queued its answer (431, 414, or
            # nothing for garbage): send it and close, never leave the client waiting
            self.handshake_complete = self.close_sent = True
            output = self.conn.data_to_send()
            if not self.transport.is_closing():
                self.transport.write(b"".join(output))
                self.transport.close()

    async def send(self, message: Any) -> None:
        await super().send(message)
        if message["type"] == "websocket.http.response.body" and not message.get("more_body"):
            self.handshake_complete = True  # the denial was sent: the handshake is over

    def shutdown(self) -> None:
        try:
            super().shutdown()
        except Exception:  # a connection in a state uvicorn did not plan for: just close it
            self.transport.close()


class HeaderTimeoutH11(H11Protocol):
    header_timeout = 10.0  # set per server by `uvicorn_config` (a subclass per config)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_header_timer()  # the next request on this keep-alive connection

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        self._disarm_header_timer()
        if not self.transport.is_closing():
            self._header_timer = self.loop.call_later(self.header_timeout, self._header_deadline)

    def _disarm_header_timer(self) -> None:
        timer = getattr(self, "_header_timer", None)
        if timer is not None:
            timer.cancel()
            self._header_timer = None

    def _header_deadline(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self.transport.get_protocol() is not self:
            return  # closed, or upgraded to a WebSocket (which has its own timeouts)
        if self.conn.their_state is not h11.IDLE:
            return  # the headers arrived: the request's body and answer are the app's
        if self.conn.our_state is h11.IDLE:
            body = f"request headers not received within {self.header_timeout:g}s\n".encode()
            head = (
                b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
                b"connection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n"
            )
            self.transport.write(head + body)
        self.transport.close()


def uvicorn_config(app: Any, config: Any, host: str, port: int, log_level: str) -> Any:
    """uvicorn.Config for `ServerConfig` `config`: the guarded protocols and every timeout."""
    import uvicorn

    http = type("HTTP", (HeaderTimeoutH11,), {"header_timeout": config.header_timeout})
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        http=http,
        ws=HandshakeWebSocket,
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        timeout_keep_alive=5,
        # drain (running rounds) + a body read + a margin: then running tasks are cancelled
        timeout_graceful_shutdown=config.drain_seconds + config.body_timeout + 2,
        # frames up to 4x the limit reach our decoder, which answers ERROR 413 by name;
        # beyond that the WebSocket layer itself closes the connection (code 1009)
        ws_max_size=4 * config.max_request_bytes,
        ws_ping_interval=None,  # rounds are our liveness signal; pings would add traffic
        ws_per_message_deflate=False,  # token ids barely compress; compression bombs do
        lifespan="off",
    )
