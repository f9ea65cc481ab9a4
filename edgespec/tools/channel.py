"""Channel emulator: a TCP proxy that makes loopback behave like a mobile link.

`listen HOST:PORT` -> `upstream HOST:PORT`; every byte is forwarded intact and in order, but
each direction is its own one-way link that adds:

* delay      RTT/2 per direction, plus uniform jitter in [-jitter, +jitter] (never negative);
* bandwidth  a serialization queue: a chunk starts sending when the link is free and takes
             size / bandwidth, so a big message takes size/bandwidth and small ones queue
             behind it, as on a real bottleneck;
* loss       emulated as TCP experiences it: the byte stream stays intact, but a lost
             segment (MSS bytes, each lost with probability `loss`, a retransmission lost
             again doubling the timeout) delays its chunk by the retransmission timeout
             RTO = max(rto_min, RTT + 4·jitter), and everything behind it waits (head-of-line);
* a trace    a time-varying channel from a CSV `time_s,rtt_ms,bandwidth_mbit[,loss]`, row i
             in force from its time until the next row's; it loops (period: the last time
             plus the last row spacing) or holds the last row.

Delivery times are monotone per direction, so jitter and loss never reorder bytes. A FIN is
forwarded after the data before it (half-close works both ways); a reset or an unreachable
upstream closes the other side. Stdlib only (asyncio).

    with Channel("127.0.0.1:8700", ChannelConfig(rtt_ms=50, bandwidth_mbit=10)) as ch:
        connect to ch.address ...
    run_channel("127.0.0.1:8701", "127.0.0.1:8700", config, trace)  # blocks (the CLI)

The link conditions and traces are in `channel_conditions.py` (re-exported here).
"""

from __future__ import annotations

import asyncio
import math
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from edgespec.tools.channel_conditions import (
    ChannelConfig,
    ChannelError,
    Trace,
    TraceRow,
    parse_address,
)

__all__ = [
    "Channel",
    "ChannelConfig",
    "ChannelError",
    "ChannelProxy",
    "ChannelStats",
    "Trace",
    "TraceRow",
    "parse_address",
    "run_channel",
]

MSS = 1448  # bytes per TCP segment (Ethernet MTU less IP/TCP headers and timestamps)
CHUNK = 4096  # scheduling granularity: bytes read and released at once per direction
QUEUE_CHUNKS = 64  # link buffer (256 KiB): a full link pushes back on the sender


class _Link:
    """One direction: when each chunk arriving at the proxy is delivered to the far side."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.busy_until = 0.0  # the serialization queue is busy until then
        self.last_delivery = 0.0  # deliveries are monotone: a byte stream is never reordered

    def schedule(self, now: float, size: int, cfg: ChannelConfig) -> float:
        start = max(now, self.busy_until)
        rate = cfg.bytes_per_s
        self.busy_until = start + (size / rate if rate else 0.0)
        delay = cfg.rtt_ms / 2000
        if cfg.jitter_ms:
            delay = max(0.0, delay + self.rng.uniform(-1, 1) * cfg.jitter_ms / 1000)
        stall = 0.0
        if cfg.loss:
            for _ in range(math.ceil(size / MSS)):  # one recovery per chunk (SACK)
                rto, lost = cfg.rto_s, 0.0
                while self.rng.random() < cfg.loss:  # the retransmission may be lost too
                    lost, rto = lost + rto, 2 * rto
                stall = max(stall, lost)
        self.last_delivery = max(self.last_delivery, self.busy_until + delay + stall)
        return self.last_delivery

    def eof_time(self, now: float, cfg: ChannelConfig) -> float:
        self.last_delivery = max(self.last_delivery, max(now, self.busy_until) + cfg.rtt_ms / 2000)
        return self.last_delivery


@dataclass
class ChannelStats:
    connections: int = 0  # accepted so far
    active: int = 0  # open now
    bytes_up: int = 0  # listen side -> upstream
    bytes_down: int = 0
    refused: int = 0  # upstream unreachable


@dataclass
class ChannelProxy:
    """The asyncio proxy. `start()` binds; `close()` stops accepting and drops connections."""

    upstream: tuple[str, int]
    config: ChannelConfig = field(default_factory=ChannelConfig)
    trace: Trace | None = None
    listen: tuple[str, int] = ("127.0.0.1", 0)
    seed: int | None = None
    stats: ChannelStats = field(default_factory=ChannelStats)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self._t0 = 0.0

    def config_at(self, now: float) -> ChannelConfig:
        """The channel in force at loop time `now` (the trace, if any, over the base config)."""
        return self.trace.at(now - self._t0, self.config) if self.trace else self.config

    def set_trace(self, trace: Trace | None) -> None:
        """Replay `trace` from its start now (None: back to the base config). Loop thread."""
        self.trace, self._t0 = trace, asyncio.get_running_loop().time()

    async def start(self) -> tuple[str, int]:
        try:
            self._server = await asyncio.start_server(self._accept, *self.listen)
        except OSError as e:
            raise ChannelError(f"cannot listen on {self.listen[0]}:{self.listen[1]}: {e}") from None
        self._t0 = asyncio.get_running_loop().time()
        host, port = self._server.sockets[0].getsockname()[:2]
        self.listen = (host, port)
        return self.listen

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.stats.connections += 1
        self.stats.active += 1
        try:
            await self._forward(client_r, client_w)
        except asyncio.CancelledError:
            pass  # closing the proxy: end quietly (asyncio logs a cancelled handler)
        finally:
            self.stats.active -= 1
            self._tasks.discard(task)

    async def _forward(
        self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter
    ) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            self.stats.refused += 1
            client_w.transport.abort()
            return
        pipes = [
            asyncio.create_task(self._pipe(client_r, up_w, _Link(self._rng), "bytes_up")),
            asyncio.create_task(self._pipe(up_r, client_w, _Link(self._rng), "bytes_down")),
        ]
        try:
            done, pending = await asyncio.wait(pipes, return_when=asyncio.FIRST_EXCEPTION)
            if pending:  # one side failed (reset): drop the other side too
                for w in (client_w, up_w):
                    w.transport.abort()
                for p in pending:
                    p.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
        finally:
            for p in pipes:
                p.cancel()
            for w in (client_w, up_w):
                w.close()
            await asyncio.gather(*pipes, return_exceptions=True)

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: _Link, count: str
    ) -> None:
        """Forward one direction through `link`, then the FIN; raise on a reset."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes | None]] = asyncio.Queue(QUEUE_CHUNKS)

        async def feed() -> None:
            while True:
                data = await reader.read(CHUNK)
                now = loop.time()
                cfg = self.config_at(now)
                if not data:
                    await queue.put((link.eof_time(now, cfg), None))
                    return
                setattr(self.stats, count, getattr(self.stats, count) + len(data))
                await queue.put((link.schedule(now, len(data), cfg), data))

        feeder = asyncio.create_task(feed())
        get: asyncio.Task | None = None
        try:
            while True:
                get = asyncio.create_task(queue.get())
                await asyncio.wait([get, feeder], return_when=asyncio.FIRST_COMPLETED)
                if not get.done() and feeder.exception() is not None:
                    get.cancel()  # the source reset: propagate
                    raise ConnectionResetError("source closed abruptly") from feeder.exception()
                at, data = await get  # (a feeder that ended cleanly queued the FIN first)
                wait = at - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if data is None:
                    break
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        finally:
            pending = [t for t in (feeder, get) if t is not None and not t.done()]
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)


class Channel:
    """A `ChannelProxy` on its own event loop in a background thread (tests, benchmarks).

    `config` can be changed while it runs (`ch.config = ChannelConfig(...)`), or a `trace`
    drives it; `address` is "host:port" to connect to.
    """

    def __init__(
        self,
        upstream: str | tuple[str, int],
        config: ChannelConfig | None = None,
        trace: Trace | None = None,
        listen: str | tuple[str, int] = ("127.0.0.1", 0),
        seed: int | None = None,
    ) -> None:
        up = parse_address(upstream) if isinstance(upstream, str) else upstream
        here = parse_address(listen) if isinstance(listen, str) else listen
        self.proxy = ChannelProxy(up, config or ChannelConfig(), trace, here, seed)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def config(self) -> ChannelConfig:
        return self.proxy.config

    @config.setter
    def config(self, value: ChannelConfig) -> None:
        self.proxy.config = value  # read per chunk by the loop thread; an atomic swap

    def replay(self, trace: Trace | None) -> None:
        """Start replaying `trace` from its first row now (None: the fixed `config` again)."""
        assert self._loop is not None, "start the channel first"
        done = threading.Event()

        def set_trace() -> None:
            self.proxy.set_trace(trace)
            done.set()

        self._loop.call_soon_threadsafe(set_trace)
        done.wait(5)

    @property
    def stats(self) -> ChannelStats:
        return self.proxy.stats

    @property
    def host(self) -> str:
        return self.proxy.listen[0]

    @property
    def port(self) -> int:
        return self.proxy.listen[1]

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> Channel:
        ready = threading.Event()
        failure: list[BaseException] = []
        loop = asyncio.new_event_loop()

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.proxy.start())
            except BaseException as e:  # noqa: BLE001 - handed to the starting thread
                failure.append(e)
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self.proxy.close())
            rest = asyncio.all_tasks(loop)
            for task in rest:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))
            loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=run, name="edgespec-channel", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        self._thread = None

    def __enter__(self) -> Channel:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_channel(
    listen: str,
    upstream: str,
    config: ChannelConfig,
    trace: Trace | None = None,
    seed: int | None = None,
    ready: Callable[[str], None] | None = None,
) -> None:
    """Run the proxy in the foreground until interrupted; `ready(address)` once listening."""
    proxy = ChannelProxy(parse_address(upstream), config, trace, parse_address(listen), seed)

    async def main() -> None:
        host, port = await proxy.start()
        if ready:
            ready(f"{host}:{port}")
        try:
            await asyncio.Event().wait()
        finally:
            await proxy.close()

    asyncio.run(main())
