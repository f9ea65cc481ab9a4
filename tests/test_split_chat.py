"""Split-mode conversations keep their server session: each turn resumes it, and the server
prefills only the positions past what its cache shares with the new prompt (its /health
counters say so), while every reply still equals transformers' apply_chat_template + greedy
generate. A session the server no longer holds (restarted, evicted, timed out, ended) is
rebuilt from the whole prompt; bad resumes get their own errors and harm no one else."""

from __future__ import annotations

import gc
import threading
import time

import pytest
from split_server import TOKEN, start_server
from test_chat_session import USERS, hf_reply
from websockets.sync.client import connect

import edgespec
from edgespec import protocol as P
from edgespec.runtime.chat.session import ChatOptions

GREEDY = ChatOptions(max_new_tokens=8, temperature=0)


@pytest.fixture(scope="module")
def hf_chat(chat_checkpoints):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = chat_checkpoints["target"]
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def server(chat_bundle, tmp_path_factory):
    s = start_server(chat_bundle, tmp_path_factory.mktemp("split_chat"), TOKEN, "--mode", "ar")
    yield s
    s.stop()


def split(bundle, url, **options):
    # late_after: rounds move here only when the link fails or times out, never because a
    # loaded machine answered late (the tests count local rounds)
    options = dict(drafter="draft", draft_policy="fixed:3", threads=1, late_after=10.0) | options
    return edgespec.load(bundle, mode="split", server=url, token=TOKEN, **options)


def counters(server) -> dict[str, int]:
    h = server.health()
    keys = ("positions_prefilled", "positions_kept", "resumes", "resumes_refused", "evictions")
    return {k: h[k] for k in keys}


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in before}


def turn(session, messages, hf_chat, server):
    """One turn: the reply (checked against transformers) and the server's counters' change."""
    before = counters(server)
    reply = session.reply(messages, GREEDY)
    assert reply.tokens == hf_reply(hf_chat, messages, GREEDY.max_new_tokens)[1]
    assert reply.stats.remote_rounds > 0 and reply.stats.local_rounds == 0
    return reply, delta(before, counters(server))


def follow(messages, reply, text):
    return [
        *messages,
        {"role": "assistant", "content": reply.text},
        {"role": "user", "content": text},
    ]


def wait_for(check, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not check() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert check()


def test_each_turn_resumes_the_server_session_and_prefills_only_new_positions(
    chat_bundle, hf_chat, server
):
    session = split(chat_bundle, server.url).chat_session()
    messages = [{"role": "user", "content": USERS[0]}]
    last_prompt = 0
    for number, text in enumerate([*USERS[1:], None], 1):
        reply, d = turn(session, messages, hf_chat, server)
        prefilled = reply.prompt_tokens - reply.cached_tokens
        assert d["positions_prefilled"] == prefilled and d["positions_kept"] == reply.cached_tokens
        assert reply.stats.prefill_tokens == prefilled
        if number == 1:
            assert reply.cached_tokens == 0 and d["resumes"] == 0
        else:  # the whole last prompt (and the part of the reply that re-encodes) was kept
            assert reply.cached_tokens >= last_prompt and d["resumes"] == 1
        assert d["resumes_refused"] == 0
        health = server.health()
        assert (health["sessions"], health["sessions_paused"]) == (1, 1)  # held between turns
        last_prompt = reply.prompt_tokens
        if text is not None:
            messages = follow(messages, reply, text)
    session.close()
    wait_for(lambda: server.health()["sessions"] == 0)


def test_a_garbage_collected_session_ends_its_server_session(chat_bundle, hf_chat, server):
    session = split(chat_bundle, server.url).chat_session()
    turn(session, [{"role": "user", "content": USERS[0]}], hf_chat, server)
    assert server.health()["sessions"] == 1
    del session
    gc.collect()
    wait_for(lambda: server.health()["sessions"] == 0)


def test_a_session_ended_behind_the_devices_back_is_refused_and_rebuilt_on_the_same_link(
    chat_bundle, hf_chat, server
):
    session = split(chat_bundle, server.url).chat_session()
    messages = [{"role": "user", "content": USERS[0]}]
    reply, _ = turn(session, messages, hf_chat, server)
    link = session.remote.link
    link.send(P.End())  # the server frees the session; the device still thinks it is held
    messages = follow(messages, reply, USERS[1])
    reply, d = turn(session, messages, hf_chat, server)
    assert d["resumes_refused"] == 1 and d["resumes"] == 0  # ERROR 410, then a full START
    assert d["positions_prefilled"] == reply.prompt_tokens and reply.cached_tokens == 0
    assert session.remote.link is link  # the refusal left the connection open
    session.close()


@pytest.mark.parametrize("how", ["restart", "evict", "idle"])
def test_a_session_the_server_lost_between_turns_is_rebuilt_from_the_whole_prompt(
    chat_bundle, hf_chat, tmp_path, how
):
    args = {"restart": (), "evict": ("--max-sessions", "1"), "idle": ("--idle-timeout", "1")}
    server = start_server(chat_bundle, tmp_path, TOKEN, "--mode", "ar", *args[how])
    try:
        session = split(chat_bundle, server.url).chat_session()
        messages = [{"role": "user", "content": USERS[0]}]
        reply, _ = turn(session, messages, hf_chat, server)
        if how == "restart":
            server.stop()
            server = start_server(chat_bundle, tmp_path, TOKEN, "--mode", "ar", port=server.port)
        elif how == "evict":  # a newcomer to the full server takes the paused session's slot
            headers = {"Authorization": f"Bearer {TOKEN}"}
            with connect(f"{server.url}/v1/session", additional_headers=headers) as other:
                other.send(P.encode(P.Start([1, 2, 3], 8)))
                assert isinstance(P.decode(other.recv(timeout=10)), P.Result)
            assert server.health()["evictions"] == 1
        else:
            time.sleep(1.5)
        messages = follow(messages, reply, USERS[1])
        reply, d = turn(session, messages, hf_chat, server)
        assert reply.cached_tokens == 0 and d["positions_kept"] == 0
        assert d["positions_prefilled"] == reply.prompt_tokens
        session.close()
    finally:
        server.stop()


def test_concurrent_split_chats_do_not_leak_into_each_others_caches(chat_bundle, hf_chat, server):
    # two devices (a model's graph sessions serve one thread at a time)
    models = [split(chat_bundle, server.url) for _ in (0, 1)]
    openers = ["Tell me about cats.", "Write a poem about the sea, please."]
    seen: dict[int, list] = {0: [], 1: []}
    errors: list[BaseException] = []

    def chat(k: int) -> None:
        try:
            session = models[k].chat_session(system="You are terse." if k else None)
            messages = [{"role": "system", "content": "You are terse."}] if k else []
            messages.append({"role": "user", "content": openers[k]})
            for text in USERS:
                reply = session.reply(messages, GREEDY)
                seen[k].append((messages, reply))
                messages = follow(messages, reply, text)
            session.close()
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=chat, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    for k in (0, 1):
        assert len(seen[k]) == len(USERS)
        for number, (messages, reply) in enumerate(seen[k]):
            assert reply.tokens == hf_reply(hf_chat, messages, GREEDY.max_new_tokens)[1]
            assert (reply.cached_tokens > 0) == (number > 0)


def ws(server):
    headers = {"Authorization": f"Bearer {TOKEN}"}
    return connect(f"{server.url}/v1/session", additional_headers=headers, proxy=None)


def ask(conn, msg) -> P.Message:
    conn.send(P.encode(msg))
    return P.decode(conn.recv(timeout=10))


def test_a_resumed_session_answers_as_a_fresh_one_and_bad_resumes_get_their_errors(server):
    with ws(server) as a, ws(server) as b, ws(server) as fresh:
        gone = ask(a, P.Start([4], 32, keep=3))  # nothing to resume on a new connection
        assert isinstance(gone, P.Error) and gone.code == P.GONE
        assert "no session to resume" in gone.text
        first = ask(a, P.Start([1, 2, 3, 4, 5], 32))  # the connection is still open
        assert isinstance(first, P.Result) and first.length == 6
        other = ask(b, P.Start([9, 8, 7], 32))
        a.send(P.encode(P.Pause()))
        past = ask(a, P.Start([6], 32, keep=6))  # the cache holds 5 positions
        assert isinstance(past, P.Error) and past.code == P.OUT_OF_SYNC
        assert "holds 5 positions" in past.text
        # the refused resume changed nothing: keep 4 of the 5, then new ids
        resumed = ask(a, P.Start([5, first.token, 11], 32, keep=4))
        want = ask(fresh, P.Start([1, 2, 3, 4, 5, first.token, 11], 32))
        assert isinstance(resumed, P.Result) and isinstance(want, P.Result)
        assert (resumed.token, resumed.length) == (want.token, want.length)
        step, step_want = (
            ask(a, P.Verify(resumed.length, [])),
            ask(fresh, P.Verify(want.length, [])),
        )
        assert isinstance(step, P.Result) and isinstance(step_want, P.Result)
        assert (step.token, step.length) == (step_want.token, step_want.length)
        # the other session went on untouched
        nxt = ask(b, P.Verify(other.length, []))
        assert isinstance(nxt, P.Result) and nxt.length == other.length + 1
        # a resume is bounded by the server's context like a START
        context = server.health()["max_context"]
        over = ask(a, P.Start([1] * context, 32, keep=3))
        assert isinstance(over, P.Error) and over.code == P.BAD_REQUEST and "context" in over.text


def test_sampled_turns_resume_the_server_session_too(chat_bundle, server):
    session = split(chat_bundle, server.url).chat_session()
    sampled = ChatOptions(max_new_tokens=8, temperature=0.8, top_p=0.9, seed=5)
    messages = [{"role": "user", "content": USERS[0]}]
    first = session.reply(messages, sampled)
    before = counters(server)
    second = session.reply(follow(messages, first, USERS[1]), sampled)
    d = delta(before, counters(server))
    assert second.cached_tokens >= first.prompt_tokens and d["resumes"] == 1
    assert d["positions_prefilled"] == second.prompt_tokens - second.cached_tokens
    assert second.stats.remote_rounds > 0 and second.stats.local_rounds == 0
    session.close()
