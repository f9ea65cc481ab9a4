"""Server streaming as a mode of split decoding, against the real server on loopback: the
server decodes on its own and streams, the device takes decoding back at any token (split
rounds, local rounds) with output equal to `ar`, a busy server answers "verify only", and a
device whose link dies mid-stream finishes locally with the same text."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import pytest
from split_server import TOKEN, hold_worker, queued, serve_in_process, start_server

import edgespec
from edgespec.runtime.round import Plan
from edgespec.runtime.stats import RoundStats
from edgespec.tools.channel import Channel

ARCH = "llama-gqa-tied"
PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n"
N = 40


@dataclass
class Scripted:
    """A placement policy that follows a script of (where, γ) per round, then repeats its
    last entry; it records what it observed."""

    script: list[tuple[str, int]]
    seen: list[RoundStats] = field(default_factory=list)

    def plan(self, source: str | None = None) -> Plan:
        k = sum(s.phase == "decode" for s in self.seen)
        where, gamma = self.script[min(k, len(self.script) - 1)]
        return Plan(gamma, where=where)  # type: ignore[arg-type]

    def observe(self, stats: RoundStats) -> None:
        self.seen.append(stats)

    def channel_estimates(self) -> tuple[float | None, float | None]:
        return None, None


@pytest.fixture(scope="module")
def bundle(spec_bundles):
    return spec_bundles[ARCH]


@pytest.fixture(scope="module")
def server(bundle, tmp_path_factory):
    s = start_server(bundle, tmp_path_factory.mktemp("server"), TOKEN, "--mode", "spec")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def ar_tokens(bundle):
    ar = edgespec.load(bundle, threads=1)
    return ar.generate(PROMPT, max_new_tokens=N, ignore_eos=True).tokens


def split(bundle, url, script, **options):
    model = edgespec.load(
        bundle, mode="split", server=url, token=TOKEN, threads=1, late_after=10.0, **options
    )
    model.policy = Scripted(script)
    return model


def test_streamed_greedy_output_equals_ar(bundle, server, ar_tokens):
    model = split(bundle, server.url, [("stream", 0)])
    before = server.health()["streaming"]["tokens"]
    out = model.generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert out.tokens == ar_tokens
    assert out.stats.stream_rounds >= 1 and out.stats.local_rounds == 0
    assert out.stats.drafted == 0  # the device drafted nothing: the server decoded
    # the server counts a round's tokens after it sent them: wait for its count to settle
    deadline, streamed = time.monotonic() + 30, 0
    while (streamed := server.health()["streaming"]["tokens"] - before) < N - 1:
        assert time.monotonic() < deadline, streamed
        time.sleep(0.05)
    assert streamed == N - 1
    # fewer decode-loop rounds than tokens: rounds carry several streamed tokens
    assert out.stats.bytes_down > 0 and out.stats.bytes_up > 0


@pytest.mark.parametrize(
    "script",
    [
        [("stream", 0), ("split", 3), ("split", 2), ("stream", 0)],
        [("split", 2), ("stream", 0), ("local", 3), ("local", 2), ("stream", 0)],
        [("stream", 0), ("local", 2), ("split", 3), ("stream", 0), ("split", 1)],
        [("split", 2), ("local", 2), ("split", 3)],  # the server learns what it lacks
    ],
)
def test_decoding_moves_between_server_device_and_stream(bundle, server, ar_tokens, script):
    model = split(bundle, server.url, script)
    out = model.generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert out.tokens == ar_tokens
    # how far the first stream gets before it is taken back depends on the machine's speed:
    # every placement is lossless, wherever the script's turns land
    if any(w == "stream" for w, _ in script):
        assert "stream" in {s.verifier for s in model.policy.seen if s.phase == "decode"}


def test_a_conversation_streams_and_resumes_its_server_session(bundle, server):
    ar = edgespec.load(bundle, threads=1)
    model = split(bundle, server.url, [("stream", 0)])
    for prompt in (PROMPT, PROMPT + "x = 1\n"):
        want = ar.generate(prompt, max_new_tokens=12, ignore_eos=True).tokens
        assert model.generate(prompt, max_new_tokens=12, ignore_eos=True).tokens == want


def test_a_busy_server_answers_verify_only_and_the_device_drafts(bundle, tmp_path, ar_tokens):
    s = start_server(bundle, tmp_path, TOKEN, "--max-streams", "0")
    try:
        model = split(bundle, s.url, [("stream", 0)])
        out = model.generate(PROMPT, max_new_tokens=N, ignore_eos=True)
        assert out.tokens == ar_tokens
        assert out.stats.stream_rounds == 0 and out.stats.local_rounds == 0
        assert all(r.server_busy for r in model.policy.seen if r.phase == "decode")
        assert s.health()["streaming"]["streams_refused"] >= 1
    finally:
        s.stop()


def _one_streamed_round(server, steps) -> tuple[list, object]:
    """Let exactly the stream's first round through the server's worker, then hold it; the
    device's chunk of that round, and the hold."""
    first = hold_worker(server.state)
    got: list = []
    reader = threading.Thread(target=lambda: got.append(next(steps)))
    reader.start()
    while queued(server.state) < 1:  # the stream's first round waits behind the hold
        reader.join(0.005)
    second = hold_worker(server.state, wait=False)
    first.release()
    reader.join(30)
    assert got and got[0].stats.verifier == "stream"
    second.wait_held()
    return got, second


def test_the_device_takes_decoding_back_mid_stream(bundle, ar_tokens):
    server = serve_in_process(bundle, mode="spec")
    try:
        model = split(bundle, server.url, [("stream", 0), ("split", 3), ("split", 2), ("local", 2)])
        steps = model.stream(PROMPT, max_new_tokens=N, ignore_eos=True)
        chunks = [next(steps)]
        got, held = _one_streamed_round(server, steps)
        chunks += got
        threading.Timer(0.2, held.release).start()  # the STOP arrives while the round waits
        chunks += list(steps)
        assert [t for c in chunks for t in c.tokens] == ar_tokens
        where = [c.stats.verifier for c in chunks[1:]]
        # the round that stopped the stream reads its FINAL tokens, then the device drafts
        assert where[:3] == ["stream", "stream", "remote"] and "device" in where
        assert server.state.streams.running == 0
    finally:
        server.stop()


def test_a_link_that_dies_mid_stream_finishes_locally_with_the_same_text(bundle, ar_tokens):
    server = serve_in_process(bundle, mode="spec")
    channel = Channel(f"127.0.0.1:{server.port}").start()
    try:
        model = split(bundle, f"ws://{channel.address}", [("stream", 0)])
        model.remote.retries, model.remote.connect_timeout = 0, 0.5
        steps = model.stream(PROMPT, max_new_tokens=N, ignore_eos=True)
        chunks = [next(steps)]  # the prefill
        got, held = _one_streamed_round(server, steps)
        channel.stop()  # the link dies while the server's stream is held mid-way
        chunks += got
        chunks += list(steps)
        held.release()
        tokens = [t for c in chunks for t in c.tokens]
        assert tokens == ar_tokens
        assert any(c.stats.verifier == "local" for c in chunks)
        assert sum(len(c.tokens) for c in chunks if c.stats.verifier == "stream") < N - 1
    finally:
        channel.stop()
        server.stop()


def test_the_default_placement_is_lossless_wherever_it_decodes(bundle, server, ar_tokens):
    model = edgespec.load(bundle, mode="split", server=server.url, token=TOKEN, threads=1)
    assert type(model.policy).__name__ == "Placement"
    for _ in range(2):  # the second generation starts from what the first one measured
        out = model.generate(PROMPT, max_new_tokens=N, ignore_eos=True)
        assert out.tokens == ar_tokens


def test_stream_messages_round_trip_and_malformed_ones_are_refused():
    from edgespec import protocol as P

    shed = P.Tokens([5], 21, 0.25, final=True, shed=True)  # FINAL: the server got busy
    for msg in (P.Stream(17, 64), P.Tokens([5, 6, 7], 20, 0.25, final=True), shed, P.Stop()):
        msg.session, msg.round = 3, 9
        assert P.decode(P.encode(msg)) == msg
    empty = P.encode(P.Tokens([], 20, 0.0))
    with pytest.raises(P.ProtocolError, match="no token"):
        P.decode(empty)
    bad = bytearray(P.encode(P.Tokens([1], 2, 0.0)))
    bad[P.HEADER.size] = 0x80  # an unknown flag
    with pytest.raises(P.ProtocolError, match="unknown flags"):
        P.decode(bytes(bad))
    with pytest.raises(P.ProtocolError, match="truncated"):
        P.decode(P.encode(P.Stream(1, 2))[:-1])


def test_after_decoding_here_the_next_prefill_is_here_too(bundle, server, ar_tokens):
    model = split(bundle, server.url, [("local", 2)])
    assert model.generate(PROMPT, max_new_tokens=N, ignore_eos=True).tokens == ar_tokens
    model.policy = Scripted([("local", 2), ("split", 3), ("stream", 0)])
    chunks = list(model.stream(PROMPT, max_new_tokens=N, ignore_eos=True))
    assert [t for c in chunks for t in c.tokens] == ar_tokens
    assert chunks[0].stats.phase == "prefill" and chunks[0].stats.verifier == "device"
    # then the server learns the sequence (a START) and verifies and streams again
    assert {"remote", "stream"} <= {c.stats.verifier for c in chunks[1:]}


def test_a_busy_server_hands_a_running_stream_back_and_the_device_decodes_on(bundle, ar_tokens):
    from websockets.sync.client import connect

    server = serve_in_process(bundle, mode="spec", stream_below=2)  # busy at 2 sessions
    try:
        model = split(bundle, server.url, [("stream", 0)])  # it asks to stream every round
        steps = model.stream(PROMPT, max_new_tokens=N, ignore_eos=True)
        chunks = [next(steps)]
        got, held = _one_streamed_round(server, steps)  # the stream's 2nd round is held
        chunks += got
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with connect(f"{server.url}/v1/session", additional_headers=headers, proxy=None):
            while len(server.state.connections) < 2:  # a second device: the server is busy
                threading.Event().wait(0.005)
            held.release()  # the held round ends, and the stream is shed after it
            chunks += list(steps)
        assert [t for c in chunks for t in c.tokens] == ar_tokens
        decode = [c.stats for c in chunks[1:]]
        shed = next(i for i, s in enumerate(decode) if s.server_busy)
        assert decode[shed].verifier == "stream"  # the shed stream's FINAL tokens
        # then the device drafts: its requests to stream again are refused while busy
        assert {s.verifier for s in decode[shed + 1 :]} == {"remote"}
        assert all(s.server_busy for s in decode[shed + 1 :])
        assert server.state.streams.shed == 1 and server.state.streams.running == 0
    finally:
        server.stop()


def test_a_local_rounds_catch_up_on_server_tokens_is_not_priced_as_its_draft_length(
    bundle, server, ar_tokens
):
    """After rounds at the server the local graphs lack those tokens: the first local round
    feeds them first. That one-off goes to `catchup_seconds`, which the cost models leave out,
    not into the round's price (priced in, it made a γ look several times dearer than it is,
    and placement's local `auto` stayed plain for generations)."""
    from edgespec.runtime.policies.estimates import CostModel

    script = [("split", 3)] * 6 + [("local", 3)] * 2
    # the draft model alone: behind prompt lookup (the default chain) it has catch-ups of its
    # own after rounds lookup drafted
    model = split(bundle, server.url, script, drafter="draft")
    out = model.generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert out.tokens == ar_tokens
    local = [s for s in model.policy.seen if s.phase == "decode" and s.verifier == "device"]
    first, later = local[0], local[1:]
    assert first.catchup_seconds > 0  # it fed the graphs the tokens decoded at the server
    assert all(s.catchup_seconds == 0 for s in later)  # in step since
    cost = CostModel()
    cost.observe(first)
    assert cost.round_time[first.drafted] == pytest.approx(first.seconds - first.catchup_seconds)
