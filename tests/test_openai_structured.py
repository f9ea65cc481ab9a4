"""OpenAI `response_format` against a real `edgespec serve` on loopback, with the official
`openai` client: json_schema (strict) and json_object replies follow the schema, streamed and
not, equal to the in-process constrained reply, and a bad schema is a 400 naming it."""

from __future__ import annotations

import json

import openai
import pytest
from split_server import TOKEN, start_server

import edgespec

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 10},
        "rain": {"type": "boolean"},
        "days": {"type": "array", "items": {"enum": ["mon", "tue", "wed"]}, "maxItems": 2},
    },
    "required": ["city", "rain", "days"],
    "additionalProperties": False,
}
FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "weather", "schema": SCHEMA, "strict": True},
}
MESSAGES = [{"role": "user", "content": "Weather in Paris as JSON."}]


@pytest.fixture(scope="module", params=["ar", "spec"])
def server(request, chat_bundle, tmp_path_factory):
    args = ("--mode", request.param, "--conversations", "2")
    srv = start_server(chat_bundle, tmp_path_factory.mktemp(f"rf-{request.param}"), TOKEN, *args)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.http}/v1", api_key=TOKEN, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def local_reply(chat_bundle):
    model = edgespec.load(chat_bundle)
    return model.chat(MESSAGES, max_new_tokens=60, temperature=0, response_format=FORMAT)


def test_json_schema_replies_validate_and_equal_the_local_reply(client, local_reply):
    r = client.chat.completions.create(
        model="m", messages=MESSAGES, max_tokens=60, temperature=0, response_format=FORMAT
    )
    text = r.choices[0].message.content
    assert text == local_reply.text
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(text), SCHEMA)
    chunks = list(
        client.chat.completions.create(
            model="m",
            messages=MESSAGES,
            max_tokens=60,
            temperature=0,
            response_format=FORMAT,
            stream=True,
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text


def test_sampled_json_schema_replies_all_validate(client):
    for seed in range(4):
        r = client.chat.completions.create(
            model="m",
            messages=MESSAGES,
            max_tokens=80,
            temperature=1.0,
            seed=seed,
            response_format=FORMAT,
        )
        if r.choices[0].finish_reason == "stop":
            jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)


def test_completions_take_json_object(client):
    r = client.completions.create(
        model="m",
        prompt="config = ",
        max_tokens=40,
        temperature=0,
        extra_body={"response_format": {"type": "json_object"}},
    )
    text = r.choices[0].text
    assert text.startswith("{")
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


def test_a_bad_schema_is_a_400_naming_it(client):
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "wat"}}}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=MESSAGES, response_format=bad)
    assert "wat" in str(e.value) and "response_format" in str(e.value)
    with pytest.raises(openai.BadRequestError, match="json_schema"):
        client.chat.completions.create(
            model="m", messages=MESSAGES, response_format={"type": "json_schema"}
        )
