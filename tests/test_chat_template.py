"""Chat templates render in the runtime exactly as transformers' apply_chat_template does."""

from __future__ import annotations

import json
import shutil

import pytest
from chat_templates import CHAT_BUNDLE_TEMPLATE, QWEN25, TEMPLATES

from edgespec.bundle import BundleError, load_manifest
from edgespec.runtime.chat.template import ChatTemplate, ChatTemplateError
from edgespec.runtime.tokenizer import Tokenizer

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city — °C, <b>bold</b> & 'quoted'",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "e.g. Zürich"}},
            "required": ["city"],
        },
    },
}
CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}

BASIC = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hello <there> & 'you'!"},
    {"role": "assistant", "content": "Hi. How can I help?"},
    {"role": "user", "content": "  Count to three.  "},
]
NO_SYSTEM = BASIC[1:]
TOOLS = [
    {"role": "system", "content": "Use tools."},
    {"role": "user", "content": "Weather in Zürich?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "content": '{"temp": 21}'},
    {"role": "user", "content": "And tomorrow?"},
]
THINKING = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
    {"role": "user", "content": "And 3+3?"},
    {"role": "assistant", "content": "6", "reasoning_content": "three twice"},
    {"role": "user", "content": "Thanks"},
]

CASES = [
    # (template, messages, extra keyword arguments)
    *[(name, NO_SYSTEM, {}) for name in TEMPLATES],
    *[(name, BASIC, {}) for name in TEMPLATES if name != "gemma"],
    ("llama3", TOOLS, {"tools": [WEATHER], "date_string": "26 Jul 2024"}),
    ("llama3", BASIC, {"add_generation_prompt": False}),
    ("qwen2.5", TOOLS, {"tools": [WEATHER]}),
    ("qwen3", TOOLS, {"tools": [WEATHER]}),
    ("qwen3", THINKING, {}),
    ("qwen3", THINKING, {"enable_thinking": False}),
    ("phi3", BASIC, {"add_generation_prompt": False}),
    ("smollm3", BASIC, {"enable_thinking": False}),
    (
        "smollm3",
        NO_SYSTEM,
        {"documents": [{"title": f"doc{i}", "text": f"text {i}"} for i in range(5)]},
    ),
]


@pytest.fixture(scope="module")
def hf_tokenizer(chat_checkpoints):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(chat_checkpoints["target"])


@pytest.fixture(scope="module")
def our_tokenizer(chat_checkpoints):
    return Tokenizer.from_dir(chat_checkpoints["target"])


def _ours(hf_tokenizer, name: str) -> ChatTemplate:
    return ChatTemplate({"default": TEMPLATES[name]}, hf_tokenizer.special_tokens_map)


@pytest.mark.parametrize(("name", "messages", "extra"), CASES, ids=lambda v: "")
def test_render_and_token_ids_equal_apply_chat_template(
    hf_tokenizer, our_tokenizer, name, messages, extra
):
    options = {"add_generation_prompt": True, **extra}
    want = hf_tokenizer.apply_chat_template(
        messages, chat_template=TEMPLATES[name], tokenize=False, **options
    )
    got = _ours(hf_tokenizer, name).render(messages, **options)
    assert got == want
    want_ids = hf_tokenizer.apply_chat_template(
        messages, chat_template=TEMPLATES[name], tokenize=True, return_dict=False, **options
    )
    assert our_tokenizer.encode(got, add_special_tokens=False) == list(want_ids)


def test_tojson_keeps_html_and_unicode_as_transformers_does(hf_tokenizer):
    got = _ours(hf_tokenizer, "qwen2.5").render(NO_SYSTEM, tools=[WEATHER])
    assert json.dumps(WEATHER, ensure_ascii=False) in got  # no \\u00fc, no \\u003c


@pytest.mark.parametrize(
    ("name", "messages", "message"),
    [
        ("gemma", BASIC, "System role not supported"),
        ("gemma", [BASIC[1], BASIC[1]], "must alternate"),
        ("llama3", [{"role": "system", "content": "x"}], "no first user message"),
    ],
)
def test_raise_exception_in_a_template_is_a_chat_template_error(
    hf_tokenizer, name, messages, message
):
    kwargs = {"tools": [WEATHER]} if name == "llama3" else {}
    with pytest.raises(Exception, match=message):
        hf_tokenizer.apply_chat_template(
            messages, chat_template=TEMPLATES[name], tokenize=False, **kwargs
        )
    with pytest.raises(ChatTemplateError, match=message):
        _ours(hf_tokenizer, name).render(messages, **kwargs)


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([], "messages is empty"),
        ("hello", "must be a list"),
        ([{"content": "no role"}], "message 0 has no 'role'"),
        (["just text"], "message 0 is a str"),
        ([{"role": "user", "content": object()}], "message 0 holds a object"),
    ],
)
def test_malformed_conversations_are_refused_with_the_reason(messages, message):
    with pytest.raises(ChatTemplateError, match=message):
        ChatTemplate({"default": QWEN25}).render(messages)


def test_the_sandbox_refuses_reaching_python_internals():
    for evil in (
        "{{ messages.__class__.__mro__ }}",
        "{% set ns = namespace(_x=1) %}",
        "{{ messages.append(1) }}",  # immutable: no mutating the caller's data
    ):
        with pytest.raises(ChatTemplateError, match="unsafe|underscore|cannot"):
            ChatTemplate({"default": evil}).render(NO_SYSTEM)


def test_a_template_syntax_error_names_the_line():
    with pytest.raises(ChatTemplateError, match="line 2"):
        ChatTemplate({"default": "ok\n{% if %}"}).render(NO_SYSTEM)


def test_named_templates_pick_tool_use_for_tools_and_default_otherwise():
    t = ChatTemplate(
        {"default": "D{{ messages|length }}", "tool_use": "T{{ tools|length if tools else 0 }}"}
    )
    assert t.render(NO_SYSTEM) == "D3"
    assert t.render(NO_SYSTEM, tools=[WEATHER]) == "T1"
    assert t.render(NO_SYSTEM, template="tool_use") == "T0"
    with pytest.raises(ChatTemplateError, match="no chat template named 'rag'"):
        t.render(NO_SYSTEM, template="rag")


# -- the bundle carries the chat format -------------------------------------------------------


def test_export_copies_the_template_and_generation_defaults(chat_bundle, hf_tokenizer):
    m = load_manifest(chat_bundle)
    assert m.chat is not None
    assert (chat_bundle / m.chat.templates["default"]).read_text() == CHAT_BUNDLE_TEMPLATE
    assert m.chat.special_tokens["eos_token"] == "<|im_end|>"
    assert m.eos_token_ids == [hf_tokenizer.convert_tokens_to_ids("<|im_end|>"), 0]
    t = ChatTemplate.from_bundle(chat_bundle, m)
    want = hf_tokenizer.apply_chat_template(BASIC, tokenize=False, add_generation_prompt=True)
    assert t.render(BASIC) == want


@pytest.mark.parametrize("source", ["config-string", "config-list", "jinja-files"])
def test_export_reads_every_template_layout(chat_checkpoints, tmp_path, source):
    """tokenizer_config.json's chat_template as a string or a list of named templates, or
    chat_template.jinja with additional_chat_templates/*.jinja."""
    from transformers import GenerationConfig

    from edgespec.export import export_bundle

    ckpt = tmp_path / "ckpt"
    shutil.copytree(chat_checkpoints["target"], ckpt)
    (ckpt / "chat_template.jinja").unlink()
    cfg_path = ckpt / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    named = {"default": TEMPLATES["phi3"], "tool_use": TEMPLATES["qwen2.5"]}
    if source == "config-string":
        cfg["chat_template"] = TEMPLATES["phi3"]
        named = {"default": TEMPLATES["phi3"]}
    elif source == "config-list":
        cfg["chat_template"] = [{"name": k, "template": v} for k, v in named.items()]
    else:
        (ckpt / "chat_template.jinja").write_text(named["default"])
        (ckpt / "additional_chat_templates").mkdir()
        (ckpt / "additional_chat_templates" / "tool_use.jinja").write_text(named["tool_use"])
    cfg_path.write_text(json.dumps(cfg))
    gen = GenerationConfig.from_pretrained(ckpt)
    gen.do_sample, gen.temperature, gen.top_p = True, 0.7, 0.8
    gen.save_pretrained(ckpt)
    m = export_bundle(ckpt, tmp_path / "b", verify=False)
    assert m.chat is not None
    got = {k: (tmp_path / "b" / v).read_text() for k, v in m.chat.templates.items()}
    assert got == named
    assert m.chat.generation == {"do_sample": True, "temperature": 0.7, "top_p": 0.8}
    assert load_manifest(tmp_path / "b").chat == m.chat


def test_a_bundle_without_a_template_loads_and_chat_says_what_is_missing(bundles):
    m = load_manifest(bundles["qwen2"])  # exported from a base checkpoint: no template
    assert m.chat is None
    with pytest.raises(ChatTemplateError, match="has no chat template"):
        ChatTemplate.from_bundle(bundles["qwen2"], m)


def test_a_manifest_from_before_chat_support_still_loads(chat_bundle, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(chat_bundle, old)
    raw = json.loads((old / "manifest.json").read_text())
    del raw["chat"]
    (old / "manifest.json").write_text(json.dumps(raw))
    assert load_manifest(old).chat is None


def test_a_missing_template_file_is_named(chat_bundle, tmp_path):
    b = tmp_path / "b"
    shutil.copytree(chat_bundle, b)
    (b / "chat_templates" / "default.jinja").unlink()
    with pytest.raises(BundleError, match="chat_templates/default.jinja"):
        load_manifest(b)


def test_inspect_shows_the_chat_template_and_generation_defaults(chat_bundle, bundles):
    from click.testing import CliRunner

    from edgespec.cli import main

    r = CliRunner().invoke(main, ["inspect", str(chat_bundle)])
    assert r.exit_code == 0, r.output
    assert "chat template default" in r.output and "chat_templates/default.jinja" in r.output
    assert "eos_token='<|im_end|>'" in r.output and "generation defaults" in r.output
    r = CliRunner().invoke(main, ["inspect", str(bundles["qwen2"])])
    assert "chat template" in r.output and "none (a base model" in r.output
