"""Structured output in split mode: the device sends the grammar once with START, the server
masks its verification by it, and greedy constrained output equals the local constrained
target's; a grammar the server cannot use is refused with a clear error; a server killed
mid-reply leaves the device to finish it under the same grammar."""

from __future__ import annotations

import json
import time

import pytest
from split_server import TOKEN, start_server
from test_structured_output import FORMAT, PERSON, PROMPT

import edgespec
from edgespec import protocol as P

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")
N = 60


@pytest.fixture(scope="module")
def bundle(spec_bundles):
    return spec_bundles["qwen2"]


@pytest.fixture(scope="module")
def server(bundle, tmp_path_factory):
    s = start_server(bundle, tmp_path_factory.mktemp("server"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def local(bundle):
    return edgespec.load(bundle).generate(PROMPT, max_new_tokens=N, response_format=FORMAT)


def split(bundle, url, **options):
    return edgespec.load(bundle, mode="split", server=url, token=TOKEN, threads=1, **options)


@pytest.mark.parametrize("drafter, policy", [("draft", "fixed:3"), ("lookup", "fixed:4")])
def test_split_constrained_output_equals_the_local_constrained_target(
    bundle, server, local, drafter, policy
):
    model = split(bundle, server.url, drafter=drafter, draft_policy=policy)
    out = model.generate(PROMPT, max_new_tokens=N, response_format=FORMAT)
    assert out.tokens == local.tokens
    assert out.stats.remote_rounds > 1 and out.stats.local_rounds == 0
    if out.finish_reason == "eos":
        jsonschema.validate(json.loads(out.text), PERSON)


def test_start_carries_the_grammar_once_and_round_trips():
    msg = P.Start([1, 2, 3], 64, grammar=('{"grammars": []}', 3))
    back = P.decode(P.encode(msg))
    assert isinstance(back, P.Start)
    assert back.grammar == ('{"grammars": []}', 3)
    plain = P.decode(P.encode(P.Start([1, 2, 3], 64)))
    assert plain.grammar is None and len(P.encode(msg)) > len(P.encode(P.Start([1, 2, 3], 64)))


def test_a_grammar_the_server_cannot_use_is_refused_clearly(bundle, server):
    """A START whose grammar does not compile: ERROR 422 naming the problem (that session
    ends; the server serves the next one)."""
    from test_split_server import refused, ws

    ids = edgespec.load(bundle).encode(PROMPT)
    for grammar, words in [
        ('{"grammars": [{"json_schema": {"type": "nope"}}]}', "nope"),
        ("not json at all", "grammar"),
    ]:
        with ws(server) as conn:
            start = P.Start(ids, 64, grammar=(grammar, len(ids)))
            err = refused(conn, P.encode(start))
            assert err.code == P.BAD_REQUEST and words in err.text
    with ws(server) as conn:
        conn.send(P.encode(P.Start(ids, 64)))
        assert isinstance(P.decode(conn.recv(timeout=30)), P.Result)


def test_a_server_killed_mid_reply_leaves_the_device_to_finish_it_under_the_grammar(
    bundle, tmp_path, local
):
    s = start_server(bundle, tmp_path)
    try:
        model = split(bundle, s.url, drafter="draft", draft_policy="fixed:2", timeout=1.0)
        model.remote.connect_timeout, model.remote.retries, model.remote.backoff = 0.5, 1, 0.05
        tokens, verifiers = [], []
        start = time.monotonic()
        for i, chunk in enumerate(model.stream(PROMPT, max_new_tokens=N, response_format=FORMAT)):
            tokens += chunk.tokens
            verifiers.append(chunk.stats.verifier)
            if i == 3:
                s.proc.kill()
        assert time.monotonic() - start < 20
    finally:
        s.stop()
    assert tokens == local.tokens
    assert "remote" in verifiers and verifiers[-1] == "local"
