"""Token trees verified in one forward: every node's logits are those of its root path run as
a chain; the cache keeps the accepted path as a chain of it would have; greedy decoding with
tree proposals is token for token `ar`'s."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import EXIT_LAYER

import edgespec
from edgespec.bundle import BundleError
from edgespec.runtime.graphs.opener import open_bundle
from edgespec.runtime.graphs.stack import Stack
from edgespec.runtime.graphs.tree_verify import tree_feed
from edgespec.runtime.round import Plan, Proposal
from edgespec.runtime.tree import TokenTree

FAMILIES = ["llama-gqa-tied", "qwen2", "gpt2"]


@pytest.fixture(scope="module")
def tree_bundles(checkpoints: dict[str, Path], tmp_path_factory) -> dict[str, Path]:
    from edgespec.export import export_bundle

    root = tmp_path_factory.mktemp("tree_bundles")
    out = {}
    for name in FAMILIES:
        out[name] = root / name
        export_bundle(checkpoints[name], out[name], exit_layers=[EXIT_LAYER], tree_verify=True)
    return out


def random_tree(rng: np.random.Generator, n: int, vocab: int) -> TokenTree:
    parents = [-1] + [int(rng.integers(-1, i)) for i in range(1, n)]
    return TokenTree(tuple(int(t) for t in rng.integers(0, vocab, n)), tuple(parents))


def target_stack(folder: Path, roles: list[str]) -> Stack:
    graphs = open_bundle(folder)
    return Stack(
        [graphs.open(r) for r in roles], tree_stages=lambda: [graphs.open_tree(r) for r in roles]
    )


def prefilled(stack: Stack, prompt: list[int]) -> None:
    stack.reset(128)
    stack.forward(np.asarray(prompt[:-1], np.int64), keep=0)


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("layout", ["full", "head+tail"])
def test_each_node_scores_as_its_root_path_run_as_a_chain(tree_bundles, name, layout):
    roles = ["full"] if layout == "full" else [f"head@{EXIT_LAYER}", f"tail@{EXIT_LAYER}"]
    stack = target_stack(tree_bundles[name], roles)
    rng = np.random.default_rng(7)
    vocab = stack.vocab_size
    prompt = [int(t) for t in rng.integers(0, vocab, 11)]
    tree = random_tree(rng, 12, vocab)
    prefilled(stack, prompt)
    ids, positions, mask = tree_feed(prompt[-1], tree, len(prompt))
    tree_logits = stack.forward_tree(ids, positions, mask, keep=len(ids))
    for node in [-1, *range(len(tree))]:
        prefilled(stack, prompt)
        chain = np.asarray([prompt[-1], *tree.path_tokens(node)], np.int64)
        want = stack.forward(chain, keep=1)[-1]
        np.testing.assert_allclose(tree_logits[node + 1], want, rtol=1e-4, atol=1e-4)


def test_a_chain_fed_as_a_tree_scores_as_the_chain_graph(tree_bundles):
    stack = target_stack(tree_bundles["llama-gqa-tied"], ["full"])
    prompt = list(range(3, 15))
    drafts = [5, 9, 2, 7]
    prefilled(stack, prompt)
    chain = stack.forward(np.asarray([prompt[-1], *drafts], np.int64), keep=5)
    prefilled(stack, prompt)
    ids, positions, mask = tree_feed(prompt[-1], TokenTree.chain(drafts), len(prompt))
    as_tree = stack.forward_tree(ids, positions, mask, keep=5)
    np.testing.assert_allclose(as_tree, chain, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["llama-gqa-tied", "gpt2"])
def test_the_cache_keeps_the_accepted_path_as_a_chain_would(tree_bundles, name):
    """After a tree verify and `keep_rows` of a path, the next steps' logits equal those
    after verifying the path alone as a chain."""
    stack = target_stack(tree_bundles[name], ["full"])
    rng = np.random.default_rng(3)
    prompt = [int(t) for t in rng.integers(0, stack.vocab_size, 9)]
    tree = random_tree(rng, 10, stack.vocab_size)
    deepest = int(np.argmax(tree.depth))
    path = tree.path(deepest)
    after = np.asarray([17, 4, 29], np.int64)

    prefilled(stack, prompt)
    stack.forward_tree(*tree_feed(prompt[-1], tree, len(prompt)), keep=0)
    assert stack.cache is not None
    stack.cache.keep_rows(len(prompt), path)
    assert stack.length == len(prompt) + len(path)
    got = stack.forward(after, keep=3)

    prefilled(stack, prompt)
    stack.forward(np.asarray([prompt[-1], *tree.path_tokens(deepest)], np.int64), keep=0)
    want = stack.forward(after, keep=3)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_keeping_a_chain_path_is_a_length_change_only(tree_bundles):
    stack = target_stack(tree_bundles["llama-gqa-tied"], ["full"])
    prefilled(stack, list(range(2, 12)))
    stack.forward(np.asarray([11, 1, 2, 3], np.int64), keep=0)
    cache = stack.cache
    assert cache is not None
    before = [k.copy() for k in cache.keys]
    cache.keep_rows(11, [0, 1])
    assert cache.length == 13
    assert all(np.array_equal(a, b) for a, b in zip(before, cache.keys, strict=True))
    with pytest.raises(ValueError, match="ascend"):
        cache.keep_rows(11, [1, 0])


class TreeDrafter:
    """Trees for the test: random siblings around the true continuation (known from an `ar`
    run), hidden on a random branch, so acceptance must find it off the main path."""

    drafts_ahead = False
    name = "tree-test"

    def __init__(self, truth: list[int], vocab: int, seed: int) -> None:
        self.truth, self.vocab = truth, vocab
        self.rng = np.random.default_rng(seed)

    def begin(self, prompt, capacity, cached=0, constraint=None) -> None:
        self.prompt_len = len(prompt)

    def source(self, seq):
        return self.name

    def propose(self, seq, plan: Plan, params, rng) -> Proposal:
        budget = plan.length
        if budget < 1:
            return Proposal([], "point")
        rng_ = self.rng
        tree = random_tree(rng_, budget, self.vocab)
        tokens, parents = list(tree.tokens), list(tree.parents)
        # plant the real continuation along the root path of a random node, mostly right
        node = int(rng_.integers(len(tokens)))
        done = len(seq) - self.prompt_len
        for depth, i in enumerate(tree.path(node)):
            if rng_.random() < 0.9 and done + depth < len(self.truth):
                tokens[i] = self.truth[done + depth]
        return Proposal.of_tree(TokenTree(tuple(tokens), tuple(parents)))

    def commit(self, valid: int) -> None:
        pass


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("verifier", ["full", f"exit:{EXIT_LAYER}"])
def test_greedy_with_tree_proposals_is_ar_token_for_token(tree_bundles, name, verifier):
    prompt = "def parse(text):\n    return"
    ar = edgespec.load(tree_bundles[name], mode="ar")
    want = ar.generate(prompt, max_new_tokens=40, ignore_eos=True).tokens
    model = edgespec.load(
        tree_bundles[name], mode="lookup", verifier=verifier, draft_policy="fixed:6"
    )
    for seed in range(3):
        model.drafter = TreeDrafter(want, model.manifest.target.vocab_size, seed)
        got = model.generate(prompt, max_new_tokens=40, ignore_eos=True)
        assert got.tokens == want
        assert got.stats.accepted > 0  # trees were accepted beyond their main paths


def test_a_bundle_without_tree_graphs_refuses_trees_naming_the_re_export(bundles):
    model = edgespec.load(bundles["llama-gqa-tied"], mode="lookup", draft_policy="fixed:4")
    model.drafter = TreeDrafter([1, 2, 3], 100, 0)
    with pytest.raises(BundleError, match="--tree-verify"):
        model.generate("hello", max_new_tokens=5, ignore_eos=True)


@pytest.fixture(scope="module")
def static_bundle(checkpoints: dict[str, Path], tmp_path_factory) -> Path:
    from edgespec.export import export_bundle

    out = tmp_path_factory.mktemp("tree_static") / "b"
    export_bundle(
        checkpoints["llama-gqa-tied"], out, static=True, max_context=96, verify_width=[1, 8]
    )
    return out


def test_static_graphs_score_each_node_as_its_root_path(static_bundle):
    """Static graphs take a tree through their own position and mask inputs."""
    from edgespec.runtime.graphs.opener import GraphOptions

    graphs = open_bundle(static_bundle, GraphOptions(static=True))
    stack = Stack([graphs.open("full")], tree_stages=lambda: [graphs.open_tree("full")])
    rng = np.random.default_rng(11)
    prompt = [int(t) for t in rng.integers(0, stack.vocab_size, 13)]
    tree = random_tree(rng, 7, stack.vocab_size)
    prefilled(stack, prompt)
    tree_logits = stack.forward_tree(*tree_feed(prompt[-1], tree, len(prompt)), keep=8)
    for node in [-1, *range(len(tree))]:
        prefilled(stack, prompt)
        chain = np.asarray([prompt[-1], *tree.path_tokens(node)], np.int64)
        want = stack.forward(chain, keep=1)[-1]
        np.testing.assert_allclose(tree_logits[node + 1], want, rtol=1e-4, atol=1e-4)
    prefilled(stack, prompt)
    with pytest.raises(ValueError, match="wider than the static graphs' widest"):
        stack.forward_tree(*tree_feed(1, random_tree(rng, 9, 50), len(prompt)), keep=1)


def test_greedy_with_tree_proposals_on_static_graphs_is_ar(static_bundle):
    prompt = "class Stack:\n    def"
    ar = edgespec.load(static_bundle, mode="ar", static=True)
    want = ar.generate(prompt, max_new_tokens=30, ignore_eos=True).tokens
    model = edgespec.load(static_bundle, mode="lookup", static=True, draft_policy="fixed:6")
    model.drafter = TreeDrafter(want, model.manifest.target.vocab_size, 1)
    got = model.generate(prompt, max_new_tokens=30, ignore_eos=True)
    assert got.tokens == want and got.stats.accepted > 0


@pytest.mark.parametrize("family", ["qwen3", "gemma2", "gemma3", "phi3"])
def test_sliding_window_families_score_each_node_past_the_window(family, tmp_path):
    """Windows of 16 positions, a 23-token prompt: the window is in the tree's bias, by
    position (the op's own window counts slots)."""
    from family_configs import FAMILIES, family_prompt

    from edgespec.export import export_bundle
    from edgespec.export.builtin import write_checkpoint

    model_type, dims = FAMILIES[family]
    dims = dict(dims)
    tie = dims.pop("tie_word_embeddings", True)
    ckpt = write_checkpoint(tmp_path / "ckpt", model_type, tie=tie, **dims)
    export_bundle(ckpt, tmp_path / "b", exit_layers=[2], tree_verify=True, verify=False)
    for roles in (["full"], ["head@2", "tail@2"]):
        stack = target_stack(tmp_path / "b", roles)
        rng = np.random.default_rng(5)
        prompt = family_prompt()
        tree = random_tree(rng, 10, stack.vocab_size)
        prefilled(stack, prompt)
        tree_logits = stack.forward_tree(*tree_feed(prompt[-1], tree, len(prompt)), keep=11)
        for node in [-1, *range(len(tree))]:
            prefilled(stack, prompt)
            chain = np.asarray([prompt[-1], *tree.path_tokens(node)], np.int64)
            want = stack.forward(chain, keep=1)[-1]
            np.testing.assert_allclose(tree_logits[node + 1], want, rtol=1e-4, atol=1e-4)


def test_the_cli_exports_tree_graphs_and_inspect_names_them(checkpoints, tmp_path):
    from click.testing import CliRunner

    from edgespec.cli import main

    out = tmp_path / "b"
    runner = CliRunner()
    args = ["export", str(checkpoints["gpt2"]), "--out", str(out), "--tree-verify", "--no-verify"]
    r = runner.invoke(main, args)
    assert r.exit_code == 0, r.output
    assert (out / "tree_full.onnx").exists()
    r = runner.invoke(main, ["inspect", str(out)])
    assert r.exit_code == 0 and "token trees" in r.output and "full" in r.output


def test_chains_never_open_the_tree_graphs(tree_bundles):
    model = edgespec.load(tree_bundles["qwen2"], mode="lookup")
    model.generate("abc abc abc abc", max_new_tokens=12, ignore_eos=True)
    assert not any(role.startswith("tree:") for role in model.graphs.opened)


@pytest.mark.parametrize(
    "options", [{"dtype": "fp16"}, {"quantize": "int4"}, {"quantize": "qdq-int8"}]
)
def test_fp16_and_quantized_tree_graphs_decode_as_ar(checkpoints, options, tmp_path):
    from edgespec.export import export_bundle

    export_bundle(checkpoints["llama-gqa-tied"], tmp_path / "b", tree_verify=True, **options)
    prompt = "def f(x):"
    want = edgespec.load(tmp_path / "b", mode="ar").generate(
        prompt, max_new_tokens=30, ignore_eos=True
    )
    model = edgespec.load(tmp_path / "b", mode="lookup", draft_policy="fixed:6")
    model.drafter = TreeDrafter(want.tokens, model.manifest.target.vocab_size, 0)
    got = model.generate(prompt, max_new_tokens=30, ignore_eos=True)
    assert got.tokens == want.tokens and got.stats.accepted > 0


def test_under_a_grammar_tree_proposals_verify_their_main_path(tree_bundles):
    """A grammar masks chains: a tree proposal turns into its main path, and the output is
    the constrained `ar` output."""
    pytest.importorskip("llguidance")
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8}, "ok": {"type": "boolean"}},
        "required": ["name", "ok"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}
    prompt = "def person(name):\n    return {'name': name}\n\n"
    bundle = tree_bundles["llama-gqa-tied"]
    want = edgespec.load(bundle, mode="ar").generate(prompt, max_new_tokens=40, response_format=fmt)
    model = edgespec.load(bundle, mode="lookup", draft_policy="fixed:4")
    model.drafter = TreeDrafter(want.tokens, model.manifest.target.vocab_size, 2)
    got = model.generate(prompt, max_new_tokens=40, response_format=fmt)
    assert got.tokens == want.tokens
    assert not any(role.startswith("tree:") for role in model.graphs.opened)
