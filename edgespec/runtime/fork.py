"""Copies of a model's decoder with state of their own, for conversations (`runtime.chat`).

`fork_decoder` gives the target and the drafter caches of their own over the same graph
sessions (allocated on first use) and the policy its own estimates. `fork_split` gives a
split verifier its own server connection — its own server session, kept between the turns
of one conversation (`hold`) — and its local fallback graphs a cache of their own;
`hang_up` ENDs that session and closes the connection. Several conversations, and plain
`Model.generate`, therefore never share or clobber each other's state, here or on a server.
"""

from __future__ import annotations

import copy

from edgespec.runtime.drafters import (
    Chain,
    EarlyExitDrafter,
    LookupDrafter,
    ModelDrafter,
    NoDrafter,
)
from edgespec.runtime.link import Remote
from edgespec.runtime.local import LocalVerifier
from edgespec.runtime.policies import DraftLengthPolicy
from edgespec.runtime.remote import FallbackVerifier, RemoteVerifier
from edgespec.runtime.round import Drafter, Verifier
from edgespec.runtime.stack import Stack


def fork_decoder(
    target: Stack | None, drafter: Drafter, policy: DraftLengthPolicy
) -> tuple[Stack | None, Drafter, DraftLengthPolicy]:
    """The same graph sessions with caches of their own (None: no local target, split)."""
    fresh = Stack(target.stages, target.logits) if target is not None else None

    def fork(d: Drafter) -> Drafter:
        if isinstance(d, NoDrafter):
            return NoDrafter()
        if isinstance(d, ModelDrafter):
            return ModelDrafter(Stack(d.model.stages, d.model.logits), d.support)
        if isinstance(d, EarlyExitDrafter) and fresh is not None:  # drafts into the target
            return EarlyExitDrafter(fresh, d.heads, d.tails, d.exit_layer, d.support)
        if isinstance(d, LookupDrafter):
            return LookupDrafter(d.max_ngram, d.min_ngram)
        if isinstance(d, Chain):
            return Chain([fork(member) for member in d.drafters])
        raise TypeError(f"cannot give a {type(d).__name__} a cache of its own")

    return fresh, fork(drafter), copy.deepcopy(policy)


def fork_split(verifier: Verifier) -> tuple[Verifier, Remote]:
    """A split verifier (remote, or remote with a local fallback) on a connection of its
    own that keeps its server session between generations; also that connection."""
    if isinstance(verifier, FallbackVerifier):
        remote, link = fork_split(verifier.remote)
        local = verifier.local
        if local is not None:
            local = LocalVerifier(Stack(local.target.stages, local.target.logits))
        fallback = FallbackVerifier(
            remote,  # type: ignore[arg-type]
            local,
            verifier.first_retry,
            verifier.max_retry_after,
        )
        return fallback, link
    if isinstance(verifier, RemoteVerifier):
        fresh = RemoteVerifier(verifier.remote.fork(), verifier.max_positions, verifier.q_ids)
        fresh.hold = True
        return fresh, fresh.remote
    raise TypeError(f"not a split verifier: {type(verifier).__name__}")


def hang_up(remote: Remote) -> None:
    """END the server's session (its cache is freed) and close the connection."""
    remote.end()
    remote.drop()
