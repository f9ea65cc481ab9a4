"""The OpenAI endpoints decode on the split verifier's own target graphs and KV pool: one copy
of the weights in the server, and OpenAI rounds verified in the same batched forwards as the
split sessions' rounds and each other's, every reply still the target's own greedy reply."""

from __future__ import annotations

import asyncio
import threading
import time

import openai
import pytest
from split_server import TOKEN, hold_worker, queued, serve_in_process
from test_openai_server import reference

import edgespec
from edgespec.runtime.chat.session import ChatOptions
from edgespec.runtime.graphs.stack import Stack
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
    chat_bundle, chat_checkpoints, hf_chat
):
    """Three chat requests and two split sessions at once: each gets exactly its solo greedy
    output (transformers'). That rounds of both kinds share a forward is arranged, not left
    to timing: a split device stops after its START, the worker is held once the first chat
    request has prefilled, the device's next round and the chat's next round queue behind
    the hold, and released they run as one batch (a mixed forward). Devices wait for the
    server as long as the test runs (late_after): a loaded machine must not move rounds."""
    import torch

    # one prefill step per prompt (no budget sizing): the arrangement below counts jobs
    server = serve_in_process(chat_bundle, mode="ar", conversations=3, prefill_budget_ms=0)
    state = server.state
    client = openai.OpenAI(base_url=f"{server.http}/v1", api_key=TOKEN, max_retries=0, timeout=120)
    chats = [[{"role": "user", "content": f"Tell me about {t}."}] for t in ("tea", "rain", "owls")]
    prompts = [[5, 9, 31, 7, 2, 40], [11, 3, 8, 8, 21]]
    new = 24
    got: dict = {}
    errors: list = []
    started, go = threading.Event(), threading.Event()

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
                chat_bundle, mode="split", server=server.url, token=TOKEN, draft_policy="fixed:1",
                timeout=120, late_after=120, threads=1,
            )  # fmt: skip
            tokens, local = [], 0
            for k, chunk in enumerate(device.stream(prompts[i], max_new_tokens=new)):
                tokens += chunk.tokens
                local += chunk.stats.verifier == "local"
                if k == 0 and i == 0:  # after its START: no round is sent until resumed
                    started.set()
                    assert go.wait(120)
            assert local == 0  # every round verified by the server
            got[("split", i)] = tokens
            device.remote.drop()
        except Exception as e:
            errors.append(e)
            started.set()

    # the arrangement needs the first chat reply to go on for two rounds past its prefill
    assert reference(hf_chat, chats[0], new)[1] >= 3
    first = threading.Thread(target=split, args=(0,))
    lead = threading.Thread(target=chat, args=(0,))
    rest = [threading.Thread(target=chat, args=(i,)) for i in (1, 2)]
    rest.append(threading.Thread(target=split, args=(1,)))
    holds: list = []
    try:
        first.start()
        assert started.wait(120)
        holds.append(hold_worker(state))
        lead.start()
        _until(lambda: queued(state) == 1)  # the chat's prefill, behind the hold
        # behind that prefill, a hold that lets it finish, then stops the chat's next round
        prefilled = lambda: state.chat.stats.prefilled_positions > 0  # noqa: E731
        holds.append(hold_worker(state, wait=False, until=prefilled))
        holds[0].release()
        holds[1].wait_held()
        go.set()  # the device sends its next round
        _until(lambda: queued(state) == 2)  # it and the chat's next round
        holds[1].release()  # ... run as one batch: a mixed forward
        for t in rest:
            t.start()
        for t in [first, lead, *rest]:
            t.join(timeout=180)
        # a split device's END is a notification: the server frees its session a moment
        # after generate() returns
        _until(lambda: not (server.health()["sessions"] or server.health()["openai"]["active"]))
        stats = server.health()
    finally:
        for hold in holds:
            hold.release()
        go.set()
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


def _until(what, seconds: float = 120.0) -> None:
    end = time.monotonic() + seconds
    while not what():
        assert time.monotonic() < end, "the server never reached the arranged state"
        time.sleep(0.01)
