"""What a client controls never becomes a 500 or a cut stream, and `--max-sessions` bounds
split sessions and OpenAI requests together.

Each hostile body gets a 400 naming the field (lone UTF-16 surrogates anywhere, JSON nested
past the limit, template flags the renderer sets itself, integers past Python's int-string
limit); a streamed reply that fails after its 200 headers ends with an error event and
`[DONE]`. The session cap holds in both directions, with the real `openai` client and the
real device client: OpenAI requests filling it turn a device away (it decodes locally, the
same tokens), devices filling it turn OpenAI requests away (503). The server is the real app
in this process, so a test can hold its worker while it arranges who is admitted.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request

import openai
import pytest
from split_server import TOKEN, hold_worker, serve_in_process

import edgespec

DEEP = 600  # past the template's recursion, inside what Python's JSON parser accepts
CHAT = '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2'


@pytest.fixture(scope="module")
def server(chat_bundle):
    s = serve_in_process(chat_bundle, max_sessions=4, conversations=2)
    yield s
    s.stop()


def post(server, path: str, body: str) -> tuple[int, dict | str]:
    req = urllib.request.Request(
        f"{server.http}{path}",
        data=body.encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            text = r.read().decode()
            return r.status, text if "text/event-stream" in r.headers[
                "content-type"
            ] else json.loads(text)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


HOSTILE = [
    # lone surrogates: in content, in a completion prompt, in the echoed model name, in a key
    (
        "/v1/chat/completions",
        '{"messages": [{"role": "user", "content": "a\\ud800b"}]}',
        "messages[0].content",
    ),
    ("/v1/completions", '{"prompt": "a\\ud800b", "max_tokens": 2}', "prompt"),
    ("/v1/chat/completions", CHAT + ', "model": "\\ud800"}', "model"),
    ("/v1/chat/completions", CHAT + ', "model": "\\ud800", "stream": true}', "model"),
    (
        "/v1/completions",
        '{"prompt": "x", "max_tokens": 2, "model": "\\udfff", "stream": true}',
        "model",
    ),
    (
        "/v1/chat/completions",
        '{"messages": [{"role": "user", "content": "hi", "\\ud800": 1}], "max_tokens": 2}',
        "messages[0].\\ud800",
    ),
    # nesting past the limit, in tools and in an extra message field
    ("/v1/chat/completions", CHAT + f', "tools": [{{"x": {nested(DEEP)}}}]}}', "tools[0].x"),
    (
        "/v1/chat/completions",
        f'{{"messages": [{{"role": "user", "content": "hi", "extra": {nested(DEEP)}}}]}}',
        "messages[0].extra",
    ),
    # a number past Python's 4,300-digit int-string limit
    ("/v1/completions", '{"prompt": "x", "max_tokens": 1' + "0" * 5000 + "}", "max_tokens"),
    ("/v1/chat/completions", CHAT + ', "seed": -' + "9" * 5000 + "}", "seed"),
] + [
    # template flags the renderer sets itself
    (
        "/v1/chat/completions",
        CHAT + f', "chat_template_kwargs": {{"{key}": 1}}}}',
        f"chat_template_kwargs.{key}",
    )
    for key in ("messages", "add_generation_prompt", "tools", "documents", "template")
]


@pytest.mark.parametrize("path, body, param", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_bodies_get_a_400_naming_the_field(server, path, body, param):
    status, answer = post(server, path, body)
    assert status == 400, answer
    assert isinstance(answer, dict) and answer["error"]["param"].startswith(param), answer
    assert answer["error"]["message"], answer


def test_the_server_is_healthy_after_the_hostile_bodies(server):
    status, answer = post(server, "/v1/completions", '{"prompt": "x = ", "max_tokens": 3}')
    assert status == 200 and answer["usage"]["completion_tokens"] >= 1, answer
    assert server.health()["sessions"] == 0


def test_a_stream_that_fails_after_its_headers_ends_with_an_error_event_and_done(server):
    """A reply whose chunks cannot be encoded (a model name that is not text, as the parser
    now refuses) fails after the 200 headers: the stream still ends in an error and [DONE]."""
    from edgespec.runtime.chat.session import ChatOptions
    from edgespec.serve.openai import _Shape, _stream

    engine = server.state.chat
    prompt = engine.sessions[0].prepare(
        [{"role": "user", "content": "hi"}], ChatOptions(max_new_tokens=4)
    )

    async def run() -> list[bytes]:
        job = engine.submit(prompt)
        return [e async for e in _stream(engine, job, _Shape("chat", "\ud800"), False)]

    events = asyncio.run(run())
    assert events[-1] == b"data: [DONE]\n\n"
    error = json.loads(events[-2].decode().removeprefix("data: "))
    assert error["error"]["type"] == "server_error", error
    deadline = time.monotonic() + 30  # the cancelled job frees its conversation
    while engine.load and time.monotonic() < deadline:
        time.sleep(0.02)
    assert engine.load == 0


def _wait(what, deadline_s: float = 60.0) -> None:
    end = time.monotonic() + deadline_s
    while not what():
        assert time.monotonic() < end, "the server never reached the arranged state"
        time.sleep(0.01)


def test_openai_requests_filling_the_cap_turn_a_split_device_away(server, chat_bundle):
    """Four streaming chat requests fill --max-sessions 4 (held queued on the worker): a
    device's START is refused, it decodes locally (the same tokens), and /health never shows
    more than 4 sessions; once they finish, the device is served again."""
    client = openai.OpenAI(base_url=f"{server.http}/v1", api_key=TOKEN, max_retries=0, timeout=120)
    texts: list[str] = []
    errors: list[BaseException] = []

    def chat(i: int) -> None:
        try:
            stream = client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": f"Tell me about {i}."}],
                max_tokens=6,
                stream=True,
            )
            texts.append("".join(c.choices[0].delta.content or "" for c in stream if c.choices))
        except BaseException as e:  # reported below
            errors.append(e)

    prompt = [5, 9, 31, 7, 2, 40]
    want = edgespec.load(chat_bundle, threads=1).generate(prompt, max_new_tokens=8).tokens
    state = server.state
    hold = hold_worker(state)
    threads = [threading.Thread(target=chat, args=(i,)) for i in range(4)]
    try:
        for t in threads:
            t.start()
        _wait(lambda: state.chat.load == 4)
        device = edgespec.load(
            chat_bundle, mode="split", server=server.url, token=TOKEN, threads=1, timeout=60
        )
        out = device.generate(prompt, max_new_tokens=8)
        health = server.health()
    finally:
        hold.release()
        for t in threads:
            t.join(timeout=120)
    assert not errors, errors
    assert len(texts) == 4
    assert out.tokens == want and out.stats.remote_rounds == 0, out.stats
    assert health["sessions"] <= health["max_sessions"] == 4, health
    _wait(lambda: state.chat.load == 0)
    again = device.generate(prompt, max_new_tokens=8)
    device.remote.drop()  # the device leaves: its connection no longer counts
    assert again.tokens == want and again.stats.remote_rounds > 0


def test_split_devices_filling_the_cap_turn_openai_requests_away(server, chat_bundle):
    """Four devices connected (their STARTs held queued on the worker) fill --max-sessions
    4: a chat request gets 503 from the `openai` client; released, every device is served."""
    client = openai.OpenAI(base_url=f"{server.http}/v1", api_key=TOKEN, max_retries=0, timeout=60)
    prompt = [11, 3, 8, 8, 21]
    want = edgespec.load(chat_bundle, threads=1).generate(prompt, max_new_tokens=6).tokens
    outs: list = []
    errors: list[BaseException] = []

    def device() -> None:
        try:
            m = edgespec.load(
                chat_bundle, mode="split", server=server.url, token=TOKEN, threads=1, timeout=60
            )
            outs.append(m.generate(prompt, max_new_tokens=6))
            m.remote.drop()
        except BaseException as e:
            errors.append(e)

    state = server.state
    _wait(lambda: not state.connections)
    hold = hold_worker(state)
    threads = [threading.Thread(target=device) for _ in range(4)]
    try:
        for t in threads:
            t.start()
        _wait(lambda: len(state.connections) == 4)
        with pytest.raises(openai.APIStatusError) as refused:
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
    finally:
        hold.release()
        for t in threads:
            t.join(timeout=120)
    assert refused.value.status_code == 503 and "full" in str(refused.value)
    assert not errors, errors
    assert [o.tokens for o in outs] == [want] * 4
    assert all(o.stats.remote_rounds > 0 and o.stats.local_rounds == 0 for o in outs)
