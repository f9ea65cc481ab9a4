"""Offline replay of a drafter against what the target actually produced: tokens per target
forward for trees and chains, and acceptance per depth and branch, without tree verification.

Under greedy decoding the target's output is known in advance (its greedy sequence), so a
round's outcome needs no verifier: the drafter proposes a tree (or a chain) after the committed
tokens, the longest root path that matches the real continuation is accepted, and the target's
own next token follows it, as a verifier would decide. `replay` walks a generation that way.

What a tree-sizing policy reads from it (`ReplayStats`): per depth d, how many rounds reached a
node at depth d - 1 that had children (`offered[d]`), and how often the accepted child there was
the k-th (`hits[d][k]`, k = 0 the most likely); the widths verified; the seconds spent drafting.

A drafter that learns from verify logits (Token Recycling) is shown the target's logits of the
rows a verify of the accepted path would score (`rows[i]`: the target's logits after
`tokens[: i + 1]`); a real verify also scores the rejected nodes, which replay cannot (their
rows depend on the tree), so a replayed recycler learns somewhat less than a real one.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ReplayStats:
    rounds: int = 0  # target forwards (one a round)
    tokens: int = 0  # tokens produced (accepted drafts + one a round)
    nodes: int = 0  # drafted nodes verified, summed over rounds (width - 1)
    draft_seconds: float = 0.0  # CPU seconds of this process spent proposing
    offered: dict[int, int] = field(default_factory=dict)  # depth -> rounds with children there
    hits: dict[int, dict[int, int]] = field(default_factory=dict)  # depth -> rank -> accepted

    @property
    def tokens_per_forward(self) -> float:
        return self.tokens / self.rounds if self.rounds else 0.0

    @property
    def mean_width(self) -> float:
        """Positions a round's verify scores: the root and the drafted nodes."""
        return 1 + self.nodes / self.rounds if self.rounds else 1.0

    @property
    def draft_ms_per_round(self) -> float:
        return 1e3 * self.draft_seconds / self.rounds if self.rounds else 0.0

    def add(self, other: ReplayStats) -> None:
        self.rounds += other.rounds
        self.tokens += other.tokens
        self.nodes += other.nodes
        self.draft_seconds += other.draft_seconds
        for d, n in other.offered.items():
            self.offered[d] = self.offered.get(d, 0) + n
        for d, ranks in other.hits.items():
            mine = self.hits.setdefault(d, {})
            for k, n in ranks.items():
                mine[k] = mine.get(k, 0) + n

    def acceptance(self) -> dict[int, dict[int, float]]:
        """P(the accepted child at depth d is the k-th | the round reached depth d - 1 and
        the node there had children), per depth d and rank k."""
        return {
            d: {k: n / self.offered[d] for k, n in sorted(self.hits.get(d, {}).items())}
            for d in sorted(self.offered)
        }

    def as_json(self) -> dict[str, Any]:
        return {
            "rounds": self.rounds,
            "tokens": self.tokens,
            "tokens_per_forward": round(self.tokens_per_forward, 3),
            "mean_width": round(self.mean_width, 2),
            "draft_ms_per_round": round(self.draft_ms_per_round, 4),
            "offered": {str(d): n for d, n in sorted(self.offered.items())},
            "acceptance": {
                str(d): {str(k): round(p, 4) for k, p in ranks.items()}
                for d, ranks in self.acceptance().items()
            },
        }


def walk(tree: Any, truth: Sequence[int], stats: ReplayStats) -> int:
    """The accepted length of `tree` (a TokenTree) against the real continuation `truth`,
    counting each depth's offer and the accepted child's rank into `stats`."""
    children: dict[int, list[int]] = {}
    for i, p in enumerate(tree.parents):
        children.setdefault(p, []).append(i)
    node, n = -1, 0
    while n < len(truth) and children.get(node):
        depth = n + 1
        stats.offered[depth] = stats.offered.get(depth, 0) + 1
        kids = children[node]
        rank = next((k for k, c in enumerate(kids) if tree.tokens[c] == truth[n]), None)
        if rank is None:
            break
        ranks = stats.hits.setdefault(depth, {})
        ranks[rank] = ranks.get(rank, 0) + 1
        node, n = kids[rank], n + 1
    return n


def replay(
    drafter: Any,
    tokens: Sequence[int],
    prompt_length: int,
    budget: int,
    max_depth: int,
    tree: bool,
    rows: Any = None,
    cached: int = 0,
) -> ReplayStats:
    """Replay one generation: `tokens` = prompt + the target's greedy output. Each round the
    drafter proposes a tree (`tree`: at most `budget` nodes, `max_depth` deep) or a chain of
    `max_depth` tokens after the committed tokens; the matching root path is accepted, then
    the target's token. `rows`: the target's logits along `tokens` (a (len, vocab) array), for
    a drafter that learns from verify logits; `cached` as in `Drafter.begin`."""
    import numpy as np

    from edgespec.runtime.round import LearnsFromVerify, Plan
    from edgespec.runtime.sampling import SamplingParams
    from edgespec.runtime.tree import TokenTree

    greedy, rng = SamplingParams(temperature=0.0), np.random.default_rng(0)
    seq = list(tokens)
    stats = ReplayStats()
    drafter.begin(seq[:prompt_length], len(seq), cached)
    learns = rows is not None and isinstance(drafter, LearnsFromVerify)
    pos = prompt_length + 1  # the prefill produced the first output token
    while pos < len(seq):
        committed = seq[:pos]
        room = min(max_depth, len(seq) - pos - 1)
        start = time.process_time()
        if room <= 0:
            proposal = TokenTree((), ())
        elif tree:
            proposal = drafter.propose_tree(committed, budget, room)
        else:
            proposal = TokenTree.chain(drafter.propose(committed, Plan(room), greedy, rng).tokens)
        stats.draft_seconds += time.process_time() - start
        n = walk(proposal, seq[pos : pos + room], stats)
        if learns:
            drafter.observe_verify(seq[pos - 1 : pos + n], rows[pos - 1 : pos + n])
        drafter.commit(pos + n)
        stats.rounds += 1
        stats.tokens += n + 1
        stats.nodes += len(proposal)
        pos += n + 1
    return stats


def verify_curve(ar: Any, widths: list[int], repeats: int) -> dict[int, float]:
    """CPU seconds of one target forward over `width` new positions after 256 cached ones."""
    import numpy as np

    target, context = ar.target, 256
    ids = np.arange(1, context + max(widths) + 1, dtype=np.int64) % 1000 + 10
    target.reset(context + max(widths) + 1)
    target.forward(ids[:context], keep=0)
    out = {}
    for w in widths:
        times = []
        for _ in range(repeats):
            start = time.process_time()
            target.forward(ids[context : context + w], keep=w)
            times.append(time.process_time() - start)
            target.truncate(context)
        out[w] = statistics.median(times)
    return out


def verify_cost(costs: dict[int, float], width: float) -> float:
    """T(width) by linear interpolation between measured widths (held flat past the ends)."""
    widths = sorted(costs)
    if width <= widths[0]:
        return costs[widths[0]]
    for lo, hi in zip(widths, widths[1:], strict=False):
        if width <= hi:
            return costs[lo] + (costs[hi] - costs[lo]) * (width - lo) / (hi - lo)
    return costs[widths[-1]]


def projected(stats: ReplayStats, costs: dict[int, float]) -> dict[str, float]:
    """Tokens/s as tokens per forward / (t_draft + t_verify(width)), on the measured verify
    cost curve `costs` (width -> seconds) and on a flat one (every width costs T(1): a
    launch-bound step, as on a GPU or an NPU with headroom)."""
    draft = stats.draft_seconds / stats.rounds if stats.rounds else 0.0
    measured = draft + verify_cost(costs, stats.mean_width)
    flat = draft + costs[min(costs)]
    return {
        "measured": stats.tokens_per_forward / measured,
        "flat": stats.tokens_per_forward / flat,
    }
