"""Device calibration: what a speculative round costs here, stored next to the bundle.

`calibrate(bundle)` runs real rounds of every mode the bundle supports (spec, self-spec at
each exit, lookup) with fixed draft lengths γ = 0..max on synthetic prompts, and records the
median wall time per round and per draft token. They are saved in `calibration.json` under a
key naming this device (execution provider, threads, processor), and `Model.load` seeds the
adaptive policies with them, so the first generation prices rounds with this machine's
numbers instead of learning them from scratch. Acceptance is not calibrated: it depends on
the text, and is learnt live.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from statistics import median

import numpy as np

from edgespec.runtime.costs import FILE, device_key
from edgespec.runtime.decode import Ahead, speculative_round
from edgespec.runtime.model import Model
from edgespec.runtime.round import Plan
from edgespec.runtime.sampling import SamplingParams

__all__ = ["calibrate", "device_key", "measure_rounds", "mode_keys"]


def mode_keys(manifest) -> list[tuple[str, dict]]:
    """(key, Model.load options) for each speculative mode this bundle supports."""
    keys: list[tuple[str, dict]] = []
    if "draft" in manifest.roles:
        keys.append(("spec", {"mode": "spec"}))
    for k in manifest.exit_layers:
        keys.append((f"self-spec@{k}", {"mode": "self-spec", "exit_layer": k}))
    keys.append(("lookup", {"mode": "lookup"}))
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
        verifier.prefill(prompt, capacity, params, rng)
        drafter.begin(prompt, capacity)
        seq = [*prompt, motif[0]]
        for i in range(repeats + 1):
            new, stats, _ = speculative_round(
                verifier, drafter, Plan(g), seq, Ahead(), g, params, rng
            )
            seq += new
            if i == 0:
                continue  # warm-up
            rounds[g].append(stats.seconds - stats.catchup_seconds)
            if stats.drafted:
                per_token.append(stats.draft_seconds / stats.drafted)
    return {
        "round_seconds": {str(g): median(v) for g, v in rounds.items()},
        "draft_token_seconds": median(per_token) if per_token else 0.0,
    }
