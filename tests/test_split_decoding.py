"""Split decoding against a real server process: lossless greedy output for every drafter,
concurrent sessions, and the fault cases (server down, killed, stalled)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from split_server import TOKEN, free_port, start_server

import edgespec
from edgespec.runtime.errors import InputError, SplitError

ARCH = "llama-gqa-tied"
PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n"
N = 40


@pytest.fixture(scope="module")
def bundle(spec_bundles):
    return spec_bundles[ARCH]


@pytest.fixture(scope="module")
def server(bundle, tmp_path_factory):
    s = start_server(bundle, tmp_path_factory.mktemp("server"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def ar_tokens(bundle):
    ar = edgespec.load(bundle, threads=1)
    return {p: ar.generate(p, max_new_tokens=N, ignore_eos=True).tokens for p in (PROMPT, "x = ")}


def split(bundle, url, **options):
    options.setdefault("token", TOKEN)
    # rounds move here only when the link fails or times out (late_after is capped by the
    # timeout), never because a loaded machine answered late: the tests count local rounds
    options.setdefault("late_after", 10.0)
    return edgespec.load(bundle, mode="split", server=url, threads=1, **options)


@pytest.mark.parametrize(
    "drafter, policy",
    [
        ("draft", "fixed:3"),
        ("exit:2", "fixed:4"),
        ("lookup", "fixed:5"),
        ("draft", "fixed:0"),  # cloud-only: one server round trip per token
        ("draft", None),  # the default policy
    ],
)
def test_split_greedy_output_equals_ar(bundle, server, ar_tokens, drafter, policy):
    model = split(bundle, server.url, drafter=drafter, draft_policy=policy)
    out = model.generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert out.tokens == ar_tokens[PROMPT]
    assert out.stats.remote_rounds > 1 and out.stats.local_rounds == 0
    assert out.stats.bytes_up > 0 and out.stats.bytes_down > 0
    if policy != "fixed:0":
        assert out.stats.drafted > 0


def test_round_stats_carry_the_channel(bundle, server):
    model = split(bundle, server.url, drafter="draft", draft_policy="fixed:3")
    rounds = [c.stats for c in model.stream(PROMPT, max_new_tokens=12, ignore_eos=True)]
    decode = [r for r in rounds if r.phase == "decode"]
    assert all(r.verifier == "remote" for r in rounds)
    for r in decode:
        assert r.server_seconds > 0 and r.network_seconds >= 0
        assert r.seconds >= r.server_seconds
        # header + drafts as int32 + framing
        assert r.bytes_up == 6 + 12 + 9 + 4 * r.drafted
        assert r.bytes_down == 2 + 12 + 14  # framing + header + RESULT (limits: START only)


def test_generations_reuse_one_connection_and_stay_lossless(bundle, server, ar_tokens):
    model = split(bundle, server.url, drafter="draft", draft_policy="fixed:2")
    for _ in range(2):
        for prompt in (PROMPT, "x = "):
            assert (
                model.generate(prompt, max_new_tokens=N, ignore_eos=True).tokens
                == (ar_tokens[prompt])
            )


def test_two_concurrent_sessions_do_not_interfere(bundle, server, ar_tokens):
    results: dict[str, list[int]] = {}

    def run(prompt: str) -> None:
        model = split(bundle, server.url, drafter="draft", draft_policy="fixed:3")
        for _ in range(2):
            results[prompt] = model.generate(prompt, max_new_tokens=N, ignore_eos=True).tokens

    threads = [threading.Thread(target=run, args=(p,)) for p in (PROMPT, "x = ")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert results == ar_tokens


def test_server_down_at_start_continues_locally(bundle, ar_tokens):
    model = split(bundle, f"ws://127.0.0.1:{free_port()}", drafter="draft")
    model.remote.retries, model.remote.backoff = 1, 0.05
    out = model.generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert out.tokens == ar_tokens[PROMPT]
    assert out.stats.remote_rounds == 0 and out.stats.local_rounds > 0


def test_server_down_without_a_local_verifier_is_a_clear_error(bundle):
    model = split(bundle, f"ws://127.0.0.1:{free_port()}", local_fallback=False)
    model.remote.retries, model.remote.backoff = 1, 0.05
    with pytest.raises(SplitError, match="no local verifier"):
        model.generate(PROMPT, max_new_tokens=4)


def test_wrong_token_is_refused(bundle, server):
    for token in (None, "wrong"):
        model = split(bundle, server.url, token=token)
        with pytest.raises(SplitError, match="401"):
            model.generate(PROMPT, max_new_tokens=4)


def _fault_mid_generation(bundle, tmp_path, ar_tokens, fault):
    s = start_server(bundle, tmp_path)
    try:
        model = split(bundle, s.url, drafter="draft", draft_policy="fixed:2", timeout=1.0)
        model.remote.connect_timeout, model.remote.retries, model.remote.backoff = 0.5, 1, 0.05
        tokens, rounds = [], []
        start = time.monotonic()
        for i, chunk in enumerate(model.stream(PROMPT, max_new_tokens=N, ignore_eos=True)):
            tokens += chunk.tokens
            rounds.append(chunk.stats)
            if i == 3:
                fault(s)
        assert time.monotonic() - start < 20
    finally:
        s.stop()
    assert tokens == ar_tokens[PROMPT]  # nothing unverified, nothing lost
    verifiers = [r.verifier for r in rounds]
    assert verifiers[:4] == ["remote"] * 4 and verifiers[-1] == "local"
    return rounds


def test_server_killed_mid_generation_continues_locally(bundle, tmp_path, ar_tokens):
    _fault_mid_generation(bundle, tmp_path, ar_tokens, lambda s: s.proc.kill())


def test_stalled_server_times_out_and_continues_locally(bundle, tmp_path, ar_tokens):
    _fault_mid_generation(
        bundle, tmp_path, ar_tokens, lambda s: os.kill(s.proc.pid, signal.SIGSTOP)
    )


def test_generate_cli_split_mode(bundle, server, tmp_path, ar_tokens):
    from click.testing import CliRunner

    from edgespec.cli import main

    (tmp_path / "token").write_text(TOKEN)
    args = ["generate", str(bundle), "-p", PROMPT, "-n", "12", "--mode", "split"]
    args += ["--server", server.url, "--token-file", str(tmp_path / "token"), "--stats"]
    args += ["--drafter", "exit:2", "--threads", "1"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "verified by the server" in result.output
    bad = CliRunner().invoke(main, ["generate", str(bundle), "-p", "x", "--server", server.url])
    assert bad.exit_code != 0 and "--mode split" in bad.output


def test_late_after_replaces_the_adaptive_late_deadline_and_is_checked(bundle):
    url = f"ws://127.0.0.1:{free_port()}"  # loading connects to nothing
    adaptive = split(bundle, url, late_after=None).remote
    adaptive.round_seconds = 0.5
    assert adaptive.late_after() == 2.0  # 4x the round trip
    fixed = split(bundle, url, late_after=3.0, timeout=10.0).remote
    fixed.round_seconds = 0.5
    assert fixed.late_after() == 3.0
    never = split(bundle, url, late_after=60.0, timeout=10.0).remote
    never.round_seconds = 0.5
    assert never.late_after() == 10.0  # capped by the timeout: only a timeout moves rounds
    for bad in (0, -1.0, float("nan"), True):
        with pytest.raises(InputError, match="late_after"):
            split(bundle, url, late_after=bad)


def test_a_full_server_is_probed_every_retry_interval_and_used_once_a_slot_frees(
    bundle, tmp_path, ar_tokens
):
    """A server that refuses the session as full (503) is up: the device verifies here
    meanwhile, tries the server again every retry interval (not at the growing intervals of a
    server that does not answer) and goes back to it as soon as a slot is free."""
    from websockets.sync.client import connect

    from edgespec import protocol as P

    s = start_server(bundle, tmp_path, TOKEN, "--max-sessions", "1")
    try:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        holder = connect(f"{s.url}/v1/session", additional_headers=auth, proxy=None, legacy=True)
        holder.send(P.encode(P.Start([1, 2], 8)))
        assert isinstance(P.decode(holder.recv(timeout=10)), P.Result)  # the one slot
        model = split(bundle, s.url, drafter="draft", draft_policy="fixed:2")
        model.remote.retries, model.remote.backoff = 1, 0.05
        fallback = model.verifier
        fallback.first_retry = fallback.retry_after = 0.05
        tokens, rounds = [], []
        for i, chunk in enumerate(model.stream(PROMPT, max_new_tokens=N, ignore_eos=True)):
            tokens += chunk.tokens
            rounds.append(chunk.stats)
            if i == 3:
                assert fallback.reconnects == 0 and "full" in fallback.last_error
                # refused at every try so far, the next try is still one interval away
                assert fallback.retry_after == fallback.first_retry
                holder.close()
                deadline = time.monotonic() + 30
                while s.health()["sessions"] and time.monotonic() < deadline:
                    time.sleep(0.05)
                time.sleep(fallback.first_retry)  # the next round tries the server
    finally:
        s.stop()
    assert tokens == ar_tokens[PROMPT]
    verifiers = [r.verifier for r in rounds]
    assert verifiers[:4] == ["local"] * 4 and verifiers[-1] == "remote"
    assert fallback.reconnects == 1
