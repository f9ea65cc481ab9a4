"""Calibrated round costs: reading `calibration.json` and seeding the adaptive policies.

`calibrate.py` measures and writes the file (`edgespec bench --calibrate`); `Model.load`
reads this device's entry through `seed_from_calibration`, so the first generation prices
rounds with this machine's numbers instead of learning them from scratch.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

from edgespec.runtime.estimates import PRIORS, CostModel, Priors
from edgespec.runtime.policies import Acceptance, Auto, DraftLengthPolicy, DynamicExit, PerSource

FILE = "calibration.json"


def device_key(device: str, threads: int | None) -> str:
    cpu = platform.processor() or platform.machine()
    return f"{device}/threads={threads or os.cpu_count()}/{cpu}"


def load_cost(
    folder: Path, device: str, threads: int | None, key: str, priors: Priors = PRIORS
) -> CostModel | None:
    """A cost model seeded from calibration.json, or None if this device has no entry."""
    path = folder / FILE
    if not path.exists():
        return None
    try:
        entry = json.loads(path.read_text()).get(device_key(device, threads), {}).get(key)
    except (json.JSONDecodeError, AttributeError):
        return None  # an unreadable calibration only costs a blind start
    if not entry:
        return None
    return CostModel(
        t_draft=float(entry["draft_token_seconds"]) or None,
        round_time={int(g): float(t) for g, t in entry["round_seconds"].items()},
        priors=priors,
    )


def seed_from_calibration(
    policy: DraftLengthPolicy, folder: Path, device: str, threads: int | None, mode: str, exit: int
) -> None:
    """Start adaptive policies from this device's measured round costs, when calibrated."""
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
        cost = load_cost(folder, device, threads, key, policy.cost.priors)
        if cost is not None:
            cost.acceptance = policy.cost.acceptance  # how it learns acceptance stays
            policy.cost = cost
