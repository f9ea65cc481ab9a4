"""The decode loop: prefill once, then draft-verify rounds until a stop, as a generator.

Plain autoregressive decoding is this same loop with a drafter that proposes nothing
(`NoDrafter`, γ = 0): one verifier call per token. Each yielded `Step` carries the tokens
the round accepted and its `RoundStats`; `Model.stream()` turns them into text.
"""

from __future__ import annotations

from collections.abc import Iterator
from time import perf_counter

import numpy as np

from edgespec.runtime.policies import DraftLengthPolicy
from edgespec.runtime.sampling import SamplingParams, next_token
from edgespec.runtime.speculative import Drafter, speculative_round
from edgespec.runtime.stats import RoundStats, Step
from edgespec.runtime.target import Target


def decode(
    target: Target,
    drafter: Drafter,
    policy: DraftLengthPolicy,
    prompt: list[int],
    params: SamplingParams,
    max_new_tokens: int,
    stop_ids: frozenset[int],
    cached: int = 0,
) -> Iterator[Step]:
    """Yield one Step per round: the prefill's first token, then each round's tokens.

    cached: the first `cached` prompt tokens equal the start of the sequence the caches last
    held (a conversation's earlier turns): the target and the drafter keep those positions
    and prefill only the rest (at least the last prompt token, whose logits start decoding).
    """
    rng = np.random.default_rng(params.seed)
    # drafts are capped below so that the last verify writes position P + max_new - 1
    capacity = min(len(prompt) + max_new_tokens, target.max_positions)
    kept = target.resume(capacity, min(cached, len(prompt) - 1))

    start = perf_counter()
    logits = target.forward(np.asarray(prompt[kept:], dtype=np.int64), keep=1)[-1]
    drafter.begin(prompt, capacity, min(cached, len(prompt) - 1))
    seq = [*prompt, next_token(logits, params, rng)]
    seconds = perf_counter() - start
    prefill = RoundStats(
        "prefill", 1, len(prompt) - kept, seconds, verify_seconds=seconds, cached_tokens=kept
    )
    step = Step([seq[-1]], prefill)
    produced = 1
    while True:
        step.finish_reason = finish_reason(
            step.tokens[-1], produced, max_new_tokens, stop_ids, len(seq) - 1, capacity
        )
        yield step
        if step.finish_reason:
            return
        # never draft past the token budget or the cache (verify writes γ + 1 positions)
        max_len = min(max_new_tokens - produced - 1, capacity - len(seq))
        new, stats = speculative_round(target, drafter, policy, seq, max_len, params, rng)
        new = _cut_at_stop(new, stop_ids)
        seq += new
        produced += len(new)
        step = Step(new, stats)


def _cut_at_stop(tokens: list[int], stop_ids: frozenset[int]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in stop_ids:
            return tokens[: i + 1]
    return tokens


def finish_reason(
    token: int, produced: int, max_new: int, stop_ids: frozenset[int], length: int, capacity: int
) -> str | None:
    if token in stop_ids:
        return "eos"
    if produced >= max_new:
        return "length"
    if length >= capacity:
        return "context"
    return None
