"""Conversations keep their cache: every turn equals transformers' apply_chat_template +
greedy generate token for token, in every local mode, while prefilling only new positions."""

from __future__ import annotations

import numpy as np
import pytest

import edgespec
from edgespec.runtime.chat.session import ChatError, ChatOptions, StopStrings
from edgespec.runtime.chat.template import ChatTemplateError
from edgespec.runtime.model import InputError

MODES = {
    "ar": dict(mode="ar"),
    "spec": dict(mode="spec", draft_policy="fixed:3"),
    "self-spec": dict(mode="self-spec", draft_policy="fixed:3"),
    "lookup": dict(mode="lookup", draft_policy="fixed:3"),
    "lookup+draft": dict(mode="spec", drafter="lookup+draft", draft_policy="fixed:3"),
    "suffix": dict(mode="suffix", draft_policy="fixed:3"),
    "recycle": dict(mode="recycle", draft_policy="fixed:3"),
}
USERS = ["Write a function that adds two numbers.", "Now make it multiply.", "Thanks, bye."]


class Counting:
    """A graph stage that counts the positions it is asked to process."""

    def __init__(self, stage) -> None:
        self.stage, self.positions, self.calls = stage, 0, []

    def __getattr__(self, name):
        return getattr(self.stage, name)

    def run(self, cache, past, feed):
        self.positions += feed.width
        self.calls.append(feed.width)
        return self.stage.run(cache, past, feed)


@pytest.fixture(scope="module")
def hf_chat(chat_checkpoints):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = chat_checkpoints["target"]
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def hf_reply(hf_chat, messages, max_new: int) -> tuple[list[int], list[int]]:
    """(prompt ids, greedy reply ids) from transformers itself."""
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
    return list(ids), out[0, len(ids) :].tolist()


@pytest.mark.parametrize("mode", MODES)
def test_every_turn_equals_transformers_and_prefills_only_new_positions(chat_bundle, hf_chat, mode):
    model = edgespec.load(chat_bundle, **MODES[mode])
    session = model.chat_session(system="You are terse.")
    target = session.target
    target.stages = [Counting(s) for s in target.stages]
    draft = session.drafter.model if mode == "spec" else None  # the draft model's own cache
    if draft is not None:
        draft.stages = [Counting(draft.stages[0])]
    messages = [{"role": "system", "content": "You are terse."}]
    last_prompt = 0
    for turn, user in enumerate(USERS, 1):
        messages.append({"role": "user", "content": user})
        want_prompt, want = hf_reply(hf_chat, messages, 12)
        before = target.stages[0].positions
        if draft is not None:
            draft_held, draft_calls = draft.length, len(draft.stages[0].calls)
        reply = session.reply(messages, ChatOptions(max_new_tokens=12, temperature=0))
        assert reply.tokens == want, f"turn {turn}"
        assert reply.prompt_tokens == len(want_prompt)
        if turn > 1:
            assert reply.cached_tokens >= last_prompt
        # the target's first stage processed the uncached prompt positions once, then each
        # round's [last, drafts] (self-spec verifies with the tail from the head's states)
        prefilled = reply.prompt_tokens - reply.cached_tokens
        assert reply.stats.prefill_tokens == prefilled
        rounds = 0 if mode == "self-spec" else reply.stats.drafted + reply.stats.rounds
        assert target.stages[0].positions - before == prefilled + rounds
        if draft is not None:  # the draft model prefilled only what its cache lacked
            kept = min(reply.cached_tokens, draft_held)
            assert draft.stages[0].calls[draft_calls] == reply.prompt_tokens - kept
            assert turn == 1 or kept > 0
        last_prompt = reply.prompt_tokens
        messages.append({"role": "assistant", "content": reply.text})


def test_a_second_turn_prefills_only_the_new_messages(chat_bundle):
    model = edgespec.load(chat_bundle, mode="ar")
    session = model.chat_session()
    counting = Counting(session.target.stages[0])
    session.target.stages = [counting]
    first = [{"role": "user", "content": USERS[0]}]
    r1 = session.reply(first, ChatOptions(max_new_tokens=6, temperature=0))
    assert (r1.cached_tokens, counting.positions) == (0, r1.prompt_tokens + len(r1.tokens) - 1)
    second = [*first, {"role": "assistant", "content": r1.text}, {"role": "user", "content": "ok"}]
    counting.positions = 0
    r2 = session.reply(second, ChatOptions(max_new_tokens=6, temperature=0))
    assert r2.cached_tokens >= r1.prompt_tokens
    assert counting.positions == r2.prompt_tokens - r2.cached_tokens + len(r2.tokens) - 1


def test_an_edited_history_reuses_only_the_common_prefix(chat_bundle, hf_chat):
    model = edgespec.load(chat_bundle, mode="spec", draft_policy="fixed:2")
    a = [{"role": "user", "content": "Tell me about cats and dogs."}]
    model.chat(a, max_new_tokens=4, temperature=0)
    b = [{"role": "user", "content": "Tell me about cars."}]
    reply = model.chat(b, max_new_tokens=10, temperature=0)
    _, want = hf_reply(hf_chat, b, 10)
    assert reply.tokens == want
    assert 0 < reply.cached_tokens < reply.prompt_tokens


def test_sessions_do_not_share_caches_and_generate_does_not_touch_them(chat_bundle, hf_chat):
    model = edgespec.load(chat_bundle, mode="self-spec", draft_policy="fixed:2")
    s1, s2 = model.chat_session(), model.chat_session()
    m1 = [{"role": "user", "content": "First conversation."}]
    m2 = [{"role": "user", "content": "A different one entirely."}]
    o = ChatOptions(max_new_tokens=8, temperature=0)
    r1 = s1.reply(m1, o)
    s2.reply(m2, o)
    model.generate("unrelated text", max_new_tokens=5)
    m1 += [{"role": "assistant", "content": r1.text}, {"role": "user", "content": "More."}]
    again = s1.reply(m1, o)
    assert again.cached_tokens > 0
    assert again.tokens == hf_reply(hf_chat, m1, 8)[1]


def test_stop_strings_cut_the_reply_and_stop_ids_end_it(chat_bundle):
    model = edgespec.load(chat_bundle)
    messages = [{"role": "user", "content": USERS[0]}]
    full = model.chat_session().reply(messages, ChatOptions(max_new_tokens=16, temperature=0))
    assert len(full.text) > 4
    stop = full.text[2:4]
    cut = model.chat_session().reply(
        messages, ChatOptions(max_new_tokens=16, temperature=0, stop=[stop])
    )
    assert cut.text == full.text[: full.text.index(stop)]
    assert cut.finish_reason == "stop"
    by_id = model.chat_session().reply(
        messages, ChatOptions(max_new_tokens=16, temperature=0, stop_ids=[full.tokens[3]])
    )
    assert by_id.tokens == full.tokens[: full.tokens.index(full.tokens[3]) + 1]
    assert by_id.finish_reason == "stop"


def test_stop_strings_hold_back_a_partial_match_across_pieces():
    s = StopStrings(["</end>"])
    assert s.push("abc</e") == ("abc", False)
    assert s.push("nd> more") == ("", True)
    assert s.text == "abc"
    s = StopStrings(["</end>"])
    assert s.push("x</") == ("x", False)
    assert s.push("b", final=True) == ("</b", False)


def test_a_conversation_past_the_context_names_the_turn_or_drops_old_turns(chat_bundle):
    model = edgespec.load(chat_bundle)
    long = " ".join(["word"] * 60)
    messages = [{"role": "system", "content": "Be brief."}]
    for i in range(4):
        messages += [
            {"role": "user", "content": f"{i} {long}"},
            {"role": "assistant", "content": "ok"},
        ]
    messages.append({"role": "user", "content": "last question"})
    with pytest.raises(ChatError, match="turn 5 .*context of 256"):
        model.chat(messages, max_new_tokens=8)
    reply = model.chat(messages, max_new_tokens=8, truncation="drop-oldest", temperature=0)
    assert reply.dropped_messages > 0 and reply.prompt_tokens + 8 <= 256
    assert len(reply.tokens) == 8 or reply.finish_reason == "stop"


def test_chat_on_a_bundle_without_a_template_says_so_and_generate_still_works(bundles):
    model = edgespec.load(bundles["qwen2"])
    with pytest.raises(ChatTemplateError, match="no chat template"):
        model.chat([{"role": "user", "content": "hi"}])
    assert len(model.generate("hi", max_new_tokens=3, ignore_eos=True).tokens) == 3


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(max_new_tokens=0), "max_new_tokens must be at least 1"),
        (dict(temperature=-1), "temperature must be >= 0"),
        (dict(top_p=0), "top_p must be in"),
        (dict(truncation="middle"), "truncation 'middle'"),
        (dict(stop=[""]), "stop strings"),
        (dict(flags={"messages": []}), "flags: messages is set by the session itself"),
        (dict(flags={"add_generation_prompt": False}), "add_generation_prompt is set by"),
    ],
)
def test_bad_chat_options_are_refused_before_any_work(chat_bundle, options, message):
    model = edgespec.load(chat_bundle)
    with pytest.raises(ChatError, match=message):
        model.chat([{"role": "user", "content": "hi"}], **options)


def test_unknown_chat_option_lists_the_known_ones(chat_bundle):
    with pytest.raises(InputError, match="unknown chat option.*max_tokens.*max_new_tokens"):
        edgespec.load(chat_bundle).chat([{"role": "user", "content": "hi"}], max_tokens=3)


def test_sampled_chat_is_reproducible_with_a_seed(chat_bundle):
    model = edgespec.load(chat_bundle, mode="spec", draft_policy="fixed:2")
    m = [{"role": "user", "content": "hi"}]
    o = ChatOptions(max_new_tokens=10, temperature=0.8, top_p=0.9, seed=3)
    a, b = model.chat_session().reply(m, o), model.chat_session().reply(m, o)
    assert a.tokens == b.tokens and np.all(np.asarray(a.tokens) >= 0)
