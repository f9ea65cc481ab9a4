"""The one name table: every user-facing choice, spelled the same in the Python API, the CLI
and split mode, mapped to what implements it; conflicting choices are refused here, once.

  modes      ar | spec | self-spec | lookup | suffix | recycle | split: defaults below
  drafters   none | draft | exit:K ("exit": the default exit) | eagle | lookup | suffix | recycle,
             and chains joined by "+" (`lookup+draft`: prompt lookup first, the draft
             model where it finds nothing), in every mode
  verifiers  full | exit:K (head@K then tail@K) on the device; split mode verifies on the
             server (`remote`), falling back to `full` when the link fails
  policies   fixed:N | confidence:T | acceptance | auto | dynamic-exit | channel-aware[:J]

`build(graphs, config)` turns a `LoadConfig` into a `Decoder`: the (verifier, drafter, policy)
of one generation loop, naming the local target and split link it holds. Each build has its
own caches, estimates and server connection over the sessions `graphs` opened once: a
conversation is a second build (`runtime.chat`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from edgespec.backbone import hello
from edgespec.runtime.channel_policy import parse_channel_aware
from edgespec.runtime.config import LoadConfig
from edgespec.runtime.costs import best_local, calibration_entry, seed_from_calibration
from edgespec.runtime.drafters import Chain, EarlyExitDrafter, ModelDrafter, NoDrafter
from edgespec.runtime.eagle import EagleDrafter
from edgespec.runtime.errors import InputError, SplitError
from edgespec.runtime.estimates import PRIORS, AcceptanceModel, CostModel, Priors
from edgespec.runtime.graph_protocol import Graph
from edgespec.runtime.link import Remote
from edgespec.runtime.local import LocalVerifier
from edgespec.runtime.lookup import LookupDrafter
from edgespec.runtime.modes import DEFAULT_SPEC_DRAFTER, MODES
from edgespec.runtime.opener import BundleGraphs
from edgespec.runtime.placement import Placement
from edgespec.runtime.policies import (
    Acceptance,
    Auto,
    Confidence,
    DraftLengthPolicy,
    DynamicExit,
    FixedLength,
    PerSource,
)
from edgespec.runtime.recycling import RecycleTable, RecyclingDrafter
from edgespec.runtime.remote import FallbackVerifier, RemoteVerifier
from edgespec.runtime.round import Drafter, Verifier
from edgespec.runtime.split_trees import SplitTrees
from edgespec.runtime.stack import Stack
from edgespec.runtime.suffix import SuffixDrafter, SuffixStore
from edgespec.runtime.tree_draft import AsTree, shared
from edgespec.runtime.tree_policy import tree_reasons, with_trees


@dataclass
class Decoder:
    """The parts of one generation loop, and what an app may tune or inspect in them."""

    verifier: Verifier
    drafter: Drafter
    policy: DraftLengthPolicy
    target: Stack | None  # the local target graphs (split: the fallback's; None: none)
    split: RemoteVerifier | None = None  # split mode: the server side of `verifier`

    @property
    def remote(self) -> Remote | None:
        """Split mode: the server session (its timeouts and retries may be tuned)."""
        return self.split.remote if self.split is not None else None


MODEL_FREE = ("lookup", "suffix", "recycle")  # deterministic drafts: q is a point mass
DRAFTERS = ("none", "draft", "exit:K", "eagle", "lookup", "suffix", "recycle")


@dataclass(frozen=True)
class PolicyName:
    """One policy name: its spelling with the argument (help text and errors) and how an
    argument ("" when none was given) becomes the policy; a ValueError refuses it."""

    spelling: str
    build: Callable[[str, PolicyContext], DraftLengthPolicy]


@dataclass(frozen=True)
class PolicyContext:
    """What a policy may need beyond its own argument."""

    exits: list[int]
    energy_budget: float | None = None
    device_profile: Mapping[str, object] | None = None
    priors: Priors = PRIORS


def _in_range(value: float, low: float, high: float) -> float:
    if not low <= value <= high:
        raise ValueError(f"{value} is outside {low:g}..{high:g}")
    return value


def _bare(name: str, arg: str) -> None:
    if arg:
        raise ValueError(f"{name} takes no argument")


def _auto(arg: str, c: PolicyContext) -> DraftLengthPolicy:
    _bare("auto", arg)
    return Auto(cost=CostModel(priors=c.priors))


def _acceptance(arg: str, c: PolicyContext) -> DraftLengthPolicy:
    _bare("acceptance", arg)
    return Acceptance(cost=CostModel(priors=c.priors))


def _dynamic_exit(arg: str, c: PolicyContext) -> DraftLengthPolicy:
    _bare("dynamic-exit", arg)
    policy = DynamicExit(sorted(c.exits))
    policy.costs = {k: CostModel(priors=c.priors) for k in policy.exits}
    return policy


def _placement(arg: str, c: PolicyContext) -> DraftLengthPolicy:
    split = parse_channel_aware(arg, c.energy_budget, c.device_profile, c.priors)
    local = Auto(cost=CostModel(priors=c.priors))
    return Placement(split, local, split.energy_budget, c.priors)


# the one table of draft-length policies: help text, parsing and errors come from here
POLICY_NAMES: dict[str, PolicyName] = {
    "fixed": PolicyName(
        "fixed:N (0..64)", lambda a, c: FixedLength(int(_in_range(int(a or 4), 0, 64)))
    ),
    "confidence": PolicyName(
        "confidence:T (0..1)", lambda a, c: Confidence(_in_range(float(a or 0.4), 0, 1))
    ),
    "acceptance": PolicyName("acceptance", _acceptance),
    "auto": PolicyName("auto", _auto),
    "dynamic-exit": PolicyName("dynamic-exit", _dynamic_exit),
    "channel-aware": PolicyName(
        "channel-aware[:J per token > 0]",
        lambda a, c: parse_channel_aware(a, c.energy_budget, c.device_profile, c.priors),
    ),
    "placement": PolicyName("placement[:J per token > 0]", _placement),
}
POLICIES = ", ".join(p.spelling for p in POLICY_NAMES.values())
# policies whose own messages say more than the table's list (no exit layers; a bad budget)
_OWN_ERRORS = ("dynamic-exit", "channel-aware", "placement")
SPLIT_ONLY = ("channel-aware", "placement")  # they price a server's link


def make_policy(
    spec: str,
    exits: list[int] | None = None,
    energy_budget: float | None = None,
    device_profile: Mapping[str, object] | None = None,
    priors: Priors = PRIORS,
) -> DraftLengthPolicy:
    """Parse "fixed:4", "confidence:0.4", "acceptance", "auto", "dynamic-exit" or
    "channel-aware[:J]" (split decoding; J: energy budget per token, also `energy_budget`;
    `device_profile` may carry its energy model, see `channel_policy.EnergyModel`);
    `priors`: the cost model's constants (benchmarks pass variants)."""
    name, _, arg = spec.partition(":")
    if energy_budget is not None and name not in SPLIT_ONLY:
        raise ValueError(
            f"an energy budget needs the channel-aware policy (or placement), not {spec!r}"
        )
    entry = POLICY_NAMES.get(name)
    if entry is None:
        raise ValueError(f"draft policy {spec!r} is not one of: {POLICIES}")
    try:
        return entry.build(arg, PolicyContext(exits or [], energy_budget, device_profile, priors))
    except ValueError:
        if name in _OWN_ERRORS and not (name in SPLIT_ONLY and arg):
            raise
        raise ValueError(f"draft policy {spec!r} is not one of: {POLICIES}") from None


def _exit(spec: str, exits: list[int], what: str, check: bool = True) -> int:
    """K of "exit:K"; `check`: refuse a K the bundle has no exit at (else opening its graph
    says how to re-export)."""
    k = spec.partition(":")[2]
    if not k.isdigit():
        raise InputError(f"{what} {spec!r}: exit:K needs a layer number K (as in exit:2)")
    if check and int(k) not in exits:
        raise InputError(f"{what} {spec!r}: this bundle's exit layers are {exits}")
    return int(k)


class _Builder:
    """Resolves a LoadConfig against one bundle (see `build`)."""

    def __init__(self, graphs: BundleGraphs, config: LoadConfig) -> None:
        self.graphs, self.config = graphs, config
        self.manifest = graphs.manifest
        self.exits = self.manifest.exit_layers
        self.opened: dict[str, Graph] = {}

    def open(self, role: str) -> Graph:
        if role not in self.opened:
            self.opened[role] = self.graphs.open(role)
        return self.opened[role]

    def drafter_spec(self) -> str:
        """The drafter's name with every bare "exit" made exit:K at the default exit."""
        c, exits = self.config, self.exits
        if c.mode == "split" and c.drafter is None:  # the best drafter the bundle has
            calibration = calibration_entry(self.graphs.folder, c.device, c.threads)
            mode, k = best_local(self.manifest, calibration)
            best = DEFAULT_SPEC_DRAFTER if mode == "spec" else MODES[mode].drafter
            return f"exit:{k if k is not None else exits[-1]}" if best == "exit" else best
        parts = (c.drafter or MODES[c.mode].drafter).split("+")
        return "+".join(self._default_exit() if p == "exit" else p for p in parts)

    def _default_exit(self) -> str:
        c, exits = self.config, self.exits
        if not exits:
            raise InputError("self-spec needs early-exit graphs: re-export with `--exit-layers K`")
        k = c.exit_layer if c.exit_layer is not None else exits[-1]
        if k not in exits:
            raise InputError(f"exit layer {k} is not in this bundle (it has {exits})")
        return f"exit:{k}"

    def drafter(self, spec: str, target: Stack | None) -> Drafter:
        parts = spec.split("+")
        if len(parts) > 1:
            if "none" in parts:
                raise InputError(f"drafter {spec!r}: 'none' cannot be chained")
            return Chain([self.drafter(p, target) for p in parts])
        if spec == "none":
            return NoDrafter()
        if spec == "lookup":
            return LookupDrafter()
        if spec == "suffix":  # earlier replies on this bundle: one shared, bounded store
            return SuffixDrafter(shared(self.graphs, SuffixStore))
        if spec == "recycle":  # the target's earlier top-k: one shared table
            return RecyclingDrafter(shared(self.graphs, RecycleTable))
        if spec == "draft":
            return ModelDrafter(Stack([self.open("draft")]), self.config.draft_support)
        if spec == "eagle":  # the feature head (runtime/eagle.py) reads the local target's
            return EagleDrafter.of(target, self.manifest, self.open, self.config.draft_support)
        if spec.startswith("exit:"):
            k = _exit(spec, self.exits, "drafter")
            if target is not None and self.config.mode == "self-spec":
                # the head drafts into the target's own cache; the tail verifies its states
                heads = {e: self.open(f"head@{e}") for e in self.exits}
                tails = {e: self.open(f"tail@{e}") for e in self.exits}
                support = self.config.draft_support
                return EarlyExitDrafter(target, heads, tails, k, support)
            head = Stack([self.open(f"head@{k}")], logits="exit_logits")
            return ModelDrafter(head, self.config.draft_support)
        raise InputError(
            f"drafter {spec!r} is not one of: {', '.join(DRAFTERS)} (or a chain such as "
            "lookup+draft)"
        )

    def target(self, spec: str) -> Stack:
        if spec == "full":
            roles = ["full"]
        elif spec.startswith("exit:"):
            k = _exit(spec, self.exits, "verifier", check=False)
            roles = [f"head@{k}", f"tail@{k}"]
        else:
            raise InputError(f"verifier {spec!r} is not one of: full, exit:K")
        # token trees: the roles' tree-verification twins, opened (or refused) on first use
        trees = lambda: [self.graphs.open_tree(r) for r in roles]  # noqa: E731
        width = self.config.step_width or self.graphs.manifest.step_width
        return Stack([self.open(r) for r in roles], tree_stages=trees, step_width=width)


def build(graphs: BundleGraphs, config: LoadConfig) -> Decoder:
    """The decoder `config` asks for on this bundle, its adaptive policy started from this
    device's calibration (when measured); conflicts are InputErrors."""
    decoder = _build(graphs, config)
    # self-spec's exit (chained or not) names its calibration entry
    drafter = decoder.drafter
    members = drafter.drafters if isinstance(drafter, Chain) else [drafter]
    exits = [d.exit_layer for d in members if isinstance(d, EarlyExitDrafter)]
    c = config
    exit_layer = exits[0] if exits else 0
    seed_from_calibration(decoder.policy, graphs.folder, c.device, c.threads, c.mode, exit_layer)
    return decoder


def _build(graphs: BundleGraphs, config: LoadConfig) -> Decoder:
    c, m = config, graphs.manifest
    if c.mode not in MODES:
        raise InputError(f"mode {c.mode!r} is not one of: {', '.join(MODES)}")
    if m.variant == "shared-backbone" and c.mode != "split":
        raise InputError(
            f"{graphs.folder} is a shared-backbone edge bundle: it holds a frozen draft "
            f"(head@{m.backbone_layers}) and no verifier, so it decodes only with "
            "mode='split' and a server running the target (--mode split --server URL)"
        )
    split = c.split
    if c.mode != "split" and (split.server or split.token or split.energy_budget is not None):
        raise InputError(
            "server=/token=/energy_budget= are options of split mode (mode='split', --mode split)"
        )
    if c.mode == "ar" and (c.drafter not in (None, "none") or c.draft_policy):
        raise InputError("mode 'ar' drafts nothing: drop --drafter/--draft-policy")
    if c.exit_layer is not None and c.mode != "self-spec":
        raise InputError("exit_layer= chooses self-spec's exit: use drafter='exit:K' otherwise")
    b = _Builder(graphs, c)
    spec = b.drafter_spec()
    policy = _policy(c, b.exits, graphs.profile.policy_profile())
    if isinstance(policy, DynamicExit) and not any(p.startswith("exit:") for p in spec.split("+")):
        raise InputError("the dynamic-exit policy chooses exit layers: use it with self-spec")
    if isinstance(policy, DynamicExit) and c.coreml:
        raise InputError(
            "dynamic-exit cannot run on Core ML packages: each head holds its layers' KV "
            "in its own state, so switching exits would read stale caches; use a fixed "
            "--exit-layer"
        )
    if c.mode == "split":
        if c.verifier is not None:
            raise InputError("split mode verifies on the server: drop verifier=")
        drafter = with_trees(c.trees, tree_reasons(c, graphs, spec), b.drafter(spec, None), 0)[0]
        fallback = _split_verifier(b, spec)
        if isinstance(drafter, AsTree):  # trees where the server offers them
            policy = SplitTrees(policy, lambda: fallback.remote.remote.tree_nodes)
        local = fallback.local.target if fallback.local is not None else None
        return Decoder(fallback, drafter, per_source(policy, drafter), local, fallback.remote)
    if c.mode == "self-spec":
        exit_drafter = next((p for p in spec.split("+") if p.startswith("exit:")), None)
        if exit_drafter is None:
            raise InputError(f"self-spec drafts from an exit: drafter {spec!r} has none")
        if c.verifier not in (None, exit_drafter):
            raise InputError(f"self-spec verifies with {exit_drafter}'s tail: drop verifier=")
        target = b.target(exit_drafter)
    else:
        target = b.target(c.verifier or "full")
    reasons = tree_reasons(c, graphs, spec)  # trees=auto|on|off: a tree drafter and policy
    drafter, policy = with_trees(c.trees, reasons, b.drafter(spec, target), policy)
    return Decoder(LocalVerifier(target), drafter, per_source(policy, drafter), target)


def per_source(policy: DraftLengthPolicy, drafter: Drafter) -> DraftLengthPolicy:
    """An adaptive policy over a chain prices each member apart (see `PerSource`): the
    members before the last, which propose only sometimes (prompt lookup), get their own."""
    if not isinstance(drafter, Chain) or not isinstance(policy, Auto | Acceptance | DynamicExit):
        return policy
    kind = Acceptance if isinstance(policy, Acceptance) else Auto

    def copying() -> DraftLengthPolicy:  # prompt lookup: drafts pass whole or not at all
        base = policy.cost.priors if isinstance(policy, Auto | Acceptance) else PRIORS
        priors = base.copying()
        return kind(cost=CostModel(AcceptanceModel(priors), priors=priors))

    return PerSource(policy, {d.name: copying() for d in drafter.drafters[:-1]})


def _policy(c: LoadConfig, exits: list[int], device_profile: dict | None) -> DraftLengthPolicy:
    spec = c.draft_policy or MODES[c.mode].policy
    budget = c.split.energy_budget
    try:
        if c.mode == "split":
            split_only = spec.partition(":")[0] in SPLIT_ONLY
            extra = {"device_profile": device_profile} if split_only else {}
            return make_policy(spec, exits, budget, **extra)
        if spec.partition(":")[0] == "placement":
            raise ValueError("the placement policy chooses where split mode decodes: --mode split")
        return make_policy(spec, exits)
    except ValueError as e:
        raise InputError(str(e)) from None


def _split_verifier(b: _Builder, drafter: str) -> FallbackVerifier:
    c, m = b.config.split, b.manifest
    if not c.server:
        raise SplitError("split mode needs a server: server='ws://HOST:PORT' (--server)")
    url = urlsplit(c.server)
    if url.scheme not in ("ws", "wss") or not url.netloc:
        raise SplitError(f"server {c.server!r} is not a ws://HOST:PORT or wss://HOST:PORT address")
    server = c.server.rstrip("/") + "/v1/session" if url.path in ("", "/") else c.server
    fingerprint = m.backbone_fingerprint
    if m.variant == "shared-backbone":
        fingerprint = hello(m)  # the server checks its target's lower layers against it
    # sampled drafts carry their q (at most this many ids each), except prompt lookup's
    q_ids = None if drafter in MODEL_FREE else b.config.draft_support.max_ids(m.target.vocab_size)
    late = {}
    if c.late_after is not None:  # a fixed deadline instead of the adaptive one
        x = c.late_after
        if isinstance(x, bool) or not (isinstance(x, int | float) and math.isfinite(x) and x > 0):
            raise InputError(
                f"late_after={c.late_after!r}: give seconds (more than 0), or None for the "
                "adaptive deadline"
            )
        late = {"late_floor": float(c.late_after), "late_factor": 0.0}
    link = Remote(server, c.token, fingerprint, timeout=c.timeout, **late)
    remote = RemoteVerifier(link, m.target.max_position_embeddings, q_ids)
    local = None
    if c.local_fallback and "full" in m.roles:  # trees to the server: here where it can
        local = LocalVerifier(b.target("full"), trees=bool(m.tree_graphs))
    return FallbackVerifier(remote, local)
