"""The verifier server under abuse: no leaked slot, every connection answered or closed in
bounded time, bounded bodies, bad numbers named, validated flags, polite auth. Real server
processes on loopback, real sockets; every attack is bounded in count and time."""

from __future__ import annotations

import json
import math
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from split_server import TOKEN, start_server
from websockets.sync.client import connect

import edgespec
from edgespec import protocol as P
from edgespec.serve.state import ConfigError, ServerConfig

CONTEXT = 1024


@pytest.fixture(scope="module")
def bundle(long_bundle) -> Path:
    return long_bundle


@pytest.fixture(scope="module")
def server(bundle, tmp_path_factory):
    s = start_server(
        bundle,
        tmp_path_factory.mktemp("server"),
        TOKEN,
        *("--max-sessions", "2", "--max-request-bytes", "4096", "--idle-timeout", "30"),
        *("--header-timeout", "1", "--body-timeout", "1", "--prefill-chunk", "64"),
    )
    yield s
    s.stop()


def ws(server, token=TOKEN):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return connect(f"{server.url}/v1/session", additional_headers=headers, proxy=None, legacy=True)


def ask(conn, msg) -> P.Message:
    conn.send(P.encode(msg) if not isinstance(msg, bytes) else msg)
    return P.decode(conn.recv(timeout=10))


def post(server, raw: bytes, token=TOKEN, timeout=30):
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(
        f"{server.http}/v1/completions", data=raw, headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.load(r), r.headers
    except urllib.error.HTTPError as e:
        return e.code, json.load(e), e.headers


def raw_http(port: int, data: bytes, wait: float = 5.0, close_after: bool = False) -> bytes:
    """Send `data` on a fresh socket; what the server answers within `wait` seconds."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as s:
        s.sendall(data)
        if close_after:
            return b""
        chunks = []
        try:  # until closed, or a whole response head is in
            while (chunk := s.recv(4096)) and b"\r\n\r\n" not in b"".join(chunks + [chunk]):
                chunks.append(chunk)
            chunks.append(chunk)
        except TimeoutError:
            pass
        return b"".join(chunks)


def settle(server, key="sessions", want=0, seconds=5.0) -> int:
    deadline = time.monotonic() + seconds
    while (value := server.health()[key]) != want and time.monotonic() < deadline:
        time.sleep(0.05)
    return value


UPGRADE = (
    b"GET /v1/session HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
    + f"Authorization: Bearer {TOKEN}\r\n".encode()
)


# -- item 1: slots ---------------------------------------------------------------------------
def test_failed_starts_never_leak_a_kv_slot(server):
    """Requests refused after parsing (negative seed, absurd temperature) used to hold their
    slot forever; more of them than there are slots must leave the server fully usable."""
    for _ in range(3):
        status, body, _ = post(server, b'{"prompt": "x", "seed": -1}')
        assert status == 400 and "seed" in body["error"]["message"]
        with ws(server) as conn:  # a START the wire accepts but the server must refuse
            error = ask(conn, P.Start([1, 2, 3], 16, temperature=1e-30))
            assert isinstance(error, P.Error) and error.code == P.BAD_REQUEST
            assert "temperature" in error.text
    assert settle(server) == 0
    with ws(server) as a, ws(server) as b:  # every slot is still there
        assert isinstance(ask(a, P.Start([1, 2], 8)), P.Result)
        assert isinstance(ask(b, P.Start([1, 2], 8)), P.Result)
        assert server.health()["sessions"] == 2
    assert settle(server) == 0


# -- item 7: numbers -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "field, raw",
    [
        ("max_tokens", "Infinity"),
        ("max_tokens", "1e400"),
        ("max_tokens", "true"),
        ("max_tokens", "0"),
        ("max_tokens", "1" + "0" * 400),
        ("seed", "Infinity"),
        ("seed", "1e400"),
        ("seed", "-1"),
        ("seed", "false"),
        ("temperature", "NaN"),
        ("temperature", "1e-320"),
        ("temperature", "-Infinity"),
        ("temperature", '"hot"'),
        ("top_p", "0"),
        ("top_p", "NaN"),
        ("top_k", "-3"),
        ("ignore_eos", '"yes"'),
    ],
)
def test_bad_numbers_get_400_naming_the_field(server, field, raw):
    fields = {"prompt": '"x = "', "max_tokens": "2", field: raw}
    body = "{" + ", ".join(f'"{k}": {v}' for k, v in fields.items()) + "}"
    status, answer, _ = post(server, body.encode())
    assert status == 400, answer
    assert answer["error"]["message"].startswith(field), answer


def test_malformed_backbone_fingerprint_is_a_bad_message(server):
    # "1" * 4301: past Python's int-string limit (a ValueError, not a malformed message)
    for fingerprint in (
        "backbone:³:aa:bb",
        "backbone:",
        "backbone:x:y",
        f"backbone:{'1' * 4301}:a:b",
    ):
        with ws(server) as conn:
            error = ask(conn, P.Start([1, 2], 8, fingerprint=fingerprint))
            assert isinstance(error, P.Error) and error.code == P.BAD_MESSAGE, error
            assert "malformed backbone fingerprint" in error.text


# -- item 8: flags ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "option, value",
    [
        ("idle_timeout", 0),
        ("idle_timeout", -5.0),
        ("idle_timeout", math.nan),
        ("drain_seconds", math.inf),
        ("header_timeout", 0),
        ("body_timeout", -1),
        ("batch_window_ms", 5000),
        ("max_sessions", 0),
        ("max_sessions", True),
        ("max_batch", 2.5),
        ("max_request_bytes", 10),
        ("prefill_chunk", -1),
        ("max_context", 1),
        ("threads", 0),
    ],
)
def test_server_settings_are_validated_with_the_flag_named(option, value):
    with pytest.raises(ConfigError, match="--" + option.replace("_", "-")):
        ServerConfig("unused", **{option: value})


def test_serve_refuses_a_bad_flag_before_loading(tmp_path):
    cmd = [sys.executable, "-m", "edgespec.cli", "serve", str(tmp_path), "--idle-timeout", "nan"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--idle-timeout nan" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


# -- item 2: connections ---------------------------------------------------------------------
def test_bad_websocket_upgrades_are_answered_431(server):
    long_line = UPGRADE + b"X-Big: " + b"a" * 9000 + b"\r\n\r\n"
    many = UPGRADE + b"".join(b"X-%d: 1\r\n" % i for i in range(200)) + b"\r\n"
    for request in (long_line, many):
        answer = raw_http(server.port, request)
        assert answer.startswith(b"HTTP/1.1 431"), answer[:80]


def test_unfinished_headers_are_closed_after_the_header_timeout(server):
    for partial in (b"GET /health HTTP/1.1\r\nHost: x\r\n", UPGRADE, b""):
        t0 = time.monotonic()
        answer = raw_http(server.port, partial, wait=5)
        assert time.monotonic() - t0 < 4  # --header-timeout 1, then closed
        assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer[:80]


def test_trickled_body_gets_408_after_the_body_timeout(server):
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
        + f"Authorization: Bearer {TOKEN}\r\n\r\n".encode()
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(head + b'{"pro')
        t0 = time.monotonic()
        answer = s.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:80]
        assert time.monotonic() - t0 < 4


def test_sigterm_exits_0_with_hostile_connections_open(bundle, tmp_path):
    s = start_server(bundle, tmp_path, TOKEN, "--drain-seconds", "1", "--body-timeout", "2")
    socks = []
    try:
        for data in (
            UPGRADE + b"X-Big: " + b"a" * 9000,  # an unfinished oversized upgrade
            b"GET /health HTTP/1.1\r\nHost: x\r\n",  # slowloris
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{",
        ):
            sock = socket.create_connection(("127.0.0.1", s.port), timeout=5)
            sock.sendall(data)
            socks.append(sock)
        time.sleep(0.3)
        t0 = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(timeout=15) == 0
        assert time.monotonic() - t0 < 1 + 2 + 2 + 1  # drain + body read + margin
        assert "Traceback" not in (tmp_path / f"server-{s.port}.log").read_text()
    finally:
        for sock in socks:
            sock.close()
        s.stop()


# -- item 6: body size -----------------------------------------------------------------------
def test_oversized_body_is_refused_by_content_length_before_reading(server):
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 67108864\r\n"
        + f"Authorization: Bearer {TOKEN}\r\n\r\n".encode()
    )
    answer = raw_http(server.port, head, wait=3)  # not a byte of the 64 MiB is sent
    assert answer.startswith(b"HTTP/1.1 413"), answer[:80]


def test_chunked_body_stops_being_read_at_the_limit(server):
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        + f"Authorization: Bearer {TOKEN}\r\n\r\n".encode()
    )
    chunk = b"%x\r\n%s\r\n" % (3000, b" " * 3000)
    answer = raw_http(server.port, head + chunk + chunk, wait=3)  # over 4096; never ended
    assert answer.startswith(b"HTTP/1.1 413"), answer[:80]


# -- item 5: abandoned work ------------------------------------------------------------------
def test_completion_whose_client_left_stops_decoding(server):
    assert settle(server) == 0
    before = server.health()["completion_tokens"]
    body = json.dumps({"prompt": [1, 2, 3], "max_tokens": 1000, "ignore_eos": True}).encode()
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {TOKEN}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(head + body)
        deadline = time.monotonic() + 10
        while server.health()["completion_tokens"] - before < 20:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    # the client is gone: its decode stops within a round or two and frees its slot
    assert settle(server, seconds=2) == 0
    done = server.health()["completion_tokens"] - before
    time.sleep(0.3)
    assert server.health()["completion_tokens"] - before == done < 1000


def test_client_leaving_during_the_body_leaves_no_traceback(server):
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n"
        + f"Authorization: Bearer {TOKEN}\r\n\r\n".encode()
    )
    for _ in range(3):
        raw_http(server.port, head + b'{"prompt": ', close_after=True)
    time.sleep(0.3)
    status, _, _ = post(server, b'{"prompt": "x", "max_tokens": 1}')
    assert status == 200
    assert "Traceback" not in _server_log(server)


def _server_log(server) -> str:
    return Path(server.proc.stdout.name).read_text() if server.proc.stdout else ""


# -- item 10: busy, auth, health -------------------------------------------------------------
def test_no_free_slot_is_503_with_retry_after(server):
    assert settle(server) == 0
    with ws(server) as a, ws(server) as b:
        ask(a, P.Start([1, 2], 8))
        ask(b, P.Start([1, 2], 8))
        status, body, headers = post(server, b'{"prompt": "x", "max_tokens": 1}')
        assert status == 503 and headers["Retry-After"] == "1", body
        assert "full" in body["error"]["message"]


def test_bearer_scheme_is_case_insensitive(server):
    for scheme in ("bearer", "BEARER", "Bearer"):
        assert _post_with(server, f"{scheme} {TOKEN}")[0] == 200
    assert _post_with(server, f"Basic {TOKEN}")[0] == 401


def _post_with(server, authorization: str):
    req = urllib.request.Request(
        f"{server.http}/v1/completions",
        data=b'{"prompt": "x", "max_tokens": 1}',
        headers={"Authorization": authorization},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def test_health_without_the_token_is_liveness_only(bundle, server):
    assert server.health(token=False) == {"status": "ok"}
    details = server.health()
    assert details["backbone_fingerprint"] == edgespec.load(bundle).manifest.backbone_fingerprint
    assert details["max_request_bytes"] == 4096


def test_failed_logins_are_slowed_and_logged_once(server):
    from websockets.exceptions import InvalidStatus

    for _ in range(2):
        with pytest.raises(InvalidStatus):
            ws(server, "nope")
    times = []
    for _ in range(7):
        t0 = time.monotonic()
        assert _post_with(server, "Bearer wrong")[0] == 401
        times.append(time.monotonic() - t0)
    assert times[-1] >= 0.25 > times[0]  # 0.05 s more per recent failure
    log = _server_log(server)
    assert log.count("missing or wrong bearer token") <= 1, log
    assert "without completing handshake" not in log, log


# -- item 4: long prompts do not stall running sessions --------------------------------------
@pytest.mark.parametrize("budget_ms", [0.0, 5.0])  # fixed chunks; chunks sized by time
def test_long_prefills_interleave_with_running_rounds(bundle, budget_ms):
    """Three 600-token prompts start while a session decodes: a round of that session never
    waits for more than two 16-position chunks (unchunked, it waited for whole prompts), and
    the chunked prefills give the same first token as the model's own greedy decoding (on
    the real worker, model and KV pool)."""
    import asyncio

    from edgespec.serve.session import prefill
    from edgespec.serve.state import load_state

    chunk, long_len = 16, 600
    config = ServerConfig(
        str(bundle), threads=1, max_sessions=4, prefill_chunk=chunk, prefill_budget_ms=budget_ms
    )
    state = load_state(config)
    budget = budget_ms / 1000
    worker, stages = state.worker, state.stages
    worker.trace = []
    prompts = [[(7 * k + i) % 200 + 3 for i in range(long_len)] for k in range(3)]

    async def scenario():
        args = (state.pool, stages)
        first = P.Start([1, 2, 3], 200)
        running, _ = await worker.steps(prefill, *args, first, CONTEXT, [], chunk, budget)
        longs = [
            asyncio.ensure_future(
                worker.steps(prefill, *args, P.Start(p, long_len + 4), CONTEXT, [], chunk, budget)
            )
            for p in prompts
        ]
        rounds = 0
        while not all(t.done() for t in longs):
            await worker.round((running, P.Verify(len(running.seq), [])))
            rounds += 1
        return rounds, [(await t)[1].token for t in longs]

    try:
        rounds, firsts = asyncio.run(scenario())
    finally:
        worker.stop()
    ar = edgespec.load(bundle, threads=1)
    assert firsts == [ar.generate(p, max_new_tokens=1).tokens[0] for p in prompts]
    trace = "".join({"round": "r", "step": "s", "call": "c"}[k] for k in worker.trace)
    # while the long prompts were prefilled (3 x 38 chunks), the session kept its rounds (how
    # many depends on how often a loaded machine lets the event loop submit the next one; that
    # none waits long is the bound below)
    assert trace.count("s") >= 3 * long_len // chunk and rounds >= 2
    # a queued round waits for at most the chunk running when it came plus one more (the
    # wall-time gaps between rounds also hold the event loop's own latency: not asserted)
    assert worker.most_step_work_before_a_round <= 2 * chunk, trace
