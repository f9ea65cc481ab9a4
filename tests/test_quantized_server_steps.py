"""A verifier server pads its target calls as the device pads its own (the bundle's step_width).

On a bundle whose activations are quantized, a call's logits are bitwise the device's own only
when it runs as the device's calls run: any width on blocks of 32 (the graph pads a lone row's
attention), an even number of positions on wider blocks (tests/test_quantized_steps.py). The
server's calls — prefill chunks, split sessions' verify rounds alone and batched, the OpenAI
conversations' rounds — run through `serve.batching`, which pads them the same way (a batched
row at least two wide); so split decoding and the OpenAI endpoint give local `ar`'s greedy
tokens on such bundles.
"""

from __future__ import annotations

import threading

import numpy as np
import openai
import pytest
from split_server import TOKEN, start_server
from test_split_streaming import Scripted

import edgespec
from edgespec.bundle import load_manifest
from edgespec.runtime.graphs.kv_cache import KVPool
from edgespec.serve.batching import forward_alone, forward_batch

gguf = pytest.importorskip("gguf")


N_NEW = 40


def _prompts(folder, n: int = 40) -> list[list[int]]:
    """Odd and even lengths. Before the server padded its calls, 3 of these 40 left `ar`'s
    tokens in split decoding at fixed:2 (three-wide rounds) on the int8 export, and several
    on the Q4_1 blocks (a random model's logits rarely tie closely enough for the rounding
    difference to change the argmax, so the test takes many prompts)."""
    rng = np.random.default_rng(5)
    vocab = load_manifest(folder).target.vocab_size
    return [list(map(int, rng.integers(3, vocab, 5 + k % 9))) for k in range(n)]


def _ar(folder, prompts) -> list[list[int]]:
    model = edgespec.load(folder, mode="ar", threads=1)
    return [model.generate(p, max_new_tokens=N_NEW, ignore_eos=True).tokens for p in prompts]


def test_batched_rows_give_the_logits_of_the_same_rows_alone(held_blocks):
    """The measurement under the batching: with every row padded as `row_width` says, a
    row's logits in a shared forward are bitwise its logits alone (a one-position row among
    wider ones, odd and even widths, rows of different lengths, an idle row between them)."""
    model = edgespec.load(held_blocks, mode="ar", threads=1)
    stages, m = model.target.stages, model.target.model
    prompts = _prompts(held_blocks, 3)[::-1]
    rounds = [np.asarray(p[:w], np.int64) for p, w in zip(prompts, (1, 4, 3), strict=True)]

    def pool_with_prompts() -> KVPool:
        pool = KVPool.allocate(model.target.layers, m.num_kv_heads, m.head_dim, 64, 4,
                               stages[0].kv_dtype, model.target.step_width)  # fmt: skip
        for slot, p in zip((0, 1, 3), prompts, strict=True):  # row 2 stays idle
            forward_alone(stages, pool, slot, np.asarray(p, np.int64))
        return pool

    pool = pool_with_prompts()
    alone = [forward_alone(stages, pool, s, r) for s, r in zip((0, 1, 3), rounds, strict=True)]
    pool = pool_with_prompts()
    together = forward_batch(stages, pool, list(zip((0, 1, 3), rounds, strict=True)))
    for a, b in zip(alone, together, strict=True):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("bundle", ["held_blocks", "int8_export"])
def test_split_decoding_on_quantized_activations_gives_local_ars_tokens(bundle, request, tmp_path):
    folder = request.getfixturevalue(bundle)
    prompts = _prompts(folder)
    ar = _ar(folder, prompts)
    server = start_server(folder, tmp_path, TOKEN, "--max-batch", "4")
    try:
        for options in ({"draft_policy": "fixed:2"}, {"draft_policy": "fixed:1"},
                        {"drafter": "lookup"}):  # fmt: skip
            client = edgespec.load(folder, mode="split", server=server.url, token=TOKEN,
                                   threads=1, **options)  # fmt: skip
            got = [client.generate(p, max_new_tokens=N_NEW, ignore_eos=True).tokens
                   for p in prompts]  # fmt: skip
            assert got == ar, options
        # several devices at once: their rounds share batched forwards
        got2: dict[int, list[int]] = {}

        def run(i: int) -> None:
            c = edgespec.load(folder, mode="split", server=server.url, token=TOKEN,
                              draft_policy=f"fixed:{1 + i % 3}", threads=1)  # fmt: skip
            got2[i] = c.generate(prompts[i], max_new_tokens=N_NEW, ignore_eos=True).tokens

        threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert [got2.get(i) for i in range(6)] == ar[:6]
    finally:
        server.stop()


@pytest.mark.parametrize("mode", ["self-spec", "lookup"])
def test_a_server_of_every_mode_verifies_and_streams_ars_tokens(held_blocks, mode, tmp_path):
    """Split rounds on a server whose target is head@1 + tail@1 (self-spec) and streamed
    decoding (the server drafts and verifies on its own) both give local `ar`'s tokens."""
    prompts = _prompts(held_blocks, 12)
    ar = _ar(held_blocks, prompts)
    server = start_server(held_blocks, tmp_path, TOKEN, "--mode", mode)
    try:
        for script in ([("split", 2)], [("stream", 0)]):
            client = edgespec.load(held_blocks, mode="split", server=server.url, token=TOKEN,
                                   threads=1, late_after=30.0)  # fmt: skip
            client.policy = Scripted(script)  # type: ignore[assignment]
            outs = [client.generate(p, max_new_tokens=N_NEW, ignore_eos=True) for p in prompts]
            assert [o.tokens for o in outs] == ar, script
            if script[0][0] == "stream":
                assert all(o.stats.stream_rounds >= 1 for o in outs)
    finally:
        server.stop()


@pytest.mark.parametrize("mode", ["ar", "lookup", "self-spec"])
def test_the_openai_endpoint_on_quantized_activations_gives_local_ars_reply(
    held_blocks, mode, tmp_path
):
    chats = [[{"role": "user", "content": t}] for t in ("tea and rain", "owls", "a b c a b c")]
    local = edgespec.load(held_blocks, mode="ar", threads=1)
    want = [local.chat_session().reply(c, _options()).tokens for c in chats]
    server = start_server(held_blocks, tmp_path, TOKEN, "--mode", mode)
    try:
        client = openai.OpenAI(base_url=f"{server.http}/v1", api_key=TOKEN, max_retries=0,
                               timeout=120)  # fmt: skip
        tok = local.tokenizer
        for c, w in zip(chats, want, strict=True):
            r = client.chat.completions.create(model="m", messages=c, max_tokens=N_NEW,
                                               temperature=0)  # fmt: skip
            assert r.choices[0].message.content == tok.decode(w, skip_special_tokens=True)
    finally:
        server.stop()


def _options():
    from edgespec.runtime.chat.session import ChatOptions

    return ChatOptions(max_new_tokens=N_NEW, temperature=0)
