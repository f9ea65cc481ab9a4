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
from edgespec.runtime.target import Target
from edgespec.serve import protocol as P
from edgespec.serve.batching import KVPool, _alone, _steps, forward_rounds, plan
from edgespec.serve.worker import Worker

ARCH = "llama-gqa-tied"


@pytest.fixture(scope="module")
def bundle(spec_bundles):
    return spec_bundles[ARCH]


def pool_for(stages, sessions: int, context: int = 96) -> KVPool:
    m = stages[0].model
    layers = list(range(m.num_layers))
    return KVPool.allocate(layers, m.num_kv_heads, m.head_dim, context, sessions, np.float32)


@pytest.mark.parametrize("verifier", ["full", "exit:2"])
def test_stepped_batch_matches_each_row_alone(bundle, verifier):
    """Rows of different lengths and round widths, idle rows inside the range, free slots,
    stepped and alone rounds in one batch: every row's logits equal a batch-1 forward of its
    whole sequence."""
    stages = edgespec.load(bundle, mode="ar", verifier=verifier, threads=1).target.stages
    pool = pool_for(stages, 6)
    rng = np.random.default_rng(0)
    seqs: dict[int, list[int]] = {}
    for _ in range(5):  # slot 5 stays free
        slot = pool.acquire()
        seqs[slot] = [int(t) for t in rng.integers(1, 500, int(rng.integers(1, 30)))]
        _alone(stages, pool, slot, np.asarray(seqs[slot]))
    cases = ([1, 3, 0, 2, 1], [4, 1, 1, 1, 1], [1, 1, 1, 1, 1], [2, 1, 1, 6, 1], [0, 2, 1, 3, 0])
    for k, widths in enumerate(cases):
        work = [(s, rng.integers(1, 500, w)) for s, w in enumerate(widths) if w]
        # all stepped (narrower rounds get dummies), or planned: some stepped, wide ones alone
        run = _steps if k % 2 == 0 else forward_rounds
        logits, per_forward = run(stages, pool, work)
        assert max(per_forward) > 1
        for (slot, ids), got in zip(work, logits, strict=True):
            seqs[slot] += [int(t) for t in ids]
            ref = Target(stages)
            ref.reset(96)
            want = ref.forward(np.asarray(seqs[slot]), keep=len(ids))
            np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
            assert pool.lengths[slot] == len(seqs[slot])


def test_plan_steps_rounds_together_only_where_it_saves_forwards():
    assert plan([5]) == 0  # alone
    assert plan([1, 1]) == 1  # γ = 0 rounds: one forward instead of two
    assert plan([5, 5, 5]) == 0  # 5 steps are no better than 3 forwards
    assert plan([5, 1, 1, 1, 1, 1]) == 1  # five rounds in 1 step, the wide one alone: 2
    assert plan([3, 3, 3, 3, 3, 9]) == 3  # 3 steps + 1 instead of 6 forwards


def ws(server):
    headers = {"Authorization": f"Bearer {TOKEN}"}
    return connect(f"{server.url}/v1/session", additional_headers=headers, proxy=None, legacy=True)


def test_rounds_arriving_together_share_forwards_and_stay_lossless(bundle, tmp_path):
    """Six sessions, different prompts and draft lengths (0..4), drafts right for a prefix
    then wrong, all sent before any answer is read: every answer is what `ar` decides, and
    the server reports forwards that served several rounds."""
    ar = edgespec.load(bundle, threads=1)
    vocab = ar.manifest.target.vocab_size
    prompts = [ar.encode(p) for p in ("def f(x):", "import os\n", "x = 1", "# a", "class A:")]
    prompts.append(list(range(5, 18)))
    n_new = 14
    wants = [ar.generate(p, max_new_tokens=n_new, ignore_eos=True).tokens for p in prompts]
    server = start_server(bundle, tmp_path, TOKEN, "--max-batch", "8", "--batch-window-ms", "200")
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
        assert health["largest_batch"] > 1, health
        assert max(int(k) for k in health["rounds_per_forward"]) > 1, health
    finally:
        server.stop()


def test_concurrent_split_clients_generate_what_each_generates_alone(bundle, tmp_path):
    """The split client, several at once with different draft lengths and sampling seeds:
    each output equals the one it got from the server alone (greedy ones equal `ar`)."""
    server = start_server(bundle, tmp_path, TOKEN, "--batch-window-ms", "5")
    # (prompt, γ, temperature)
    configs = [("def f(x):", 0, 0.0), ("import os\n", 1, 0.0), ("x = [1", 3, 0.9), ("a", 2, 1.0)]

    def run(prompt, gamma, temperature):
        model = edgespec.load(
            bundle,
            mode="split",
            server=server.url,
            token=TOKEN,
            draft_policy=f"fixed:{gamma}",
            threads=1,
            local_fallback=False,
        )
        out = model.generate(
            prompt, max_new_tokens=16, ignore_eos=True, temperature=temperature, seed=11
        )
        return out.tokens

    try:
        alone = [run(*c) for c in configs]
        together: list = [None] * len(configs)

        def device(i):
            together[i] = run(*configs[i])

        threads = [threading.Thread(target=device, args=(i,)) for i in range(len(configs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert together == alone
        ar = edgespec.load(bundle, threads=1)
        for (prompt, _, temperature), tokens in zip(configs, together, strict=True):
            if temperature == 0.0:
                assert tokens == ar.generate(prompt, max_new_tokens=16, ignore_eos=True).tokens
        assert server.health()["rounds_served"] > 0
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
