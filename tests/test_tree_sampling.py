"""Sampling on token trees follows the target's distribution: the first two tokens a tree
round yields (the accepted path, then the target's token) are drawn from the target's
joint distribution, for deterministic candidates and for siblings sampled from a q.
Deterministic chi-square tests (fixed seeds), with a biased acceptance the same test must
reject, so they can fail."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from edgespec.runtime.draft_q import SparseQ, quantize
from edgespec.runtime.sampling import SamplingParams, probabilities, sample
from edgespec.runtime.tree import TokenTree
from edgespec.runtime.verify.tree_accept import accept_tree

V = 5
CHI2_CRITICAL_P001_24 = 51.18  # chi-square quantile at p = 0.001, 24 degrees of freedom
PARAMS = SamplingParams(temperature=1.0)


def target(prefix: tuple[int, ...]) -> np.ndarray:
    """The target's next-token distribution after `prefix` (fixed, random)."""
    seed = 1 + sum(t * 7**i for i, t in enumerate(prefix)) + 1000 * len(prefix)
    p = np.random.default_rng(seed).dirichlet(np.ones(V) * 0.8)
    return p / p.sum()


def joint() -> np.ndarray:
    return np.array([[target(())[a] * target((a,))[b] for b in range(V)] for a in range(V)])


def rows(tree: TokenTree) -> np.ndarray:
    return np.log(
        np.stack([target(())] + [target(tuple(tree.path_tokens(i))) for i in range(len(tree))])
    )


def point_tree(rng: np.random.Generator) -> tuple[TokenTree, None]:
    """Distinct candidates per node (a lookup's or a suffix tree's), random shape."""
    tokens, parents = [], []
    for parent in [-1, -1, -1, 0, 0, 1]:
        taken = {tokens[i] for i, p in enumerate(parents) if p == parent}
        free = [t for t in range(V) if t not in taken]
        tokens.append(int(rng.choice(free)))
        parents.append(parent)
    keep = int(rng.integers(3, len(tokens) + 1))  # three candidates at the root, then some
    return TokenTree(tuple(tokens[:keep]), tuple(parents[:keep])), None


def sampled_tree(rng: np.random.Generator) -> tuple[TokenTree, list[SparseQ]]:
    """Three siblings drawn independently from one q at the root, two from each child's."""
    qs: list[SparseQ] = []
    tokens, parents = [], []
    root_q = quantize(np.arange(V), rng.dirichlet(np.ones(V)))
    for _ in range(3):
        tokens.append(root_q.sample(rng))
        parents.append(-1)
        qs.append(root_q)
    for parent in range(3):
        q = quantize(np.arange(V), rng.dirichlet(np.ones(V)))
        for _ in range(2):
            tokens.append(q.sample(rng))
            parents.append(parent)
            qs.append(q)
    return TokenTree(tuple(tokens), tuple(parents)), qs


Acceptance = Callable[..., tuple[list[int], int]]


def first_two(make, accept: Acceptance, trials: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    counts = np.zeros((V, V))
    for _ in range(trials):
        tree, q = make(rng)
        path, token = accept(tree, q, rows(tree), PARAMS, rng)
        out = [tree.tokens[i] for i in path] + [token]
        if len(out) < 2:  # the next round's first token
            out.append(sample(target((out[0],)), rng))
        counts[out[0], out[1]] += 1
    return counts


def chi_square(counts: np.ndarray, p: np.ndarray) -> float:
    expected = p * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def biased(tree, q, logits, params, rng) -> tuple[list[int], int]:
    """A plausible slip: a rejected candidate is not taken out of the residual."""
    children = [
        [c for c, p in enumerate(tree.parents) if p == node] for node in range(-1, len(tree))
    ]
    node, path = -1, []
    while True:
        r = probabilities(logits[node + 1], params)
        for c in children[node + 1]:
            q_x = 1.0 if q is None else q[c].prob(tree.tokens[c])
            if rng.random() * q_x < r[tree.tokens[c]]:
                path.append(c)
                node = c
                break
        else:
            return path, sample(r, rng)


def test_deterministic_candidates_keep_the_target_distribution():
    counts = first_two(point_tree, accept_tree, 20000, seed=0)
    assert chi_square(counts, joint()) < CHI2_CRITICAL_P001_24


def test_siblings_sampled_from_q_keep_the_target_distribution():
    counts = first_two(sampled_tree, accept_tree, 20000, seed=1)
    assert chi_square(counts, joint()) < CHI2_CRITICAL_P001_24


def test_the_same_test_rejects_an_acceptance_that_keeps_rejected_candidates():
    for make, seed in ((point_tree, 0), (sampled_tree, 1)):
        counts = first_two(make, biased, 20000, seed=seed)
        assert chi_square(counts, joint()) > CHI2_CRITICAL_P001_24


class PointTrees:
    """Random trees of distinct siblings (as a lookup's), from a generator of its own."""

    drafts_ahead = False
    name = "tree-test"

    def __init__(self, vocab: int) -> None:
        self.vocab, self.rng = vocab, np.random.default_rng(5)

    def begin(self, prompt, capacity, cached=0, constraint=None) -> None:
        pass

    def source(self, seq):
        return self.name

    def propose(self, seq, plan, params, rng):
        from edgespec.runtime.round import Proposal

        if plan.length < 1:
            return Proposal([], "point")
        shape = [-1, -1, 0, 0, 1, 2][: plan.length]
        tokens: list[int] = []
        for i, parent in enumerate(shape):
            taken = {tokens[j] for j in range(i) if shape[j] == parent}
            tokens.append(int(self.rng.choice([t for t in range(self.vocab) if t not in taken])))
        return Proposal.of_tree(TokenTree(tuple(tokens), tuple(shape)))

    def commit(self, valid: int) -> None:
        pass


def exact_marginals(t, prompt: list[int], params: SamplingParams) -> tuple[np.ndarray, ...]:
    """The target's exact marginals of the 2nd and 3rd generated tokens, by enumeration."""

    def dist(ids: list[int]) -> np.ndarray:
        t.reset(16)
        return probabilities(t.forward(np.array(ids), keep=1)[-1], params)

    p1, p2, p3 = dist(prompt), np.zeros(16), np.zeros(16)
    for a in np.flatnonzero(p1):
        p2_given = dist([*prompt, a])
        p2 += p1[a] * p2_given
        for b in np.flatnonzero(p2_given):
            p3 += p1[a] * p2_given[b] * dist([*prompt, a, b])
    return p2, p3


def test_decoding_with_tree_proposals_samples_the_targets_marginals(tiny_vocab_bundle, tmp_path):
    """The whole path (tree graphs, cache gather, acceptance) under sampling: the 2nd and 3rd
    generated tokens have the target's exact marginals, computed by enumeration."""
    import edgespec
    from edgespec.bundle import load_manifest
    from edgespec.export import export_bundle

    source = load_manifest(tiny_vocab_bundle).source["model"]
    bundle = tmp_path / "tree"
    export_bundle(source, bundle, tree_verify=True)
    params = SamplingParams(temperature=1.0, top_p=0.95)
    prompt = [3, 7, 1, 3, 7]
    p2, p3 = exact_marginals(edgespec.load(bundle, mode="ar").target, prompt, params)
    model = edgespec.load(bundle, mode="lookup", draft_policy="fixed:6")
    model.drafter = PointTrees(16)
    second, third = np.zeros(16), np.zeros(16)
    for seed in range(1500):
        out = model.generate(
            prompt, max_new_tokens=6, temperature=1.0, top_p=0.95, seed=seed, ignore_eos=True
        ).tokens
        second[out[1]] += 1
        third[out[2]] += 1
    for counts, p in ((second, p2), (third, p3)):
        expected = p * counts.sum()
        assert counts[expected == 0].sum() == 0
        seen = expected > 0
        chi2 = float(((counts[seen] - expected[seen]) ** 2 / expected[seen]).sum())
        assert chi2 < 37.70  # chi-square quantile at p = 0.001, 15 degrees of freedom


def drafter_row(prefix: tuple[int, ...]) -> np.ndarray:
    """A drafting model's logits after `prefix` (fixed, random, unlike the target's)."""
    seed = 5 + sum(t * 11**i for i, t in enumerate(prefix)) + 777 * len(prefix)
    return np.log(np.random.default_rng(seed).dirichlet(np.ones(V) * 0.8))


def dynamic_tree_of_a_model(rng: np.random.Generator) -> tuple[TokenTree, list[SparseQ]]:
    """A model drafter's dynamic tree (runtime/drafters/model_tree.py): a spine of two tokens each
    drawn from the drafter's q, and its runner-ups at each depth as point-mass leaves."""
    from edgespec.runtime.drafters.model_tree import _tree_proposal, dynamic_tree

    spine, rows_, qs = [], [], []
    for _ in range(2):
        row = drafter_row(tuple(spine))
        q = quantize(np.arange(V), np.exp(row))
        spine.append(q.sample(rng))
        rows_.append(row)
        qs.append(q)
    tree = dynamic_tree(spine, rows_, budget=int(rng.integers(3, 7)), side=2)
    proposal = _tree_proposal(tree, spine, qs, PARAMS, 0.0)
    assert proposal.tree is tree and proposal.tree_q is not None
    return tree, proposal.tree_q


def test_a_model_drafters_dynamic_trees_keep_the_target_distribution():
    counts = first_two(dynamic_tree_of_a_model, accept_tree, 20000, seed=2)
    assert chi_square(counts, joint()) < CHI2_CRITICAL_P001_24
    biased_counts = first_two(dynamic_tree_of_a_model, biased, 20000, seed=2)  # power control
    assert chi_square(biased_counts, joint()) > CHI2_CRITICAL_P001_24


@pytest.mark.parametrize("mode", ["spec", "self-spec"])
def test_decoding_with_a_models_dynamic_trees_samples_the_targets_marginals(
    tiny_vocab_bundle, tmp_path, mode
):
    """The draft model's (or the exit's) dynamic trees end to end under sampling: spine
    tokens drawn from the drafter's q, runner-ups as point masses, the tree graphs, the
    cache gather; the 2nd and 3rd tokens have the target's exact marginals."""
    import edgespec
    from edgespec.bundle import load_manifest
    from edgespec.export import export_bundle
    from edgespec.runtime.policies.draft_length import FixedLength

    manifest = load_manifest(tiny_vocab_bundle)
    bundle = tmp_path / "tree"
    export_bundle(
        manifest.source["model"],
        bundle,
        draft=manifest.draft_source["model"],
        exit_layers=[1],
        tree_verify=True,
    )
    params = SamplingParams(temperature=1.0, top_p=0.95)
    prompt = [3, 7, 1, 3, 7]
    p2, p3 = exact_marginals(edgespec.load(bundle, mode="ar").target, prompt, params)
    model = edgespec.load(bundle, mode=mode, trees="on")
    model.policy.chain = FixedLength(3)  # every round a tree: a spine of 3 and side leaves
    sides = []
    observe = model.policy.observe
    model.policy.observe = lambda s: (sides.append(s.tree_nodes > s.drafted), observe(s))
    second, third = np.zeros(16), np.zeros(16)
    for seed in range(1500):
        out = model.generate(
            prompt, max_new_tokens=6, temperature=1.0, top_p=0.95, seed=seed, ignore_eos=True
        )
        second[out.tokens[1]] += 1
        third[out.tokens[2]] += 1
    assert sum(sides) > 1000  # side leaves were sent
    for counts, p in ((second, p2), (third, p3)):
        expected = p * counts.sum()
        assert counts[expected == 0].sum() == 0
        seen = expected > 0
        chi2 = float(((counts[seen] - expected[seen]) ** 2 / expected[seen]).sum())
        assert chi2 < 37.70  # chi-square quantile at p = 0.001, 15 degrees of freedom
