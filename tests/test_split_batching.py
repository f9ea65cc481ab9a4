"""Continuous batching of verify rounds: rounds that arrive together share forwards and each
session still gets exactly what it gets alone (greedy: what local `ar` generates)."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
from split_server import TOKEN, start_server
from websockets.sync.client import connect

import edgespec
from edgespec import protocol as P
from edgespec.runtime.draft_q import quantize
from edgespec.runtime.graphs.kv_cache import KVPool
from edgespec.runtime.graphs.stack import Stack
from edgespec.serve.batching import forward_alone, forward_batch, forward_rounds, plan
from edgespec.serve.worker import Worker

ARCH = "llama-gqa-tied"


@pytest.fixture(scope="module")
def bundle(spec_bundles):
    return spec_bundles[ARCH]


def pool_for(stages, sessions: int, context: int = 96) -> KVPool:
    m = stages[0].model
    layers = list(range(m.num_layers))
    return KVPool.allocate(layers, m.num_kv_heads, m.head_dim, context, sessions, np.float32)


def fill(stages, pool, rng, rows: int) -> dict[int, list[int]]:
    seqs: dict[int, list[int]] = {}
    for _ in range(rows):
        slot = pool.acquire()
        seqs[slot] = [int(t) for t in rng.integers(1, 500, int(rng.integers(1, 30)))]
        forward_alone(stages, pool, slot, np.asarray(seqs[slot]))
    return seqs


def alone(stages, seq: list[int], n: int, context: int = 96) -> np.ndarray:
    ref = Stack(stages)
    ref.reset(context)
    return ref.forward(np.asarray(seq), keep=n)


FAMILIES = ["qwen3", "gemma2", "gemma3", "mistral"]  # tests/family_configs.py


@pytest.mark.parametrize(
    "arch,verifier",
    [(ARCH, "full"), (ARCH, "exit:2"), ("gpt2", "full"), ("qwen2", "full")]
    + [(family, "full") for family in FAMILIES]
    + [("gemma3", "exit:2")],
)
def test_full_width_batch_matches_each_row_alone(request, arch, verifier):
    """Rows of different lengths and round widths in ONE forward ([rows, max width], padded),
    with idle rows inside the range and a free slot: every row's logits equal a batch-1
    forward of its whole sequence, and idle rows keep their cache untouched. Also for the
    families' graphs: q/k norms, soft-caps and sliding windows of 16 that the rows cross."""
    bundles = request.getfixturevalue("family_bundles" if arch in FAMILIES else "spec_bundles")
    stages = edgespec.load(bundles[arch], mode="ar", verifier=verifier, threads=1)
    stages = stages.target.stages
    assert all(g.batched for g in stages)  # every dynamic graph takes query_seqlens
    pool = pool_for(stages, 6)
    rng = np.random.default_rng(0)
    seqs = fill(stages, pool, rng, 5)  # slot 5 stays free
    cases = ([1, 3, 0, 2, 1], [4, 1, 1, 1, 1], [1, 1, 1, 1, 1], [2, 5, 1, 3, 4], [0, 2, 1, 3, 0])
    for widths in cases:
        work = [(s, rng.integers(1, 500, w)) for s, w in enumerate(widths) if w]
        idle = [s for s, w in enumerate(widths) if not w]
        before = [pool.keys[-1][s].copy() for s in idle]
        logits = forward_batch(stages, pool, work)
        for (slot, ids), got in zip(work, logits, strict=True):
            seqs[slot] += [int(t) for t in ids]
            np.testing.assert_allclose(got, alone(stages, seqs[slot], len(ids)), atol=1e-4)
            assert pool.lengths[slot] == len(seqs[slot])
        for s, cache in zip(idle, before, strict=True):
            np.testing.assert_array_equal(pool.keys[-1][s], cache)
    assert max(len(seq) for seq in seqs.values()) > 16  # past the families' windows


def test_rounds_together_in_one_forward_and_wide_or_full_rows_alone(bundle):
    """forward_rounds runs rounds of similar width in one forward; a round much wider than the
    rest, and one whose row has no room for the padded chunk after it, run alone."""
    stages = edgespec.load(bundle, mode="ar", threads=1).target.stages
    pool = pool_for(stages, 5, context=39)  # rows of 39 positions + 1 of room for a pad
    seqs = [list(range(1, 37)), [3, 4, 5], [6, 7], [8], [9, 10]]
    for seq in seqs:
        forward_alone(stages, pool, pool.acquire(), np.asarray(seq))
    work = [(0, np.asarray([9, 10])), (1, np.asarray([13, 2, 3, 4, 5]))]
    work += [(2, np.asarray([14, 15, 16])), (3, np.asarray([17] * 20)), (4, np.asarray([18]))]
    # width 5 for rounds 1, 2, 4 (and 0); row 0 (36 + 5 > 39 + 1) and round 3 (20 wide) alone
    logits, forwards = forward_rounds(stages, pool, work)
    assert sorted(forwards) == [[0], [1, 2, 4], [3]]
    for (slot, ids), got in zip(work, logits, strict=True):
        want = alone(stages, seqs[slot] + list(ids), len(ids), context=40)
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    assert list(pool.lengths) == [38, 8, 5, 21, 3]


def test_plan_batches_rounds_unless_padding_would_dominate():
    assert plan([5]) == 0  # alone
    assert plan([1, 1]) == 1  # γ = 0 rounds: one forward instead of two
    assert plan([5, 5, 5]) == 5  # γ = 4 rounds: one forward at full width
    assert plan([5, 1, 1, 1, 1, 1]) == 1  # the wide one alone (10 real positions, 30 padded)
    assert plan([3, 3, 3, 3, 3, 9]) == 3
    assert plan([1, 2, 3, 4, 5]) == 5


def ws(server):
    headers = {"Authorization": f"Bearer {TOKEN}"}
    return connect(f"{server.url}/v1/session", additional_headers=headers, proxy=None, legacy=True)


@pytest.mark.parametrize("max_batch", [8, 1])
def test_rounds_arriving_together_share_forwards_and_stay_lossless(bundle, tmp_path, max_batch):
    """Six sessions, different prompts and draft lengths (0..4), drafts right for a prefix
    then wrong, all sent before any answer is read: every answer is what `ar` decides, and
    the server reports forwards that served several rounds (none with --max-batch 1)."""
    ar = edgespec.load(bundle, threads=1)
    vocab = ar.manifest.target.vocab_size
    prompts = [ar.encode(p) for p in ("def f(x):", "import os\n", "x = 1", "# a", "class A:")]
    prompts.append(list(range(5, 18)))
    n_new = 14
    wants = [ar.generate(p, max_new_tokens=n_new, ignore_eos=True).tokens for p in prompts]
    server = start_server(
        bundle, tmp_path, TOKEN, "--max-batch", str(max_batch), "--batch-window-ms", "200"
    )
    try:
        conns = [ws(server) for _ in prompts]
        seqs = []
        for conn, prompt, want in zip(conns, prompts, wants, strict=True):
            conn.send(P.encode(P.Start(prompt, 64)))
            first = P.decode(conn.recv(timeout=10))
            assert first.token == want[0]
            seqs.append([*prompt, first.token])
        for r in range(4):
            sent = []
            for i, conn in enumerate(conns):
                done = len(seqs[i]) - len(prompts[i])
                gamma = min((i + r) % 5, n_new - done - 1)
                drafts = list(wants[i][done : done + gamma])
                wrong_at = (i + 2 * r) % 6  # beyond γ: every draft is right
                if wrong_at < gamma:
                    drafts[wrong_at] = (drafts[wrong_at] + 1) % vocab
                conn.send(P.encode(P.Verify(len(seqs[i]), drafts)))
                sent.append((drafts, min(wrong_at, gamma)))
            for i, conn in enumerate(conns):
                reply = P.decode(conn.recv(timeout=30))
                drafts, n = sent[i]
                done = len(seqs[i]) - len(prompts[i])
                assert isinstance(reply, P.Result), reply
                assert (reply.accepted, reply.token) == (n, wants[i][done + n]), (i, r)
                seqs[i] += [*drafts[:n], reply.token]
        for conn in conns:
            conn.close()
        health = server.health()
        if max_batch == 1:
            assert health["largest_batch"] == 1 and set(health["rounds_per_forward"]) == {"1"}
        else:
            assert health["largest_batch"] > 1, health
            assert max(int(k) for k in health["rounds_per_forward"]) > 1, health
    finally:
        server.stop()


def test_concurrent_split_clients_generate_what_ar_generates(bundle, tmp_path):
    """The split client (draft model, pipelined), several devices at once with different draft
    lengths: each greedy output equals local `ar`'s. (Sampled outputs of the split client
    depend on timing, through how far it drafts ahead; the next test covers sampling.)"""
    server = start_server(bundle, tmp_path, TOKEN, "--batch-window-ms", "5")
    configs = [("def f(x):", 0), ("import os\n", 1), ("x = [1", 3), ("a", 2), ("b = (", 0)]
    together: list = [None] * len(configs)

    def device(i):
        prompt, gamma = configs[i]
        model = edgespec.load(
            bundle,
            mode="split",
            server=server.url,
            token=TOKEN,
            draft_policy=f"fixed:{gamma}",
            threads=1,
            local_fallback=False,
        )
        together[i] = model.generate(prompt, max_new_tokens=16, ignore_eos=True).tokens

    try:
        threads = [threading.Thread(target=device, args=(i,)) for i in range(len(configs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        ar = edgespec.load(bundle, threads=1)
        for (prompt, _), tokens in zip(configs, together, strict=True):
            assert tokens == ar.generate(prompt, max_new_tokens=16, ignore_eos=True).tokens
    finally:
        server.stop()


def test_sampled_rounds_answer_the_same_batched_as_alone(bundle, tmp_path):
    """Sampling sessions (seeded, with q rows) played in lockstep, every round batched with
    the others', get the answers they get when each session runs alone."""
    vocab = edgespec.load(bundle).manifest.target.vocab_size
    server = start_server(bundle, tmp_path, TOKEN, "--batch-window-ms", "200")
    rng = np.random.default_rng(5)
    plans = []
    for i in range(5):
        prompt = [int(t) for t in rng.integers(1, vocab, 3 + 4 * i)]
        drafts = [[int(t) for t in rng.integers(1, 40, g)] for g in (1, 0, 2, 1, 0, 1)]
        plans.append((prompt, drafts, 1.0 if i % 2 else 0.8, 100 + i))
    q = quantize(np.arange(1, 40), np.ones(39))  # the drafts' proposal: uniform over 1..39

    def play(conns_plans):
        answers = [[] for _ in conns_plans]
        seqs = []
        for conn, (prompt, _, temperature, seed) in conns_plans:
            conn.send(P.encode(P.Start(prompt, 64, temperature=temperature, seed=seed)))
            first = P.decode(conn.recv(timeout=10))
            answers[len(seqs)].append(first.token)
            seqs.append(len(prompt) + 1)
        for r in range(6):
            for k, (conn, (_, drafts, _, _)) in enumerate(conns_plans):
                d = drafts[r]
                conn.send(P.encode(P.Verify(seqs[k], d, [q] * len(d) if d else None)))
            for k, (conn, _) in enumerate(conns_plans):
                reply = P.decode(conn.recv(timeout=30))
                assert isinstance(reply, P.Result), reply
                answers[k].append((reply.accepted, reply.token))
                seqs[k] = reply.length
        return answers

    try:
        alone = []
        for plan_ in plans:
            with ws(server) as conn:
                alone += play([(conn, plan_)])
        conns = [ws(server) for _ in plans]
        together = play(list(zip(conns, plans, strict=True)))
        for conn in conns:
            conn.close()
        assert together == alone
        assert max(int(k) for k in server.health()["rounds_per_forward"]) > 1
    finally:
        server.stop()


def test_worker_batches_queued_rounds_in_order_up_to_max_batch():
    """Rounds queued while the worker is busy form batches of at most max_batch, in order;
    a call between rounds splits them; an error reaches only its own round."""
    seen: list[list] = []

    def rounds(items):
        seen.append(list(items))
        return [(None, ValueError("bad")) if i == 3 else (i * 10, None) for i in items]

    worker = Worker(rounds, max_batch=2)
    gate = threading.Event()

    async def main():
        worker.submit(gate.wait)  # hold the worker while everything below queues up
        tasks = [asyncio.ensure_future(worker.round(i)) for i in range(5)]
        await asyncio.sleep(0.05)
        tasks.append(asyncio.ensure_future(worker.run(lambda: "call")))
        await asyncio.sleep(0.05)
        tasks.append(asyncio.ensure_future(worker.round(5)))
        await asyncio.sleep(0.05)
        gate.set()
        return await asyncio.gather(*tasks, return_exceptions=True)

    try:
        results = asyncio.run(main())
    finally:
        worker.stop()
    assert seen == [[0, 1], [2, 3], [4], [5]]
    assert results[:3] == [0, 10, 20] and isinstance(results[3], ValueError)
    assert results[4:] == [40, "call", 50]


def test_worker_window_waits_for_a_late_round():
    seen: list[list] = []

    def rounds(items):
        seen.append(list(items))
        return [(i, None) for i in items]

    worker = Worker(rounds, max_batch=8, window=1.0)

    async def main():
        first = asyncio.ensure_future(worker.round(0))
        await asyncio.sleep(0.1)  # well inside the window
        return await asyncio.gather(first, worker.round(1))

    try:
        assert asyncio.run(main()) == [0, 1]
    finally:
        worker.stop()
    assert seen == [[0, 1]]


def test_concurrent_completions_match_ar(bundle, tmp_path):
    """/v1/completions requests at once (decoded in turn by the OpenAI engine, see
    test_openai_server.py) each answer with plain greedy decoding of their prompt."""
    import json
    import urllib.request

    ar = edgespec.load(bundle, threads=1)
    prompts = ["x = ", "def g(", "import sys", "for i in"]
    server = start_server(bundle, tmp_path, TOKEN, "--batch-window-ms", "50")
    texts: list = [None] * len(prompts)

    def post(i):
        body = {"prompt": prompts[i], "max_tokens": 8, "temperature": 0, "ignore_eos": True}
        req = urllib.request.Request(
            f"{server.http}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {TOKEN}"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            texts[i] = json.load(r)["choices"][0]["text"]

    try:
        threads = [threading.Thread(target=post, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=90)
        for prompt, text in zip(prompts, texts, strict=True):
            assert text == ar.generate(prompt, max_new_tokens=8, ignore_eos=True).text
    finally:
        server.stop()
