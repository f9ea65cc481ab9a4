"""What decoding reports: per-round stats, the steps the decode loop yields, and totals.

Stats are data, never prints: the CLI formats them, apps read them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ChannelStats:
    """Split decoding: the channel as one round saw it, and what the server's answer said."""

    network_seconds: float  # waiting for the server's answer, less its verify time
    server_seconds: float  # the verify time the server reported
    bytes_up: int
    bytes_down: int
    server_busy: bool = False  # the server refused to stream ("verify only") or shed it
    stream_rate: float | None = None  # a START's answer: its streams' tokens/s (0: none yet)


@dataclass
class RoundStats:
    """One forward round: what was drafted and accepted, and where the time went."""

    phase: str  # "prefill" | "decode"
    new_tokens: int  # tokens this round added to the output
    input_tokens: int  # positions the verifier processed (prompt length on prefill)
    seconds: float
    drafted: int = 0
    accepted: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    exit_layer: int | None = None  # self-speculation: the exit layer that drafted
    source: str | None = None  # the drafter the round was planned for (a chain's member)
    index: int = 0  # the round's place in its generation (1: the first after the prefill)
    # drafter catching up on tokens it skipped while γ was 0, and split mode's local graphs
    # catching up on tokens decoded at the server: one-offs the policies do not price
    catchup_seconds: float = 0.0
    # split decoding (drafted here, verified by a server): the channel as this round saw it
    # "local" | "remote" | "none" (the grammar alone decided) | "stream" (the server
    # decoded on its own) | "device" (split mode: verified here because the placement
    # policy chose it, with the server up)
    verifier: str = "local"
    network_seconds: float = 0.0  # waiting for the server's answer, less its verify time
    server_seconds: float = 0.0  # the verify time the server reported
    bytes_up: int = 0
    bytes_down: int = 0
    rtt_estimate: float | None = None  # the policy's channel estimates after this round (s)
    bandwidth_estimate: float | None = None  # uplink, bytes/s
    reconnected: bool = False  # this round rebuilt the server session on a new connection
    # constrained decoding: tokens the grammar alone decided (not in drafted / accepted)
    forced: int = 0
    # the server answered "verify only" to a request to stream (or at START: it would start
    # no stream now), or it handed a running stream back (shed)
    server_busy: bool = False
    stream_rate: float | None = None  # a START's answer: the server's streams' tokens/s lately

    # prefill of a conversation's turn: prompt positions kept from the cache (not processed;
    # input_tokens counts only the rest)
    cached_tokens: int = 0
    # a verified token tree: its nodes (`drafted` is then its depth, `accepted` the path
    # kept) and, per depth from 1, (children offered under the accepted path, the rank the
    # target took or -1): what tree policies learn acceptance per depth and rank from
    tree_nodes: int = 0
    tree_offers: tuple[tuple[int, int], ...] = ()

    def set_channel(self, c: ChannelStats) -> None:
        """Record what the channel did in this round."""
        self.network_seconds, self.server_seconds = c.network_seconds, c.server_seconds
        self.bytes_up, self.bytes_down = c.bytes_up, c.bytes_down
        self.server_busy, self.stream_rate = c.server_busy, c.stream_rate


@dataclass
class Step:
    tokens: list[int]
    stats: RoundStats
    # set on the last step: "length" | "eos" | "context" | "server_context"
    finish_reason: str | None = None


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of prompt_tokens: kept in the KV cache from earlier turns
    prefill_seconds: float = 0.0
    decode_tokens: int = 0  # tokens produced after the first (the first comes from prefill)
    decode_seconds: float = 0.0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    accepted_lengths: Counter[int] = field(default_factory=Counter)
    # split decoding: where rounds were verified and what the channel carried
    remote_rounds: int = 0  # prefill included
    local_rounds: int = 0
    network_seconds: float = 0.0
    server_seconds: float = 0.0
    bytes_up: int = 0
    bytes_down: int = 0
    reconnects: int = 0  # server sessions rebuilt after a failure (resync, possibly elsewhere)
    forced: int = 0  # constrained decoding: tokens the grammar alone decided
    stream_rounds: int = 0  # of remote_rounds: tokens the server decoded and streamed
    device_rounds: int = 0  # split mode: rounds placed on the device by choice (not local_rounds)
    tree_rounds: int = 0  # rounds that verified a token tree
    tree_nodes: int = 0  # the nodes those trees held (their depths count in `drafted`)

    def add(self, r: RoundStats) -> None:
        self.reconnects += r.reconnected
        if r.verifier in ("remote", "stream"):
            self.remote_rounds += 1
            self.stream_rounds += r.verifier == "stream"
            self.network_seconds += r.network_seconds
            self.server_seconds += r.server_seconds
            self.bytes_up += r.bytes_up
            self.bytes_down += r.bytes_down
        elif r.verifier == "device":
            self.device_rounds += 1
        elif r.verifier == "local":
            self.local_rounds += 1
        if r.phase == "prefill":
            self.prompt_tokens += r.input_tokens + r.cached_tokens
            self.cached_tokens += r.cached_tokens
            self.prefill_seconds += r.seconds
            return
        self.decode_tokens += r.new_tokens
        self.decode_seconds += r.seconds
        self.forced += r.forced
        self.rounds += 1
        self.drafted += r.drafted
        self.accepted += r.accepted
        self.tree_rounds += r.tree_nodes > 0
        self.tree_nodes += r.tree_nodes
        self.draft_seconds += r.draft_seconds
        self.verify_seconds += r.verify_seconds
        self.accepted_lengths[r.accepted] += 1

    @property
    def prefill_tokens(self) -> int:
        """Prompt positions actually processed (the cached ones were not)."""
        return self.prompt_tokens - self.cached_tokens

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_seconds if self.prefill_seconds else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted(self) -> float:
        return self.accepted / self.rounds if self.rounds else 0.0
