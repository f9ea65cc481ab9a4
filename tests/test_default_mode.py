"""A bundle loaded without a mode decodes in the mode its measured costs favour; a calibration
seeds acceptance as well as round times, so `auto` starts plain where drafting loses."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest

import edgespec
from edgespec.bundle import load_manifest
from edgespec.runtime.calibrate import mode_keys
from edgespec.runtime.policies.costs import best_local, calibrated_speedup, device_key
from edgespec.runtime.policies.draft_length import Auto, PerSource, set_priors
from edgespec.runtime.policies.estimates import PRIORS, AcceptanceModel, CostModel
from edgespec.runtime.registry import make_policy


def entry(plain: float, round_1: float, tokens_1: float) -> dict:
    """A calibration entry: plain step and a γ = 1 round's seconds, what a γ = 1 round yields."""
    return {
        "round_seconds": {"0": plain, "1": round_1},
        "draft_token_seconds": round_1 - plain,
        "tokens_per_round": {"1": tokens_1},
    }


def test_the_measured_best_mode_is_the_default_and_lookup_where_nothing_pays(bundles):
    m = load_manifest(bundles["llama-gqa-tied"])
    exit_layer = m.exit_layers[-1]
    losing = {
        f"self-spec@{exit_layer}": entry(0.010, 0.017, 1.09),
        "lookup": entry(0.010, 0.0105, 1.02),
    }
    assert best_local(m, losing) == ("lookup", None)
    paying = {**losing, f"self-spec@{exit_layer}": entry(0.010, 0.012, 1.8)}
    assert best_local(m, paying) == ("self-spec", exit_layer)
    assert calibrated_speedup(paying[f"self-spec@{exit_layer}"]) == pytest.approx(1.5)
    # within the run-to-run spread of plain decoding is no reason to speculate
    assert best_local(m, {"lookup": entry(0.010, 0.0100, 1.02)}) == ("lookup", None)


def test_uncalibrated_raw_exits_are_not_the_default(bundles):
    # raw exits of a model not trained for them lose: prompt lookup is free where it misses
    assert best_local(load_manifest(bundles["llama-gqa-tied"])) == ("lookup", None)


def test_load_without_a_mode_takes_the_calibrated_choice(bundles, tmp_path):
    b = tmp_path / "b"
    shutil.copytree(bundles["llama-gqa-tied"], b)
    k = load_manifest(b).exit_layers[-1]
    key = device_key("cpu", 1)
    calibration = {
        key: {f"self-spec@{k}": entry(0.010, 0.012, 1.8), "lookup": entry(0.01, 0.011, 1.0)}
    }
    (b / "calibration.json").write_text(json.dumps(calibration))
    model = edgespec.load(b, threads=1)
    assert model.mode == "self-spec"
    # the policy starts from the measured acceptance, not from the prior
    assert model.policy.cost.expected(1) == pytest.approx(1.8, abs=0.1)
    calibration[key][f"self-spec@{k}"] = entry(0.010, 0.017, 1.05)
    (b / "calibration.json").write_text(json.dumps(calibration))
    assert edgespec.load(b, threads=1).mode == "lookup"
    assert edgespec.load(b, threads=2).mode == "lookup"  # another device: uncalibrated
    assert edgespec.load(b, threads=1, mode="ar").mode == "ar"  # asked for: kept


def test_suffix_decoding_is_a_calibration_candidate_and_the_default_where_it_measures_best(
    bundles, tmp_path
):
    b = tmp_path / "b"
    shutil.copytree(bundles["llama-gqa-tied"], b)
    m = load_manifest(b)
    keys = [key for key, _ in mode_keys(m)]
    assert "suffix" in keys and "lookup" in keys and "recycle" not in keys
    both = {"lookup": entry(0.010, 0.0102, 1.30), "suffix": entry(0.010, 0.0105, 1.60)}
    assert best_local(m, both) == ("suffix", None)
    assert best_local(m, {**both, "suffix": entry(0.010, 0.0105, 1.10)}) == ("lookup", None)
    # where neither pays, prompt lookup (free where it finds nothing to copy)
    assert best_local(m, {"suffix": entry(0.010, 0.0105, 1.0)}) == ("lookup", None)
    key = device_key("cpu", 1)
    (b / "calibration.json").write_text(json.dumps({key: both}))
    model = edgespec.load(b, threads=1)
    assert model.mode == "suffix"
    # its auto starts from suffix's measured acceptance and round times, not the priors'
    assert model.policy.cost.round_time[1] == pytest.approx(0.0105)
    assert model.policy.cost.expected(1) == pytest.approx(1.6, abs=0.1)


def test_auto_seeded_with_a_losing_calibration_starts_plain():
    cost = CostModel(t_draft=0.007, round_time={0: 0.010, 1: 0.017})
    cost.acceptance.seed({1: 1.09, 2: 1.1}, PRIORS.calibrated_acceptance)
    p = Auto(cost=cost)
    assert [p.plan().length for _ in range(3)] == [0, 0, 0]


def test_seeded_acceptance_gives_back_the_measured_tokens_per_round():
    a = AcceptanceModel()
    a.seed({1: 1.7, 2: 2.2, 3: 2.5, 4: 2.7}, 1000)
    for g, n in ((1, 1.7), (2, 2.2), (3, 2.5), (4, 2.7)):
        assert a.expected(g, pooled=True) == pytest.approx(n, abs=0.02)


def test_priors_variants_name_their_fields_and_reach_every_cost_model():
    with pytest.raises(ValueError, match="no field 'shrinkage'.*'shrink'"):
        PRIORS.with_values({"shrinkage": "3"})
    assert PRIORS.with_values({"shrink": "3", "warm_rounds": "0"}) == replace(
        PRIORS, shrink=3.0, warm_rounds=0
    )
    chain = PerSource(Auto(), {"lookup": make_policy("auto", priors=PRIORS.copying())})
    set_priors(chain, replace(PRIORS, ridge=7.0))
    assert chain.main.cost.priors.ridge == chain.apart["lookup"].cost.priors.ridge == 7.0
    assert chain.main.cost.acceptance.priors.ridge == 7.0
    assert chain.apart["lookup"].cost.priors.is_copying  # lookup keeps its state prior
    assert not chain.main.cost.priors.is_copying


def test_channel_aware_prices_acceptance_with_the_shared_cost_model():
    p = make_policy("channel-aware", priors=replace(PRIORS, acceptance=0.2))
    assert p.cost.priors.acceptance == 0.2
    assert p.alpha == pytest.approx(p.cost.alpha)


def test_a_bundle_with_a_draft_defaults_to_lookup_then_the_draft_and_keeps_ar_tokens(
    spec_bundles,
):
    b = spec_bundles["self-draft"]  # the target drafts for itself: the draft is accepted
    model = edgespec.load(b, threads=1)
    assert (model.mode, model.config.drafter) == ("spec", "lookup+draft")
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    want = edgespec.load(b, mode="ar", threads=1).generate(prompt, max_new_tokens=24)
    got = model.generate(prompt, max_new_tokens=24)
    assert got.tokens == want.tokens
    # a mode asked for by name keeps its own drafter
    assert edgespec.load(b, mode="spec", threads=1).config.drafter is None


def with_head(manifest, record: dict | None):
    """`manifest` with an eagle graph listed and `record` as its distill record."""
    from edgespec.bundle import GraphInfo

    m = replace(manifest, graphs=[*manifest.graphs, GraphInfo("eagle", "eagle.onnx", "target",
                                                               [0], [], [])])  # fmt: skip
    m.extra = {**m.extra, "eagle": record} if record is not None else dict(m.extra)
    return m


PROMISE = {"held_out": {"tokens_per_round": {"1": 1.47, "2": 1.71, "3": 1.85, "4": 1.93}},
           "step_cost": 0.13}  # fmt: skip


@pytest.mark.parametrize(
    "measured, default",
    [
        (None, "lookup"),  # the held-out promise alone (1.10x) is no measurement
        ({"lookup": 2.42, "eagle": 1.0, "lookup+eagle": 2.40}, "lookup"),  # lookup alone wins
        ({"lookup": 1.12, "eagle": 1.05, "lookup+eagle": 1.14}, "lookup"),  # within the spread
        ({"lookup": 0.98, "eagle": 1.0, "lookup+eagle": 1.02}, "lookup"),  # not over plain
        ({"lookup": 1.12, "eagle": 1.3, "lookup+eagle": 1.4}, "eagle"),  # the chain pays
    ],
)
def test_a_head_is_the_default_only_where_decoding_with_it_was_measured_to_pay(
    bundles, measured, default
):
    from edgespec.runtime.policies.costs import eagle_speedup

    m = load_manifest(bundles["llama-gqa-tied"])
    record = PROMISE if measured is None else {**PROMISE, "decode_speedup": measured}
    head = with_head(m, record)
    assert eagle_speedup(head) == pytest.approx(1.47 / 1.33)  # what it promised
    assert best_local(head) == (default, None)
    # an imported head (llama.cpp's) has no record of its own to promise with
    assert best_local(with_head(m, {"imported": {"file": "h.gguf"}})) == ("lookup", None)
