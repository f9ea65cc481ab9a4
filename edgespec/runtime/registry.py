"""Resolves a `LoadConfig` against a bundle: the user-facing names (`modes.MODES`, and the
drafter and policy tables of `names`), spelled the same in the Python API, the CLI and split
mode, become what implements them; conflicting choices are refused here, once.

  modes      ar | spec | self-spec | eagle | lookup | suffix | recycle | split (`modes.MODES`)
  drafters   `names.DRAFTER_NAMES` ("exit": exit:K at the default exit), and chains joined
             by "+" (`lookup+draft`: prompt lookup first, the draft model where it finds
             nothing), in every mode
  verifiers  full | exit:K (head@K then tail@K) on the device; split mode verifies on the
             server (`remote`), falling back to `full` when the link fails
  policies   `names.POLICY_NAMES`, parsed by `make_policy`
  trees      auto | on | off: `with_trees` makes a drafter and its policy propose token trees
             (priced by `policies.trees.TreePolicy`); `tree_reasons` says why a bundle or
             configuration cannot

`build(graphs, config)` turns a `LoadConfig` into a `Decoder`: the (verifier, drafter, policy)
of one generation loop, naming the local target and split link it holds. Each build has its
own caches, estimates and server connection over the sessions `graphs` opened once: a
conversation is a second build (`runtime.chat.session`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from edgespec.backbone import hello
from edgespec.runtime.config import LoadConfig
from edgespec.runtime.drafters.base import Chain, EarlyExitDrafter, ModelDrafter
from edgespec.runtime.drafters.model_tree import ModelTrees
from edgespec.runtime.drafters.tree_draft import AsTree, TreeDrafter
from edgespec.runtime.errors import InputError, SplitError
from edgespec.runtime.graphs.opener import BundleGraphs
from edgespec.runtime.graphs.protocol import Graph
from edgespec.runtime.graphs.stack import Stack, settle_step_width
from edgespec.runtime.modes import DEFAULT_SPEC_DRAFTER, MODES
from edgespec.runtime.names import (
    POLICIES,
    POLICY_NAMES,
    SPLIT_ONLY,
    SPLIT_TREE_DRAFTERS,
    TREE_DRAFTERS,
    TREE_MODES,
    PolicyContext,
    drafter_name,
    exit_layer,
    is_model_free,
    proposes_trees,
)
from edgespec.runtime.policies.costs import best_local, calibration_entry, seed_from_calibration
from edgespec.runtime.policies.draft_length import Acceptance, Auto, DynamicExit, PerSource
from edgespec.runtime.policies.estimates import PRIORS, AcceptanceModel, CostModel, Priors
from edgespec.runtime.policies.split_trees import SplitTrees
from edgespec.runtime.policies.trees import MAX_DEPTH, TreePolicy
from edgespec.runtime.round import Drafter, DraftLengthPolicy, Verifier
from edgespec.runtime.split.fallback import FallbackVerifier, RemoteVerifier
from edgespec.runtime.split.session import Remote
from edgespec.runtime.verify.local import LocalVerifier


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
        return self.split.session if self.split is not None else None


def make_policy(
    spec: str,
    exits: list[int] | None = None,
    energy_budget: float | None = None,
    device_profile: Mapping[str, object] | None = None,
    priors: Priors = PRIORS,
) -> DraftLengthPolicy:
    """Parse "fixed:4", "confidence:0.4", "acceptance", "auto", "dynamic-exit" or
    "channel-aware[:J]" (split decoding; J: energy budget per token, also `energy_budget`;
    `device_profile` may carry its energy model, see `policies.channel.EnergyModel`);
    `priors`: the cost model's constants (benchmarks pass variants)."""
    name, _, arg = spec.partition(":")
    entry = POLICY_NAMES.get(name)
    if energy_budget is not None and (entry is None or not entry.split_only):
        raise ValueError(
            f"an energy budget needs the channel-aware policy (or placement), not {spec!r}"
        )
    if entry is None:
        raise ValueError(f"draft policy {spec!r} is not one of: {POLICIES}")
    try:
        return entry.build(arg, PolicyContext(exits or [], energy_budget, device_profile, priors))
    except ValueError:
        if entry.own_errors and not (entry.split_only and arg):
            raise
        raise ValueError(f"draft policy {spec!r} is not one of: {POLICIES}") from None


class _Builder:
    """Resolves a LoadConfig against one bundle (see `build`)."""

    def __init__(self, graphs: BundleGraphs, config: LoadConfig) -> None:
        self.graphs, self.config = graphs, config
        self.manifest = graphs.manifest
        self.exits = self.manifest.exit_layers

    def open(self, role: str) -> Graph:
        return self.graphs.open(role)  # one session per role (`BundleGraphs.open`)

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
        return drafter_name(spec).build(self, spec, target)

    def target(self, spec: str) -> Stack:
        if spec == "full":
            roles = ["full"]
        elif spec.startswith("exit:"):
            k = exit_layer(spec, self.exits, "verifier", check=False)
            roles = [f"head@{k}", f"tail@{k}"]
        else:
            raise InputError(f"verifier {spec!r} is not one of: full, exit:K")
        # token trees: the roles' tree-verification twins, opened (or refused) on first use
        trees = lambda: [self.graphs.open_tree(r) for r in roles]  # noqa: E731
        width = self.config.step_width or self.graphs.manifest.step_width
        stack = Stack([self.open(r) for r in roles], tree_stages=trees, step_width=width)
        if self.config.step_width is None:  # asked for: as asked
            settle_step_width(stack)
        return stack


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
            policy = SplitTrees(policy, lambda: fallback.server.session.tree_nodes)
        local = fallback.local.target if fallback.local is not None else None
        return Decoder(fallback, drafter, per_source(policy, drafter), local, fallback.server)
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
    q_ids = None if is_model_free(drafter) else b.config.draft_support.max_ids(m.target.vocab_size)
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


def with_trees(
    trees: str, reasons: list[str], drafter: Drafter, policy: Any
) -> tuple[Drafter, Any]:
    """`drafter` and `policy` as `trees` (auto | on | off) makes them: the drafter's trees
    (a model drafter's dynamic trees, `ModelTrees`) through `AsTree` and a `TreePolicy`
    (`on`: forced every drafting round), unless one of `reasons` (why this bundle or
    configuration cannot use trees) holds: then `auto` keeps the chain and `on` refuses."""
    if trees not in TREE_MODES:
        raise InputError(f"trees={trees!r} is not one of: {', '.join(TREE_MODES)}")
    if trees == "off":
        return drafter, policy
    per_depth = isinstance(drafter, ModelDrafter | EarlyExitDrafter)
    if per_depth and not reasons:
        drafter = ModelTrees(drafter)  # type: ignore[arg-type]
    if not isinstance(drafter, TreeDrafter):
        reasons = [*reasons, f"drafter {drafter.name!r} proposes no trees ({TREE_DRAFTERS} do)"]
    if reasons:
        if trees == "on":
            raise InputError(f"trees='on' cannot be used here: {reasons[0]}")
        return drafter, policy
    priors = policy.cost.priors if hasattr(policy, "cost") else PRIORS
    tree_policy = TreePolicy(cost=CostModel(priors=priors), chain=policy, per_depth=per_depth)
    if per_depth:  # no shadow trees (they would cost draft steps): probe trees measure
        tree_policy.probe_every, tree_policy.shadow_every = 16, 0
    tree_policy.force = trees == "on"
    tree_policy.acceptance.priors = priors
    return AsTree(drafter, max_depth=MAX_DEPTH), tree_policy


def tree_reasons(config: LoadConfig, graphs: BundleGraphs, spec: str) -> list[str]:
    """Why this configuration cannot verify token trees (empty: it can)."""
    out = []
    split = config.mode == "split"  # the server's graphs verify: its offer decides, per link
    if not graphs.manifest.tree_graphs and not split:
        out.append(
            f"bundle {graphs.folder} has no tree-verification graphs; re-export it with "
            "`edgespec export MODEL --out FOLDER --tree-verify`"
        )
    if config.coreml and not split:
        out.append("Core ML packages cannot verify token trees; run the ONNX graphs")
    planners = ("placement", "channel-aware") if split else ("auto", "acceptance")
    if config.draft_policy not in (None, *planners):
        out.append(
            f"draft policy {config.draft_policy!r} plans chains; drop --draft-policy so the "
            "tree policy sizes each round"
        )
    if not proposes_trees(spec):
        out.append(f"drafter {spec!r} proposes no trees; use one of {TREE_DRAFTERS}")
    elif split and not is_model_free(spec):
        out.append(
            f"in split mode trees come from {SPLIT_TREE_DRAFTERS}, not drafter {spec!r} "
            "(a model drafter's dynamic trees verify locally)"
        )
    return out
