"""Model-free tree drafters: the suffix trie counts exactly what a brute force counts (appended
token by token, and after a bounded store forgot its oldest texts), the recycle table keeps the
target's top-k, and every drafter's trees are valid trees within their budget whose most likely
path is the chain it proposes."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from test_tree_verify import tree_bundles  # noqa: F401  (the bundles with tree graphs)

from edgespec.runtime.drafters.lookup import LookupDrafter
from edgespec.runtime.drafters.recycling import RecycleConfig, RecycleTable, RecyclingDrafter
from edgespec.runtime.drafters.suffix import CountTrie, SuffixConfig, SuffixDrafter, SuffixStore
from edgespec.runtime.round import Plan
from edgespec.runtime.sampling import SamplingParams
from edgespec.runtime.tree import TokenTree

GREEDY = SamplingParams(temperature=0.0)
RNG = np.random.default_rng(0)


def substrings(texts: list[list[int]], depth: int) -> dict[tuple[int, ...], int]:
    out: Counter[tuple[int, ...]] = Counter()
    for text in texts:
        for i in range(len(text)):
            for j in range(i + 1, min(i + depth, len(text)) + 1):
                out[tuple(text[i:j])] += 1
    return dict(out)


def check_tree(tree: TokenTree, budget: int, max_depth: int) -> None:
    assert len(tree) <= budget and tree.max_depth <= max_depth
    assert all(p < i for i, p in enumerate(tree.parents))
    for node in range(-1, len(tree)):  # siblings hold distinct tokens
        kids = [tree.tokens[c] for c in tree.children(node)]
        assert len(kids) == len(set(kids))


def test_an_appended_trie_counts_every_substring_like_a_brute_force():
    rng = np.random.default_rng(1)
    trie = CountTrie(depth=5)
    active = trie.start()
    text: list[int] = []
    for _ in range(300):
        t = int(rng.integers(0, 6))
        active = trie.append(active, t)
        text.append(t)
    assert trie.counts() == substrings([text], 5)
    assert trie.nodes == len(trie.counts()) + 1  # the root


def test_a_bounded_store_forgets_its_oldest_texts_exactly():
    rng = np.random.default_rng(2)
    config = SuffixConfig(depth=4, store_tokens=100)
    store = SuffixStore(config)
    texts = [[int(t) for t in rng.integers(0, 5, int(rng.integers(5, 40)))] for _ in range(40)]
    for text in texts:
        store.add(text)
        assert store.tokens <= 100
        kept = [list(t) for t in store.texts]
        assert store.trie.counts() == substrings(kept, 4)
        assert store.trie.nodes == len(store.trie.counts()) + 1
    assert [list(t) for t in store.texts] == texts[-len(store.texts) :]  # the newest, in order
    assert store.trie.nodes <= 100 * 4 + 1  # at most depth nodes a kept token


def test_suffix_trees_follow_the_most_frequent_continuations():
    drafter = SuffixDrafter(config=SuffixConfig(max_match=3, min_match=2, depth=8))
    drafter.begin([], 100)
    # "1 2" went on as 3 4 twice and as 5 6 once
    seq = [1, 2, 3, 4, 9, 1, 2, 3, 4, 8, 1, 2, 5, 6, 7, 1, 2]
    tree = drafter.propose_tree(seq, budget=6, max_depth=3)
    check_tree(tree, 6, 3)
    assert tree.path_tokens(0) == [3] and tree.tokens[tree.children(-1)[1]] == 5
    assert tree.path_tokens(tree.children(0)[0]) == [3, 4]
    chain = drafter.propose(seq, Plan(3), GREEDY, RNG)
    assert chain.tokens == [3, 4, 9] or chain.tokens == [3, 4, 8]
    assert chain.kind == "point"
    assert drafter.source(seq) == "suffix" and drafter.source([7, 7, 7]) is None


def test_shorter_matches_that_occurred_more_often_add_branches():
    # "8 1 2" went on as 3 once; "1 2" (shorter) also went on as 5, twice
    seq = [8, 1, 2, 3, 0, 1, 2, 5, 0, 1, 2, 5, 0, 8, 1, 2]
    longest = SuffixDrafter(config=SuffixConfig(max_match=3, backoff=False))
    backoff = SuffixDrafter(config=SuffixConfig(max_match=3))
    for d in (longest, backoff):
        d.begin([], 100)
    assert longest.propose_tree(seq, 4, 1).tokens == (3,)
    tree = backoff.propose_tree(seq, 4, 1)
    assert tree.tokens == (3, 5)  # the longest match's continuation first (weight 1 vs 1/2)
    trie = backoff.local
    assert [sum(c.count for c in n.children.values()) for n in trie.matches(seq, 3, 2)] == [1, 3]


def test_a_suffix_index_kept_across_turns_equals_one_built_afresh():
    rng = np.random.default_rng(3)
    first = [int(t) for t in rng.integers(0, 8, 60)]
    second = first + [int(t) for t in rng.integers(0, 8, 30)]
    kept = SuffixDrafter()
    kept.begin(first[:20], 200)
    for n in range(21, len(first)):  # the first turn's output, committed a token at a time
        kept.propose(first[:n], Plan(4), GREEDY, RNG)
    kept.begin(second, 200, cached=len(first) - 1)  # the next turn extends the sequence
    fresh = SuffixDrafter()
    fresh.begin(second, 200)
    for n in range(len(second) - 10, len(second) + 1):
        a, b = kept.propose_tree(second[:n], 12, 5), fresh.propose_tree(second[:n], 12, 5)
        assert a == b
    assert kept.local.counts() == fresh.local.counts()
    # a prompt that shares less than was indexed rebuilds the index
    other = [7, 7, 1, 2, 3, 7, 7]
    kept.begin(other, 200, cached=0)
    kept.propose(other, Plan(2), GREEDY, RNG)
    assert kept.local.counts() == substrings([other], kept.config.depth)


def test_earlier_replies_in_the_shared_store_draft_for_a_new_request():
    store = SuffixStore()
    a = SuffixDrafter(store)
    reply = [40, 41, 42, 43, 44, 45]
    a.begin([1, 2, 3], 100)
    a.propose([1, 2, 3, *reply], Plan(2), GREEDY, RNG)  # indexes the reply
    b = SuffixDrafter(store)
    b.begin([9, 9, 9], 100)  # no reply of b's yet; a's goes in at a's next begin
    assert b.source([9, 9, 9, 40, 41]) is None
    a.begin([5, 6], 100)
    assert b.propose([9, 9, 9, 40, 41], Plan(3), GREEDY, RNG).tokens == [42, 43, 44]


def test_the_recycle_table_keeps_each_tokens_top_k_from_the_latest_verify():
    rng = np.random.default_rng(4)
    table = RecycleTable(top_k=3)
    logits = rng.normal(size=(4, 50)).astype(np.float32)
    logits[2, 7] = -np.inf  # a grammar's mask
    table.update([5, 6, 7, 5], logits)
    assert table.ids is not None and table.ids.shape == (50, 3)  # bounded: vocab x k
    for token, row in ((6, 1), (7, 2), (5, 3)):  # token 5's later row wins
        want = np.argsort(-logits[row])[:3]
        p = np.exp(logits[row] - logits[row].max())
        p /= p.sum()
        got = table.successors(token)
        assert [i for i, _, _ in got] == want.tolist()
        assert np.allclose([q for _, q, _ in got], p[want], rtol=1e-5)
    assert table.successors(8) == [] and table.successors(10_000) == []


def test_recycled_trees_grow_from_the_table_and_the_chain_is_their_best_path():
    table = RecycleTable(top_k=2)
    logits = np.full((3, 10), -10.0, np.float32)
    logits[0, [2, 3]] = [2.0, 1.0]  # after 1: 2 (likelier) or 3
    logits[1, [4, 5]] = [3.0, 0.0]  # after 2: 4 or 5
    logits[2, [1, 6]] = [1.0, 0.5]  # after 4: 1 or 6
    table.update([1, 2, 4], logits)
    drafter = RecyclingDrafter(table)
    tree = drafter.propose_tree([0, 1], budget=5, max_depth=3)
    check_tree(tree, 5, 3)
    assert tree.tokens[:3] == (2, 4, 1) and tree.parents[:3] == (-1, 0, 1)  # top-1s first
    assert 3 in [tree.tokens[c] for c in tree.children(-1)]
    by_softmax = RecyclingDrafter(table, RecycleConfig(top_k=2, rank_scores=()))
    tree = by_softmax.propose_tree([0, 1], budget=5, max_depth=3)
    check_tree(tree, 5, 3)
    assert tree.tokens[:2] == (2, 4) and 3 in [tree.tokens[c] for c in tree.children(-1)]
    chain = drafter.propose([0, 1], Plan(3), GREEDY, RNG)
    assert chain.tokens[:2] == [2, 4]
    assert drafter.source([0, 9]) is None and drafter.source([0, 1]) == "recycle"


def test_lookup_trees_branch_at_the_last_few_matches_and_keep_the_chain_first():
    drafter = LookupDrafter(branches=3)
    drafter.begin([], 100)
    seq = [1, 2, 3, 4, 0, 1, 2, 5, 6, 8, 1, 2, 3, 7, 9, 1, 2]
    tree = drafter.propose_tree(seq, budget=8, max_depth=2)
    check_tree(tree, 8, 2)
    firsts = [tree.tokens[c] for c in tree.children(-1)]
    assert firsts == [3, 5]  # 3 followed "1 2" twice
    below = sorted(tree.path_tokens(c) for c in range(len(tree)) if tree.depth[c] == 2)
    assert below == [[3, 4], [3, 7], [5, 6]]
    # the chain is still the most recent match's continuation
    assert drafter.propose(seq, Plan(2), GREEDY, RNG).tokens == [3, 7]


@pytest.mark.parametrize("budget, depth", [(1, 1), (4, 2), (16, 6)])
def test_trees_respect_their_budget_and_depth(budget, depth):
    rng = np.random.default_rng(5)
    seq = [int(t) for t in rng.integers(0, 4, 200)]
    short = SuffixDrafter(config=SuffixConfig(max_match=1, min_match=1))
    drafters = (SuffixDrafter(), LookupDrafter(), short)
    for drafter in drafters:
        drafter.begin([], 400)
        tree = drafter.propose_tree(seq, budget, depth)
        check_tree(tree, budget, depth)
        assert len(tree) >= 1
    # a one-token match on 200 tokens of 4 ids has enough continuations to fill any budget
    assert len(short.propose_tree(seq, budget, depth)) == budget


def test_replay_accepts_the_longest_matching_path_and_counts_each_depth_and_rank():
    from benchmarks.lib.tree_replay import ReplayStats, replay, walk

    tree = TokenTree((5, 6, 7, 8), (-1, -1, 1, 1))  # 5 | 6 -> 7 | 6 -> 8
    stats = ReplayStats()
    assert walk(tree, [6, 8, 9], stats) == 2
    assert stats.offered == {1: 1, 2: 1}  # node 8 has no children: nothing offered at 3
    assert stats.hits == {1: {1: 1}, 2: {1: 1}}
    assert walk(tree, [4], stats) == 0 and stats.offered[1] == 2
    # a period-5 text: after one period every round is a full chain, whatever the drafter
    text = [1, 2, 3, 4, 5] * 8
    for drafter in (LookupDrafter(), SuffixDrafter()):
        for tree_mode in (False, True):
            got = replay(drafter, text, 5, budget=8, max_depth=4, tree=tree_mode)
            assert got.tokens == len(text) - 6  # the prefill made the first output token
            assert got.tokens == sum(got.hits.get(d, {}).get(0, 0) for d in got.hits) + got.rounds
            assert got.rounds < got.tokens / 3


def test_the_projection_prices_a_round_on_the_measured_and_on_a_flat_cost_curve():
    from benchmarks.lib.tree_replay import ReplayStats, projected, verify_cost

    costs = {1: 0.010, 4: 0.016, 16: 0.040}
    assert verify_cost(costs, 2.5) == pytest.approx(0.013)
    assert verify_cost(costs, 0.5) == 0.010 and verify_cost(costs, 64) == 0.040
    stats = ReplayStats(rounds=10, tokens=30, nodes=30, draft_seconds=0.010)  # width 4
    got = projected(stats, costs)
    assert got["measured"] == pytest.approx(3 / (0.001 + 0.016))
    assert got["flat"] == pytest.approx(3 / (0.001 + 0.010))


def test_a_trees_first_children_are_its_most_likely_path_and_the_chain():
    rng = np.random.default_rng(6)
    seq = [int(t) for t in rng.integers(0, 5, 300)]
    drafter = SuffixDrafter(config=SuffixConfig(max_match=2, min_match=1))
    drafter.begin([], 400)
    for end in range(250, 300, 7):
        tree = drafter.propose_tree(seq[:end], 24, 5)
        path, node = [], -1
        while kids := tree.children(node):
            node = kids[0]
            path.append(tree.tokens[node])
        chain = drafter.propose(seq[:end], Plan(len(path)), GREEDY, RNG).tokens
        assert path and chain == path


@pytest.mark.parametrize("kind", ["suffix", "lookup", "recycle"])
def test_model_free_trees_verified_in_one_forward_give_ar_output(kind, tree_bundles):  # noqa: F811
    """The drafters' trees through the tree verifier (`AsTree`: plan.length nodes): greedy
    output is `ar`'s token for token, and some rounds accept more than one draft (Token
    Recycling learns only from verify rows, so the tree verifier's rows reach it)."""
    import edgespec
    from edgespec.runtime.drafters.tree_draft import AsTree

    prompt = "def f(a, b):\n    return a + b\n\ndef g(a, b):\n    return a + b\n\ndef f(a"
    bundle = tree_bundles["qwen2"]
    want = edgespec.load(bundle, mode="ar").generate(prompt, max_new_tokens=40, ignore_eos=True)
    model = edgespec.load(bundle, mode="lookup", draft_policy="fixed:8")
    inner = {
        "suffix": lambda: SuffixDrafter(config=SuffixConfig(min_match=1)),
        "lookup": LookupDrafter,
        "recycle": RecyclingDrafter,
    }[kind]()
    model.drafter = AsTree(inner, max_depth=4)
    got = model.generate(prompt, max_new_tokens=40, ignore_eos=True)
    assert got.tokens == want.tokens
    assert got.stats.accepted > 0
