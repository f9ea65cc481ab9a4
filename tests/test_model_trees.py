"""Dynamic trees from a drafting model (runtime/drafters/model_tree.py): with the draft model
(`spec`) or an early exit (`self-spec`) drafting trees, greedy decoding is token for token `ar`'s;
side candidates are really sent and sometimes taken (a draft that is the target with noise:
it agrees often, not always); after a round that kept a side candidate the draft model's
cache holds what a fresh draft fed the sequence would; runner-ups appear only where a row
splits. Sampling on these trees: tests/test_tree_sampling.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import EXIT_LAYER

import edgespec
from edgespec.runtime.drafters.base import ModelDrafter
from edgespec.runtime.drafters.model_tree import ModelTrees, runner_ups
from edgespec.runtime.drafters.tree_draft import AsTree
from edgespec.runtime.graphs.stack import Stack
from edgespec.runtime.policies.draft_length import FixedLength
from edgespec.runtime.policies.trees import TreePolicy
from edgespec.runtime.round import Plan
from edgespec.runtime.sampling import SamplingParams

FAMILIES = ["qwen2", "llama-gqa-tied", "gpt2"]
PROMPT = "def parse(text):\n    return"
GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def near_bundles(checkpoints: dict[str, Path], tmp_path_factory) -> dict[str, Path]:
    """Per family: tree graphs, an exit at EXIT_LAYER, and a draft that is the target with
    noise on every weight (10% of its spread)."""
    import torch
    from transformers import AutoModelForCausalLM

    from edgespec.export import export_bundle

    root = tmp_path_factory.mktemp("near_bundles")
    out = {}
    for name in FAMILIES:
        draft = root / f"{name}-draft"
        shutil.copytree(checkpoints[name], draft)
        model = AutoModelForCausalLM.from_pretrained(checkpoints[name])
        g = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.1 * p.std())
        model.save_pretrained(draft)
        out[name] = root / name
        export_bundle(
            checkpoints[name], out[name], draft=draft, exit_layers=[EXIT_LAYER], tree_verify=True
        )
    return out


def decode_with_trees(bundle: Path, mode: str):
    """Greedy output with every round a tree (spine 4, up to 3 side leaves), and the rounds."""
    model = edgespec.load(bundle, mode=mode, trees="on")
    assert isinstance(model.drafter, AsTree) and isinstance(model.drafter.drafter, ModelTrees)
    assert isinstance(model.policy, TreePolicy) and model.policy.per_depth
    model.policy.chain = FixedLength(4)
    rounds = []
    observe = model.policy.observe

    def spy(stats) -> None:
        rounds.append(stats)
        observe(stats)

    model.policy.observe = spy
    return model.generate(PROMPT, max_new_tokens=48, ignore_eos=True), rounds


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("mode", ["spec", "self-spec"])
def test_greedy_with_model_trees_is_ar_token_for_token(near_bundles, name, mode):
    want = edgespec.load(near_bundles[name], mode="ar").generate(
        PROMPT, max_new_tokens=48, ignore_eos=True
    )
    got, rounds = decode_with_trees(near_bundles[name], mode)
    assert got.tokens == want.tokens
    trees = [s for s in rounds if s.tree_nodes]
    assert trees and all(s.tree_nodes > s.drafted for s in trees)  # side leaves were sent
    assert got.stats.tree_rounds == len(trees)


@pytest.mark.parametrize("mode", ["spec", "self-spec"])
def test_trees_auto_with_a_model_drafter_decodes_as_ar(near_bundles, mode):
    bundle = near_bundles["qwen2"]
    want = edgespec.load(bundle, mode="ar").generate(PROMPT, max_new_tokens=48, ignore_eos=True)
    model = edgespec.load(bundle, mode=mode, trees="auto")
    assert isinstance(model.drafter, AsTree) and not model.policy.force
    got = model.generate(PROMPT, max_new_tokens=48, ignore_eos=True)
    assert got.tokens == want.tokens


def test_side_candidates_are_taken_where_the_draft_disagrees(near_bundles):
    got, rounds = decode_with_trees(near_bundles["qwen2"], "spec")
    taken = [s for s in rounds if any(rank > 0 for _, rank in s.tree_offers)]
    assert taken  # a runner-up of the draft was the target's token
    assert got.stats.accepted > sum(s.accepted for s in rounds if not s.tree_nodes)


def test_after_a_side_leaf_the_draft_cache_is_a_fresh_drafts(near_bundles):
    from edgespec.runtime.graphs.opener import open_bundle

    graphs = open_bundle(near_bundles["qwen2"])
    trees = ModelTrees(ModelDrafter(Stack([graphs.open("draft")])))
    fresh = ModelDrafter(Stack([graphs.open("draft")]))
    rng = np.random.default_rng(0)
    prompt = edgespec.load(near_bundles["qwen2"], mode="ar").tokenizer.encode(PROMPT)
    trees.begin(prompt, 128)
    seq = [*prompt, 7]  # the prefill's token
    plan = Plan(12, tree_depth=4)
    for _ in range(6):
        p = trees.propose_tree_round(seq, plan, GREEDY, rng)
        assert p.tree is not None
        side = len(p.tokens)  # the first side leaf: keep the spine above it, then it
        depth = p.tree.depth[side]
        kept = [*p.tree.path_tokens(side)]
        assert kept[:-1] == p.tokens[: depth - 1] and kept[-1] != p.tokens[depth - 1]
        trees.commit(len(seq) + len(kept))  # what the decode loop commits
        seq = [*seq, *kept, 7]  # then the target's token
    fresh.begin(prompt, 128)
    want = fresh.propose(seq, Plan(4), GREEDY, rng).tokens
    assert trees.propose(seq, Plan(4), GREEDY, rng).tokens == want


def test_runner_ups_come_only_where_the_row_splits():
    confident = np.log(np.array([0.9, 0.05, 0.03, 0.02]))
    assert runner_ups(confident, 0) == []
    close = np.log(np.array([0.5, 0.4, 0.06, 0.04]))
    assert [t for t, _ in runner_ups(close, 0)] == [1, 2, 3]
    assert [t for t, _ in runner_ups(close, 1, side=2)] == [0, 2]  # never the drawn token
    masked = np.array([0.0, -np.inf, -np.inf, -np.inf])
    assert runner_ups(masked, 0) == []


def test_trees_on_with_a_model_drafter_needs_tree_graphs(spec_bundles):
    from edgespec.runtime.errors import InputError

    with pytest.raises(InputError, match="--tree-verify"):
        edgespec.load(spec_bundles["qwen2"], mode="spec", trees="on")
    auto = edgespec.load(spec_bundles["qwen2"], mode="spec", trees="auto")
    assert isinstance(auto.drafter, ModelDrafter)  # auto stays on chains


@pytest.mark.parametrize("mode", ["spec", "self-spec"])
def test_under_a_grammar_model_trees_draft_masked_chains(near_bundles, mode):
    """A grammar masks what a model drafter draws: its tree rounds become masked chains, and
    the output is the constrained `ar` output."""
    pytest.importorskip("llguidance")
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8}, "ok": {"type": "boolean"}},
        "required": ["name", "ok"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}
    bundle = near_bundles["llama-gqa-tied"]
    want = edgespec.load(bundle, mode="ar").generate(PROMPT, max_new_tokens=40, response_format=fmt)
    model = edgespec.load(bundle, mode=mode, trees="on")
    model.policy.chain = FixedLength(4)
    got = model.generate(PROMPT, max_new_tokens=40, response_format=fmt)
    assert got.tokens == want.tokens and got.stats.tree_rounds == 0
