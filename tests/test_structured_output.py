"""Structured output: a grammar's mask applies to drafts and to verification alike, so greedy
constrained output is the constrained target's greedy output in every mode, sampled output
follows the masked target distribution, and every finished reply validates."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

import edgespec
from edgespec.runtime.errors import InputError
from edgespec.runtime.sampling import SamplingParams, probabilities

llguidance = pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "bb", "ccc"]}, "maxItems": 3},
    },
    "required": ["name", "age", "ok", "tags"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
MODES = [
    ("ar", {}),
    ("spec", {"draft_policy": "fixed:3"}),
    ("self-spec", {"exit_layer": 2, "draft_policy": "fixed:3"}),
    ("lookup", {"draft_policy": "fixed:4"}),
    ("spec", {"drafter": "lookup+draft", "draft_policy": "fixed:3"}),
]
PROMPT = "def person(name, age):\n    return {'name': name, 'age': age, 'ok': True}\n\n"


def masked_greedy_reference(model, prompt: list[int], grammar: str, n: int) -> list[int]:
    """The constrained target's greedy output, slowly: the whole sequence through the target
    at every step, masked by a fresh llguidance matcher of its own."""
    tok = model.vocabulary().tokenizer
    matcher = llguidance.LLMatcher(tok, grammar)
    vocab = model.manifest.target.vocab_size
    eos = set(model.manifest.eos_token_ids)
    out: list[int] = []
    t = model.target
    while len(out) < n:
        t.reset(len(prompt) + n + 1)
        logits = t.forward(np.asarray([*prompt, *out], np.int64), keep=1)[-1]
        bits = np.unpackbits(np.frombuffer(matcher.compute_bitmask(), np.uint8), bitorder="little")
        allowed = bits[:vocab].astype(bool)
        token = int(np.where(allowed, logits, -np.inf).argmax())
        out.append(token)
        if token in eos:
            break
        assert matcher.consume_token(token)
    return out


@pytest.mark.parametrize("mode,options", MODES)
def test_greedy_constrained_output_equals_the_masked_target_in_every_mode(
    spec_bundles, mode, options
):
    bundle = spec_bundles["llama-gqa-tied"]
    ar = edgespec.load(bundle)
    prompt = ar.encode(PROMPT)
    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        PERSON,
        defaults={"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "},
    )
    ref = masked_greedy_reference(ar, prompt, grammar, 60)
    model = edgespec.load(bundle, mode=mode, **options)
    got = model.generate(prompt, max_new_tokens=60, response_format=FORMAT)
    assert got.tokens == ref
    assert got.stats.forced > 0  # keys, quotes and separators came from the grammar alone
    if mode in ("spec", "self-spec"):  # a lookup may find nothing to propose here
        assert got.stats.drafted > 0
    if got.finish_reason == "eos":
        jsonschema.validate(json.loads(got.text), PERSON)


@pytest.mark.parametrize("mode,options", MODES)
def test_every_finished_sampled_reply_validates(spec_bundles, mode, options):
    model = edgespec.load(spec_bundles["qwen2"], mode=mode, **options)
    finished = 0
    for seed in range(6):
        g = model.generate(
            PROMPT, max_new_tokens=80, temperature=1.0, seed=seed, response_format=FORMAT
        )
        if g.finish_reason == "eos":
            finished += 1
            jsonschema.validate(json.loads(g.text), PERSON)
    assert finished >= 3, "too few replies finished to check"


def test_json_object_gives_a_json_object(spec_bundles):
    model = edgespec.load(spec_bundles["qwen2"], mode="spec")
    g = model.generate(PROMPT, max_new_tokens=40, response_format={"type": "json_object"})
    assert g.text.startswith("{")
    if g.finish_reason == "eos":
        assert isinstance(json.loads(g.text), dict)


def spy_on_submit(model) -> list[tuple[list[int], list[int]]]:
    """Record what reaches the model's (real) verifier."""
    submitted: list[tuple[list[int], list[int]]] = []
    real_submit = model.verifier.submit

    def submit(seq, proposal, params, rng):
        submitted.append((list(seq), list(proposal.tokens)))
        return real_submit(seq, proposal, params, rng)

    model.verifier.submit = submit
    return submitted


@pytest.mark.parametrize("mode", ["ar", "spec"])
def test_a_reply_the_grammar_alone_decides_needs_no_verify_round(spec_bundles, mode):
    """A one-value enum: after the prefill's token every token is forced, the end of
    sequence included, so no round reaches the verifier."""
    model = edgespec.load(spec_bundles["qwen2"], mode=mode)
    submitted = spy_on_submit(model)
    fmt = {"type": "json_schema", "json_schema": {"name": "c", "schema": {"enum": ["done!"]}}}
    g = model.generate(PROMPT, max_new_tokens=20, response_format=fmt)
    assert g.text == '"done!"' and g.finish_reason == "eos"
    assert submitted == []
    assert g.stats.forced == len(g.tokens) - 1


def _chi_square(counts: np.ndarray, p: np.ndarray) -> tuple[float, int]:
    expected = p * counts.sum()
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a token the masked target never gives was produced"
    stat = float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    return stat, int(keep.sum()) - 1


def test_tokens_the_grammar_alone_decides_inside_a_draft_cost_no_draft_step(spec_bundles):
    """A draft position where the grammar allows one token takes that token without a step
    of the draft model (it rides in the next step's feed): fewer drafting steps than drafted
    tokens, and the output is still the masked target's greedy output (the test above)."""
    model = edgespec.load(spec_bundles["llama-gqa-tied"], mode="spec", draft_policy="fixed:3")
    stack = model.drafter.model
    forward, steps = stack.forward, []

    def counted(ids, keep=1):  # the real forward; drafting steps are the keep=1 calls
        steps.append((len(ids), keep))
        return forward(ids, keep)

    stack.forward = counted
    got = model.generate(PROMPT, max_new_tokens=60, response_format=FORMAT)
    drafting = [n for n, keep in steps if keep == 1]
    assert got.stats.drafted > 0
    assert len(drafting) < got.stats.drafted  # every drafted token used to cost a step
    ar = edgespec.load(spec_bundles["llama-gqa-tied"])
    assert got.tokens == ar.generate(PROMPT, max_new_tokens=60, response_format=FORMAT).tokens


def _critical(df: int) -> float:
    """The chi-square quantile at p = 0.001 (Wilson-Hilferty; within 1% for df >= 3)."""
    z = 3.0902
    return df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize("mode,options", [MODES[1], MODES[2]])
def test_constrained_sampling_follows_the_masked_target_distribution(spec_bundles, mode, options):
    """The 2nd output token (the first drafted and verified one) has the exact marginal of
    the masked target's sampling, computed by enumeration; the same test rejects the masked
    draft's marginal (it can fail)."""
    schema = {"enum": ["alpha", "beta", "gamma", "delta", "epsilon", "omega", "zeta"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "pick", "schema": schema}}
    bundle = spec_bundles["llama-gqa-tied"]
    model = edgespec.load(bundle, mode=mode, **options)
    prompt = model.encode("x = ")
    params = SamplingParams(temperature=1.0)
    vocab = model.manifest.target.vocab_size
    grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
    tok = model.vocabulary().tokenizer

    def masked(stack, ids: list[int], matcher) -> np.ndarray:
        stack.reset(len(ids) + 1)
        logits = stack.forward(np.asarray(ids, np.int64), keep=1)[-1]
        bits = np.unpackbits(np.frombuffer(matcher.compute_bitmask(), np.uint8), bitorder="little")
        return probabilities(np.where(bits[:vocab].astype(bool), logits, -np.inf), params)

    def marginal(stack) -> np.ndarray:
        first = masked(stack, prompt, llguidance.LLMatcher(tok, grammar))
        p2 = np.zeros(vocab)
        for a in np.flatnonzero(first):
            m = llguidance.LLMatcher(tok, grammar)
            assert m.consume_token(int(a))
            p2 += first[a] * masked(stack, [*prompt, int(a)], m)
        return p2

    ar = edgespec.load(bundle)
    target = marginal(ar.target)
    control = marginal(edgespec.load(bundle, mode="spec").drafter.model)
    counts = np.zeros(vocab)
    for seed in range(1200):
        out = model.generate(
            prompt, max_new_tokens=3, temperature=1.0, seed=seed, response_format=fmt
        )
        counts[out.tokens[1]] += 1
    stat, df = _chi_square(counts, target)
    assert df >= 3, "too few allowed second tokens for a meaningful test"
    assert stat < _critical(df)
    keep = control > 0
    wrong = float(((counts[keep] - control[keep] * 1200) ** 2 / (control[keep] * 1200)).sum())
    assert wrong > _critical(int(keep.sum()) - 1) or counts[~keep].sum() > 0


def test_lookup_drafts_the_grammar_forbids_are_cut_before_verification(spec_bundles):
    """A prompt full of text the schema forbids: lookup finds matches, but no forbidden
    draft reaches the verifier (every submitted draft is allowed where it stands)."""
    model = edgespec.load(spec_bundles["qwen2"], mode="lookup", draft_policy="fixed:6")
    submitted = spy_on_submit(model)
    prompt = '{"name": "x", "age": 5, "ok": true, "tags": []} ' * 6 + "import os\nimport os\n"
    g = model.generate(prompt, max_new_tokens=60, response_format=FORMAT)
    ids = model.encode(prompt)
    tok = model.vocabulary().tokenizer
    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        PERSON,
        defaults={"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "},
    )
    assert any(d for _, d in submitted)
    for seq, drafts in submitted:
        m = llguidance.LLMatcher(tok, grammar)
        assert m.consume_tokens(seq[len(ids) :])
        assert m.validate_tokens(drafts) == len(drafts)
    assert g.stats.drafted > 0


def test_bad_schemas_and_missing_engine_are_refused_clearly(spec_bundles, monkeypatch):
    model = edgespec.load(spec_bundles["qwen2"])
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}
    with pytest.raises(InputError, match="nope"):
        model.generate("x", response_format=bad)
    with pytest.raises(InputError, match="json_object"):
        model.generate("x", response_format={"type": "yaml"})
    with pytest.raises(InputError, match="ignore_eos"):
        model.generate("x", response_format=FORMAT, ignore_eos=True)
    monkeypatch.setitem(sys.modules, "llguidance", None)
    with pytest.raises(InputError, match=r"pip install 'edgespec\[grammar\]'"):
        model.generate("x", response_format=FORMAT)


def test_generate_cli_follows_a_json_schema_file(spec_bundles, tmp_path):
    from click.testing import CliRunner

    from edgespec.cli import main

    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    bundle = str(spec_bundles["qwen2"])
    args = ["generate", bundle, "-p", PROMPT, "-n", "80", "--no-stream", "--mode", "spec"]
    r = CliRunner().invoke(main, [*args, "--json-schema", str(schema)])
    assert r.exit_code == 0, r.output
    model = edgespec.load(spec_bundles["qwen2"])
    want = model.generate(PROMPT, max_new_tokens=80, response_format=FORMAT)
    assert r.output.strip() == want.text
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    r = CliRunner().invoke(main, [*args, "--json-schema", str(bad)])
    assert r.exit_code != 0 and "bad.json is not JSON" in r.output
    assert "Traceback" not in r.output
