"""Calibrated round costs: reading `calibration.json`, seeding the adaptive policies, and the
mode a bundle decodes in by default (`best_local`).

`calibrate.py` measures and writes the file (`edgespec bench --calibrate`); `Model.load`
reads this device's entry through `seed_from_calibration`, so the first generation prices
rounds with this machine's numbers instead of learning them from scratch.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgespec.bundle import Manifest
from edgespec.runtime.policies.draft_length import Acceptance, Auto, DynamicExit, PerSource
from edgespec.runtime.policies.estimates import PRIORS, AcceptanceModel, CostModel, Priors
from edgespec.runtime.round import DraftLengthPolicy

FILE = "calibration.json"


def device_key(device: str, threads: int | None) -> str:
    cpu = platform.processor() or platform.machine()
    return f"{device}/threads={threads or os.cpu_count()}/{cpu}"


def load_cost(
    folder: Path,
    device: str,
    threads: int | None,
    key: str,
    priors: Priors = PRIORS,
    acceptance: AcceptanceModel | None = None,
) -> CostModel | None:
    """A cost model seeded from calibration.json (round times, draft time and, when measured,
    acceptance, into `acceptance` if given), or None if this device has no entry."""
    entry = calibration_entry(folder, device, threads).get(key)
    if not isinstance(entry, dict) or "round_seconds" not in entry:
        return None
    cost = CostModel(
        acceptance or AcceptanceModel(priors),
        t_draft=float(entry["draft_token_seconds"]) or None,
        round_time={int(g): float(t) for g, t in entry["round_seconds"].items()},
        priors=priors,
    )
    seed_acceptance(cost, entry)
    return cost


def seed_acceptance(cost: CostModel, entry: Mapping[str, Any]) -> None:
    """Start `cost`'s acceptance from the entry's measured tokens per round, if it has them."""
    tokens = entry.get("tokens_per_round")
    if tokens:
        curve = {int(g): float(n) for g, n in tokens.items()}
        cost.acceptance.seed(curve, cost.priors.calibrated_acceptance)


def calibration_entry(folder: Path, device: str, threads: int | None) -> dict[str, Any]:
    """This device's calibration (mode key -> measurements), {} if none."""
    path = folder / FILE
    if not path.exists():
        return {}
    try:
        entry = json.loads(path.read_text()).get(device_key(device, threads), {})
    except (json.JSONDecodeError, AttributeError):
        return {}  # an unreadable calibration only costs a blind start
    return entry if isinstance(entry, dict) else {}


def seed_from_calibration(
    policy: DraftLengthPolicy, folder: Path, device: str, threads: int | None, mode: str, exit: int
) -> None:
    """Start adaptive policies from this device's measured round costs, when calibrated."""
    from edgespec.runtime.policies.trees import TreePolicy

    if isinstance(policy, TreePolicy) and policy.chain is not None:  # its chain rounds
        policy = policy.chain
    if isinstance(policy, PerSource):  # a chain: its members' entries (prompt lookup's)
        for name, member in policy.apart.items():
            seed_from_calibration(member, folder, device, threads, name, 0)
        policy = policy.main
    if isinstance(policy, DynamicExit):
        for k in policy.exits:
            cost = load_cost(folder, device, threads, f"self-spec@{k}")
            if cost is not None:
                policy.costs[k] = cost
    elif isinstance(policy, Auto | Acceptance):
        key = f"self-spec@{exit}" if exit else mode
        # how the policy learns acceptance stays its own (prompt lookup's state prior)
        cost = load_cost(folder, device, threads, key, policy.cost.priors, policy.cost.acceptance)
        if cost is not None:
            policy.cost = cost


# a mode is the default only if its calibration promises more than this over plain decoding:
# closer is within the host's run-to-run spread
DEFAULT_MARGIN = 1.03


def best_local(
    manifest: Manifest, calibration: Mapping[str, Any] | None = None
) -> tuple[str, int | None]:
    """The local mode (and self-spec's exit layer) this bundle decodes fastest in: the default
    of `Model.load`, the CLI and the server, and in split mode the device's drafter.

    With this device's calibration (`edgespec bench BUNDLE --calibrate`: round times and the
    tokens a round yields on instruct replies, per mode), the mode whose best γ promises the
    most tokens per second, N(γ) / T(γ) against 1 / T(0), if that beats plain decoding by
    DEFAULT_MARGIN. Without one: the bundle's feature head (chained after prompt lookup:
    modes.DEFAULT_EAGLE_DRAFTER) where distill measured the chain beating prompt lookup alone
    (`eagle_pays`); else its draft model (chained after prompt lookup:
    modes.DEFAULT_SPEC_DRAFTER); else an exit whose fitted adapter
    agrees with the final layer on more than k/L + 0.1 of tokens (a round drafting one token
    at exit k costs about 1 + k/L plain steps: raw exits of a model not trained for them
    agree far less and lose). Else, and where nothing measured pays, prompt lookup: it costs
    nothing where it finds nothing to copy, and `auto` then steps plainly. (SuffixDecoding,
    a calibration candidate, is not the uncalibrated choice: on SmolLM2-135M-Instruct's
    unrelated instruct prompts, `python -m benchmarks.real`, it drafted and was accepted
    less than prompt lookup; it wins where replies repeat earlier ones, which a calibration
    on the user's own device and prompts can tell.)"""
    if calibration:
        rates = {key: calibrated_speedup(entry) for key, entry in calibration.items()}
        measured = {key: r for key, r in rates.items() if r is not None}
        if measured:
            key = max(measured, key=lambda k: measured[k])
            if measured[key] > DEFAULT_MARGIN:
                return mode_of_key(key)
            return "lookup", None
    if "eagle" in manifest.roles and eagle_pays(manifest):
        return "eagle", None
    if "draft" in manifest.roles:
        return "spec", None
    layers = manifest.target.num_layers
    fitted = manifest.extra.get("exit_adapters", {}) if isinstance(manifest.extra, dict) else {}
    paying = [
        int(k)
        for k, record in fitted.items()
        if int(k) in manifest.exit_layers
        and float(record.get("top1_after", 0.0)) > int(k) / layers + 0.1
    ]
    if paying:
        return "self-spec", max(paying)
    return "lookup", None


# an extra verified position's cost, in plain target steps (a verify of γ + 1 positions on a
# CPU costs about one step plus this per extra position: on SmolLM2's Q4_1 file, 2 cores, a
# 5-position verify took 11.1 ms against 6.3 ms for one step)
VERIFY_POSITION = 0.2


def eagle_pays(manifest: Manifest) -> bool:
    """Whether a bundle's feature head is its default without a calibration: its distill
    record's end-to-end measurement (`decode_speedup`, distill/measure.py: lookup+eagle,
    lookup and the head alone decoding instruct prompts, x `ar`, on the machine that
    distilled) has lookup+eagle beating both prompt lookup and plain decoding by
    DEFAULT_MARGIN. A record without one (an older distill, a head imported from llama.cpp)
    does not: the held-out promise (`eagle_speedup`) is no measurement of decoding (on
    SmolLM2-135M-Instruct's Q4_1 file it promised 1.10x where the head alone decoded at
    0.94–1.09x `ar` and lookup alone beat lookup+eagle on every workload)."""
    record = manifest.extra.get("eagle") if isinstance(manifest.extra, dict) else None
    try:
        measured = record["decode_speedup"]
        chain, lookup = float(measured["lookup+eagle"]), float(measured["lookup"])
    except (KeyError, TypeError, ValueError):
        return False
    return chain > DEFAULT_MARGIN * max(lookup, 1.0)


def eagle_speedup(manifest: Manifest) -> float | None:
    """What a bundle's feature head promises over plain decoding before any calibration: its
    held-out tokens per round N(γ) (`edgespec distill`'s record) over the round's cost in
    target steps, 1 + γ (step_cost + VERIFY_POSITION), at the best γ. None: no record."""
    record = manifest.extra.get("eagle") if isinstance(manifest.extra, dict) else None
    try:
        curve = record["held_out"]["tokens_per_round"]
        cost = float(record["step_cost"])
        return max(float(n) / (1 + int(g) * (cost + VERIFY_POSITION)) for g, n in curve.items())
    except (KeyError, TypeError, ValueError):
        return None


def calibrated_speedup(entry: Any) -> float | None:
    """max over γ of N(γ) / T(γ), over 1 / T(0), from a calibration entry (None: no
    acceptance was measured, or the entry is unreadable)."""
    try:
        times = {int(g): float(t) for g, t in entry["round_seconds"].items()}
        tokens = {int(g): float(n) for g, n in entry["tokens_per_round"].items()}
        plain = times[0]
        return max(tokens[g] / times[g] for g in tokens if g in times) * plain
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def mode_of_key(key: str) -> tuple[str, int | None]:
    """A calibration key ("spec", "self-spec@K", "lookup") as (mode, exit layer)."""
    mode, _, k = key.partition("@")
    return mode, int(k) if k else None
