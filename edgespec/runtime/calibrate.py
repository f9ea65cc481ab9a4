"""Device calibration: what a speculative round costs here and what it yields, stored next to
the bundle.

`calibrate(bundle)` runs real rounds of every mode the bundle supports (spec, self-spec at each
exit, and the model-free lookup and suffix) with fixed draft lengths γ = 0..max on synthetic
prompts, and records the median wall time per round and per draft token; then each mode drafts γ = 4
per round while the model answers a few built-in instruct prompts (its own greedy replies, through
its chat template when it has one) and records the tokens a round of γ = 1..4 yields
(`tokens_per_round`). They are saved in `calibration.json` under a key naming this device (execution
provider, threads, processor). `Model.load` seeds the adaptive policies with them, so the first
generation prices rounds with this machine's numbers and starts from a measured acceptance instead
of a prior, and a bundle loaded without a mode decodes in the mode they favour
(`registry.best_local`): where no drafter pays, plain decoding's equal, prompt lookup. Acceptance
depends on the text: live rounds keep learning it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from statistics import median

import numpy as np

from edgespec.runtime.decode import Budget, decode, decode_rounds
from edgespec.runtime.model import Model
from edgespec.runtime.policies.costs import FILE, device_key
from edgespec.runtime.policies.draft_length import FixedLength
from edgespec.runtime.round import Start
from edgespec.runtime.sampling import SamplingParams

# the instruct prompts acceptance is measured on: a question, a rewrite, a summary (lookup
# and the drafters see the kinds of text a chat model writes)
PROMPTS = (
    "Why do leaves change colour in autumn? Answer in a short paragraph.",
    "Rewrite this Python function with type hints and a docstring:\n\ndef area(w, h):\n"
    "    if w < 0 or h < 0:\n        return 0\n    return w * h\n",
    "Summarise in two sentences: The library will close for renovation from June to August. "
    "During that time, books can be borrowed from the school hall, and returns can be left "
    "in the box by the main door. The new library will have more study rooms and a cafe.",
)
PROBE = 4  # drafts per round while measuring acceptance: tells N(1..4) at once

__all__ = ["calibrate", "device_key", "measure_rounds", "mode_keys"]


def mode_keys(manifest) -> list[tuple[str, dict]]:
    """(key, Model.load options) for each speculative mode this bundle supports."""
    keys: list[tuple[str, dict]] = []
    if "draft" in manifest.roles:
        keys.append(("spec", {"mode": "spec"}))
    if "eagle" in manifest.roles:
        keys.append(("eagle", {"mode": "eagle"}))
    for k in manifest.exit_layers:
        keys.append((f"self-spec@{k}", {"mode": "self-spec", "exit_layer": k}))
    # the model-free drafters every bundle has: Token Recycling (`recycle`) is left out, it
    # drafts every round and lost to plain decoding on open questions (benchmarks.real)
    keys.append(("lookup", {"mode": "lookup"}))
    keys.append(("suffix", {"mode": "suffix"}))
    return keys


def calibrate(
    bundle: str | os.PathLike,
    *,
    device: str = "cpu",
    threads: int | None = None,
    max_length: int = 8,
    repeats: int = 5,
    progress=None,
) -> dict:
    """Measure round costs for every mode; write and return this device's entry."""
    folder = Path(bundle)
    entry: dict[str, dict] = {}
    for key, options in mode_keys(Model.load(folder, threads=threads, device=device).manifest):
        if progress:
            progress(key)
        model = Model.load(folder, device=device, threads=threads, **options)
        entry[key] = measure_rounds(model, max_length, repeats)
        entry[key]["tokens_per_round"] = measure_acceptance(model)
    path = folder / FILE
    saved = json.loads(path.read_text()) if path.exists() else {}
    saved[device_key(device, threads)] = entry
    path.write_text(json.dumps(saved, indent=2) + "\n")
    return entry


def measure_rounds(model, max_length: int, repeats: int) -> dict:
    """Median seconds per round for γ = 0..max_length, and per draft token."""
    rng = np.random.default_rng(0)
    vocab = model.manifest.target.vocab_size
    # a repeated stretch, so prompt lookup always has a continuation to propose
    motif = [int(i) for i in rng.integers(1, vocab, 16)]
    prompt = motif * 4
    capacity = len(prompt) + (max_length + 1) * (repeats + 1) * (max_length + 1) + 8
    params = SamplingParams()
    rounds: dict[int, list[float]] = {g: [] for g in range(max_length + 1)}
    per_token: list[float] = []
    for g in range(max_length + 1):
        verifier, drafter = model.verifier, model.drafter
        verifier.prefill(Start(prompt, capacity, params, rng))
        drafter.begin(prompt, capacity)
        # the loop from the motif's next token (lookup always has a continuation), never
        # cut short: every round may draft g
        seq = [*prompt, motif[0]]
        budget = Budget(capacity - len(prompt), frozenset(), capacity)
        steps = decode_rounds(verifier, drafter, FixedLength(g), seq, params, rng, budget)
        for i, step in zip(range(repeats + 1), steps, strict=False):
            stats = step.stats
            if i == 0:
                continue  # warm-up
            rounds[g].append(stats.seconds - stats.catchup_seconds)
            if stats.drafted:
                per_token.append(stats.draft_seconds / stats.drafted)
    return {
        "round_seconds": {str(g): median(v) for g, v in rounds.items()},
        "draft_token_seconds": median(per_token) if per_token else 0.0,
    }


def prompt_ids(model: Model, text: str) -> list[int]:
    """`text` as a user's message through the chat template, or plain without one."""
    if model.manifest.chat:
        return model.chat_session().prepare([{"role": "user", "content": text}]).ids
    return model.encode(text)


def measure_acceptance(model: Model, new_tokens: int = 48) -> dict[str, float]:
    """Tokens a round drafting γ = 1..PROBE yields on the model's own greedy replies to
    PROMPTS: each round drafts PROBE, which tells what every shorter draft would have
    accepted (N(γ) = 1 + Σ_{k≤γ} P(drafts 1..k accepted))."""
    reached, passed = [0] * (PROBE + 1), [0] * (PROBE + 1)
    stop = frozenset(model.manifest.eos_token_ids)
    for text in PROMPTS:
        steps = decode(
            model.verifier,
            model.drafter,
            FixedLength(PROBE),
            prompt_ids(model, text),
            SamplingParams(),
            new_tokens,
            stop,
        )
        for step in steps:
            s = step.stats
            if s.phase != "decode" or not s.drafted:
                continue
            judged = min(s.accepted + 1, s.drafted, PROBE)  # drafts the verifier got to
            for k in range(1, judged + 1):
                reached[k] += 1
                passed[k] += k <= s.accepted
    tokens, survive, out = 1.0, 1.0, {}
    for g in range(1, PROBE + 1):  # P(drafts 1..g accepted) = Π h(k), h(k) = passed / reached
        survive *= passed[g] / reached[g] if reached[g] else 0.0
        tokens += survive
        out[str(g)] = tokens
    return out
