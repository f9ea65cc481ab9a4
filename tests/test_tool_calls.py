"""Tool calls: each family's format read back into OpenAI calls (whole and streamed), the
template's own rendering of calls and tool results round-trips, and tool_choice "required" /
a named function make the reply calls whose arguments validate, through `Model.chat` and the
OpenAI endpoints with the official client."""

from __future__ import annotations

import json

import numpy as np
import openai
import pytest
from chat_templates import TEMPLATES
from split_server import TOKEN, start_server

import edgespec
from edgespec.runtime.chat.template import ChatTemplate
from edgespec.runtime.chat.tool_calls import parse, style_of
from edgespec.runtime.chat.tool_stream import INCREMENTAL, ToolStream

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
ADD = {
    "type": "object",
    "properties": {
        "a": {"type": "integer", "maximum": 999},
        "b": {"type": "integer", "maximum": 999},
    },
    "required": ["a", "b"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "add", "parameters": ADD}},
]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
# the shapes of Mistral's and Phi-4-mini's templates where tools and calls are written
MISTRAL = (
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- if tools and loop.last %}"
    "[AVAILABLE_TOOLS] {{ tools | tojson }}[/AVAILABLE_TOOLS]{%- endif %}"
    "[INST] {{ m.content }}[/INST]{%- elif m.tool_calls %}[TOOL_CALLS] "
    "{{ m.tool_calls | map(attribute='function') | list | tojson }}</s>{%- elif m.role == 'tool' %}"
    "[TOOL_RESULTS] {{ m.content }}[/TOOL_RESULTS]{%- else %}{{ m.content }}</s>{%- endif %}"
    "{%- endfor %}"
)
PHI4_MINI = (
    "{%- for m in messages %}{%- if m.role == 'system' and tools %}<|system|>{{ m.content }}"
    "<|tool|>{{ tools | tojson }}<|/tool|><|end|>{%- elif m.tool_calls %}<|assistant|>functools"
    "{{ m.tool_calls | map(attribute='function') | list | tojson }}<|end|>{%- else %}"
    "<|{{ m.role }}|>{{ m.content }}<|end|>{%- endif %}{%- endfor %}<|assistant|>"
)
FAMILIES = {
    "qwen2.5": ("hermes", TEMPLATES["qwen2.5"]),
    "qwen3": ("hermes", TEMPLATES["qwen3"]),
    "llama3": ("llama3", TEMPLATES["llama3"]),
    "mistral": ("mistral", MISTRAL),
    "phi4-mini": ("phi4", PHI4_MINI),
    "gemma": ("pythonic", TEMPLATES["gemma"]),
}
REPLIES = {
    "hermes": 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", '
    '"unit": "c"}}\n</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n'
    "</tool_call>",
    "llama3": '{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "c"}}; '
    '{"name": "add", "parameters": {"a": 2, "b": 3}}',
    "mistral": 'Let me look.[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Oslo", '
    '"unit": "c"}}, {"name": "add", "arguments": {"a": 2, "b": 3}}]',
    "phi4": 'Let me look.functools[{"name": "get_weather", "arguments": {"city": "Oslo", '
    '"unit": "c"}}, {"name": "add", "arguments": {"a": 2, "b": 3}}]',
    "pythonic": '```tool_code\n[get_weather(city="Oslo", unit="c"), add(a=2, b=3)]\n```',
}
WANT = [("get_weather", {"city": "Oslo", "unit": "c"}), ("add", {"a": 2, "b": 3})]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_familys_calls_are_read_back(family):
    style, template = FAMILIES[family]
    assert style_of(template) == style
    content, calls = parse(REPLIES[style], style)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == WANT
    assert content == ("Let me look." if style in ("hermes", "mistral", "phi4") else None)
    assert all(c.id.startswith("call_") for c in calls) and calls[0].id != calls[1].id


def assemble(events) -> list[tuple[str, str]]:
    """(name, arguments) per call from ToolStream's events, as an OpenAI client adds up the
    deltas; each call announced before its arguments."""
    calls: list[list[str]] = []
    for kind, value in events:
        if kind == "call":
            assert value.arguments == "" and value.id.startswith("call_")
            calls.append([value.name, ""])
        elif kind == "arguments":
            index, piece = value
            assert 0 <= index < len(calls) and piece
            calls[index][1] += piece
    return [(n, a) for n, a in calls]


@pytest.mark.parametrize("style", list(REPLIES))
def test_streamed_calls_equal_the_whole_reply_in_any_chunking(style):
    text = REPLIES[style]
    whole = [(c.name, c.arguments) for c in parse(text, style)[1]]
    assert [(n, json.loads(a)) for n, a in whole] == WANT
    rng = np.random.default_rng(0)
    for _ in range(5):
        cuts = sorted(rng.choice(np.arange(1, len(text)), 12, replace=False))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        stream = ToolStream(style)
        events = [e for p in pieces for e in stream.push(p)] + list(stream.push("", final=True))
        assert assemble(events) == whole  # the same text, piece by piece
        content = "".join(v for k, v in events if k == "content")
        assert content.strip() == (parse(text, style)[0] or "")


@pytest.mark.parametrize("style", INCREMENTAL)
def test_arguments_stream_as_they_decode_in_the_json_formats(style):
    """Character by character: a call is announced once its name is complete, before its
    arguments are; the arguments come in many pieces, each sent as soon as it is written."""
    text = REPLIES[style]
    stream = ToolStream(style)
    announced_at, pieces = {}, []
    for i, ch in enumerate(text):
        for kind, value in stream.push(ch):
            if kind == "call":
                announced_at[value.name] = i
            elif kind == "arguments":
                pieces.append((i, value))
    tail = list(stream.push("", final=True))
    assert [k for k, _ in tail] == []  # everything was out before the end
    first = text.index('"get_weather"') + len('"get_weather"')
    assert announced_at["get_weather"] == first - 1  # the name's closing quote
    assert len([p for p in pieces if p[1][0] == 0]) > 10
    # each piece leaves as its character arrives (nothing held back inside the arguments)
    args0 = text.index('{"city"')
    assert pieces[0] == (args0, (0, "{"))


@pytest.mark.parametrize("style", list(REPLIES))
def test_text_that_is_not_a_call_stays_text(style):
    for text in ["Plain words, no tools.", '<tool_call>\n{"name": broken', "[1, 2, 3]", "{}"]:
        content, calls = parse(text, style)
        assert calls == [] and content == text
        stream = ToolStream(style)
        events = list(stream.push(text)) + list(stream.push("", final=True))
        assert "".join(v for k, v in events if k == "content") == text


@pytest.mark.parametrize("family", ["qwen2.5", "qwen3", "llama3", "mistral", "phi4-mini"])
def test_a_templates_rendering_of_calls_and_results_round_trips(family):
    """The assistant's calls as the template writes them back parse into the same calls, and
    the tool's result is in the prompt."""
    style, template = FAMILIES[family]
    args = {"city": "Oslo", "unit": "c"}
    call = {"type": "function", "function": {"name": "get_weather", "arguments": args}}
    messages = [
        {"role": "system", "content": "You help."},
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": '{"temp": 3}'},
    ]
    if family == "mistral":
        messages = messages[1:]
    text = ChatTemplate({"default": template}).render(messages, tools=TOOLS)
    marker = {"hermes": "<tool_call>", "llama3": '{"name"', "mistral": "[TOOL_CALLS]"}
    start = text.rindex(marker.get(style, "functools"))  # the assistant's, after any example
    assert "temp" in text[start:]  # the tool's result, rendered after the call
    end = {"hermes": "</tool_call>", "llama3": "<|eot_id|>", "mistral": "</s>"}.get(
        style, "<|end|>"
    )
    _, calls = parse(text[start : text.index(end, start) + len(end) * (style == "hermes")], style)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", args)]


@pytest.fixture(scope="module")
def tool_bundle(tmp_path_factory):
    """The chat bundle's model (Qwen 2.5 template) with a 1,024-position context: two tools'
    schemas in the system prompt take ~400 tokens."""
    from conftest import write_chat_checkpoint

    from edgespec.export import export_bundle

    root = tmp_path_factory.mktemp("tool_bundle")
    target = write_chat_checkpoint(root / "t", seed=0, max_position_embeddings=1024)
    draft = write_chat_checkpoint(root / "d", seed=1, max_position_embeddings=1024)
    export_bundle(target, root / "b", draft=draft)
    return root / "b"


@pytest.mark.parametrize("mode", ["ar", "spec"])
def test_model_chat_with_tool_choice_required_returns_valid_calls(tool_bundle, mode):
    model = edgespec.load(tool_bundle, mode=mode)
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    reply = model.chat(messages, tools=TOOLS, tool_choice="required", max_new_tokens=400)
    assert reply.finish_reason == "tool_calls" and reply.tool_calls
    for c in reply.tool_calls:
        jsonschema.validate(json.loads(c.arguments), SCHEMAS[c.name])
    named = {"type": "function", "function": {"name": "add"}}
    reply = model.chat(messages, tools=TOOLS, tool_choice=named, max_new_tokens=80)
    assert [c.name for c in reply.tool_calls] == ["add"]
    free = model.chat(messages, tools=TOOLS, max_new_tokens=20)
    assert free.finish_reason in ("stop", "length", "tool_calls")


@pytest.fixture(scope="module", params=["ar", "spec"])
def client(request, tool_bundle, tmp_path_factory):
    args = ("--mode", request.param, "--conversations", "2")
    srv = start_server(tool_bundle, tmp_path_factory.mktemp(f"tools-{request.param}"), TOKEN, *args)
    yield openai.OpenAI(base_url=f"{srv.http}/v1", api_key=TOKEN, max_retries=0, timeout=60)
    srv.stop()


MESSAGES = [{"role": "user", "content": "Weather in Oslo, and 2 + 3?"}]


def test_openai_tool_calls_come_back_whole_and_streamed(client, tool_bundle):
    r = client.chat.completions.create(
        model="m", messages=MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=400
    )
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and msg.tool_calls
    for c in msg.tool_calls:
        assert c.type == "function" and c.id.startswith("call_")
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])
    local = edgespec.load(tool_bundle).chat(
        MESSAGES, tools=TOOLS, tool_choice="required", max_new_tokens=400
    )
    assert [(c.function.name, c.function.arguments) for c in msg.tool_calls] == [
        (c.name, c.arguments) for c in local.tool_calls
    ]
    chunks = list(
        client.chat.completions.create(
            model="m",
            messages=MESSAGES,
            tools=TOOLS,
            tool_choice="required",
            max_tokens=400,
            stream=True,
        )
    )
    assert streamed_calls(chunks) == [
        (c.function.name, c.function.arguments) for c in msg.tool_calls
    ]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def streamed_calls(chunks) -> list[tuple[str, str]]:
    """The calls of a streamed reply as the OpenAI client's deltas add up; checks that each
    call's first delta carries its id and name (and no arguments) and the rest only pieces of
    arguments, several of them (the arguments stream as they decode)."""
    calls: dict[int, dict] = {}
    for ch in chunks:
        for d in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
            if d.index not in calls:
                assert d.id.startswith("call_") and d.type == "function" and d.function.name
                assert d.function.arguments == ""
                calls[d.index] = {"name": d.function.name, "arguments": "", "pieces": 0}
                continue
            assert d.id is None and d.function.name is None and d.function.arguments
            calls[d.index]["arguments"] += d.function.arguments
            calls[d.index]["pieces"] += 1
    assert calls and all(c["pieces"] > 1 for c in calls.values())
    return [(c["name"], c["arguments"]) for _, c in sorted(calls.items())]


@pytest.fixture(scope="module")
def mistral_client(tool_bundle, tmp_path_factory):
    """The tool bundle with a Mistral-style template: calls are `[TOOL_CALLS] [{..}, ..]`."""
    import shutil

    from edgespec.bundle import load_manifest

    root = tmp_path_factory.mktemp("mistral-tools")
    bundle = root / "b"
    shutil.copytree(tool_bundle, bundle)
    chat = load_manifest(bundle).chat
    assert chat is not None
    (bundle / chat.templates["default"]).write_text(MISTRAL)
    srv = start_server(bundle, root, TOKEN, "--mode", "ar", "--conversations", "1")
    yield openai.OpenAI(base_url=f"{srv.http}/v1", api_key=TOKEN, max_retries=0, timeout=60)
    srv.stop()


def test_openai_streams_mistral_call_arguments_in_pieces(mistral_client):
    args = {"model": "m", "messages": MESSAGES, "tools": TOOLS, "tool_choice": "required"}
    r = mistral_client.chat.completions.create(**args, max_tokens=400)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and msg.tool_calls
    for c in msg.tool_calls:
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])
    chunks = list(mistral_client.chat.completions.create(**args, max_tokens=400, stream=True))
    assert streamed_calls(chunks) == [
        (c.function.name, c.function.arguments) for c in msg.tool_calls
    ]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_openai_named_tool_choice_and_tool_results(client):
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = client.chat.completions.create(
        model="m", messages=MESSAGES, tools=TOOLS, tool_choice=named, max_tokens=400
    )
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    follow = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 3}'},
    ]
    r = client.chat.completions.create(
        model="m", messages=follow, tools=TOOLS, tool_choice="none", max_tokens=8
    )
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].finish_reason in ("stop", "length")


def test_openai_bad_tool_choices_are_400s(client):
    with pytest.raises(openai.BadRequestError, match="not one of the tools"):
        client.chat.completions.create(
            model="m",
            messages=MESSAGES,
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "nope"}},
        )
    with pytest.raises(openai.BadRequestError, match="needs tools"):
        client.chat.completions.create(model="m", messages=MESSAGES, tool_choice="required")
