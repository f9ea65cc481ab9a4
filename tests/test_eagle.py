"""The feature head (EAGLE style): the target's declared features, the eagle graph against its
torch twin, and its drafter lossless — greedy output equal to `ar`, its cache what a fresh head
computes after partial acceptance, sampling exact (with a power control)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_speculative_sampling import CHI2_CRITICAL_P001, chi_square

import edgespec
from edgespec.bundle import BundleError, load_manifest, save_manifest
from edgespec.runtime.errors import InputError
from edgespec.runtime.graphs.protocol import Feed
from edgespec.runtime.sampling import SamplingParams, probabilities

LAYERS = [1, 2, 4]


def add_head(
    bundle: Path, weights, layers: list[int], seed: int = 0, copying=False, draft_ids=None
) -> None:
    """A random (untrained) head written into `bundle` as distill writes a trained one
    (`draft_ids`: with that draft vocabulary, rows of the target's LM head).
    `copying`: one that mostly proposes the token it was fed (the target's logits there),
    its attention scaled down but not off: on a random target, whose greedy output repeats
    tokens now and then, some rounds keep all drafts, some a few, some none."""
    from edgespec.export.eagle import initial_head, write_head

    head = initial_head(weights, layers, seed)
    rng = np.random.default_rng(seed)
    if copying:
        head.proj[: head.proj.shape[1]] = 0
        head.layer.o_w *= 0.5
        head.layer.down_w[:] = 0
    else:
        head.fuse += rng.normal(0, 0.1, head.fuse.shape).astype(np.float32)
        head.proj += rng.normal(0, 0.1, head.proj.shape).astype(np.float32)
    head.draft_ids = draft_ids
    graph = write_head(bundle, weights, head)
    m = load_manifest(bundle)
    m.graphs = [g for g in m.graphs if g.role != "eagle"] + [graph]
    save_manifest(m, bundle)


def hf_weights(ckpt: Path):
    from edgespec.export.hf import extract, load_checkpoint

    return extract(load_checkpoint(str(ckpt), None)[0])


@pytest.fixture(scope="module")
def eagle_bundles(checkpoints, tmp_path_factory) -> dict[str, Path]:
    """llama (GQA, tied), qwen2 and a Q4_1 GGUF (quantized activations: step width 2), each
    with its features declared and a random head."""
    from edgespec.export import export_bundle

    root = tmp_path_factory.mktemp("eagle")
    out = {}
    for name in ("llama-gqa-tied", "qwen2"):
        out[name] = root / name
        export_bundle(checkpoints[name], out[name], feature_layers=LAYERS)
        add_head(out[name], hf_weights(checkpoints[name]), LAYERS)
    pytest.importorskip("gguf")
    from edgespec.export.gguf_model import read_gguf
    from tests.gguf_files import write_gguf

    write_gguf(root / "m.gguf", "llama", "Q4_1")
    out["gguf-q4_1"] = root / "gguf"
    export_bundle(root / "m.gguf", out["gguf-q4_1"], feature_layers=[1, 2])
    add_head(out["gguf-q4_1"], read_gguf(root / "m.gguf").weights, [1, 2])
    return out


def test_full_graph_features_are_the_residual_streams_after_the_chosen_layers(
    checkpoints, eagle_bundles, hf_models
):
    import torch

    ids = np.array([5, 17, 301, 9, 44, 2, 1000, 7])
    model = edgespec.load(eagle_bundles["llama-gqa-tied"], mode="ar")
    t = model.target
    t.reset(16)
    logits = t.forward(ids, keep=len(ids))
    with torch.no_grad():
        hf = hf_models["llama-gqa-tied"](torch.tensor(ids[None]), output_hidden_states=True)
    h = 64
    for j, k in enumerate(LAYERS[:-1]):  # transformers' hidden_states[k]: after k layers
        np.testing.assert_allclose(
            t.features[: len(ids), j * h : (j + 1) * h], hf.hidden_states[k][0].numpy(), atol=1e-4
        )
    # the last layer's stream (before the final norm) gives the logits through norm + LM head
    hf_model = hf_models["llama-gqa-tied"]
    last = torch.tensor(t.features[: len(ids), -h:])
    with torch.no_grad():
        again = hf_model.lm_head(hf_model.model.norm(last)).numpy()
    np.testing.assert_allclose(again, logits, atol=1e-4)
    np.testing.assert_allclose(logits, hf.logits[0].numpy(), atol=1e-4)


def test_a_bundle_without_features_refuses_the_eagle_drafter_with_the_fix(bundles):
    with pytest.raises((BundleError, InputError), match="edgespec distill"):
        edgespec.load(bundles["llama-gqa-tied"], mode="eagle")


def test_eagle_graph_computes_what_the_torch_head_computes(checkpoints, eagle_bundles):
    """Pass 1 (the target's features) and passes 2, 3 (the head's own states, attending what a
    draft step attends) of the training forward, against the graph run as the drafter runs it."""
    torch = pytest.importorskip("torch")
    from edgespec.distill.head import FeatureHead
    from edgespec.export.eagle import initial_head
    from edgespec.runtime.graphs.kv_cache import KVCache
    from edgespec.runtime.graphs.opener import open_bundle
    from edgespec.runtime.graphs.stack import Stack

    weights = hf_weights(checkpoints["qwen2"])
    head = initial_head(weights, LAYERS, 0)
    rng = np.random.default_rng(0)
    head.fuse += rng.normal(0, 0.1, head.fuse.shape).astype(np.float32)
    head.proj += rng.normal(0, 0.1, head.proj.shape).astype(np.float32)
    graphs = open_bundle(eagle_bundles["qwen2"])
    full, sess = Stack([graphs.open("full")]), graphs.open("eagle")
    ids = rng.integers(0, 2000, 20)
    full.reset(32)
    full.forward(ids, keep=1)
    feats = full.features[:20].copy()
    with torch.no_grad():
        states = FeatureHead(weights, head).unrolled(
            torch.tensor(ids[None]), torch.tensor(feats[None, :19]), 3
        )
        logits = [FeatureHead(weights, head).logits(s)[0].numpy() for s in states]
    m = graphs.manifest.target
    cache = KVCache.allocate([0], m.num_kv_heads, m.head_dim, 40, np.float32)
    zeros = lambda n, w: np.zeros((1, n, w), np.float32)  # noqa: E731
    f, hd = feats.shape[1], m.hidden_size

    def run(at: int, n: int, features, state):
        cache.length = at
        return sess.run(cache, at, Feed(input_ids=ids[None, at + 1 : at + 1 + n], keep=n),
                        extra={"features": features, "state": state})  # fmt: skip

    one = run(0, 19, feats[None, :19], zeros(19, hd))
    np.testing.assert_allclose(one["next_state"][0], states[0][0].numpy(), atol=1e-4)
    np.testing.assert_allclose(one["logits"][0], logits[0], atol=1e-4)
    for t in (4, 11, 18):
        run(0, t, feats[None, :t], zeros(t, hd))  # exact positions up to t - 1
        two = run(t, 1, zeros(1, f), one["next_state"][:, t - 1 : t])
        np.testing.assert_allclose(two["logits"][0, 0], logits[1][t], atol=1e-4)
        mid = run(t - 1, 1, zeros(1, f), one["next_state"][:, t - 2 : t - 1])
        three = run(t, 1, zeros(1, f), mid["next_state"])
        np.testing.assert_allclose(three["logits"][0, 0], logits[2][t], atol=1e-4)


PROMPTS = ["def f(x):\n    return", "import os\nimport sys\n", "the the the cat", "a b c a b"]


@pytest.mark.parametrize("name", ["llama-gqa-tied", "qwen2", "gguf-q4_1"])
@pytest.mark.parametrize("policy", ["fixed:1", "fixed:3", "fixed:6", "auto"])
def test_eagle_greedy_output_equals_ar(eagle_bundles, name, policy):
    ar = edgespec.load(eagle_bundles[name], mode="ar")
    eagle = edgespec.load(eagle_bundles[name], mode="eagle", draft_policy=policy)
    chain = edgespec.load(eagle_bundles[name], drafter="lookup+eagle", draft_policy=policy)
    for prompt in PROMPTS:
        want = ar.generate(prompt, max_new_tokens=40, ignore_eos=True).tokens
        got = eagle.generate(prompt, max_new_tokens=40, ignore_eos=True)
        assert got.tokens == want
        assert chain.generate(prompt, max_new_tokens=40, ignore_eos=True).tokens == want
        if policy.startswith("fixed"):
            assert got.stats.drafted > 0


def fresh_drafts(bundle: Path, seq: list[int], gamma: int) -> list[int]:
    """The greedy drafts after `seq` of a head that never drafted before: the target's
    features over seq[:-1] from scratch, then the head over all of it in one call."""
    from edgespec.runtime.graphs.kv_cache import KVCache
    from edgespec.runtime.graphs.opener import open_bundle
    from edgespec.runtime.graphs.stack import Stack

    graphs = open_bundle(bundle)
    m = graphs.manifest.target
    full, head = Stack([graphs.open("full")]), graphs.open("eagle")
    full.reset(len(seq) + 1)
    full.forward(np.asarray(seq[:-1]), keep=1)
    n = len(seq) - 1
    cache = KVCache.allocate([0], m.num_kv_heads, m.head_dim, n + gamma + 1, np.float32)
    out = head.run(cache, 0, Feed(input_ids=np.asarray([seq[1:]]), keep=1),
                   extra={"features": full.features[None, :n],
                          "state": np.zeros((1, n, m.hidden_size), np.float32)})  # fmt: skip
    drafts = [int(out["logits"][0, -1].argmax())]
    state = out["next_state"][:, -1:]
    width = full.feature_width
    for i in range(gamma - 1):
        out = head.run(
            cache,
            n + i,
            Feed(input_ids=np.asarray([[drafts[-1]]]), keep=1),
            extra={"features": np.zeros((1, 1, width), np.float32), "state": state},
        )
        drafts.append(int(out["logits"][0, -1].argmax()))
        state = out["next_state"]
    return drafts


def test_eagle_cache_after_partial_acceptance_is_what_a_fresh_head_computes(checkpoints, tmp_path):
    """Each round's drafts, after rounds that kept some, none or all of theirs, equal the
    drafts of a head started afresh on the same sequence: the head's cache and the features
    it reads hold the kept positions only."""
    from edgespec.export import export_bundle

    bundle = tmp_path / "b"
    export_bundle(checkpoints["llama-gqa-tied"], bundle, feature_layers=LAYERS)
    add_head(bundle, hf_weights(checkpoints["llama-gqa-tied"]), LAYERS, copying=True)
    model = edgespec.load(bundle, mode="eagle", draft_policy="fixed:4")
    seen: list[tuple[list[int], list[int]]] = []
    propose = model.drafter.propose

    def recording(seq, plan, params, rng):
        p = propose(seq, plan, params, rng)
        if p.tokens:
            seen.append((list(seq), list(p.tokens)))
        return p

    model.drafter.propose = recording
    kept = set()
    for prompt in PROMPTS[:3]:
        out = model.generate(prompt, max_new_tokens=40, ignore_eos=True)
        kept |= set(out.stats.accepted_lengths)
    assert len(seen) > 10 and 0 in kept and len(kept - {0}) > 1  # none, some, more kept
    assert any(len(set(d)) > 1 for _, d in seen)  # not only copies: the cache is read
    for seq, drafts in seen:
        assert drafts == fresh_drafts(bundle, seq, len(drafts))


@pytest.fixture(scope="module")
def tiny_vocab_eagle(tmp_path_factory) -> Path:
    """A 16-token model with its features and a random head: exact distributions computable."""
    from edgespec.export import export_bundle
    from edgespec.export.builtin import write_checkpoint

    root = tmp_path_factory.mktemp("tiny_eagle")
    dims = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, max_position_embeddings=64)  # fmt: skip
    ckpt = write_checkpoint(root / "t", "llama", seed=1, vocab_size=16, **dims)
    export_bundle(ckpt, root / "b", feature_layers=[1, 2])
    add_head(root / "b", hf_weights(ckpt), [1, 2], seed=5)
    return root / "b"


def test_eagle_sampling_follows_the_target_distribution(tiny_vocab_eagle):
    """The 2nd and 3rd generated tokens have the marginals of the target's own sampling
    (enumerated), and the test has power: the head's first drafts, which it was drawn from,
    are rejected by it."""
    params = SamplingParams(temperature=1.0, top_p=0.95)
    prompt = [3, 7, 1, 3, 7]
    t = edgespec.load(tiny_vocab_eagle, mode="ar").target

    def dist(ids: list[int]) -> np.ndarray:
        t.reset(16)
        return probabilities(t.forward(np.array(ids), keep=1)[-1], params)

    p1 = dist(prompt)
    p2, p3 = np.zeros(16), np.zeros(16)
    for a in np.flatnonzero(p1):
        p2_given = dist([*prompt, a])
        p2 += p1[a] * p2_given
        for b in np.flatnonzero(p2_given):
            p3 += p1[a] * p2_given[b] * dist([*prompt, a, b])

    model = edgespec.load(tiny_vocab_eagle, mode="eagle", draft_policy="fixed:2")
    propose, firsts = model.drafter.propose, []

    def recording(seq, plan, params, rng):
        p = propose(seq, plan, params, rng)
        if len(seq) == len(prompt) + 1 and p.tokens:
            firsts.append(p.tokens[0])  # a draft of the 2nd token, from the head's q
        return p

    model.drafter.propose = recording
    second, third = np.zeros(16), np.zeros(16)
    for seed in range(1500):
        out = model.generate(
            prompt, max_new_tokens=3, temperature=1.0, top_p=0.95, seed=seed, ignore_eos=True
        ).tokens
        second[out[1]] += 1
        third[out[2]] += 1
    assert chi_square(second, p2) < CHI2_CRITICAL_P001[15]
    assert chi_square(third, p3) < CHI2_CRITICAL_P001[15]
    drafted = np.bincount(firsts, minlength=16).astype(float)
    assert len(firsts) > 1000
    assert np.any((drafted > 0) & (p2 == 0)) or chi_square(drafted, p2) > CHI2_CRITICAL_P001[15]


def test_split_mode_refuses_the_head_it_has_no_features_for(eagle_bundles):
    with pytest.raises(InputError, match="split mode draft with the bundle's draft model"):
        edgespec.load(eagle_bundles["qwen2"], mode="split", drafter="eagle",
                      server="ws://127.0.0.1:9")  # fmt: skip


def test_a_draft_vocabulary_scores_its_ids_on_their_target_ids_and_decodes_as_ar(
    checkpoints, tmp_path
):
    """A head with a draft vocabulary (a distilled head's: rows of the target's LM head)
    computes the torch head's logits at the draft ids' target ids and -inf at every other id;
    the target verifies, so greedy output stays ar's, and drafts are still kept."""
    torch = pytest.importorskip("torch")
    from edgespec.distill.head import FeatureHead
    from edgespec.export import export_bundle
    from edgespec.export.eagle import initial_head
    from edgespec.runtime.graphs.kv_cache import KVCache
    from edgespec.runtime.graphs.opener import open_bundle
    from edgespec.runtime.graphs.stack import Stack

    ckpt = checkpoints["llama-gqa-tied"]
    weights = hf_weights(ckpt)
    vocab = weights.embed.shape[0]
    rng = np.random.default_rng(3)
    draft_ids = np.sort(rng.choice(vocab, vocab // 3, replace=False)).astype(np.int64)
    bundle = tmp_path / "b"
    export_bundle(ckpt, bundle, feature_layers=LAYERS)
    add_head(bundle, weights, LAYERS, copying=True, draft_ids=draft_ids)

    head = initial_head(weights, LAYERS, 0)
    head.proj[: head.proj.shape[1]] = 0
    head.layer.o_w *= 0.5
    head.layer.down_w[:] = 0
    graphs = open_bundle(bundle)
    full, sess = Stack([graphs.open("full")]), graphs.open("eagle")
    ids = rng.integers(0, vocab, 12)
    full.reset(16)
    full.forward(ids, keep=1)
    feats = full.features[:11].copy()
    with torch.no_grad():
        twin = FeatureHead(weights, head, draft_ids)
        state = twin.unrolled(torch.tensor(ids[None]), torch.tensor(feats[None]), 1)[0]
        want = twin.logits(state)[0].numpy()  # [11, len(draft_ids)]
    m = graphs.manifest.target
    cache = KVCache.allocate([0], m.num_kv_heads, m.head_dim, 16, np.float32)
    got = sess.run(cache, 0, Feed(input_ids=ids[None, 1:], keep=11),
                   extra={"features": feats[None],
                          "state": np.zeros((1, 11, m.hidden_size), np.float32)})  # fmt: skip
    logits = got["logits"][0]
    assert logits.shape == (11, vocab)
    np.testing.assert_allclose(logits[:, draft_ids], want, atol=1e-4)
    others = np.setdiff1d(np.arange(vocab), draft_ids)
    assert np.isneginf(logits[:, others]).all()

    ar = edgespec.load(bundle, mode="ar")
    eagle = edgespec.load(bundle, mode="eagle", draft_policy="fixed:4")
    drafted = accepted = 0
    for prompt in PROMPTS:
        want_ids = ar.generate(prompt, max_new_tokens=40, ignore_eos=True).tokens
        out = eagle.generate(prompt, max_new_tokens=40, ignore_eos=True)
        assert out.tokens == want_ids
        drafted += out.stats.drafted
        accepted += sum(k * n for k, n in out.stats.accepted_lengths.items())
    assert drafted > 0 and accepted > 0


def test_a_gguf_targets_lm_rows_are_its_own_blocks(tmp_path):
    """The draft vocabulary's rows of a GGUF target's LM head are its blocks taken whole:
    the same values as the target's, no requantization."""
    pytest.importorskip("gguf")
    from edgespec.export.eagle import lm_rows
    from edgespec.export.gguf_blocks import PackedMatrix
    from edgespec.export.gguf_model import read_gguf
    from tests.gguf_files import write_gguf

    write_gguf(tmp_path / "m.gguf", "llama", "Q4_1")
    weights = read_gguf(tmp_path / "m.gguf").weights
    ids = np.array([5, 0, 17, 3, 40], np.int64)
    rows = lm_rows(weights, ids)
    assert isinstance(rows, PackedMatrix) and rows.shape == (weights.embed.shape[1], len(ids))
    np.testing.assert_array_equal(np.asarray(rows), np.asarray(weights.lm_head)[ids].T)
