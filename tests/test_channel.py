"""The channel emulator adds the delay, bandwidth cap and loss it is told to, follows a trace,
and never corrupts, reorders or hangs the byte stream. Real sockets on loopback; timing
tolerances are generous (the machine is shared)."""

from __future__ import annotations

import contextlib
import os
import socket
import socketserver
import statistics
import threading
import time
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from edgespec.cli import main
from edgespec.tools.channel import (
    Channel,
    ChannelConfig,
    ChannelError,
    Trace,
    TraceRow,
    parse_address,
)


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)
        self.request.shutdown(socket.SHUT_WR)


class _Bye(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.sendall(b"bye")
        self.request.close()  # the server hangs up first


def _serve(handler: type[socketserver.BaseRequestHandler]) -> Iterator[str]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def echo() -> Iterator[str]:
    yield from _serve(_Echo)


def connect(channel: Channel) -> socket.socket:
    s = socket.create_connection((channel.host, channel.port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def ping(s: socket.socket, size: int = 1) -> float:
    start = time.perf_counter()
    s.sendall(b"x" * size)
    got = 0
    while got < size:
        got += len(s.recv(65536))
    return time.perf_counter() - start


def median_rtt(channel: Channel, n: int = 5) -> float:
    with connect(channel) as s:
        return statistics.median(ping(s) for _ in range(n))


def recv_all(s: socket.socket) -> bytes:
    parts = []
    while data := s.recv(65536):
        parts.append(data)
    return b"".join(parts)


def test_added_rtt_is_measured_within_tolerance(echo):
    with Channel(echo, ChannelConfig(rtt_ms=80)) as ch:
        assert 0.075 < median_rtt(ch) < 0.13


def test_no_impairment_adds_almost_nothing(echo):
    with Channel(echo) as ch:
        assert median_rtt(ch) < 0.02


def test_bandwidth_limit_makes_a_transfer_take_size_over_bandwidth(echo):
    size = 250_000  # at 8 Mbit/s = 1 MB/s: 0.25 s each way, pipelined through the echo
    with Channel(echo, ChannelConfig(bandwidth_mbit=8)) as ch, connect(ch) as s:
        elapsed = ping(s, size)
    assert 0.22 < elapsed < 0.6


def test_small_messages_queue_behind_a_big_one(echo):
    with Channel(echo, ChannelConfig(bandwidth_mbit=8)) as ch, connect(ch) as s:
        start = time.perf_counter()
        s.sendall(b"y" * 100_000)  # 0.1 s of serialization ahead of the one byte
        s.sendall(b"!")
        got = b""
        while not got.endswith(b"!"):
            got += s.recv(65536)
        elapsed = time.perf_counter() - start
    assert len(got) == 100_001 and elapsed > 0.09


def test_trace_switching_changes_the_measured_rtt(echo):
    trace = Trace((TraceRow(0.0, 20, 100), TraceRow(0.4, 150, 100)), loop=False)
    with Channel(echo, trace=trace) as ch:
        early = median_rtt(ch, 3)
        time.sleep(max(0.0, 0.45 - 3 * early))
        late = median_rtt(ch, 3)
    assert early < 0.06 and 0.14 < late < 0.25


def test_config_changes_live_and_replay_restarts_a_trace(echo):
    with Channel(echo) as ch:
        ch.config = ChannelConfig(rtt_ms=100)
        assert median_rtt(ch, 1) > 0.09
        ch.replay(Trace((TraceRow(0.0, 30, 100),), loop=False))
        assert 0.025 < median_rtt(ch, 3) < 0.08
        ch.replay(None)
        assert median_rtt(ch, 1) > 0.09


def test_trace_loops_or_holds_its_last_row():
    rows = (TraceRow(0.0, 10, 1), TraceRow(1.0, 50, 1))
    base = ChannelConfig()
    assert Trace(rows, loop=True).period == 2.0
    assert Trace(rows, loop=True).at(2.5, base).rtt_ms == 10
    assert Trace(rows, loop=False).at(2.5, base).rtt_ms == 50


def test_loss_adds_delay_but_never_corrupts_or_reorders(echo):
    payload = os.urandom(200_000)
    lossy = ChannelConfig(jitter_ms=5, loss=0.05, rto_min_ms=30)
    with Channel(echo, lossy, seed=1) as ch, connect(ch) as s:
        start = time.perf_counter()
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        back = recv_all(s)
        elapsed = time.perf_counter() - start
    assert back == payload
    assert elapsed > 0.03  # at least one retransmission timeout


def test_connections_close_cleanly_both_ways(echo):
    with Channel(echo, ChannelConfig(rtt_ms=10)) as ch:
        with connect(ch) as s:  # client half-closes: gets every byte back, then EOF
            s.sendall(b"hello")
            s.shutdown(socket.SHUT_WR)
            assert recv_all(s) == b"hello"
        deadline = time.time() + 2
        while ch.stats.active and time.time() < deadline:
            time.sleep(0.01)
        assert ch.stats.active == 0 and ch.stats.connections == 1
    for address in _serve(_Bye):  # the server hangs up first: the client reads "bye", EOF
        with Channel(address, ChannelConfig(rtt_ms=10)) as ch, connect(ch) as s:
            assert recv_all(s) == b"bye"


def test_unreachable_upstream_closes_the_client_and_the_proxy_survives(echo):
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{free.getsockname()[1]}"
    with Channel(dead) as ch:
        with connect(ch) as s, contextlib.suppress(ConnectionResetError):
            assert s.recv(1) == b""
        assert ch.stats.refused == 1
        ch.proxy.upstream = parse_address(echo)
        assert median_rtt(ch, 1) < 2.0  # it answers (a bound for a loaded machine, not a speed)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"rtt_ms": -1}, "rtt_ms -1 must be >= 0"),
        ({"bandwidth_mbit": 0}, "must be > 0"),
        ({"jitter_ms": -2}, "jitter_ms"),
        ({"loss": 1.5}, "probability"),
    ],
)
def test_bad_config_is_refused_with_the_reason(options, message):
    with pytest.raises(ChannelError, match=message):
        ChannelConfig(**options)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "is empty"),
        ("time_s,rtt_ms,bandwidth_mbit\n", "is empty"),
        ("0,50\n", "line 1: expected time_s,rtt_ms,bandwidth_mbit"),
        ("0,50,abc\n", "line 1"),
        ("0,50,10\n1,-5,10\n", "line 2: rtt_ms -5.0 must be >= 0"),
        ("0,50,10\n0,20,10\n", "must start at >= 0 and increase"),
    ],
)
def test_bad_trace_csv_is_refused_with_the_line(tmp_path, text, message):
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(ChannelError, match=message):
        Trace.from_csv(path)


def test_trace_csv_with_header_comments_and_loss_column(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("time_s,rtt_ms,bandwidth_mbit,loss\n# lte\n0,40,20,0\n5,120,2,0.01\n")
    trace = Trace.from_csv(path)
    assert [r.rtt_ms for r in trace.rows] == [40, 120] and trace.rows[1].loss == 0.01


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rtt-ms", "-5"], "rtt_ms -5.0 must be >= 0"),
        (["--trace", "/nonexistent/t.csv"], "cannot read trace"),
        (["--listen", "localhost"], "is not HOST:PORT"),
    ],
)
def test_cli_refuses_bad_options_in_one_line(args, message):
    r = CliRunner().invoke(main, ["channel", *args])
    assert r.exit_code == 1 and message in r.output and "Traceback" not in r.output
