"""The verifier server, spoken to directly: auth, every bad message answered by name while
other sessions go on, limits, idle timeout, health and the OpenAI-style completion endpoint."""

from __future__ import annotations

import json
import struct
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from split_server import TOKEN, start_server
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

import edgespec
from edgespec import protocol as P
from edgespec.runtime.draft_q import quantize

ARCH = "llama-gqa-tied"


@pytest.fixture(scope="module")
def bundle(spec_bundles):
    return spec_bundles[ARCH]


@pytest.fixture(scope="module")
def server(bundle, tmp_path_factory):
    s = start_server(
        bundle,
        tmp_path_factory.mktemp("server"),
        TOKEN,
        "--max-sessions",
        "3",
        "--max-context",
        "128",
        "--max-request-bytes",
        "2048",
        "--idle-timeout",
        "1.5",
    )
    yield s
    s.stop()


def ws(server, token=TOKEN, subprotocols=None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = f"{server.url}/v1/session"
    return connect(
        url, additional_headers=headers, proxy=None, legacy=True, subprotocols=subprotocols
    )


def ask(conn, msg) -> P.Message:
    conn.send(P.encode(msg) if not isinstance(msg, bytes | str) else msg)
    return P.decode(conn.recv(timeout=10))


def refused(conn, data) -> P.Error:
    """Send `data`; the answer must be an ERROR, then the server closes this session."""
    answer = ask(conn, data)
    assert isinstance(answer, P.Error), answer
    with pytest.raises(ConnectionClosed):
        conn.recv(timeout=5)
    return answer


def test_session_protocol_is_lossless_against_ar(bundle, server):
    ar = edgespec.load(bundle, threads=1)
    prompt = ar.encode("def f(x):")
    want = ar.generate(prompt, max_new_tokens=8, ignore_eos=True).tokens
    with ws(server) as conn:
        first = ask(conn, P.Start(prompt, 64))
        assert isinstance(first, P.Result) and first.token == want[0]
        seq = [*prompt, first.token]
        # draft the right answer for 3 tokens, then a wrong one: 3 accepted + correction
        wrong = (want[4] + 1) % ar.manifest.target.vocab_size
        r = ask(conn, P.Verify(len(seq), [*want[1:4], wrong]))
        assert (r.accepted, r.token, r.length) == (3, want[4], len(seq) + 4)


def test_missing_or_wrong_token_is_refused_with_401(server):
    for token in (None, "nope"):
        with pytest.raises(InvalidStatus) as info:
            ws(server, token)
        assert info.value.response.status_code == 401
    req = urllib.request.Request(f"{server.http}/v1/completions", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as http:
        urllib.request.urlopen(req, timeout=5)
    assert http.value.code == 401


def start_bytes(ids):
    return P.encode(P.Start(ids, 64))


@pytest.mark.parametrize(
    "setup, data, code, words",
    [
        (False, b"garbage!", P.BAD_MESSAGE, "shorter than the 12-byte header"),
        (False, "hello", P.BAD_MESSAGE, "binary frames only"),
        (False, P.HEADER.pack(b"ES", P.VERSION, 99, 0, 0), P.BAD_MESSAGE, "unknown message type"),
        (False, start_bytes([1, 2, 10**6]), P.BAD_REQUEST, "outside the vocabulary"),
        (False, start_bytes(list(range(1, 200))), P.TOO_LARGE, "exceed the limit 128"),
        (False, P.encode(P.End()) + b"\0" * 3000, P.TOO_LARGE, "exceeds the limit of 2048"),
        (False, P.encode(P.Verify(3, [1])), P.BAD_MESSAGE, "VERIFY before START"),
        (True, P.encode(P.Verify(99, [1])), P.OUT_OF_SYNC, "out of step"),
        (True, P.encode(P.Verify(4, list(range(64)))), P.BAD_REQUEST, "context"),
        (False, P.encode(P.Result(0, 1, 1, 0.0)), P.BAD_MESSAGE, "server message"),
        (False, P.encode(P.Start([1], 8, fingerprint="sha256:other")), P.INCOMPATIBLE, "backbone"),
    ],
)
def test_each_bad_message_gets_its_error_and_other_sessions_continue(
    server, setup, data, code, words
):
    with ws(server) as good, ws(server) as bad:
        first = ask(good, P.Start([1, 2, 3], 64))
        if setup:
            ask(bad, P.Start([1, 2, 3], 8))
        error = refused(bad, data)
        assert error.code == code and words in error.text, error.text
        # the other session is untouched
        r = ask(good, P.Verify(4, [5]))
        assert isinstance(r, P.Result) and r.length in (5, 6)
        assert first.token is not None


def test_max_sessions_is_enforced(server):
    deadline = time.monotonic() + 5
    while server.health()["sessions"] and time.monotonic() < deadline:
        time.sleep(0.05)  # sessions of earlier tests end as their connections close
    conns = [ws(server) for _ in range(3)]
    try:
        for c in conns:
            assert isinstance(ask(c, P.Start([1, 2], 8)), P.Result)
        with ws(server) as extra:
            error = P.decode(extra.recv(timeout=5))
            assert isinstance(error, P.Error) and error.code == P.UNAVAILABLE
            assert "full" in error.text
    finally:
        for c in conns:
            c.close()


def test_idle_session_is_closed_and_its_cache_freed(server):
    with ws(server) as conn:
        ask(conn, P.Start([1, 2], 8))
        before = server.health()["sessions"]
        time.sleep(2.0)
        error = P.decode(conn.recv(timeout=5))
        assert isinstance(error, P.Error) and error.code == P.IDLE_TIMEOUT
    assert server.health()["sessions"] < before


def post(server, body, token=TOKEN):
    req = urllib.request.Request(
        f"{server.http}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def test_completions_endpoint_is_plain_greedy_decoding(bundle, server):
    ar = edgespec.load(bundle, threads=1)
    want = ar.generate("x = ", max_new_tokens=6, ignore_eos=True)
    status, body = post(
        server, {"prompt": "x = ", "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    )
    assert status == 200, body
    assert body["choices"][0]["text"] == want.text
    assert body["usage"]["completion_tokens"] == 6
    status, body = post(server, {"prompt": "", "max_tokens": 3})
    assert status == 400 and "prompt" in body["error"]["message"]


def test_completions_are_bounded_by_the_servers_max_context(server):
    status, body = post(server, {"prompt": [5] * 130, "max_tokens": 3})
    assert status == 400 and "context is 128" in body["error"]["message"]
    status, body = post(server, {"prompt": [5] * 120, "max_tokens": 50, "ignore_eos": True})
    assert status == 200 and body["usage"]["completion_tokens"] == 8
    assert body["choices"][0]["finish_reason"] == "length"


def test_health_reports_the_model(bundle, server):
    h = server.health()
    assert h["status"] == "ok" and h["max_sessions"] == 3 and h["max_context"] == 128
    assert h["backbone_fingerprint"] == edgespec.load(bundle).manifest.backbone_fingerprint


def test_sampling_rounds_accept_q_rows(bundle, server):
    with ws(server, subprotocols=[P.SUBPROTOCOL]) as conn:
        first = ask(conn, P.Start([1, 2, 3], 64, temperature=1.0, top_k=20, seed=3))
        assert isinstance(first, P.Result)
        # START's answer states the limits, and that it would stream (nothing streamed yet)
        assert first.limits == P.ServerLimits(128, 2048, stream_rate=0.0, stream_room=4)
        q = quantize(np.array([5, 6]), np.array([0.5, 0.5]))
        r = ask(conn, P.Verify(4, [5], [q]))
        assert isinstance(r, P.Result) and r.accepted in (0, 1)
        assert r.limits is None  # only START's answer carries them
        bad_q = P.encode(P.Verify(r.length, [5], [q])).replace(
            struct.pack("<H", q.counts[0]), struct.pack("<H", q.counts[0] + 1), 1
        )
        assert refused(conn, bad_q).code == P.BAD_MESSAGE


def test_shutdown_answers_or_cleanly_refuses_rounds(bundle, tmp_path):
    import signal

    s = start_server(bundle, tmp_path)
    try:
        with ws(s) as conn:
            first = ask(conn, P.Start([1, 2, 3], 250))
            conn.send(P.encode(P.Verify(4, [first.token])))
            s.proc.send_signal(signal.SIGTERM)
            answers = []
            try:
                while True:
                    answers.append(P.decode(conn.recv(timeout=10)))
                    if isinstance(answers[-1], P.Error):
                        break
                    time.sleep(0.01)  # a device's pace: shutdown starts within ~0.1 s
                    conn.send(P.encode(P.Verify(answers[-1].length, [])))
            except ConnectionClosed:
                pass
        assert answers, "the round in flight was neither answered nor refused"
        *results, last = answers
        assert all(isinstance(r, P.Result) for r in results)
        assert isinstance(last, P.Result) or last.code == P.UNAVAILABLE
        # uvicorn re-raises the signal once its graceful shutdown is done
        assert s.proc.wait(timeout=15) in (0, -signal.SIGTERM)
    finally:
        s.stop()
