"""Trees sized by measurement: the policy's choice between the best chain and a tree, fed cost
curves and acceptance per depth and rank (a steep curve keeps chains, a flat one with measured
second-rank acceptance grows trees, unmeasured side ranks never buy a tree); a tree bundle
with a model-free drafter decodes as `ar` with trees on, and one without tree graphs stays on
chains under `auto` and is refused under `on`."""

from __future__ import annotations

import pytest
from test_tree_verify import tree_bundles  # noqa: F401  (the bundles with tree graphs)

import edgespec
from edgespec.runtime.drafters.tree_draft import AsTree
from edgespec.runtime.errors import InputError
from edgespec.runtime.policies.trees import TreePolicy
from edgespec.runtime.stats import RoundStats
from edgespec.runtime.tree import TokenTree

PROMPT = "def f(a, b):\n    return a + b\n\ndef g(a, b):\n    return a + b\n\ndef f(a"


def fed(curve, rank1: float, rounds: int = 200) -> TreePolicy:
    """A policy that saw `rounds` rounds costing curve(nodes) seconds (every node count
    1..16 in turn), whose trees offered two candidates at each of 4 depths: the spine taken
    with 0.5 at each depth, the second candidate with `rank1` (the rest: no token taken)."""
    policy = TreePolicy()
    for i in range(rounds):
        nodes = 1 + i % 16
        u = (i * 0.618034) % 1.0  # a deterministic spread of outcomes
        offers: list[tuple[int, int]] = []
        for _ in range(4):
            if u < 0.5:
                offers.append((2, 0))
                u = u / 0.5
                continue
            offers.append((2, 1 if u < 0.5 + rank1 else -1))
            break
        accepted = sum(r >= 0 for _, r in offers)
        stats = RoundStats("decode", accepted + 1, nodes + 1, curve(nodes), index=100)
        stats.drafted, stats.accepted, stats.draft_seconds = len(offers), accepted, 1e-5 * nodes
        stats.tree_nodes, stats.tree_offers = nodes, tuple(offers)
        policy.observe(stats)
    return policy


def steep(nodes: int) -> float:  # a compute-bound verify: its cost grows with its width
    return 0.005 * (nodes + 1)


def cpu(nodes: int) -> float:  # the shape measured on this project's CPU: T(16)/T(1) ~ 2.7x
    return 0.010 * (1 + 0.11 * (nodes - 1))


def flat(nodes: int) -> float:  # a launch-bound step: any width costs the same
    return 0.010


def test_a_steep_cost_curve_keeps_chains_even_with_second_ranks_accepted():
    policy = fed(steep, rank1=0.3)
    plan = policy.plan()
    assert plan.tree_depth == 0 and plan.length >= 1
    chain, tree = policy.last
    assert tree is None or tree.rate <= 1.05 * chain.rate


def test_rounds_that_are_not_trees_are_the_chain_policys_own():
    from edgespec.runtime.policies.draft_length import FixedLength

    policy = fed(steep, rank1=0.3)
    policy.chain = FixedLength(5)
    plan = policy.plan()
    assert (plan.length, plan.tree_depth) == (5, 0)
    policy = fed(flat, rank1=0.3)
    policy.chain = FixedLength(5)
    assert policy.plan().tree_depth  # a tree that pays is still planned


def test_on_this_cpus_curve_rarely_taken_second_ranks_keep_chains():
    policy = fed(cpu, rank1=0.05)
    assert policy.plan().tree_depth == 0


def test_a_flat_cost_curve_with_measured_second_ranks_grows_a_tree():
    policy = fed(flat, rank1=0.3)
    plan = policy.plan()
    chain, tree = policy.last
    assert tree is not None and tree.rate > 1.05 * chain.rate
    assert plan.tree_depth and plan.tree_depth >= 1 and plan.length > plan.tree_depth


def test_side_ranks_the_target_never_takes_buy_no_tree_even_on_a_flat_curve():
    policy = fed(flat, rank1=0.0)
    for _ in range(5):  # rank 1 is measured (offered every round): no probes either
        assert policy.plan().tree_depth == 0


def test_unmeasured_side_ranks_are_probed_now_and_then_but_never_picked():
    policy = TreePolicy(probe_every=4)
    for _ in range(60):  # chain rounds (past `probe_after`): rank 0 measured, rank 1 never
        stats = RoundStats("decode", 3, 5, flat(4), drafted=4, accepted=2, index=100)
        stats.draft_seconds = 1e-5
        policy.observe(stats)
    plans = [policy.plan() for _ in range(8)]
    assert [p.tree_depth != 0 for p in plans].count(True) == 2  # every 4th: a probe
    assert policy.last is not None and policy.last[1] is None


def test_no_probe_where_even_optimistic_second_candidates_could_not_pay():
    policy = TreePolicy(probe_every=2)
    for i in range(80):  # chain rounds of every length, on a verify whose cost grows
        g = 1 + i % 8
        accepted = g if i % 5 else g // 2  # the spine is taken ~90% of the time
        stats = RoundStats("decode", accepted + 1, g + 1, steep(g), index=100)
        stats.drafted, stats.accepted, stats.draft_seconds = g, accepted, 1e-5 * g
        policy.observe(stats)
    assert all(policy.plan().tree_depth == 0 for _ in range(8))


def test_offers_read_the_rank_taken_at_each_depth():
    # root -> 5 (0), 6 (1); 5 -> 7 (2), 8 (3); 6 -> 9 (4)
    tree = TokenTree((5, 6, 7, 8, 9), (-1, -1, 0, 0, 1))
    assert tree.offers([5, 8]) == ((2, 0), (2, 1))  # node 8 has no children: nothing at 3
    assert tree.offers([6]) == ((2, 1), (1, -1))
    assert tree.offers([]) == ((2, -1),)
    assert TokenTree.chain([1, 2, 3]).offers([1]) == ((1, 0), (1, -1))


def test_a_shadow_tree_reads_the_rank_of_each_known_token_until_they_end():
    # root -> 5 (0), 6 (1); 5 -> 7 (2), 8 (3); 6 -> 9 (4)
    tree = TokenTree((5, 6, 7, 8, 9), (-1, -1, 0, 0, 1))
    assert tree.shadow_offers([5, 8, 1]) == ((2, 0), (2, 1))  # 8 is a leaf: nothing below
    assert tree.shadow_offers([6, 3]) == ((2, 1), (1, -1))  # the target took no child of 6
    assert tree.shadow_offers([5]) == ((2, 0),)  # what came after 5 is not known
    assert tree.shadow_offers([4, 5]) == ((2, -1),)
    assert tree.shadow_offers([]) == ()


def test_shadow_rounds_are_chains_whose_offers_price_side_ranks():
    policy = TreePolicy(shadow_every=2)
    for _ in range(60):  # chain rounds: rank 0 measured, rank 1 never
        stats = RoundStats("decode", 3, 5, flat(4), drafted=4, accepted=2, index=100)
        stats.draft_seconds = 1e-5
        policy.observe(stats)
    assert policy.acceptance.measured(1) == 0
    plans = [policy.plan() for _ in range(8)]
    assert all(p.tree_depth == 0 for p in plans)  # no tree is sent to measure side ranks
    assert [p.shadow for p in plans].count(True) == 4
    for _ in range(60):  # shadows: the spine's second token missed, its sibling taken
        stats = RoundStats("decode", 2, 5, flat(4), drafted=4, accepted=1, index=100)
        stats.draft_seconds, stats.tree_offers = 1e-5, ((2, 0), (2, 1))
        policy.observe(stats)
    assert policy.acceptance.measured(1) > 10 and policy.acceptance.p(2, 1) > 0.5
    policy.open_seconds = 0.02  # a tree pays, but not yet what opening its graphs costs
    assert policy.plan().tree_depth == 0  # one round of 10 ms saved a share of 10 ms
    for _ in range(20):
        if policy.plan().tree_depth:
            break
    assert policy.trees_open  # the rounds it would have saved repaid opening the graphs
    assert policy.plan().tree_depth  # a flat curve and a sibling the target takes: a tree
    policy.open_seconds = 100.0
    assert policy.plan().tree_depth  # once open, a tree is planned wherever it pays


@pytest.mark.parametrize("mode", ["suffix", "lookup"])
def test_shadow_trees_measure_side_ranks_without_opening_the_tree_graphs(mode, tree_bundles):  # noqa: F811
    bundle = tree_bundles["qwen2"]
    want = edgespec.load(bundle, mode="ar").generate(PROMPT, max_new_tokens=48, ignore_eos=True)
    model = edgespec.load(bundle, mode=mode, trees="auto")
    assert isinstance(model.policy, TreePolicy)
    model.policy.shadow_every = 1
    model.policy.margin = 1e9  # price trees, never pick one
    got = model.generate(PROMPT, max_new_tokens=48, ignore_eos=True)
    assert got.tokens == want.tokens
    assert got.stats.tree_rounds == 0
    assert not any(role.startswith("tree:") for role in model.graphs.opened)
    assert model.policy.acceptance.measured(1) > 0  # side candidates priced from shadows


@pytest.mark.parametrize("mode", ["suffix", "lookup", "recycle"])
def test_trees_on_decode_as_ar_and_count_tree_nodes_apart(mode, tree_bundles, monkeypatch):  # noqa: F811
    bundle = tree_bundles["qwen2"]
    want = edgespec.load(bundle, mode="ar").generate(PROMPT, max_new_tokens=48, ignore_eos=True)
    model = edgespec.load(bundle, mode=mode, trees="on")
    assert isinstance(model.drafter, AsTree) and isinstance(model.policy, TreePolicy)
    model.policy.probe_every, model.policy.probe_after = 2, 0  # probe trees: tree rounds run
    # whether a probe could pay depends on the costs this machine measured (a loaded one may
    # price width steeply): probe regardless, so tree rounds run however loaded it is
    monkeypatch.setattr(model.policy, "_could_pay", lambda: True)
    got = model.generate(PROMPT, max_new_tokens=48, ignore_eos=True)
    assert got.tokens == want.tokens
    s = got.stats
    if mode != "recycle":  # recycling learns its table from the first verifies
        assert s.tree_rounds > 0
    assert s.tree_nodes >= s.tree_rounds and s.accepted <= s.drafted


def test_a_bundle_without_tree_graphs_stays_on_chains_under_auto_and_refuses_on(bundles):
    plain = bundles["qwen2"]
    model = edgespec.load(plain, mode="suffix", trees="auto")
    assert not isinstance(model.drafter, AsTree) and not isinstance(model.policy, TreePolicy)
    with pytest.raises(InputError, match="--tree-verify"):
        edgespec.load(plain, mode="suffix", trees="on")


def test_trees_on_is_refused_where_trees_cannot_run(tree_bundles):  # noqa: F811
    bundle = tree_bundles["qwen2"]
    with pytest.raises(InputError, match="fixed:4"):
        edgespec.load(bundle, mode="suffix", trees="on", draft_policy="fixed:4")
    with pytest.raises(InputError, match="proposes no trees"):
        edgespec.load(bundle, mode="self-spec", drafter="lookup+exit", trees="on")
    with pytest.raises(InputError, match="auto, on, off"):
        edgespec.load(bundle, mode="suffix", trees="sometimes")
    auto = edgespec.load(bundle, mode="suffix", trees="auto")
    assert isinstance(auto.drafter, AsTree) and isinstance(auto.policy, TreePolicy)
    default = edgespec.load(bundle, mode="suffix")  # off by default: width costs on a CPU
    assert not isinstance(default.drafter, AsTree)
    assert not isinstance(edgespec.load(bundle, mode="suffix", trees="off").drafter, AsTree)


def test_generate_refuses_trees_on_a_bundle_without_tree_graphs_in_one_line(bundles):
    from click.testing import CliRunner

    from edgespec.cli import main

    args = ["generate", str(bundles["qwen2"]), "-p", "x", "-n", "4", "--mode", "suffix"]
    r = CliRunner().invoke(main, [*args, "--trees", "on"])
    assert r.exit_code == 1 and "--tree-verify" in r.output and "Traceback" not in r.output
    assert CliRunner().invoke(main, [*args, "--trees", "auto"]).exit_code == 0


def test_a_model_drafters_side_leaves_are_priced_at_verify_width_only():
    from edgespec.runtime.policies.trees import MAX_DEPTH, MAX_RANK, best_shapes

    table = [[0.5, 0.3] + [0.0] * (MAX_RANK - 2) for _ in range(MAX_DEPTH + 1)]
    step = 0.004  # a draft step; the verify is nearly flat in width

    def cost(nodes: int) -> float:  # every node priced at a draft step, as a chain's are
        return nodes * step + 0.010 * (1 + 0.02 * (nodes - 1))

    chain, tree = best_shapes(table, cost, 16)
    assert tree is None or tree.rate <= 1.05 * chain.rate  # side nodes drafted: no tree
    chain, tree = best_shapes(table, cost, 16, side_discount=step)  # leaves of the spine's rows
    assert tree is not None and tree.rate > 1.05 * chain.rate


def test_a_model_drafters_tree_rounds_teach_the_draft_step_per_depth():
    for per_depth, want in ((True, 0.004), (False, 0.004 * 4 / 7)):
        policy = TreePolicy(per_depth=per_depth)
        for _ in range(30):  # trees of 7 nodes on a spine of 4: four draft steps each
            stats = RoundStats("decode", 3, 8, 0.03, drafted=4, accepted=2, index=100)
            stats.draft_seconds, stats.tree_nodes = 4 * 0.004, 7
            stats.tree_offers = ((2, 0), (2, 0), (2, -1))
            policy.observe(stats)
        assert policy.cost.t_draft == pytest.approx(want)


def test_trees_on_forces_a_tree_every_drafting_round():
    from edgespec.runtime.policies.draft_length import FixedLength

    policy = TreePolicy(force=True, chain=FixedLength(3))
    plan = policy.plan()  # nothing measured yet
    assert (plan.length, plan.tree_depth) == (6, 3)
    policy = fed(steep, rank1=0.0)  # trees cannot pay here: auto keeps chains, on does not
    policy.chain = FixedLength(3)
    assert policy.plan().tree_depth == 0
    policy.force = True
    assert policy.plan().tree_depth == 3
    policy.chain = FixedLength(0)  # a round the chain policy would not draft stays plain
    assert policy.plan().length == 0
