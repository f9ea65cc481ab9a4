"""Dynamic token trees from a drafting model: the draft model (`spec`) or an early exit
(`self-spec`) drafts its chain, the spine, as it always does, and at the depths where its
distribution splits (top-1 probability under `top1`, or the runner-up within `ratio` of it)
its runner-up candidates join the tree as siblings of the spine's token there (DySpec-style
dynamic trees, sized by the node budget the tree policy plans).

  runner_ups   the most likely tokens of a logits row other than the drawn one, if it splits
  ModelTrees   a `TreeDrafter` over a `ModelDrafter` or an `EarlyExitDrafter`: chains through
               the drafter's own `propose`, trees through `propose_tree_round`

Siblings are leaves. A leaf costs no draft step: its token comes from the logits row that
drew the spine's token at its depth. A branch below a sibling would: the draft model's KV
cache is one linear buffer that `forward` appends to and `truncate` cuts, so drafting under
a sibling means cutting the spine's rows off and feeding them again next round (or a tree
graph for the draft); the early exit writes into the target's own cache. So a tree holds the
spine (nodes 0..D-1, parents -1, 0, 1, ...) then its side leaves, depth by depth, most
likely first: at each depth the spine's token is rank 0 (first child) and the runner-ups
ranks 1, 2, ..., which is what `TokenTree.offers` and the tree policy's acceptance per depth
and rank read. Side leaves go where the drafter's own path probability says they are worth
most (s(d-1)·p(candidate), s the spine's path probability), within the budget.

Sampling stays exact. The spine's token at depth d is drawn from q_d (the `SparseQ` it
carries, as in a chain); its siblings are deterministic: the tokens the drafter ranks highest
other than the drawn one, each carried as a point mass. `tree_accept` tries a node's children
in order with recursive rejection sampling: the spine's token with min(1, p/q_d), and on its
rejection the residual r = norm(max(0, p - q_d)) is exactly the target's distribution given
that rejection, whatever token was drawn; a sibling then is a candidate whose distribution,
given everything before it, is a point mass at itself, kept with r(x) and else removed from
r. Each child's distribution is known given what precedes it, so each step hands on exactly
the target's conditional distribution, and the token that ends the round is drawn from it
(that the siblings depend on the draw, and on deeper spine draws through the budget, does
not matter: none of that touches the target's randomness). Siblings are never drawn
independently from q_d: that would repeat the spine's token as often as q_d is peaked.
Greedy acceptance takes the target's argmax wherever it is among the children.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from edgespec.runtime.draft_q import SparseQ
from edgespec.runtime.drafters.base import EarlyExitDrafter, ModelDrafter, _proposal
from edgespec.runtime.grammar.constraints import Constraint
from edgespec.runtime.round import Plan, Proposal
from edgespec.runtime.sampling import SamplingParams
from edgespec.runtime.tree import TokenTree

SIDE = 3  # runner-ups per depth at most (the tree policy prices ranks 1..3)
TOP1 = 0.8  # a row whose top-1 probability is below this splits
RATIO = 0.25  # so does one whose runner-up has at least this share of the top-1's probability
GREEDY = SamplingParams(temperature=0.0)


def runner_ups(
    logits: np.ndarray, drawn: int, side: int = SIDE, top1: float = TOP1, ratio: float = RATIO
) -> list[tuple[int, float]]:
    """The `side` most likely tokens of the row other than `drawn`, with their probabilities
    (softmax of the logits), most likely first; none unless the row splits."""
    return _split(np.asarray(logits), drawn, side, top1, ratio)[0]


def _split(
    x: np.ndarray, drawn: int, side: int, top1: float, ratio: float
) -> tuple[list[tuple[int, float]], float]:
    """(`runner_ups`, the drawn token's probability), from one pass over the row."""
    k = min(side + 1, x.shape[-1])
    top = np.argpartition(-x, k - 1)[:k]
    top = top[np.argsort(-x[top], kind="stable")]
    peak = x[top[0]]
    if not np.isfinite(peak):
        return [], 1.0
    z = float(np.exp(x - peak).sum(dtype=np.float64))
    p = np.exp((x[top] - peak).astype(np.float64)) / z
    drawn_p = float(np.exp(np.float64(x[drawn] - peak)) / z)
    if k < 2 or not (p[0] < top1 or p[1] >= ratio * p[0]):
        return [], drawn_p
    out = [(int(t), float(q)) for t, q in zip(top, p, strict=True) if t != drawn and q > 0.0]
    return out[:side], drawn_p


def dynamic_tree(
    spine: list[int], rows: list[np.ndarray], budget: int, side: int = SIDE
) -> TokenTree:
    """The spine and at most `budget - len(spine)` side leaves where its rows split (row i
    drew spine[i]), the most likely by their path probability."""
    path, scored = 1.0, []  # (score, depth, rank, token)
    for d, (token, row) in enumerate(zip(spine, rows, strict=True)):
        ups, drawn_p = _split(np.asarray(row), token, side, TOP1, RATIO)
        for rank, (t, p) in enumerate(ups, 1):
            scored.append((path * p, d, rank, t))
        path *= drawn_p  # the spine's own probability
    room = max(budget - len(spine), 0)
    kept = sorted(sorted(scored, key=lambda s: -s[0])[:room], key=lambda s: (s[1], s[2]))
    tokens = [*spine, *(t for *_, t in kept)]
    parents = [*range(-1, len(spine) - 1), *(d - 1 for _, d, _, _ in kept)]
    return TokenTree(tuple(tokens), tuple(parents))


class ModelTrees:
    """`drafter`'s chains as they are, and its dynamic trees (see the module doc)."""

    drafts_ahead = False  # trees verify locally; the wrapper never drafts past a verdict

    def __init__(self, drafter: ModelDrafter | EarlyExitDrafter, side: int = SIDE) -> None:
        self.inner, self.side = drafter, side
        self.name = drafter.name
        self.constraint: Constraint | None = None
        # the draft model's last tree round: (len(seq), its spine), to cut its cache back to
        # the part of the spine the target kept (a sibling ends the path one row short)
        self._held: tuple[int, list[int]] | None = None

    def begin(
        self,
        prompt: list[int],
        capacity: int,
        cached: int = 0,
        constraint: Constraint | None = None,
    ) -> None:
        self._held, self.constraint = None, constraint
        self.inner.begin(prompt, capacity, cached, constraint)

    def source(self, seq: list[int]) -> str | None:
        return self.inner.source(seq)

    def propose(
        self, seq: list[int], plan: Plan, params: SamplingParams, rng: np.random.Generator
    ) -> Proposal:
        self._resync(seq)
        return self.inner.propose(seq, plan, params, rng)

    def commit(self, valid: int) -> None:
        self.inner.commit(valid)

    def propose_tree(self, seq: list[int], budget: int, max_depth: int) -> TokenTree:
        """The greedy tree: the argmax spine, `max_depth` deep, and its runner-ups."""
        p = self.propose_tree_round(seq, Plan(budget, tree_depth=max_depth), GREEDY, None)
        return p.tree if p.tree is not None else TokenTree.chain(p.tokens)

    def propose_tree_round(
        self,
        seq: list[int],
        plan: Plan,
        params: SamplingParams,
        rng: np.random.Generator | None,
    ) -> Proposal:
        """A round's proposal: a tree of at most `plan.length` nodes whose spine is
        `plan.tree_depth` deep, or the spine as a chain where no row split (or under a
        grammar, whose masks chains apply as they draft)."""
        rng = rng if rng is not None else np.random.default_rng(0)
        self._resync(seq)
        depth = min(plan.tree_depth or plan.length, plan.length)
        if self.constraint is not None or depth <= 0:
            return self.inner.propose(seq, replace(plan, tree_depth=0), params, rng)
        if isinstance(self.inner, EarlyExitDrafter):
            return self._exit_round(seq, plan, depth, params, rng)
        rows: list[np.ndarray] = []
        chain = self.inner.propose(seq, Plan(depth), params, rng, rows)
        tree = dynamic_tree(chain.tokens, rows, plan.length, self.side)
        if len(tree) == len(chain.tokens):  # no row split: a chain
            return chain
        self._held = (len(seq), chain.tokens)
        out = _tree_proposal(tree, chain.tokens, chain.q or [], params, chain.seconds)
        out.catchup_seconds = chain.catchup_seconds
        return out

    def _exit_round(
        self, seq: list[int], plan: Plan, depth: int, params: SamplingParams, rng
    ) -> Proposal:
        """The head drafts the spine into the target's cache as `EarlyExitDrafter.propose`
        does. A tree carries no tail input: the verifier runs the target's tree graphs (head
        and tail) over it, writing over the rows the head left past the cache's length."""
        d = self.inner
        assert isinstance(d, EarlyExitDrafter)
        chain = Plan(depth, plan.exit_layer).capped(d.target.max_positions - len(seq))
        spine = d.spine(seq, chain, params, rng)
        tree = dynamic_tree(spine.tokens, spine.rows, plan.length, self.side)
        if len(tree) > len(spine.tokens):
            return _tree_proposal(tree, spine.tokens, spine.qs, params, spine.seconds)
        # no row split: a chain, verified by the tail as usual
        return _proposal(spine.tokens, spine.qs, params, seconds=spine.seconds, tail=spine.tail())

    def _resync(self, seq: list[int]) -> None:
        if self._held is None or not isinstance(self.inner, ModelDrafter):
            return
        base, spine = self._held
        self._held = None
        kept = 0  # the spine's tokens the sequence went on with (spine[j] is at base + j)
        while kept < len(spine) and base + kept < len(seq) and seq[base + kept] == spine[kept]:
            kept += 1
        self.inner.model.truncate(base + kept)


def _tree_proposal(
    tree: TokenTree, spine: list[int], qs: list[SparseQ], params: SamplingParams, seconds: float
) -> Proposal:
    """A tree proposal: spine nodes carry the q they were drawn from, side leaves a point
    mass at their own token (see the module doc)."""
    if params.greedy:
        return Proposal.of_tree(tree, "greedy", None, seconds)
    sides = tree.tokens[len(spine) :]
    point = [SparseQ.point(t) for t in sides]
    return Proposal.of_tree(tree, "sampled", [*qs, *point], seconds)
