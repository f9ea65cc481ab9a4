"""The OpenAI endpoints decode on the split verifier's own target graphs and KV pool: one copy
of the weights in the server, and OpenAI rounds verified in the same batched forwards as the
split sessions' rounds and each other's, every reply still the target's own greedy reply."""

from __future__ import annotations

import asyncio
import threading
import time

import openai
import pytest
from split_server import TOKEN, start_server
from test_openai_server import reference

import edgespec
from edgespec.runtime.chat import ChatOptions
from edgespec.runtime.stack import Stack
from edgespec.serve.pool_verifier import PoolVerifier
from edgespec.serve.server import stop
from edgespec.serve.state import ServerConfig, load_state


@pytest.fixture(scope="module")
def hf_chat(chat_checkpoints):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = chat_checkpoints["target"]
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


@pytest.mark.parametrize("mode", ["ar", "spec", "self-spec", "lookup"])
def test_the_openai_engine_runs_on_the_verifiers_own_target_graphs(chat_bundle, mode):
    state = load_state(ServerConfig(str(chat_bundle), threads=1, mode=mode, conversations=3))
    try:
        engine = state.chat
        assert engine is not None and engine.model.mode == mode
        target = engine.model.target
        assert target is not None
        # the same graph session objects, not equal copies: one set of target weights
        assert all(a is b for a, b in zip(target.stages, state.stages, strict=True))
        roles = [g.graph.role for g in state.stages]
        assert roles == (["head@2", "tail@2"] if mode == "self-spec" else ["full"])
        # each conversation's cache is a reserved row of the split sessions' pool
        rows = [s.verifier for s in engine.sessions]
        assert all(isinstance(v, PoolVerifier) and v.pool is state.pool for v in rows)
        assert all(v.stages is state.stages for v in rows)  # type: ignore[union-attr]
        assert sorted(v.slot for v in rows) == sorted(state.pool.reserved) == [0, 1, 2]
        assert state.pool.held == 0  # reserved rows are no sessions (/health, max_sessions)
        drafter = engine.sessions[0].drafter
        if mode == "self-spec":  # the head drafts from the verifier's own head@2 session
            assert isinstance(drafter.model, Stack)  # type: ignore[attr-defined]
            assert drafter.model.stages[0] is state.stages[0]  # type: ignore[attr-defined]
        # every graph the process opened, opened once
        opened = list(state.chat.model.graphs.opened.values())
        assert len({id(g.session) for g in opened}) == len(opened)
    finally:
        stop(state)


def test_a_second_turn_prefills_only_its_new_positions_on_the_pool_row(chat_bundle, hf_chat):
    """In process: the positions the worker ran through the target for the second turn are
    exactly the prompt past the cached prefix, and the reply is still transformers' own."""
    state = load_state(ServerConfig(str(chat_bundle), threads=1, mode="spec", conversations=2))
    engine = state.chat
    assert engine is not None

    async def ask(messages):
        prompt = engine.sessions[0].prepare(messages, ChatOptions(max_new_tokens=8))
        before = state.worker.step_work
        job = engine.submit(prompt)
        while True:
            kind, payload = await job.queue.get()
            if kind == "done":
                return payload, state.worker.step_work - before
            assert kind == "chunk", payload

    messages = [{"role": "user", "content": "Tell me something about rivers."}]
    try:
        first, ran = asyncio.run(ask(messages))
        assert (first.cached_tokens, ran) == (0, first.prompt_tokens)
        messages += [
            {"role": "assistant", "content": first.text},
            {"role": "user", "content": "And lakes?"},
        ]
        second, ran = asyncio.run(ask(messages))
    finally:
        stop(state)
    assert second.cached_tokens >= first.prompt_tokens
    assert ran == second.prompt_tokens - second.cached_tokens
    assert second.text == reference(hf_chat, messages, 8)[0]


def test_openai_requests_and_split_sessions_share_forwards_and_keep_their_outputs(
    chat_bundle, chat_checkpoints, hf_chat, tmp_path
):
    """Three chat requests and two split sessions at once: each gets exactly its solo greedy
    output (transformers'), and the batch stats show OpenAI rounds sharing forwards, with
    each other and with split rounds."""
    import torch

    server = start_server(
        chat_bundle,
        tmp_path,
        TOKEN,
        *("--mode", "ar", "--conversations", "3", "--batch-window-ms", "20"),
    )
    client = openai.OpenAI(base_url=f"{server.http}/v1", api_key=TOKEN, max_retries=0, timeout=60)
    chats = [[{"role": "user", "content": f"Tell me about {t}."}] for t in ("tea", "rain", "owls")]
    prompts = [[5, 9, 31, 7, 2, 40], [11, 3, 8, 8, 21]]
    new = 24
    got: dict = {}
    errors: list = []

    def chat(i: int) -> None:
        try:
            r = client.chat.completions.create(
                model="m",
                messages=chats[i],
                max_tokens=new,
                temperature=0,
            )
            got[("chat", i)] = r.choices[0].message.content
        except Exception as e:  # reported below
            errors.append(e)

    def split(i: int) -> None:
        try:
            device = edgespec.load(
                chat_bundle, mode="split", server=server.url, token=TOKEN, draft_policy="fixed:1"
            )
            out = device.generate(prompts[i], max_new_tokens=new)
            assert out.stats.local_rounds == 0  # every round verified by the server
            got[("split", i)] = out.tokens
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=chat, args=(i,)) for i in range(len(chats))]
    threads += [threading.Thread(target=split, args=(i,)) for i in range(len(prompts))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=180)
        stats = server.health()
        # a split device's END is a notification: the server frees its session a moment
        # after generate() returns (one CI run read the health before that)
        deadline = time.monotonic() + 10
        while (stats["sessions"] or stats["openai"]["active"]) and time.monotonic() < deadline:
            time.sleep(0.05)
            stats = server.health()
    finally:
        server.stop()
    assert not errors, errors
    for i, messages in enumerate(chats):
        assert got[("chat", i)] == reference(hf_chat, messages, new)[0]
    model = hf_chat[0]
    for i, ids in enumerate(prompts):
        with torch.no_grad():
            want = model.generate(
                torch.tensor([ids]),
                max_new_tokens=new,
                do_sample=False,
                eos_token_id=model.generation_config.eos_token_id,
                pad_token_id=0,
            )
        assert got[("split", i)] == want[0, len(ids) :].tolist()
    assert stats["openai_rounds"] > 0
    assert stats["openai_rounds_shared"] > 0, stats
    assert stats["mixed_forwards"] > 0, stats  # an OpenAI round and a split round, one forward
    assert stats["sessions"] == 0 and stats["openai"]["active"] == 0
