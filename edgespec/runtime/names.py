"""The name tables of drafters and draft-length policies: every name the Python API, the CLI
and split mode accept, with what builds it and what it can do. A leaf of the standard library
when imported (the CLI writes its help from these tables without loading numpy or
onnxruntime): each build imports what it builds when it is called. `registry` resolves a
`LoadConfig` with them; `modes.MODES` names each mode's default drafter and policy.

  DRAFTER_NAMES  name -> DrafterName: its spelling (help and errors), a few words of help,
                 its build, whether it is model-free (deterministic drafts, no graphs of its
                 own: q a point mass, nothing to send per draft in split mode, and its trees
                 verify at a server) and whether it proposes token trees (`trees=auto|on`)
  POLICY_NAMES   name -> PolicyName: its spelling with its argument, its build from that
                 argument, whether it prices a server's link (split mode only), and whether
                 its own errors say more than the table's list

A drafter is one row of DRAFTER_NAMES (its build below the table's others); chains join
names with "+" (`lookup+draft`: prompt lookup first, the draft model where it finds nothing).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from edgespec.runtime.errors import InputError
from edgespec.runtime.policies.estimates import PRIORS, Priors

if TYPE_CHECKING:
    from edgespec.runtime.config import LoadConfig
    from edgespec.runtime.graphs.protocol import Graph
    from edgespec.runtime.graphs.stack import Stack
    from edgespec.runtime.policies.draft_length import DraftLengthPolicy
    from edgespec.runtime.round import Drafter


class DrafterParts(Protocol):
    """What a drafter's build may use of the bundle being resolved (`registry._Builder`)."""

    config: LoadConfig
    exits: list[int]  # the bundle's exit layers
    graphs: Any  # the bundle's opened graphs (`opener.BundleGraphs`): shared state's owner

    def open(self, role: str) -> Graph:
        """The bundle's graph for `role`, opened once per build."""
        ...


@dataclass(frozen=True)
class DrafterName:
    spelling: str  # as help and errors write it ("exit:K": K an exit layer)
    help: str  # what it drafts with, for --drafter's help
    # (the bundle's parts, the name as given, the local target or None) -> the drafter
    build: Callable[[DrafterParts, str, Stack | None], Drafter]
    model_free: bool = False
    trees: bool = False


def _none(b: DrafterParts, spec: str, target: Stack | None) -> Drafter:
    from edgespec.runtime.drafters.base import NoDrafter

    return NoDrafter()


def _draft(b: DrafterParts, spec: str, target: Stack | None) -> Drafter:
    from edgespec.runtime.drafters.base import ModelDrafter
    from edgespec.runtime.graphs.stack import Stack

    return ModelDrafter(Stack([b.open("draft")]), b.config.draft_support)


def _exit(b: DrafterParts, spec: str, target: Stack | None) -> Drafter:
    from edgespec.runtime.drafters.base import EarlyExitDrafter, ModelDrafter
    from edgespec.runtime.graphs.stack import Stack

    k = exit_layer(spec, b.exits, "drafter")
    if target is not None and b.config.mode == "self-spec":
        # the head drafts into the target's own cache; the tail verifies its states
        heads = {e: b.open(f"head@{e}") for e in b.exits}
        tails = {e: b.open(f"tail@{e}") for e in b.exits}
        return EarlyExitDrafter(target, heads, tails, k, b.config.draft_support)
    head = Stack([b.open(f"head@{k}")], logits="exit_logits")
    return ModelDrafter(head, b.config.draft_support)


def _eagle(b: DrafterParts, spec: str, target: Stack | None) -> Drafter:
    from edgespec.runtime.drafters.eagle import EagleDrafter

    # the feature head (runtime/drafters/eagle.py) reads the local target's features
    return EagleDrafter.of(target, b.graphs.manifest, b.open, b.config.draft_support)


def _lookup(b: DrafterParts, spec: str, target: Stack | None) -> Drafter:
    from edgespec.runtime.drafters.lookup import LookupDrafter

    return LookupDrafter()


def _suffix(b: DrafterParts, spec: str, target: Stack | None) -> Drafter:
    from edgespec.runtime.drafters.suffix import SuffixDrafter, SuffixStore
    from edgespec.runtime.drafters.tree_draft import shared

    return SuffixDrafter(shared(b.graphs, SuffixStore))  # earlier replies: one shared store


def _recycle(b: DrafterParts, spec: str, target: Stack | None) -> Drafter:
    from edgespec.runtime.drafters.recycling import RecycleTable, RecyclingDrafter
    from edgespec.runtime.drafters.tree_draft import shared

    return RecyclingDrafter(shared(b.graphs, RecycleTable))  # the target's top-k: one table


# the one table of drafters: help text, building, errors and capabilities come from here
DRAFTER_NAMES: dict[str, DrafterName] = {
    "none": DrafterName("none", "nothing: plain decoding", _none),
    "draft": DrafterName("draft", "the bundle's draft model", _draft, trees=True),
    "exit": DrafterName("exit:K", "the target's early exit at layer K", _exit, trees=True),
    "eagle": DrafterName("eagle", "the feature head (edgespec distill)", _eagle),
    "lookup": DrafterName("lookup", "prompt lookup", _lookup, model_free=True, trees=True),
    "suffix": DrafterName("suffix", "SuffixDecoding", _suffix, model_free=True, trees=True),
    "recycle": DrafterName("recycle", "Token Recycling", _recycle, model_free=True, trees=True),
}
DRAFTERS = ", ".join(d.spelling for d in DRAFTER_NAMES.values())
TREE_DRAFTERS = ", ".join(d.spelling for d in DRAFTER_NAMES.values() if d.trees)
TREE_MODES = ("auto", "on", "off")  # `trees=`: where the measured costs say | always | never
# trees a server verifies come from the model-free ones (a model drafter's verify locally)
SPLIT_TREE_DRAFTERS = ", ".join(
    d.spelling for d in DRAFTER_NAMES.values() if d.trees and d.model_free
)


def _row(spec: str) -> DrafterName | None:
    """The row one drafter's name spells ("exit:2" is "exit"'s; a chain has none)."""
    row = DRAFTER_NAMES.get(spec.partition(":")[0])
    if row is None or "+" in spec or (":" in spec) != (":" in row.spelling):
        return None
    return row


def drafter_name(spec: str) -> DrafterName:
    """The row of one drafter's name; an InputError names the others."""
    row = _row(spec)
    if row is None:
        raise InputError(
            f"drafter {spec!r} is not one of: {DRAFTERS} (or a chain such as lookup+draft)"
        )
    return row


def is_model_free(spec: str) -> bool:
    """Whether `spec` names one model-free drafter (a chain is not one)."""
    row = _row(spec)
    return row is not None and row.model_free


def proposes_trees(spec: str) -> bool:
    """Whether `spec` names one drafter that proposes token trees (a chain does not)."""
    row = _row(spec)
    return row is not None and row.trees


def exit_layer(spec: str, exits: list[int], what: str, check: bool = True) -> int:
    """K of "exit:K"; `check`: refuse a K the bundle has no exit at (else opening its graph
    says how to re-export)."""
    k = spec.partition(":")[2]
    if not k.isdigit():
        raise InputError(f"{what} {spec!r}: exit:K needs a layer number K (as in exit:2)")
    if check and int(k) not in exits:
        raise InputError(f"{what} {spec!r}: this bundle's exit layers are {exits}")
    return int(k)


# -- draft-length policies ------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyContext:
    """What a policy may need beyond its own argument."""

    exits: list[int]
    energy_budget: float | None = None
    device_profile: Mapping[str, object] | None = None
    priors: Priors = PRIORS


@dataclass(frozen=True)
class PolicyName:
    """One policy name: its spelling with the argument (help text and errors) and how an
    argument ("" when none was given) becomes the policy; a ValueError refuses it."""

    spelling: str
    build: Callable[[str, PolicyContext], DraftLengthPolicy]
    split_only: bool = False  # it prices a server's link: split mode only
    own_errors: bool = False  # its messages say more than the table's list


def _in_range(value: float, low: float, high: float) -> float:
    if not low <= value <= high:
        raise ValueError(f"{value} is outside {low:g}..{high:g}")
    return value


def _bare(name: str, arg: str) -> None:
    if arg:
        raise ValueError(f"{name} takes no argument")


def _fixed(arg: str, c: PolicyContext) -> DraftLengthPolicy:
    from edgespec.runtime.policies.draft_length import FixedLength

    return FixedLength(int(_in_range(int(arg or 4), 0, 64)))


def _confidence(arg: str, c: PolicyContext) -> DraftLengthPolicy:
    from edgespec.runtime.policies.draft_length import Confidence

    return Confidence(_in_range(float(arg or 0.4), 0, 1))


def _acceptance(arg: str, c: PolicyContext) -> DraftLengthPolicy:
    from edgespec.runtime.policies.draft_length import Acceptance
    from edgespec.runtime.policies.estimates import CostModel

    _bare("acceptance", arg)
    return Acceptance(cost=CostModel(priors=c.priors))


def _auto(arg: str, c: PolicyContext) -> DraftLengthPolicy:
    from edgespec.runtime.policies.draft_length import Auto
    from edgespec.runtime.policies.estimates import CostModel

    _bare("auto", arg)
    return Auto(cost=CostModel(priors=c.priors))


def _dynamic_exit(arg: str, c: PolicyContext) -> DraftLengthPolicy:
    from edgespec.runtime.policies.draft_length import DynamicExit

    _bare("dynamic-exit", arg)
    return DynamicExit(sorted(c.exits), priors=c.priors)


def _channel_aware(arg: str, c: PolicyContext) -> DraftLengthPolicy:
    from edgespec.runtime.policies.channel import parse_channel_aware

    return parse_channel_aware(arg, c.energy_budget, c.device_profile, c.priors)


def _placement(arg: str, c: PolicyContext) -> DraftLengthPolicy:
    from edgespec.runtime.policies.channel import parse_channel_aware
    from edgespec.runtime.policies.draft_length import Auto
    from edgespec.runtime.policies.estimates import CostModel
    from edgespec.runtime.policies.placement import Placement

    split = parse_channel_aware(arg, c.energy_budget, c.device_profile, c.priors)
    local = Auto(cost=CostModel(priors=c.priors))
    return Placement(split, local, split.energy_budget, c.priors)


# the one table of draft-length policies: help text, parsing and errors come from here
POLICY_NAMES: dict[str, PolicyName] = {
    "fixed": PolicyName("fixed:N (0..64)", _fixed),
    "confidence": PolicyName("confidence:T (0..1)", _confidence),
    "acceptance": PolicyName("acceptance", _acceptance),
    "auto": PolicyName("auto", _auto),
    "dynamic-exit": PolicyName("dynamic-exit", _dynamic_exit, own_errors=True),
    "channel-aware": PolicyName(
        "channel-aware[:J per token > 0]", _channel_aware, split_only=True, own_errors=True
    ),
    "placement": PolicyName(
        "placement[:J per token > 0]", _placement, split_only=True, own_errors=True
    ),
}
POLICIES = ", ".join(p.spelling for p in POLICY_NAMES.values())
SPLIT_ONLY = tuple(name for name, p in POLICY_NAMES.items() if p.split_only)
