"""Token trees in split mode: a device sends a tree, the server verifies it on its tree graphs
(one forward, its row alone), keeps the accepted path's KV rows and answers with the path.

Against a real `edgespec serve` on loopback, with bundles exported with `--tree-verify`:
greedy split decoding with tree drafters (suffix, lookup) is `ar` token for token while trees
with side branches are sent and some side branch is kept; sampling on trees follows the
target's exact marginals (with a power control that must fail); the server answers trees
by the protocol (PATH), refuses hostile trees by name, and a bundle without tree graphs
offers none and refuses a tree naming `--tree-verify`."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from split_server import TOKEN, start_server
from test_speculative_sampling import CHI2_CRITICAL_P001, chi_square
from test_split_sampling import PARAMS, PROMPT, marginals, sample_counts
from test_split_server import ask, refused, ws
from test_tree_sampling import PointTrees
from test_tree_verify import TreeDrafter

import edgespec
from edgespec import protocol as P
from edgespec.runtime.drafters.tree_draft import AsTree
from edgespec.runtime.policies.split_trees import SplitTrees
from edgespec.runtime.round import Plan, Start
from edgespec.runtime.tree import TokenTree

ARCH = "qwen2"
TEXT = "the cat sat on the mat. the cat sat on the hat. the dog sat on the mat. the cat"


@pytest.fixture(scope="module")
def tree_bundle(checkpoints: dict[str, Path], tmp_path_factory) -> Path:
    from edgespec.export import export_bundle

    out = tmp_path_factory.mktemp("split_trees") / ARCH
    export_bundle(checkpoints[ARCH], out, tree_verify=True)
    return out


@pytest.fixture(scope="module")
def server(tree_bundle, tmp_path_factory):
    s = start_server(tree_bundle, tmp_path_factory.mktemp("server"), TOKEN, "--max-context", "256")
    yield s
    s.stop()


def split_model(bundle: Path, server, drafter: str, trees: str = "on"):
    return edgespec.load(
        bundle,
        mode="split",
        server=server.url,
        token=TOKEN,
        threads=1,
        drafter=drafter,
        trees=trees,
        draft_policy="channel-aware",  # every round on the server (no placement elsewhere)
        late_after=30.0,  # only a failed link moves rounds to the device
    )


@pytest.mark.parametrize("drafter", ["suffix", "lookup"])
def test_greedy_split_trees_are_ar_and_keep_side_branches(tree_bundle, server, drafter):
    ar = edgespec.load(tree_bundle, threads=1)
    want = ar.generate(TEXT, max_new_tokens=128, ignore_eos=True).tokens
    model = split_model(tree_bundle, server, drafter)
    assert isinstance(model.drafter, AsTree) and isinstance(model.policy, SplitTrees)
    # every round the server verifies is a probe tree (a chain of 4 plus side candidates):
    # what rounds cost on this loaded machine decides neither the shapes nor whether trees run
    model.policy.probe_every, model.policy.probe_until = 1, float("inf")
    model.policy.inner.plan = lambda source=None: Plan(4)
    before = server.health()["tree_rounds"]
    got = model.generate(TEXT, max_new_tokens=128, ignore_eos=True)
    assert got.tokens == want
    s = got.stats
    assert s.local_rounds == 0 and s.tree_rounds > 0 and s.tree_nodes > s.tree_rounds
    assert server.health()["tree_rounds"] - before == s.tree_rounds  # verified as trees
    assert model.policy.side_taken > 0  # a side branch was the target's choice, and kept


def priced(seconds_per_node: float, side_hits: bool) -> SplitTrees:
    """A SplitTrees over a real ChannelAware that measured a round trip of 50 ms, a server
    whose seconds grow by `seconds_per_node`, and a drafter whose second candidates the
    target takes often (`side_hits`) or never."""
    from edgespec.runtime.policies.channel import ChannelAware
    from edgespec.runtime.stats import RoundStats

    channel = ChannelAware()
    policy = SplitTrees(channel, lambda: P.MAX_DRAFTS)
    for k in range(60):
        g = 1 + k % 6
        stats = RoundStats("decode", 2, g + 1, 0.05 + g * seconds_per_node, drafted=g, accepted=1)
        stats.verifier, stats.network_seconds = "remote", 0.05
        stats.server_seconds, stats.bytes_up, stats.bytes_down = g * seconds_per_node, 40, 20
        policy.observe(stats)
        if side_hits:  # a tree round: the spine's 2nd token missed, its sibling was taken
            tree = replace(stats, tree_nodes=g + 3, tree_offers=((1, 0), (2, 1), (1, -1)))
            policy.observe(replace(tree, accepted=2))
    return policy


def test_trees_are_priced_from_the_measured_round_time_per_width():
    flat = priced(0.0001, side_hits=True)  # the round trip dominates: width is cheap
    plans = [flat.plan() for _ in range(4)]
    assert all(p.tree_depth and p.length > p.tree_depth for p in plans)
    steep = priced(0.05, side_hits=True)  # every node costs a round trip's worth
    assert all(steep.plan().tree_depth == 0 for _ in range(4))
    useless = priced(0.0001, side_hits=False)  # side candidates never taken: no trees
    useless.probe_every = 10**9
    assert all(useless.plan().tree_depth == 0 for _ in range(4))


def test_a_chain_policy_round_stays_a_chain_until_trees_pay(tree_bundle, server):
    model = split_model(tree_bundle, server, "suffix", trees="auto")
    model.policy.probe_every = 10**9  # no probes: only a priced tree would be sent
    model.policy.margin = 1e9  # ... and none is priced that high
    got = model.generate(TEXT, max_new_tokens=24, ignore_eos=True)
    assert got.stats.tree_rounds == 0 and got.stats.rounds > 1


def test_sampling_on_split_trees_follows_the_target(tiny_vocab_bundle, tmp_path):
    from edgespec.bundle import load_manifest
    from edgespec.export import export_bundle

    bundle = tmp_path / "tree"
    export_bundle(load_manifest(tiny_vocab_bundle).source["model"], bundle, tree_verify=True)
    want = marginals(bundle)
    server = start_server(bundle, tmp_path)
    try:
        model = edgespec.load(
            bundle,
            mode="split",
            server=server.url,
            token=TOKEN,
            threads=1,
            drafter="lookup",
            draft_policy="fixed:6",
            late_after=10.0,
        )
        model.drafter = PointTrees(16)  # random trees of distinct siblings, every round
        counts = sample_counts(model, 1200)
        trees = server.health()["tree_rounds"]
    finally:
        server.stop()
    assert trees >= 1200  # the rounds were trees, verified on the server
    for c, p in zip(counts, want, strict=True):
        assert chi_square(c, p) < CHI2_CRITICAL_P001[15]
    # the test has power: a verifier that kept the first candidate would give the drafter's
    # uniform choice, and the 4th token's counts are not the 2nd token's marginal
    assert chi_square(counts[0], np.full(16, 1 / 16)) > CHI2_CRITICAL_P001[15]
    assert chi_square(counts[2], want[0]) > CHI2_CRITICAL_P001[15]
    assert PARAMS.temperature == 1.0 and len(PROMPT) == 5


def test_the_server_answers_a_tree_with_its_kept_path(tree_bundle, server):
    ar = edgespec.load(tree_bundle, threads=1)
    prompt = ar.encode("def f(x):")
    want = ar.generate(prompt, max_new_tokens=6, ignore_eos=True).tokens
    with ws(server, subprotocols=[P.TREES, P.SUBPROTOCOL]) as conn:
        first = ask(conn, P.Start(prompt, 128))
        assert first.limits is not None and first.limits.tree_nodes == P.MAX_DRAFTS
        assert first.token == want[0]
        # root -> wrong (0), right (1); right -> wrong (2), right (3); wrong -> right (4)
        a, b = want[1], want[2]
        tree = TokenTree((a + 1, a, b + 1, b, b), (-1, -1, 1, 1, 0))
        r = ask(conn, P.Verify(first.length, list(tree.tokens), None, list(tree.parents)))
        assert isinstance(r, P.Result) and r.path == [1, 3] and r.accepted == 2
        assert r.token == want[3] and r.length == first.length + 3
        # the row kept the path's keys and values: the next round continues as ar
        r = ask(conn, P.Verify(r.length, want[4:6]))
        assert r.accepted == 2 and r.path is None
    with ws(server, subprotocols=[P.SUBPROTOCOL]) as conn:  # a device that did not ask
        assert ask(conn, P.Start(prompt, 128)).limits.tree_nodes is None


@pytest.mark.parametrize(
    "parents, code, words",
    [
        ([0, -1], P.BAD_REQUEST, "parent must be the root"),  # its own parent: a cycle
        ([-1, 2, 0], P.BAD_REQUEST, "earlier node"),  # a parent after its child
        ([-1, 200], P.BAD_REQUEST, "earlier node"),  # out of range
        (list(range(-1, 39)), P.TOO_LARGE, "deep"),  # deeper than the limit
    ],
)
def test_hostile_trees_are_refused_by_name(tree_bundle, server, parents, code, words):
    with ws(server, subprotocols=[P.TREES]) as conn:
        first = ask(conn, P.Start([1, 2, 3], 128))
        data = bytearray(P.encode(P.Verify(first.length, [5] * len(parents))))
        data[P.HEADER.size + 4] = P.TREE  # the kind byte: a tree, parents after the drafts
        data += bytes((p + 1) % 256 for p in parents)
        error = refused(conn, bytes(data))
        assert error.code == code and words in error.text
    with ws(server) as conn:  # the server goes on
        assert isinstance(ask(conn, P.Start([1, 2, 3], 128)), P.Result)


def test_too_many_nodes_and_truncated_parents_are_refused(server):
    with ws(server, subprotocols=[P.TREES]) as conn:
        first = ask(conn, P.Start([1, 2, 3], 128))
        many = P.Verify(first.length, [5] * 65, None, [-1] * 65)
        error = refused(conn, P.encode(many))
        assert error.code == P.TOO_LARGE and "exceed the limit 64" in error.text
    with ws(server, subprotocols=[P.TREES]) as conn:
        first = ask(conn, P.Start([1, 2, 3], 128))
        short = P.encode(P.Verify(first.length, [5, 6], None, [-1, 0]))[:-1]
        assert "truncated" in refused(conn, short).text


def test_a_bundle_without_tree_graphs_offers_none_and_refuses_a_tree(
    checkpoints, tmp_path, tree_bundle
):
    from edgespec.export import export_bundle

    plain = tmp_path / "plain"
    export_bundle(checkpoints[ARCH], plain)
    server = start_server(plain, tmp_path)
    try:
        with ws(server, subprotocols=[P.TREES, P.SUBPROTOCOL]) as conn:
            first = ask(conn, P.Start([1, 2, 3], 128))
            assert first.limits.tree_nodes == 0
            tree = P.Verify(first.length, [5, 6], None, [-1, -1])
            error = refused(conn, P.encode(tree))
            assert error.code == P.BAD_REQUEST and "--tree-verify" in error.text
        # the device reads the offer and sends chains: split trees=on decodes as ar
        ar = edgespec.load(tree_bundle, threads=1)
        want = ar.generate(TEXT, max_new_tokens=16, ignore_eos=True).tokens
        model = split_model(tree_bundle, server, "suffix")
        model.policy.probe_every, model.policy.probe_until = 1, float("inf")
        got = model.generate(TEXT, max_new_tokens=16, ignore_eos=True)
        assert got.tokens == want and got.stats.tree_rounds == 0
        assert server.health()["tree_rounds"] == 0
    finally:
        server.stop()


def test_mutated_tree_frames_on_a_live_server_are_answered_by_name(tree_bundle, server):
    """Tree VERIFY frames the real split client sent, mutated (bit flips, boundary bytes,
    truncation, junk): every one is answered (a PATH, a RESULT or an ERROR naming the
    problem, never a 500 or a hang), and the server's slots all come back."""
    import random

    from test_server_fuzz import mutate

    sent: list[bytes] = []
    encode = P.encode

    def recording(msg):
        sent.append(encode(msg))
        return sent[-1]

    model = split_model(tree_bundle, server, "suffix")
    model.policy.probe_every, model.policy.probe_until = 1, float("inf")
    model.policy.inner.plan = lambda source=None: Plan(4)
    P.encode = recording
    try:
        model.generate(TEXT, max_new_tokens=48, ignore_eos=True)
    finally:
        P.encode = encode
    model.remote.drop()
    trees = [f for f in sent if f[3] == P.VERIFY and f[P.HEADER.size + 4] & P.TREE]
    start = next(f for f in sent if f[3] == P.START)
    assert trees
    rng, answers = random.Random(36), {"ok": 0, "error": 0, "closed": 0}
    for _ in range(60):
        with ws(server, subprotocols=[P.TREES]) as conn:
            first = ask(conn, start)
            frame = bytearray(rng.choice(trees))
            frame[P.HEADER.size : P.HEADER.size + 4] = first.length.to_bytes(4, "little")
            conn.send(mutate(rng, bytes(frame)))
            try:
                answer = P.decode(conn.recv(timeout=10))
            except Exception as e:  # the server closed after its ERROR
                assert type(e).__name__.startswith("Connection"), e
                answers["closed"] += 1
                continue
            assert not (isinstance(answer, P.Error) and answer.code == P.INTERNAL), answer
            answers["error" if isinstance(answer, P.Error) else "ok"] += 1
    assert answers["error"] > 0 and answers["ok"] > 0, answers
    deadline = time.monotonic() + 5
    while server.health()["sessions"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.health()["sessions"] == 0


def test_a_device_bundle_without_tree_graphs_sends_trees_and_falls_back_on_main_paths(
    checkpoints, tmp_path, tree_bundle, server
):
    """The server's graphs verify trees, so the device's bundle needs none; its own fallback
    verifier then verifies a tree proposal's main path (a late round, a lost link)."""
    from edgespec.export import export_bundle
    from edgespec.runtime.sampling import SamplingParams

    plain = tmp_path / "plain"
    export_bundle(checkpoints[ARCH], plain)
    ar = edgespec.load(tree_bundle, threads=1)
    want = ar.generate(TEXT, max_new_tokens=48, ignore_eos=True).tokens
    model = split_model(plain, server, "suffix")
    model.policy.probe_every, model.policy.probe_until = 1, float("inf")
    model.policy.inner.plan = lambda source=None: Plan(4)
    got = model.generate(TEXT, max_new_tokens=48, ignore_eos=True)
    assert got.tokens == want and got.stats.tree_rounds > 0 and got.stats.accepted > 0
    local = model.verifier.local
    prompt = ar.encode(TEXT)
    rng = np.random.default_rng(0)
    first, _ = local.prefill(Start(prompt, 128, SamplingParams(), rng))
    a, b = want[1], want[2]
    tree = TokenTree((a + 1, a, b), (-1, -1, 1))  # main path: a + 1 (wrong)
    from edgespec.runtime.round import Proposal

    verdict = local.submit([*prompt, first], Proposal.of_tree(tree), SamplingParams(), rng).result()
    assert not verdict.tree and (verdict.accepted, verdict.tokens) == (0, [a])


@pytest.fixture(scope="module")
def int8_trees(checkpoints, tmp_path_factory) -> Path:
    from edgespec.bundle import load_manifest
    from edgespec.export import export_bundle

    bundle = tmp_path_factory.mktemp("int8") / "b"
    export_bundle(checkpoints["llama-gqa-tied"], bundle, quantize="int8", tree_verify=True)
    assert load_manifest(bundle).step_width == 2
    return bundle


@pytest.mark.parametrize("nodes", [4, 5])
def test_a_pool_row_scores_a_tree_bitwise_as_the_devices_verifier(int8_trees, nodes):
    """The server's tree forward on a pool row (padded to the pool's step width) gives the
    logits the device's own `Stack.forward_tree` gives, bit for bit, and keeps the same
    rows: what makes the server's acceptance the device's."""
    from edgespec.runtime.graphs.kv_cache import KVPool
    from edgespec.runtime.graphs.tree_verify import tree_feed
    from edgespec.serve.batching import forward_alone, forward_tree_alone, keep_rows

    target = edgespec.load(int8_trees, threads=1).target
    prompt = list(range(3, 20))
    rng = np.random.default_rng(nodes)
    parents = [-1] + [int(rng.integers(-1, i)) for i in range(1, nodes)]
    tree = TokenTree(tuple(int(t) for t in rng.integers(0, 200, nodes)), tuple(parents))
    ids, positions, mask = tree_feed(prompt[-1], tree, len(prompt))
    target.reset(64)
    target.forward(np.asarray(prompt[:-1]), keep=1)
    want = target.forward_tree(ids, positions, mask, keep=len(ids))
    m = target.model
    pool = KVPool.allocate(target.layers, m.num_kv_heads, m.head_dim, 64, 2,
                           target.stages[0].kv_dtype, target.step_width)  # fmt: skip
    slot = pool.acquire()
    forward_alone(target.stages, pool, slot, np.asarray(prompt[:-1]))
    got = forward_tree_alone(target.tree_graphs(), pool, slot, ids, positions, mask)
    assert np.array_equal(got, want)
    path = tree.path(nodes - 1)
    target.cache.keep_rows(len(prompt), path)
    keep_rows(pool, slot, len(prompt), path)
    n = len(prompt) + len(path)
    for k, pk in zip(target.cache.keys, pool.keys, strict=True):
        assert np.array_equal(k[0, :, :n], pk[slot, :, :n])


def test_an_int8_activation_bundle_verifies_split_trees_as_ar(int8_trees, tmp_path):
    """Graphs whose activations are quantized run even widths (manifest step_width 2): the
    server pads a tree's feed as the device's own verifier pads it, so output stays `ar`'s."""
    bundle = int8_trees
    server = start_server(bundle, tmp_path)
    try:
        ar = edgespec.load(bundle, threads=1)
        want = ar.generate(TEXT, max_new_tokens=40, ignore_eos=True).tokens
        model = edgespec.load(bundle, mode="split", server=server.url, token=TOKEN, threads=1,
                              drafter="lookup", draft_policy="fixed:6")  # fmt: skip
        # trees of 6 nodes (7 positions with the root: padded to 8) hiding the truth on a
        # random branch, mostly right
        model.drafter = TreeDrafter(want, model.manifest.target.vocab_size, seed=0)
        got = model.generate(TEXT, max_new_tokens=40, ignore_eos=True)
    finally:
        server.stop()
    assert got.tokens == want and got.stats.tree_rounds > 0 and got.stats.accepted > 0


def test_a_tree_round_advances_what_the_link_knows_the_server_holds():
    """A conversation resumes the server's session from what the link knows it holds: after
    a tree round, the kept path's tokens (not the first drafts sent)."""
    from edgespec.runtime.split.session import Remote

    remote = Remote("ws://127.0.0.1:1")
    remote.held, remote.sent_base, remote.sent_drafts = [1, 2, 3], 3, [7, 8, 9, 10]
    remote._advance(P.Result(2, 11, 6, 0.0, path=[1, 3]))
    assert remote.held == [1, 2, 3, 8, 10, 11]
    remote.sent_base, remote.sent_drafts = 6, [4, 5]
    remote._advance(P.Result(1, 12, 8, 0.0, path=[5]))  # not a node that was sent
    assert remote.held is None
