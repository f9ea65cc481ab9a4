"""`edgespec serve` with a feature head: a load without --mode decodes with it where its distill
record promises a speed-up, and the OpenAI conversations draft from their own pool rows'
features: replies equal transformers' greedy ones, drafts accepted as the local head's are."""

from __future__ import annotations

import openai
import pytest
from split_server import TOKEN, start_server
from test_eagle import add_head, hf_weights
from test_openai_server import reference

import edgespec
from edgespec.bundle import load_manifest, save_manifest

LAYERS = [2, 4]
PROMISING = {
    "held_out": {"tokens_per_round": {"1": 1.8, "2": 2.3}},
    "step_cost": 0.2,
    "decode_speedup": {"lookup": 1.2, "eagle": 1.4, "lookup+eagle": 1.6},
}


@pytest.fixture(scope="module")
def eagle_chat(chat_checkpoints, tmp_path_factory):
    from edgespec.export import export_bundle

    out = tmp_path_factory.mktemp("eagle_chat") / "b"
    export_bundle(chat_checkpoints["target"], out, feature_layers=LAYERS)
    add_head(out, hf_weights(chat_checkpoints["target"]), LAYERS, copying=True)
    m = load_manifest(out)
    m.extra["eagle"] = PROMISING
    save_manifest(m, out)
    return out


@pytest.fixture(scope="module")
def hf_chat(chat_checkpoints):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = chat_checkpoints["target"]
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def test_a_promising_head_is_the_default_and_a_poor_one_is_not(eagle_chat, tmp_path):
    import shutil

    model = edgespec.load(eagle_chat)
    assert model.mode == "eagle" and model.drafter.name == "lookup+eagle"
    poor = tmp_path / "poor"
    shutil.copytree(eagle_chat, poor)
    m = load_manifest(poor)
    m.extra["eagle"] = {**PROMISING, "decode_speedup": {"lookup": 2.4, "lookup+eagle": 2.3}}
    save_manifest(m, poor)
    assert edgespec.load(poor).mode == "lookup"


def test_openai_conversations_draft_from_their_rows_features(eagle_chat, hf_chat, tmp_path):
    args = ("--mode", "eagle", "--draft-policy", "fixed:3", "--conversations", "2")
    server = start_server(eagle_chat, tmp_path, TOKEN, *args)
    try:
        client = openai.OpenAI(base_url=f"{server.http}/v1", api_key=TOKEN, max_retries=0,
                               timeout=60)  # fmt: skip
        local = edgespec.load(eagle_chat, mode="eagle", draft_policy="fixed:3")
        drafted = accepted = 0
        for topic in ("rivers", "the sea and its waves", "a red car"):
            messages = [{"role": "user", "content": f"Tell me about {topic}."}]
            r = client.chat.completions.create(model="m", messages=messages, max_tokens=24,
                                               temperature=0)  # fmt: skip
            assert r.choices[0].message.content == reference(hf_chat, messages, 24)[0]
            mine = local.chat(messages, max_new_tokens=24, temperature=0)
            local._chat = None  # each conversation afresh, as the server's first turns
            drafted += mine.stats.drafted
            accepted += mine.stats.accepted
        report = server.health()["openai"]
        assert report["mode"] == "eagle" and accepted > 0
        # the same drafts as the local head's, from the same features: the same acceptance
        assert (report["drafted"], report["accepted"]) == (drafted, accepted)
    finally:
        server.stop()
