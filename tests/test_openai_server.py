"""`edgespec serve` speaks the OpenAI API: checked with the official `openai` client against
transformers' apply_chat_template + greedy generate, in ar and a speculative mode."""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.request

import openai
import pytest
from split_server import TOKEN, start_server

import edgespec

MODES = ["ar", "spec"]


@pytest.fixture(scope="module", params=MODES)
def server(request, chat_bundle, tmp_path_factory):
    mode = request.param
    args = ("--mode", mode, "--conversations", "2", "--max-sessions", "8")
    srv = start_server(chat_bundle, tmp_path_factory.mktemp(f"openai-{mode}"), TOKEN, *args)
    srv.mode = mode
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.http}/v1", api_key=TOKEN, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def hf_chat(chat_checkpoints):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = chat_checkpoints["target"]
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def reference(hf_chat, messages, max_new: int) -> tuple[str, int, int]:
    """(text, completion tokens, prompt tokens) of transformers' greedy reply."""
    import torch

    model, tok = hf_chat
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]),
            max_new_tokens=max_new,
            do_sample=False,
            eos_token_id=model.generation_config.eos_token_id,
            pad_token_id=0,
        )
    new = out[0, len(ids) :].tolist()
    return tok.decode(new, skip_special_tokens=True), len(new), len(ids)


def stream_text(client, **kwargs) -> tuple[str, list]:
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks


def test_chat_completions_equal_transformers_streamed_and_not(client, hf_chat):
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Write a function that adds two numbers."},
    ]
    want, n, prompt = reference(hf_chat, messages, 16)
    r = client.chat.completions.create(
        model="whatever-name", messages=messages, max_tokens=16, temperature=0
    )
    assert r.object == "chat.completion" and r.model == "whatever-name"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == want
    assert (r.usage.completion_tokens, r.usage.prompt_tokens) == (n, prompt)
    assert r.choices[0].finish_reason == ("length" if n == 16 else "stop")
    text, chunks = stream_text(
        client,
        model="m",
        messages=messages,
        max_completion_tokens=16,
        temperature=0,
        stream_options={"include_usage": True},
    )
    assert text == want
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == r.choices[
        0
    ].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == n


def test_the_stream_is_server_sent_events_ending_with_done(server):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
    req = urllib.request.Request(
        f"{server.http}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [e for e in r.read().decode().split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[0][6:])["object"] == "chat.completion.chunk"


def health(server) -> dict:
    return server.health()["openai"]


def test_a_second_turn_reuses_the_cached_prompt_and_prefills_only_new_positions(
    server, client, hf_chat
):
    messages = [{"role": "user", "content": "Tell me something about rivers."}]
    first = client.chat.completions.create(
        model="m", messages=messages, max_tokens=8, temperature=0
    )
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And lakes?"},
    ]
    before = health(server)
    second = client.chat.completions.create(
        model="m", messages=messages, max_tokens=8, temperature=0
    )
    after = health(server)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens
    # the server's target graph processed only the positions past the cached prefix
    prefilled = after["prefilled_positions"] - before["prefilled_positions"]
    assert prefilled == second.usage.prompt_tokens - cached
    assert after["cached_positions"] - before["cached_positions"] == cached
    want, _, _ = reference(hf_chat, messages, 8)
    assert second.choices[0].message.content == want


def test_concurrent_conversations_do_not_leak_into_each_other(client, hf_chat):
    """Three conversations of two turns at once on two cache slots: every reply equals
    transformers' own, whichever slot (and whose leftover cache) it landed on."""
    topics = ["the sea", "mountains and snow", "a small red car"]
    results: dict[int, list] = {}
    errors: list = []

    def converse(i: int) -> None:
        try:
            messages = [{"role": "user", "content": f"Tell me about {topics[i]}."}]
            replies = []
            for follow in ("Why?", "Say more."):
                r = client.chat.completions.create(
                    model="m", messages=messages, max_tokens=8, temperature=0
                )
                replies.append((list(messages), r.choices[0].message.content))
                messages += [
                    {"role": "assistant", "content": r.choices[0].message.content},
                    {"role": "user", "content": follow},
                ]
            results[i] = replies
        except Exception as e:  # reported below, with the thread's view
            errors.append(e)

    threads = [threading.Thread(target=converse, args=(i,)) for i in range(len(topics))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    for i in range(len(topics)):
        for messages, got in results[i]:
            assert got == reference(hf_chat, messages, 8)[0]


def test_completions_stream_and_match_generate(chat_bundle, client):
    model = edgespec.load(chat_bundle)
    want = model.generate("def add(a, b):", max_new_tokens=10, ignore_eos=True)
    r = client.completions.create(
        model="m",
        prompt="def add(a, b):",
        max_tokens=10,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert r.choices[0].text == want.text and r.usage.completion_tokens == 10
    chunks = list(
        client.completions.create(
            model="m",
            prompt="def add(a, b):",
            max_tokens=10,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks) == want.text


def test_stop_strings_seed_and_models(server, client):
    messages = [{"role": "user", "content": "Count."}]
    full = client.chat.completions.create(
        model="m", messages=messages, max_tokens=12, temperature=0
    )
    text = full.choices[0].message.content
    cut = client.chat.completions.create(
        model="m", messages=messages, max_tokens=12, temperature=0, stop=[text[3:5]]
    )
    assert cut.choices[0].message.content == text[: text.index(text[3:5])]
    assert cut.choices[0].finish_reason == "stop"
    a, b = (
        client.chat.completions.create(
            model="m", messages=messages, max_tokens=8, temperature=0.9, top_p=0.95, seed=7
        )
        .choices[0]
        .message.content
        for _ in range(2)
    )
    if server.mode == "ar":  # speculative modes: γ adapts per request, so the draws differ
        assert a == b
    assert [m.object for m in client.models.list().data] == ["model"]


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role", "not one of"),
        ({"messages": []}, "messages", "non-empty"),
        (
            {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]},
            None,
            "already ends with an assistant",
        ),  # fmt: skip
        ({"messages": [{"role": "user", "content": "word " * 300}]}, None, "context of"),
        (
            {"messages": [{"role": "user", "content": "x"}], "temperature": -1},
            "temperature",
            "outside",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
            "max_tokens",
            "outside",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2.5},
            "max_tokens",
            "integer",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}], "top_p": "high"},
            "top_p",
            "not a number",
        ),
        ({"messages": [{"role": "user", "content": "x"}], "n": 3}, "n", "must be 1"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content[0]",
            "text",
        ),  # fmt: skip
    ],
)
def test_bad_requests_get_an_openai_shaped_400_and_the_server_stays_healthy(
    server, client, body, param, message
):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="m", **body)
    err = info.value.body
    assert message in err["message"] and err["type"] == "invalid_request_error"
    assert err.get("param") == param
    assert server.health()["status"] == "ok"
    ok = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert ok.usage.completion_tokens >= 1


def test_nan_bad_json_oversized_bodies_and_wrong_token_are_refused(server):
    def post(data: bytes, token: str = TOKEN) -> tuple[int, dict]:
        req = urllib.request.Request(
            f"{server.http}/v1/chat/completions",
            data=data,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, json.load(r)
        except urllib.error.HTTPError as e:
            return e.code, json.load(e)

    good = '{"messages": [{"role": "user", "content": "x"}], "temperature": %s}'
    status, body = post((good % "NaN").encode())
    assert status == 400 and "nan" in body["error"]["message"].lower()
    status, body = post(b"{not json")
    assert status == 400 and "not valid JSON" in body["error"]["message"]
    # a body declared larger than the limit is refused before it is read
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.putrequest("POST", "/v1/chat/completions")
    conn.putheader("Authorization", f"Bearer {TOKEN}")
    conn.putheader("Content-Length", str(2 << 20))
    conn.endheaders()
    conn.send(b"{}")
    r = conn.getresponse()
    assert r.status == 413 and "exceeds the limit" in json.load(r)["error"]["message"]
    conn.close()
    status, body = post((good % "0").encode(), token="wrong")
    assert status == 401 and body["error"]["type"] == "authentication_error"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.http}/v1", api_key="wrong", max_retries=0).models.list()


def test_a_short_request_is_not_held_up_by_a_long_one(client):
    """Requests are decoded one round each in turn: a short reply asked for while a long one
    streams finishes first."""
    done: dict[str, float] = {}
    started = threading.Event()

    def long_reply() -> None:
        for chunk in client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "Go on for a while."}],
            max_tokens=200,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        ):
            if chunk.choices and chunk.choices[0].delta.content:
                started.set()
        done["long"] = time.monotonic()

    t = threading.Thread(target=long_reply)
    t.start()
    assert started.wait(60)
    client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Short."}], max_tokens=2
    )
    done["short"] = time.monotonic()
    t.join(timeout=120)
    assert done["short"] < done["long"]
