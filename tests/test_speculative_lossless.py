"""Losslessness of every speculative mode and policy: greedy output is token for token the
target's own greedy output (transformers `generate`), whatever the drafter proposes."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from conftest import ARCHS

import edgespec
from edgespec.runtime.decode import GREEDY_RNG

N_NEW = 40
CONFIGS = [
    ("spec", "fixed:4", {}),
    ("spec", "acceptance", {}),
    ("spec", "confidence:0.3", {}),
    ("spec", "fixed:3", {"drafter": "lookup+draft"}),
    ("spec", "auto", {"drafter": "lookup+draft"}),
    ("self-spec", "fixed:3", {"exit_layer": 2}),
    ("self-spec", "confidence:0.2", {"exit_layer": 1}),
    ("self-spec", "acceptance", {}),
    ("self-spec", "dynamic-exit", {}),
    ("self-spec", "fixed:2", {"drafter": "lookup+exit"}),
    ("lookup", "fixed:5", {}),
    ("spec", "auto", {}),
    ("self-spec", "auto", {"exit_layer": 1}),
    ("lookup", "auto", {}),
    ("lookup", "acceptance", {"verifier": "exit:2"}),
    ("suffix", "fixed:4", {}),
    ("suffix", "auto", {}),
    ("recycle", "fixed:3", {}),
    ("recycle", "auto", {}),
    ("spec", "fixed:3", {"drafter": "suffix+recycle+draft"}),
]


def repetitive_prompt(seed: int) -> list[int]:
    """Random ids with a repeated stretch, so prompt lookup finds matches."""
    ids = [int(i) for i in np.random.default_rng(seed).integers(1, 2048, 12)]
    return ids + ids[:7] + ids[3:9]


@pytest.fixture(scope="module")
def references(hf_models) -> dict[str, list[int]]:
    out = {}
    for arch, hf in hf_models.items():
        prompt = repetitive_prompt(1)
        with torch.no_grad():
            ids = hf.generate(
                torch.tensor([prompt]),
                max_new_tokens=N_NEW,
                min_new_tokens=N_NEW,
                do_sample=False,
                pad_token_id=0,
            )
        out[arch] = ids[0, len(prompt) :].tolist()
    return out


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("mode, policy, options", CONFIGS, ids=lambda c: str(c))
def test_greedy_speculative_equals_transformers(
    arch, mode, policy, options, spec_bundles, references
):
    model = edgespec.load(spec_bundles[arch], mode=mode, draft_policy=policy, **options)
    state = GREEDY_RNG.bit_generator.state
    got = model.generate(repetitive_prompt(1), max_new_tokens=N_NEW, ignore_eos=True)
    assert got.tokens == references[arch]
    # greedy decoding draws no random numbers (its generator is shared by every generation)
    assert GREEDY_RNG.bit_generator.state == state
    s = got.stats
    assert s.decode_tokens == N_NEW - 1 and s.rounds >= 1
    assert s.decode_tokens == s.accepted + s.rounds  # each round: accepted drafts + one token


@pytest.mark.parametrize("mode", ["suffix", "recycle"])
def test_model_free_drafters_draft_and_are_accepted_as_chains(mode, spec_bundles, references):
    """SuffixDecoding and Token Recycling draft from what the run itself showed them (the
    repeated stretch, the target's own earlier top-k): greedy output stays the target's, and
    some of their drafts pass."""
    model = edgespec.load(spec_bundles["qwen2"], mode=mode, draft_policy="fixed:4")
    got = model.generate(repetitive_prompt(1), max_new_tokens=N_NEW, ignore_eos=True)
    assert got.tokens == references["qwen2"]
    assert got.stats.drafted > 0 and got.stats.accepted > 0


def test_all_drafts_accepted_when_the_draft_is_the_target(spec_bundles, hf_models):
    model = edgespec.load(spec_bundles["self-draft"], mode="spec", draft_policy="fixed:4")
    prompt = repetitive_prompt(2)
    got = model.generate(prompt, max_new_tokens=31, ignore_eos=True)
    with torch.no_grad():
        ref = hf_models["qwen2"].generate(
            torch.tensor([prompt]),
            max_new_tokens=31,
            min_new_tokens=31,
            do_sample=False,
            pad_token_id=0,
        )
    assert got.tokens == ref[0, len(prompt) :].tolist()
    assert got.stats.acceptance_rate == 1.0 and got.stats.accepted_lengths == {4: 6}


def test_a_draft_model_runs_one_call_per_drafted_token_when_every_draft_is_accepted(
    spec_bundles,
):
    """After a round that accepted all its drafts the draft model has seen neither d_γ nor
    the target's token; both go into the next round's first draft step. A call of its own for
    d_γ cost a whole draft step in most rounds at high acceptance (a 135M draft: 20 ms)."""
    model = edgespec.load(spec_bundles["self-draft"], mode="spec", draft_policy="fixed:4")
    stack = model.drafter.model
    calls: list[int] = []
    forward = stack.forward

    def counted(ids, keep=1):
        calls.append(len(ids))
        return forward(ids, keep=keep)

    stack.forward = counted
    got = model.generate(repetitive_prompt(2), max_new_tokens=31, ignore_eos=True)
    assert got.stats.accepted_lengths == {4: 6}
    assert len(calls) == 1 + got.stats.drafted  # the prompt, then one call per draft
    assert calls[1:] == [1, 1, 1, 1] + [2, 1, 1, 1] * 5


def test_a_chains_members_are_priced_apart_each_learning_only_from_its_own_rounds(
    spec_bundles,
):
    """`lookup+draft` under `auto`: prompt lookup's drafts cost nothing and pay best long,
    the draft model's cost a step each; one policy over both drafted the model ~6 where 4
    paid best. Each round names the member that drafted it, and that member's policy alone
    learns from it."""
    from edgespec.runtime.policies.draft_length import PerSource

    model = edgespec.load(spec_bundles["self-draft"], mode="spec", drafter="lookup+draft")
    assert isinstance(model.policy, PerSource) and list(model.policy.apart) == ["lookup"]
    chunks = list(model.stream(repetitive_prompt(2), max_new_tokens=60, ignore_eos=True))
    sources = [c.stats.source for c in chunks[1:]]
    assert {"lookup", "draft"} <= set(sources) <= {"lookup", "draft"}
    assert model.policy.apart["lookup"].cost.rounds == sources.count("lookup")
    assert model.policy.main.cost.rounds == sources.count("draft")
    # a fixed policy has nothing to learn: it stays one policy
    fixed = edgespec.load(
        spec_bundles["self-draft"], mode="spec", drafter="lookup+draft", draft_policy="fixed:3"
    )
    assert not isinstance(fixed.policy, PerSource)


def test_stream_chunks_carry_round_stats(spec_bundles):
    model = edgespec.load(spec_bundles["qwen2"], mode="self-spec", draft_policy="dynamic-exit")
    chunks = list(model.stream(repetitive_prompt(3), max_new_tokens=30, ignore_eos=True))
    rounds = [c.stats for c in chunks[1:]]
    assert all(r.exit_layer in (1, 2, 3) for r in rounds)
    assert sum(len(c.tokens) for c in chunks) == 30
    assert all(r.new_tokens == r.accepted + 1 for r in rounds[:-1])


def test_self_spec_counts_the_head_step_on_the_last_draft_as_verifying(spec_bundles):
    """The tail needs d_γ's hidden state, computed by one more head call a round: that call
    is part of the verify (at γ = 0 head + tail is a plain step), not of drafting, which
    policies price per drafted token."""
    model = edgespec.load(spec_bundles["qwen2"], mode="self-spec", draft_policy="fixed:2")
    head = model.drafter.heads[model.drafter.exit_layer]
    run = head.run

    def slow_tail_input(cache, past, feed, *rest):  # the tail-input call keeps no logits
        if feed.keep == 0:
            time.sleep(0.05)
        return run(cache, past, feed, *rest)

    head.run = slow_tail_input
    chunks = list(model.stream(repetitive_prompt(3), max_new_tokens=9, ignore_eos=True))
    rounds = [c.stats for c in chunks[1:]]
    assert any(r.drafted == 2 for r in rounds)  # the last rounds may be capped by the budget
    assert all(r.verify_seconds >= 0.05 > r.draft_seconds for r in rounds)


def test_stops_at_eos_inside_an_accepted_run(spec_bundles):
    model = edgespec.load(spec_bundles["self-draft"], mode="spec", draft_policy="fixed:6")
    free = model.generate([3, 4, 5], max_new_tokens=20, ignore_eos=True).tokens
    model.manifest.eos_token_ids = [free[5]]
    got = model.generate([3, 4, 5], max_new_tokens=20)
    assert got.tokens == free[: free.index(free[5]) + 1] and got.finish_reason == "eos"


@pytest.mark.parametrize("mode, options", [("spec", {}), ("self-spec", {}), ("lookup", {})])
def test_modes_refuse_bundles_without_what_they_need(bundles, mode, options):
    from edgespec.bundle import BundleError
    from edgespec.runtime.model import InputError

    b = bundles["gpt2"]  # exits at 2 only, no draft
    if mode == "spec":
        with pytest.raises(BundleError, match="--draft DRAFT_MODEL"):
            edgespec.load(b, mode="spec")
    elif mode == "self-spec":
        with pytest.raises(InputError, match="exit layer 3 is not in this bundle"):
            edgespec.load(b, mode="self-spec", exit_layer=3)
    else:
        with pytest.raises(InputError, match="dynamic-exit policy chooses exit layers"):
            edgespec.load(b, mode="lookup", draft_policy="dynamic-exit")


@pytest.mark.parametrize("bad", ["fixed:-1", "fixed:x", "confidence:2", "greedy", "acceptance:3"])
def test_bad_draft_policy_is_explained(bundles, bad):
    from edgespec.runtime.model import InputError

    with pytest.raises(InputError, match="is not one of: fixed:N"):
        edgespec.load(bundles["qwen2"], mode="lookup", draft_policy=bad)


def test_a_failing_round_leaves_the_caches_as_before_it(spec_bundles, references):
    """An exception inside a round rewinds target and drafter to the round's start."""
    import numpy as np

    from edgespec.runtime.decode import Ahead, speculative_round
    from edgespec.runtime.round import Plan
    from edgespec.runtime.sampling import SamplingParams

    model = edgespec.load(spec_bundles["qwen2"], mode="spec", draft_policy="fixed:3")
    prompt = repetitive_prompt(1)
    model.generate(prompt, max_new_tokens=N_NEW, ignore_eos=True)  # sizes the caches
    first = model.generate(prompt, max_new_tokens=1, ignore_eos=True).tokens  # prefills them
    seq = [*prompt, *first]
    target, drafter, rng = model.target, model.drafter, np.random.default_rng
    real_forward = target.forward

    def broken(*args, **kwargs):
        real_forward(*args, **kwargs)  # the verify call writes its positions, then fails
        raise RuntimeError("device lost")

    target.forward = broken
    with pytest.raises(RuntimeError, match="device lost"):
        speculative_round(model.verifier, drafter, Plan(3), seq, Ahead(), SamplingParams(), rng(0))
    assert target.length == len(seq) - 1 and drafter.model.length <= len(seq) - 1
    target.forward = real_forward
    new, _, _ = speculative_round(
        model.verifier, drafter, Plan(3), seq, Ahead(), SamplingParams(), rng(0)
    )
    assert [*first, *new] == references["qwen2"][: 1 + len(new)]
