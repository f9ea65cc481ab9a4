"""The server as a verifier: one split-decoding session per generation (`RemoteVerifier`).

Each round goes to the server as a VERIFY with the drafts (and, when sampling, the sparse
distributions they were drawn from; a token tree whole, with its parents, to a server that
offered trees: it answers with the root path it kept); `submit` answers with an `InFlight`
the decode loop polls while it drafts ahead, checked against the round when its answer
comes (a tree's path against the tree). The server
applies the acceptance rule and keeps its own cache in step, so `truncate` has nothing to do.
A START (re)builds the server's session from the committed tokens; with `hold` (a
conversation) a generation ends with PAUSE and the next prefill resumes the session. The
fallback to local graphs around it is `runtime.split.fallback.FallbackVerifier`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from time import perf_counter

import numpy as np

from edgespec import protocol as P
from edgespec.runtime.errors import LinkError
from edgespec.runtime.round import Proposal, Start, Verdict
from edgespec.runtime.sampling import SamplingParams
from edgespec.runtime.split.session import Exchange, Remote
from edgespec.runtime.stats import ChannelStats, RoundStats
from edgespec.runtime.tree import TokenTree


def _channel(x: Exchange) -> ChannelStats:
    c = ChannelStats(x.network_seconds, x.result.server_seconds, x.bytes_up, x.bytes_down)
    limits = x.result.limits
    if limits is None:
        return c
    # a START's answer: how the server would stream now
    return replace(c, server_busy=limits.stream_room == 0, stream_rate=limits.stream_rate)


def _verdict(x: Exchange, resync: bool = False, drafts: list[int] | None = None) -> Verdict:
    """The server's answer as a verdict; `drafts`: those it accepted (a START's: none)."""
    r = x.result
    tokens = [*(drafts or []), r.token]
    return Verdict(r.accepted, tokens, r.server_seconds, "remote", resync, _channel(x))


@dataclass
class InFlight:
    """A VERIFY sent to the server; its answer is checked against the round."""

    session: Remote
    base: int
    proposal: Proposal  # the drafts sent: the caller's, or the prefix that fit the server
    tree: TokenTree | None = None  # the token tree sent (its nodes), if one was

    @property
    def sent(self) -> int:
        return len(self.proposal.tokens)

    def done(self) -> bool:
        return self.session.answered()

    def result(self, late: float | None = None) -> Verdict:
        """The verdict; RoundLate after `late` seconds (the round stays in flight)."""
        x = self.session.receive(late=late)
        r, tree = x.result, self.tree
        kept = _root_path(tree, r.path) if tree is not None and r.path is not None else None
        if tree is None:
            fits = r.path is None and r.accepted <= self.sent
        else:
            fits = kept is not None and len(kept) == r.accepted
        if not fits or r.length != self.base + r.accepted + 1:
            self.session.drop()
            raise LinkError(f"the server's answer does not fit the round: {x.result}")
        drafts = kept if kept is not None else self.proposal.tokens[: r.accepted]
        verdict = _verdict(x, drafts=drafts)
        verdict.tree = kept is not None
        return verdict


def _root_path(tree: TokenTree, nodes: list[int]) -> list[int] | None:
    """The tokens of `nodes` if they are a root path of `tree` (else None)."""
    parent = -1
    for i in nodes:
        if not 0 <= i < len(tree) or tree.parents[i] != parent:
            return None
        parent = i
    return [tree.tokens[i] for i in nodes]


class RemoteVerifier:
    """The target on a server (`edgespec serve`), one session per generation."""

    def __init__(self, session: Remote, max_positions: int, q_ids: int | None = None) -> None:
        """q_ids: the most ids a drafted token's q holds (its drafter's support), None when
        the drafter sends no q (prompt lookup)."""
        self.session, self.max_positions = session, max_positions
        self.capacity = 0
        self.q_ids = q_ids
        self.row_ids: int | None = None  # q_ids while the generation samples, else None
        self.server_capacity = 0  # positions the server's session holds (its limit applied)
        self.hold = False  # between generations, keep the server's session to resume it

    @property
    def connected(self) -> bool:
        return self.session.link is not None

    def started(self, length: int) -> None:
        limit = self.session.limits.max_context if self.session.limits else self.capacity
        self.server_capacity = max(min(self.capacity, limit), length + 1)

    def prefill(self, start: Start) -> tuple[int, RoundStats]:
        # the server masks its verification by the same grammar, sent with every START
        c = start.constraint
        self.session.grammar = None if c is None else (c.grammar, c.start)
        # the server's cache is resumed from what the link knows it holds, not `cached`
        began, prompt = perf_counter(), start.prompt
        self.capacity = start.capacity
        self.row_ids = None if start.params.greedy else self.q_ids
        x = self.session.start(prompt, start.capacity, start.params, resume=self.hold)
        self.started(len(prompt))
        seconds = perf_counter() - began
        stats = RoundStats(
            "prefill", 1, len(prompt) - x.kept, seconds, verifier="remote", cached_tokens=x.kept
        )
        stats.set_channel(_channel(x))
        return x.result.token, stats

    def resync(
        self,
        seq: list[int],
        params: SamplingParams,
        attempts: int,
        wait: float | None = None,
        resume: bool = False,
    ) -> Verdict:
        """Reconnect and rebuild the server session from the committed sequence; its answer
        is the token after it (a round of γ = 0). `resume`: keep what the session holds of
        seq (after local rounds, with the link still up: only the new tokens are sent)."""
        x = self.session.start(seq, self.capacity, params, attempts, wait, resume=resume)
        self.started(len(seq))
        return _verdict(x, resync=True)

    def max_drafts(self, seq: list[int]) -> int:
        """Drafts the server's session can take after seq (-1: it can go no further), as many
        as a VERIFY within the server's request size carries (its q rows at their largest)."""
        room = max(self.server_capacity - len(seq), -1)
        if self.session.max_request is None or room <= 0:
            return room
        return min(room, P.max_drafts(self.session.max_request, self.row_ids))

    def submit(
        self, seq: list[int], proposal: Proposal, params: SamplingParams, rng: np.random.Generator
    ) -> InFlight:
        tree = self._tree(seq, proposal)
        if tree is not None:  # every node, with its parent; the server answers a PATH
            q = proposal.tree_q if proposal.kind == "sampled" else None
            self.session.send(P.Verify(len(seq), list(tree.tokens), q, list(tree.parents)))
            return InFlight(self.session, len(seq), proposal, tree)
        q = proposal.q if proposal.kind == "sampled" and proposal.tokens else None
        msg = P.Verify(len(seq), proposal.tokens, q)
        if self.session.limits is not None:  # within the session's room and the request size
            most = max(self.server_capacity - len(seq), 0)
            msg = P.fit(msg, self.session.limits.max_request_bytes, most)
        sent = replace(proposal, tree=None, tree_q=None)  # its main path, as a chain
        if len(msg.drafts) < len(proposal.tokens):  # the decode loop recommits its drafter
            sent = replace(sent, tokens=list(msg.drafts), q=msg.q)
        self.session.send(msg)
        return InFlight(self.session, len(seq), sent)

    def _tree(self, seq: list[int], proposal: Proposal) -> TokenTree | None:
        """The proposal's tree if it goes to the server whole: the server offered trees at
        least this large, the session has room for every node and the VERIFY fits its
        request size (else the main path goes, as a chain)."""
        tree = proposal.tree
        if tree is None or tree.is_chain or len(tree) > self.session.tree_nodes:
            return None
        room = self.server_capacity - len(seq)
        q = proposal.tree_q if proposal.kind == "sampled" else None
        size = P.verify_size(len(tree), [len(x.ids) for x in q] if q else None, tree=True)
        limit = self.session.max_request
        return tree if len(tree) <= room and (limit is None or size <= limit) else None

    def truncate(self, length: int) -> None:
        pass  # the server truncates its own cache to what it accepted

    def close(self) -> None:
        if self.hold:
            self.session.pause()
        else:
            self.session.end()
