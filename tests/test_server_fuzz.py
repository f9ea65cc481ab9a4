"""Bounded, seeded fuzzing of what a server reads: binary protocol frames captured from the
real split client, mutated; and /v1/completions bodies, mutated. Every input gets an answer
that names a problem (never a crash, a hang or a 500) and the server stays usable: its
slots all free afterwards and a well-formed generation still equals `ar`."""

from __future__ import annotations

import json
import random
import struct
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from split_server import TOKEN, start_server
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

import edgespec
from edgespec import protocol as P
from edgespec.sparse_q import SCALE, SparseQ

SEED = 18
INTERESTING_U32 = [0, 1, 2, 63, 64, 65, 255, 256, 1023, 1024, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF]


@pytest.fixture(scope="module")
def server(long_bundle, tmp_path_factory):
    s = start_server(
        long_bundle,
        tmp_path_factory.mktemp("fuzz"),
        TOKEN,
        *("--max-sessions", "4", "--max-context", "96", "--max-request-bytes", "8192"),
        *("--idle-timeout", "30", "--header-timeout", "2", "--body-timeout", "2"),
    )
    yield s
    s.stop()


@pytest.fixture(scope="module")
def frames(long_bundle, server, monkeypatch_module) -> list[bytes]:
    """Every frame the real split client sends in a greedy and a sampled generation, and a
    conversation's PAUSE and resuming START."""
    sent: list[bytes] = []
    encode = P.encode

    def recording(msg):
        data = encode(msg)
        sent.append(data)
        return data

    monkeypatch_module.setattr(P, "encode", recording)
    # the default policy (placement: it may stream) and one that always drafts (VERIFY)
    for policy in (None, "channel-aware"):
        for sampling in ({}, {"temperature": 0.9, "top_k": 8, "seed": 1}):
            model = edgespec.load(long_bundle, mode="split", server=server.url, token=TOKEN,
                                  threads=1, draft_policy=policy)  # fmt: skip
            model.generate("def f(x):", max_new_tokens=12, ignore_eos=True, **sampling)
            model.remote.drop()  # its connection would hold one of the server's 4 sessions
    monkeypatch_module.undo()
    sent += [P.encode(P.Pause()), P.encode(P.Start([7, 8], 40, keep=5))]
    # token trees (this server has no tree graphs: refused by name) and a tree's answer
    sent += [P.encode(P.Verify(10, [5, 6, 7, 8], None, [-1, -1, 0, 2]))]
    q = SparseQ(np.array([5, 6], np.int32), np.array([SCALE // 2, SCALE - SCALE // 2]))
    sent += [P.encode(P.Verify(10, [5, 6], [q, q], [-1, -1]))]
    sent += [P.encode(P.Result(2, 9, 13, 0.01, path=[1, 3]))]
    kinds = {P.HEADER.unpack_from(f)[2] for f in sent}
    assert {P.START, P.VERIFY, P.PAUSE} <= kinds, kinds
    return sent


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(6)
        at = rng.randrange(len(b)) if b else 0
        if op == 0 and b:  # flip a bit
            b[at] ^= 1 << rng.randrange(8)
        elif op == 1 and b:  # a boundary byte
            b[at] = rng.choice([0, 1, 0x7F, 0x80, 0xFF])
        elif op == 2 and len(b) >= at + 4:  # a boundary u32 (counts, ids, lengths)
            b[at : at + 4] = struct.pack("<I", rng.choice(INTERESTING_U32))
        elif op == 3:  # truncate
            del b[at:]
        elif op == 4:  # append junk
            b += bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        else:  # duplicate a slice
            b[at:at] = b[at : at + rng.randint(1, 12)]
    return bytes(b)


def test_mutated_frames_decode_or_raise_protocol_error(frames):
    rng = random.Random(SEED)
    limits = P.Limits(vocab_size=2048, max_bytes=8192, max_ids=96)
    outcomes = {"ok": 0, "refused": 0}
    for _ in range(3000):
        data = mutate(rng, rng.choice(frames))
        try:
            P.decode(data, limits)
            outcomes["ok"] += 1
        except P.ProtocolError:
            outcomes["refused"] += 1
    assert outcomes["refused"] > 0 and outcomes["ok"] > 0, outcomes


def ws(server):
    headers = {"Authorization": f"Bearer {TOKEN}"}
    return connect(f"{server.url}/v1/session", additional_headers=headers, proxy=None, legacy=True)


def test_mutated_frames_on_a_live_server_are_answered_and_leak_nothing(long_bundle, server, frames):
    rng = random.Random(SEED + 1)
    starts = [f for f in frames if P.HEADER.unpack_from(f)[2] == P.START]
    answers = {"result": 0, "error": 0, "closed": 0}
    deadline = time.monotonic() + 60
    for _ in range(120):
        assert time.monotonic() < deadline, "fuzzing the live server took over a minute"
        with ws(server) as conn:
            frame = rng.choice(frames)
            if P.HEADER.unpack_from(frame)[2] != P.START:  # a round needs a session
                conn.send(rng.choice(starts))
                P.decode(conn.recv(timeout=10))
            data = mutate(rng, frame)
            if _is_end(data):
                continue  # END, PAUSE and STOP are never answered (STOP: a FINAL TOKENS)
            conn.send(data)
            try:
                answer = P.decode(conn.recv(timeout=10))  # TimeoutError here: a hang
            except ConnectionClosed:
                answers["closed"] += 1
                continue
            if isinstance(answer, P.Error):
                assert answer.code != P.INTERNAL, answer
                answers["error"] += 1
            else:
                answers["result"] += 1
    assert answers["error"] > 0, answers
    # every slot comes back, and a clean generation is still exactly `ar`
    end = time.monotonic() + 5
    while server.health()["sessions"] and time.monotonic() < end:
        time.sleep(0.05)
    assert server.health()["sessions"] == 0
    ar = edgespec.load(long_bundle, threads=1)
    split = edgespec.load(long_bundle, mode="split", server=server.url, token=TOKEN, threads=1)
    want = ar.generate("x = ", max_new_tokens=10, ignore_eos=True).tokens
    assert split.generate("x = ", max_new_tokens=10, ignore_eos=True).tokens == want


def _is_end(data: bytes) -> bool:
    try:
        return isinstance(P.decode(data, P.Limits(vocab_size=2048)), P.End | P.Pause | P.Stop)
    except P.ProtocolError:
        return False


BODIES = [
    {"prompt": "x = ", "max_tokens": 4, "temperature": 0, "ignore_eos": True},
    {"prompt": [1, 2, 3], "max_tokens": 2, "temperature": 0.8, "top_p": 0.9, "seed": 7},
    {"prompt": "def f(x):", "max_tokens": 3, "top_k": 5},
]
JSON_SWAPS = ["NaN", "Infinity", "-Infinity", "1e400", "-1", "0", "true", "null", "[]", "{}"]
JSON_SWAPS += ['""', '"x"', "1" + "0" * 30, "1e-320", "[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]"]
# lone surrogates, nesting past the limit (and past the template's recursion), huge integers
JSON_SWAPS += ['"a\\ud800b"', '"\\udfff"', '["\\ud83d"]', '{"\\ud800": 1}']
JSON_SWAPS += ["[" * 70 + "]" * 70, "[" * 600 + "]" * 600, "1" + "0" * 5000, "-" + "9" * 4400]


def mutate_json(rng: random.Random, body: dict) -> bytes:
    op = rng.randrange(4)
    if op == 0:  # a field gets a hostile JSON value
        text = json.dumps(body)
        key = rng.choice(list(body))
        return text.replace(json.dumps(body[key]), rng.choice(JSON_SWAPS), 1).encode()
    if op == 1:  # bytes flipped in the text
        raw = bytearray(json.dumps(body).encode())
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        return bytes(raw)
    if op == 2:  # deep nesting (Python's json recursion limit) or a huge prompt list
        return ("[" * rng.choice([500, 2000, 4000]) + "]" * 10).encode()
    return json.dumps(dict(body, prompt=[rng.randrange(-5, 600) for _ in range(50)])).encode()


def test_mutated_completion_bodies_get_a_named_answer(server):
    rng = random.Random(SEED + 2)
    seen: dict[int, int] = {}
    for _ in range(150):
        data = mutate_json(rng, rng.choice(BODIES))
        req = urllib.request.Request(
            f"{server.http}/v1/completions",
            data=data,
            headers={"Authorization": f"Bearer {TOKEN}"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=20) as r:
                status, answer = r.status, json.load(r)
        except urllib.error.HTTPError as e:
            status, answer = e.code, json.load(e)
        seen[status] = seen.get(status, 0) + 1
        assert status in (200, 400, 413), (status, data[:200], answer)
        if status != 200:
            assert answer["error"]["message"], answer
    assert seen.get(400) and seen.get(200), seen
    assert np.isfinite(server.health()["mean_batch"])


def test_a_device_refuses_server_messages_that_are_not_answers():
    """A hostile server sending a VERIFY with q rows must not make the device decode drafts
    and q rows it never asked for (up to 65535 ids a row, 64 rows, with the default limits):
    the link refuses it."""
    import threading

    from websockets.sync.server import serve

    from edgespec.runtime.errors import LinkError
    from edgespec.runtime.split.websocket import Link

    q = SparseQ(np.array([1], np.int32), np.array([SCALE]))
    hostile = P.encode(P.Verify(3, [1], [q]))

    def handler(conn):
        conn.recv()
        conn.send(hostile)
        time.sleep(1)

    with serve(handler, "127.0.0.1", 0) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        port = server.socket.getsockname()[1]
        link = Link(f"ws://127.0.0.1:{port}", None, 5)
        link.send(P.End())
        t0 = time.monotonic()
        with pytest.raises(LinkError, match="not an answer"):
            link.poll(5)
        assert time.monotonic() - t0 < 2
        link.close()
        server.shutdown()


CHAT_BODIES = [
    {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0},
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "x = "}]},
        ],
        "max_tokens": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    },
    {
        "messages": [{"role": "user", "content": "weather?"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        "chat_template_kwargs": {"enable_thinking": False},
        "max_tokens": 2,
        "stream": True,
        "model": "m",
    },
]


def mutate_chat(rng: random.Random, body: dict) -> bytes:
    """A chat body with a hostile value somewhere inside (not only at the top), streamed or
    not, or mangled as text."""
    body = json.loads(json.dumps(body))
    body["stream"] = rng.random() < 0.5
    if not body["stream"]:
        body.pop("stream_options", None)
    op = rng.randrange(4)
    if op == 0:  # a hostile value at a random place of the tree
        marker = "@@HOSTILE@@"
        _plant(rng, body, marker)
        return json.dumps(body).replace(f'"{marker}"', rng.choice(JSON_SWAPS), 1).encode()
    if op == 1:  # a template flag or an extra message field
        key = rng.choice(["messages", "tools", "template", "documents", "add_generation_prompt"])
        body["chat_template_kwargs"] = {key: 1} if rng.random() < 0.5 else {"x": [[1]]}
        body["messages"][0][rng.choice(["name", "extra", "\ud800"])] = "@"
        return json.dumps(body).encode()
    if op == 2:  # bytes flipped in the text
        raw = bytearray(json.dumps(body).encode())
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        return bytes(raw)
    return json.dumps(body).encode()  # well formed: answered 200


def _plant(rng: random.Random, tree: dict | list, marker: str) -> None:
    """Put `marker` in place of a random value (or a new key) somewhere in `tree`."""
    while True:
        keys = list(tree) if isinstance(tree, dict) else list(range(len(tree)))
        if not keys:
            break
        k = rng.choice(keys)
        if isinstance(tree[k], dict | list) and tree[k] and rng.random() < 0.7:
            tree = tree[k]
            continue
        tree[k] = marker
        return
    if isinstance(tree, dict):
        tree["extra"] = marker
    else:
        tree.append(marker)


@pytest.fixture(scope="module")
def chat_server(chat_bundle, tmp_path_factory):
    s = start_server(
        chat_bundle,
        tmp_path_factory.mktemp("fuzz-chat"),
        TOKEN,
        *("--max-sessions", "4", "--conversations", "2", "--max-context", "96"),
        *("--body-timeout", "5"),
    )
    yield s
    s.stop()


def test_mutated_chat_bodies_streamed_or_not_get_a_named_answer(chat_server):
    """Every chat body gets 200 or a 4xx naming the problem; every stream that started ends
    with [DONE] (an error event before it if the reply failed); nothing leaks."""
    rng = random.Random(SEED + 3)
    seen: dict[int, int] = {}
    for _ in range(150):
        data = mutate_chat(rng, rng.choice(CHAT_BODIES))
        req = urllib.request.Request(
            f"{chat_server.http}/v1/chat/completions",
            data=data,
            headers={"Authorization": f"Bearer {TOKEN}"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                status, text = r.status, r.read().decode()
                streamed = r.headers["content-type"].startswith("text/event-stream")
        except urllib.error.HTTPError as e:
            status, text, streamed = e.code, e.read().decode(), False
        seen[status] = seen.get(status, 0) + 1
        assert status in (200, 400, 413), (status, data[:200], text[:300])
        if streamed:
            assert text.endswith("data: [DONE]\n\n"), (data[:200], text[-300:])
        elif status != 200:
            assert json.loads(text)["error"]["message"], text
    assert seen.get(400) and seen.get(200), seen
    end = time.monotonic() + 10
    while chat_server.health()["sessions"] and time.monotonic() < end:
        time.sleep(0.05)
    assert chat_server.health()["sessions"] == 0
