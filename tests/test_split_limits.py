"""The device against a server's limits and a server that freezes: it learns the limits at
START, keeps rounds within them, finishes locally (or stops with a clear finish reason) when
the server can go no further, and decodes locally while a round is late. Output equals `ar`
in every case; real server processes on loopback."""

from __future__ import annotations

import os
import signal
import time

import pytest
from split_server import TOKEN, start_server
from websockets.sync.client import connect

import edgespec
from edgespec import protocol as P
from edgespec.runtime.draft_q import DraftSupport
from edgespec.runtime.round import Start

PROMPT = "def f(x):"
N = 80  # past the 48-position server below


@pytest.fixture(scope="module")
def bundle(long_bundle):
    return long_bundle


@pytest.fixture(scope="module")
def small_server(bundle, tmp_path_factory):
    s = start_server(
        bundle,
        tmp_path_factory.mktemp("small"),
        TOKEN,
        *("--max-context", "48", "--max-request-bytes", "4096"),
    )
    yield s
    s.stop()


@pytest.fixture(scope="module")
def ar_tokens(bundle):
    return edgespec.load(bundle, threads=1).generate(PROMPT, max_new_tokens=N, ignore_eos=True)


def split(bundle, url, **options):
    options.setdefault("drafter", "draft")
    options.setdefault("draft_policy", "fixed:3")
    return edgespec.load(bundle, mode="split", server=url, token=TOKEN, threads=1, **options)


def test_start_answer_carries_the_limits_only_when_asked(small_server):
    url, headers = f"{small_server.url}/v1/session", {"Authorization": f"Bearer {TOKEN}"}
    with connect(url, additional_headers=headers, proxy=None, subprotocols=[P.SUBPROTOCOL]) as c:
        c.send(P.encode(P.Start([1, 2, 3], 16)))
        first = P.decode(c.recv(timeout=10))
        limits = first.limits
        assert (limits.max_context, limits.max_request_bytes) == (48, 4096)
    # a device that does not offer the subprotocol (a protocol-1 device gets no further:
    # the server refuses its messages' version)
    with connect(url, additional_headers=headers, proxy=None) as plain:
        plain.send(P.encode(P.Start([1, 2, 3], 16)))
        frame = plain.recv(timeout=10)
        assert len(frame) == P.HEADER.size + P.RESULT_BODY.size  # the plain RESULT layout
        assert P.decode(frame).limits is None


def test_generation_past_the_servers_context_finishes_locally(bundle, small_server, ar_tokens):
    model = split(bundle, small_server.url)
    out = model.generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert out.tokens == ar_tokens.tokens  # before: ERROR 422 at position 49, SplitError
    assert out.stats.remote_rounds > 0 and out.stats.local_rounds > 0
    assert out.finish_reason == "length"


def test_without_a_local_verifier_the_server_limit_is_the_finish_reason(
    bundle, small_server, ar_tokens
):
    model = split(bundle, small_server.url, local_fallback=False)
    out = model.generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert out.finish_reason == "server_context"
    assert 0 < len(out.tokens) < N and out.tokens == ar_tokens.tokens[: len(out.tokens)]
    assert len(model.encode(PROMPT)) + len(out.tokens) >= 48


@pytest.mark.parametrize("top_k", [128, 0])
def test_sampled_rounds_stay_within_the_request_size(bundle, small_server, top_k):
    """Within the 4 KiB limit learned at START: top-128 q rows (773 bytes) let 3 drafts
    through; uncapped rows over the 2048 vocabulary (12 KiB each) do not fit even once, so
    the device sends γ = 0 rounds (the server generates) instead of an ERROR 413 ending the
    run."""
    model = split(bundle, small_server.url, draft_support=DraftSupport(top_k=top_k))
    out = model.generate(PROMPT, max_new_tokens=30, temperature=1.0, seed=3, ignore_eos=True)
    assert len(out.tokens) == 30 and out.stats.remote_rounds > 1
    assert (out.stats.drafted > 0) == (top_k == 128)


def test_generate_cli_exits_0_with_the_whole_text_past_the_servers_context(
    bundle, small_server, ar_tokens, tmp_path
):
    from click.testing import CliRunner

    from edgespec.cli import main

    (tmp_path / "token").write_text(TOKEN)
    args = ["generate", str(bundle), "-p", PROMPT, "-n", str(N), "--mode", "split"]
    args += ["--server", small_server.url, "--token-file", str(tmp_path / "token")]
    args += ["--ignore-eos", "--threads", "1", "--drafter", "draft"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert result.output.strip() == ar_tokens.text.strip()


def test_frozen_server_is_detected_from_round_times_and_decoding_goes_on(
    bundle, tmp_path, ar_tokens
):
    """SIGSTOP mid-generation: the device notices a late round within about 4x its usual
    round time (floor 0.5 s), decodes locally meanwhile, and after SIGCONT takes the server
    back; the default 10 s timeout never stalls it (before: 10-20 s without a token)."""
    s = start_server(bundle, tmp_path)
    try:
        model = split(bundle, s.url)
        tokens, gaps, verifiers = [], [], []
        last = time.monotonic()
        for i, chunk in enumerate(model.stream(PROMPT, max_new_tokens=N, ignore_eos=True)):
            now = time.monotonic()
            gaps.append(now - last)
            last = now
            tokens += chunk.tokens
            verifiers.append(chunk.stats.verifier)
            if i == 3:
                os.kill(s.proc.pid, signal.SIGSTOP)
            if i == 12:
                os.kill(s.proc.pid, signal.SIGCONT)
        assert tokens == ar_tokens.tokens
        assert "local" in verifiers[4:]
        assert max(gaps[4:]) < 3.0, gaps  # the late bound plus one local round, not 10 s
    finally:
        s.stop()


def test_against_a_server_that_announces_no_limits_the_refusal_ends_in_local_rounds(
    bundle, small_server, ar_tokens, monkeypatch
):
    """A server that announces no limits (`edgespec.limits` not negotiated: the device offers
    a name this server does not know; protocol-1 servers, which never announced them, refuse
    protocol-2 devices outright) refuses the round past its context with ERROR 422: the
    device finishes locally."""
    monkeypatch.setattr(P, "SUBPROTOCOL", "edgespec.not-this-one")
    monkeypatch.setattr(P, "TREES", "edgespec.nor-this-one")  # (the trees offer implies them)
    model = split(bundle, small_server.url)
    out = model.generate(PROMPT, max_new_tokens=N, ignore_eos=True)
    assert model.verifier.server.session.limits is None
    assert out.tokens == ar_tokens.tokens
    assert out.stats.remote_rounds > 0 and out.stats.local_rounds > 0


def test_a_round_sends_the_drafts_that_fit_and_leaves_the_callers_proposal_whole(
    bundle, small_server
):
    """A proposal longer than the server's session has room for: the VERIFY carries the
    prefix that fits, `Pending.sent` says how many, and the caller's proposal is unchanged
    (the decode loop recommits its drafter to `sent`)."""
    import numpy as np

    from edgespec.runtime.round import Proposal
    from edgespec.runtime.sampling import SamplingParams

    model = split(bundle, small_server.url)
    remote = model.verifier.server  # the RemoteVerifier inside the fallback
    params, rng = SamplingParams(0.0), np.random.default_rng(0)
    ids = model.encode(PROMPT)
    token, _ = remote.prefill(Start(ids, N, params, rng))
    seq = [*ids, token]
    room = 48 - len(seq)  # the server's context is 48 positions
    drafts = [int(t) for t in np.arange(room + 10) % 50 + 10]
    proposal = Proposal(list(drafts), "greedy")
    pending = remote.submit(seq, proposal, params, rng)
    assert proposal.tokens == drafts  # not shortened in place
    assert pending.sent == room
    verdict = pending.result()
    assert 0 <= verdict.accepted <= room and verdict.verifier == "remote"
    remote.close()
