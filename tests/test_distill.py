"""`edgespec distill`: a head trained on a tiny GGUF's own replies within seconds, end to end
through the CLI, resumed after an interruption, bad input refused with the fix."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import edgespec
from edgespec.bundle import load_manifest
from edgespec.cli import main
from edgespec.runtime.policies.costs import eagle_pays

pytest.importorskip("torch")
pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory) -> Path:
    from tests.gguf_files import write_gguf

    path = tmp_path_factory.mktemp("distill") / "m.gguf"
    write_gguf(path, "llama", "Q4_1")
    return path


def prompts_file(folder: Path, n: int = 12) -> Path:
    path = folder / "prompts.jsonl"
    rows = [{"prompt": f"the cat {i} sat on the"} for i in range(n)]
    rows.append({"messages": [{"role": "user", "content": "a b c a b c"}]})
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_distill_cli_writes_a_head_that_decodes_as_ar(gguf_file, tmp_path):
    out = tmp_path / "b"
    args = [str(gguf_file), "--out", str(out), "--minutes", "0.25", "--new-tokens", "24",
            "--prompts", str(prompts_file(tmp_path))]  # fmt: skip
    r = CliRunner().invoke(main, ["distill", *args])
    assert r.exit_code == 0, r.output
    assert "held-out drafts kept per round at γ=4" in r.output
    m = load_manifest(out)
    assert "eagle" in m.roles and m.feature_layers == [1, 2]
    # a user's prompts file: only its prompts are answered (no own prompts, own.py)
    assert all(int(p.stem) < 1_000_000 for p in (out / "distill" / "replies").glob("*.npz"))
    record = m.extra["eagle"]
    assert record["steps"] > 0 and record["samples"] >= 2 and record["step_cost"] > 0
    assert set(record["held_out"]["tokens_per_round"]) == {"1", "2", "3", "4"}
    by_kind = record["held_out_by_kind"]  # the prompts file's are all questions
    assert list(by_kind) == ["question"] and by_kind["question"] == record["held_out"]
    # decoding measured with and without the head, and the default is what it favours
    assert set(record["decode_speedup"]) == {"lookup", "eagle", "lookup+eagle"}
    assert all(x > 0 for x in record["decode_speedup"].values())
    pays = eagle_pays(m)
    assert ("drafts with lookup+eagle" if pays else "keeps prompt lookup") in r.output
    assert edgespec.load(out).mode == ("eagle" if pays else "lookup")
    shown = CliRunner().invoke(main, ["inspect", str(out)]).output
    assert "feature head" in shown and "distilled" in shown and "decoding, x ar" in shown
    # the head is the target's: its graph names no second vocabulary matrix
    import onnx

    head = onnx.load(str(out / "eagle.onnx"), load_external_data=False)
    shared = [t for t in head.graph.initializer if t.name.startswith(("embed.", "lm_head."))]
    assert shared and all(
        e.value == "weights.bin" for t in shared for e in t.external_data if e.key == "location"
    )
    ar = edgespec.load(out, mode="ar")
    eagle = edgespec.load(out, mode="eagle", draft_policy="fixed:3")
    for prompt in ("the cat sat", "a b c a b"):
        want = ar.generate(prompt, max_new_tokens=24, ignore_eos=True).tokens
        got = eagle.generate(prompt, max_new_tokens=24, ignore_eos=True)
        assert got.tokens == want and got.stats.drafted > 0


def test_an_interrupted_distill_resumes_where_it_stopped(gguf_file, tmp_path):
    """Ctrl-C in training keeps the replies, the text read and the checkpoint (and writes the
    head so far); the same call again trains on from the checkpoint without generating the
    replies or reading the text again, with the same draft vocabulary."""
    from edgespec.distill.pipeline import DistillConfig, distill
    from edgespec.distill.train import TrainConfig

    out = tmp_path / "b"
    seen: list = []

    def stop_at_step_3(p) -> None:
        seen.append(p)
        if p.phase == "train" and p.steps >= 3:
            raise KeyboardInterrupt

    prompts = prompts_file(tmp_path)
    # no share for replies (the two every distill makes), 9 s of text, training until step 3:
    # the same on a loaded machine
    config = DistillConfig(minutes=5, prompts=prompts, new_tokens=24, reply_share=0.0,
                           text_share=0.03, train=TrainConfig(draft_vocab=40),
                           on_progress=stop_at_step_3)  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        distill(gguf_file, out, config)
    assert (out / "distill" / "checkpoint.pt").exists()
    assert "eagle" in load_manifest(out).roles  # the head so far, usable
    replies = sorted(p.name for p in (out / "distill" / "replies").glob("*.npz"))
    state = json.loads((out / "distill" / "state.json").read_text())
    spent = state["seconds"]
    texts = sorted(p.name for p in (out / "distill" / "text").glob("*.npz"))
    assert len(replies) == 2 and texts and spent > 0 and len(state["draft_ids"]) == 40

    after: list = []
    config.on_progress = after.append
    config.minutes = spent / 60 + 0.05
    record = distill(gguf_file, out, config)
    assert sorted(p.name for p in (out / "distill" / "replies").glob("*.npz")) == replies
    assert sorted(p.name for p in (out / "distill" / "text").glob("*.npz")) == texts
    assert not [p for p in after if p.phase in ("export", "replies", "text")]  # nothing redone
    again = json.loads((out / "distill" / "state.json").read_text())
    assert again["draft_ids"] == state["draft_ids"]  # chosen once
    assert record["draft_vocab"] == len(state["draft_ids"])
    assert 0 < record["coverage"] <= 1 and record["text_tokens"] > 0
    assert record["steps"] > 3  # from the checkpoint's step on
    first_train = next(p for p in after if p.phase == "train")
    assert first_train.steps == 4


def test_bad_inputs_are_refused_with_the_fix(gguf_file, tmp_path):
    run = lambda *a: CliRunner().invoke(main, ["distill", *map(str, a)])  # noqa: E731
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"text": 3}\n')
    r = run(gguf_file, "--out", tmp_path / "b1", "--prompts", bad)
    assert r.exit_code == 1 and "line 2" in r.output and '{"prompt": "..."}' in r.output
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x.txt").write_text("mine")
    r = run(gguf_file, "--out", busy, "--minutes", "0.05")
    assert r.exit_code == 1 and "not empty" in r.output and (busy / "x.txt").exists()
    r = run(tmp_path / "nothing.txt", "--out", tmp_path / "b2")
    assert r.exit_code == 1 and "neither a GGUF file" in r.output
    r = run(gguf_file, "--out", tmp_path / "b3", "--minutes", "0")
    assert r.exit_code == 1 and "--minutes" in r.output


def test_the_runtime_never_imports_torch_to_decode_with_a_head(tmp_path):
    """A head's bundle decodes in a process where torch cannot be imported."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import edgespec\n"
        f"m = edgespec.load({str(tmp_path)!r} + '/b', mode='eagle')\n"
        "print(len(m.generate('the cat', max_new_tokens=8, ignore_eos=True).tokens))\n"
    )
    from edgespec.distill.pipeline import DistillConfig, distill
    from tests.gguf_files import write_gguf

    write_gguf(tmp_path / "m.gguf", "llama", "Q4_1")
    distill(
        tmp_path / "m.gguf",
        tmp_path / "b",
        DistillConfig(minutes=0.05, prompts=prompts_file(tmp_path, 4), new_tokens=16),
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "8"
    assert np.isfinite(load_manifest(tmp_path / "b").extra["eagle"]["step_cost"])


def test_a_bundle_exported_with_its_features_is_distilled_into_a_copy(gguf_file, tmp_path):
    run = lambda *a: CliRunner().invoke(main, list(map(str, a)))  # noqa: E731
    plain, featured = tmp_path / "plain", tmp_path / "featured"
    assert run("export", gguf_file, "--out", plain).exit_code == 0
    r = run("distill", plain, "--out", tmp_path / "x", "--minutes", "0.1")
    assert (
        r.exit_code == 1 and "declares no features" in r.output and "--feature-layers" in r.output
    )
    r = run("export", gguf_file, "--out", featured, "--feature-layers", "1,2")
    assert r.exit_code == 0, r.output
    out = tmp_path / "headed"
    r = run("distill", featured, "--out", out, "--minutes", "0.2", "--new-tokens", "16",
            "--prompts", prompts_file(tmp_path, 6))  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "eagle" in load_manifest(out).roles and "eagle" not in load_manifest(featured).roles


def test_the_draft_vocabulary_is_the_targets_most_frequent_next_tokens():
    """N ids: those the target most often ranks first, then most often in its top k, then the
    lowest (ties by id), ascending; coverage is the share of reply tokens among them."""
    from edgespec.distill.data import Sample
    from edgespec.distill.train import coverage, draft_vocabulary

    def sample(first: list[int], ids: list[int], start: int) -> Sample:
        top = np.zeros((len(first), 2), np.int32)
        top[:, 0], top[:, 1] = first, 99
        z = np.zeros((len(first), 4), np.float16)
        return Sample(0, np.asarray(ids, np.int32), start, z, top, z[:, :2])

    a = sample([7, 7, 3, 5, 3, 7], [1, 2, 7, 7, 3, 9], 2)
    b = sample([5, 2, 7, 1], [4, 5, 5, 2], 1)
    # first: 7 x4, 3 x2, 5 x2, 2 x1, 1 x1; in the top k besides: 99 x10; never: the rest
    assert draft_vocabulary([a, b], 3, 100).tolist() == [3, 5, 7]  # 3 before 5: the lower id
    assert draft_vocabulary([a, b], 4, 100).tolist() == [1, 3, 5, 7]
    assert draft_vocabulary([a, b], 6, 100).tolist() == [1, 2, 3, 5, 7, 99]
    assert draft_vocabulary([a, b], 8, 100).tolist() == [0, 1, 2, 3, 4, 5, 7, 99]
    assert len(draft_vocabulary([a, b], 500, 100)) == 100
    # reply tokens: 7 7 3 9 | 5 5 2 -> in {3, 5, 7}: 5 of 7
    assert coverage([a, b], np.array([3, 5, 7])) == round(5 / 7, 4)


def test_the_built_in_prompts_alternate_kinds_so_any_budget_has_each():
    from edgespec.distill import prompts as P
    from edgespec.distill.data import held_out_indices
    from edgespec.distill.prompts import KINDS, by_kind, fitting_prompts, prompt_kind

    assert prompt_kind("Summarise this text in two sentences:\n\nThe town...") == "summary"
    assert prompt_kind("Add comments to this code:\n\ndef f(x):\n    return x") == "code"
    assert prompt_kind("Write a Python function that reverses a string.") == "code"
    assert prompt_kind("Explain tides to a ten-year-old.") == "question"
    prompts = by_kind(fitting_prompts())
    assert sorted(prompts) == sorted(fitting_prompts())
    first = [prompt_kind(p) for p in prompts[:30]]
    assert all(first.count(k) == 10 for k in KINDS)
    conversations = [[{"role": "user", "content": p}] for p in prompts]
    out = set(held_out_indices(conversations, built_in=True))
    held = [prompt_kind(p) for i, p in enumerate(prompts[:60]) if i in out]
    assert set(held) == set(KINDS)
    # a source's prompts (a topic's styles, a text's summaries) are held out together, and a
    # chat (numbered past the prompts, data.chats_after) with its first turn
    sources = {P.prompt_source(p) for i, p in enumerate(prompts) if i in out}
    assert all((i in out) == (P.prompt_source(p) in sources) for i, p in enumerate(prompts))
    assert len(sources) > 1 and 0.05 < sum(i < len(prompts) for i in out) / len(prompts) < 0.2
    assert P.prompt_source("Give three tips about saving money.") == "saving money"
    assert P.prompt_source("Explain tides to a ten-year-old.") == "tides"
    first = len(prompts) + (-len(prompts) % 10)
    assert all((first + i in out) == (i in out) for i in range(len(prompts)))


def test_replies_made_many_at_a_time_are_the_targets_own(gguf_file, tmp_path):
    """Rows of one KV pool stepping together give each conversation the reply the target
    decodes alone, with the features and top-k log-probabilities one scoring call gives."""
    from edgespec.distill import data
    from edgespec.distill.pipeline import DistillConfig, _export
    from edgespec.runtime.model import Model

    out = tmp_path / "b"
    _export(gguf_file, out, DistillConfig())
    model = Model.load(out, mode="ar")
    from edgespec.serve.batching import batchable

    assert model.target.feature_width and batchable(model.target.stages)  # rows together
    convs = [[{"role": "user", "content": f"the cat {i} sat on the {'mat ' * i}"}]
             for i in range(7)]  # fmt: skip
    folder = tmp_path / "replies"
    data.generate(model, convs, folder, float("inf"), new_tokens=20, rows=3)
    got = {s.index: s for s in data.load(folder)}
    assert sorted(got) == list(range(7))
    for i, s in got.items():
        prompt = data.conversation_ids(model, convs[i])
        alone = model.generate(prompt, max_new_tokens=20).tokens
        assert s.start == len(prompt) and s.ids.tolist() == prompt + alone
        features, top_ids, top_logp = data.score(model, s.ids.tolist())
        np.testing.assert_allclose(s.features.astype(np.float32), features.astype(np.float32),
                                   atol=0.02, rtol=0.02)  # fmt: skip
        assert (s.top_ids[:, 0] == top_ids[:, 0]).all()
        np.testing.assert_allclose(s.top_logp[:, :4].astype(np.float32),
                                   top_logp[:, :4].astype(np.float32), atol=0.02)  # fmt: skip


def test_chats_follow_the_targets_own_first_replies(gguf_file, tmp_path):
    """Every other reply is continued as a two-turn chat (its text as the assistant's turn,
    then a follow-up of its kind), answered right after it and labelled "chat"; a resumed
    run first answers the chats of replies made before."""
    from edgespec.distill import data
    from edgespec.distill.pipeline import DistillConfig, _export
    from edgespec.distill.prompts import FOLLOW_UPS, conversation_kind
    from edgespec.runtime.model import Model

    out = tmp_path / "b"
    _export(gguf_file, out, DistillConfig())
    model = Model.load(out, mode="ar")
    convs = [[{"role": "user", "content": "Explain tides in a short paragraph."}],
             [{"role": "user", "content": "Write a Python function that adds two numbers."}],
             [{"role": "user", "content": "Explain rainbows."}],
             [{"role": "user", "content": "Explain the water cycle."}]]  # fmt: skip
    folder = tmp_path / "replies"
    data.generate(model, convs[:2], folder, float("inf"), new_tokens=12)  # no chats
    seen = []
    follow = data.chats_after(model, convs)
    data.generate(model, convs, folder, float("inf"), new_tokens=12, rows=2,
                  on_sample=lambda s: seen.append(s.index), follow=follow)  # fmt: skip
    # the chat of reply 1 (made before) first; then 2, 3 and the chat of 3 (10 + 3)
    assert seen[0] == 11 and sorted(seen) == [2, 3, 11, 13] and seen.index(13) > seen.index(3)
    got = {s.index: s for s in data.load(folder)}
    stop = set(model.manifest.eos_token_ids)
    for i in (1, 3):
        s = got[i]
        reply = model.tokenizer.decode([int(t) for t in s.ids[s.start :] if int(t) not in stop])
        chat = convs[i] + [{"role": "assistant", "content": reply.strip()}]
        kind = "code" if i == 1 else "question"
        ask = FOLLOW_UPS[kind][i % len(FOLLOW_UPS[kind])]
        chat.append({"role": "user", "content": ask})
        assert conversation_kind(chat) == "chat" and conversation_kind(convs[i]) == kind
        c = got[10 + i]
        assert c.ids[: c.start].tolist() == data.conversation_ids(model, chat)


def test_the_target_answers_prompts_it_writes_itself(gguf_file, tmp_path):
    """Rows that sample a user turn after the chat template's opening of one (own.py) end it
    with the template's own end of turn, then answer it as the target decodes alone; every
    tenth own prompt is held out, and a resumed run numbers on."""
    from edgespec.distill import data
    from edgespec.distill.own import FIRST, OwnPrompts, held_out
    from edgespec.distill.pipeline import DistillConfig, _export
    from edgespec.runtime.model import Model

    out = tmp_path / "b"
    _export(gguf_file, out, DistillConfig())
    model = Model.load(out, mode="ar")
    own = OwnPrompts.of(model, 1.0, [])
    assert own is not None and own.next_index == FIRST
    text = [{"role": "user", "content": "the cat sat"}]
    encoded = model.tokenizer.encode("the cat sat", add_special_tokens=False)
    assert own.prefix + encoded + own.opening == data.conversation_ids(model, text)
    own.max_tokens = 400  # a random target seldom ends a turn: give it room
    folder = tmp_path / "replies"
    data.generate(model, [], folder, 0.0, new_tokens=16, rows=3, at_least=3, own=own)
    got = data.load(folder)
    assert len(got) >= 3 and all(s.index >= FIRST for s in got)
    end = own.opening[0]
    for s in got:
        ids = s.ids.tolist()
        prompt, asked = ids[: s.start], ids[len(own.prefix) : s.start - len(own.opening)]
        assert (
            prompt[: len(own.prefix)] == own.prefix and prompt[-len(own.opening) :] == own.opening
        )
        assert len(asked) >= own.min_tokens and end not in asked
        assert ids[s.start :] == model.generate(prompt, max_new_tokens=16).tokens
        assert (s.top_ids[:, 0] == data.score(model, ids)[1][:, 0]).all()
    assert len({tuple(s.ids[: s.start]) for s in got}) == len(got)  # no prompt twice
    assert [held_out(i) for i in (FIRST, FIRST + 1, FIRST + 11, 1)] == [False, True, True, False]
    again = OwnPrompts.of(model, 1.0, [s.index for s in got] + [3])
    assert again is not None and again.next_index == max(s.index for s in got) + 1
    assert OwnPrompts.of(model, 0.0, []) is None


def test_with_the_built_in_prompts_the_target_also_answers_its_own(gguf_file, tmp_path):
    """A distill without a prompts file has rows answer prompts the target writes (all of
    them at share 1) and trains on them; a held-out one is scored under its own kind."""
    from edgespec.distill.own import FIRST, held_out
    from edgespec.distill.pipeline import DistillConfig, distill
    from edgespec.distill.train import TrainConfig

    out = tmp_path / "b"
    # no share for replies: the two every distill makes
    config = DistillConfig(minutes=0.05, new_tokens=12, reply_share=0.0, own_share=1.0,
                           train=TrainConfig(draft_vocab=40))  # fmt: skip
    record = distill(gguf_file, out, config)
    made = sorted(int(p.stem) for p in (out / "distill" / "replies").glob("*.npz"))
    assert len(made) >= 2 and all(i >= FIRST for i in made)
    assert record["samples"] == len(made) and record["steps"] >= 1
    if any(held_out(i) for i in made):
        assert list(record["held_out_by_kind"]) == ["own"]
