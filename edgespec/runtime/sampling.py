"""Turning logits into the next token: greedy, or sampling with temperature / top-k / top-p.

`probabilities` is the target distribution every decoding mode must reproduce (speculative
sampling compares draft and target probabilities computed by this same function).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def probabilities(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The sampling distribution (float64, sums to 1) over the vocab for one logits row."""
    # in place: at a 150k vocabulary each fresh temporary costs more than the arithmetic
    z = logits.astype(np.float64)
    z /= params.temperature
    if params.top_k and params.top_k < z.shape[-1]:
        kth = np.partition(z, -params.top_k)[-params.top_k]
        z[z < kth] = -np.inf
    z -= z.max()
    p = np.exp(z, out=z)
    p /= p.sum()
    if params.top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        cumulative = np.cumsum(p[order])
        # keep the smallest prefix whose mass reaches top_p (always at least one token)
        cut = int(np.searchsorted(cumulative, params.top_p)) + 1
        keep = np.zeros_like(p, dtype=bool)
        keep[order[:cut]] = True
        p = np.where(keep, p, 0.0)
        p /= p.sum()
    return p


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    """Inverse-CDF draw from p: one uniform per token, so a seed fixes the whole generation.
    Consumes p (its cumulative sum is taken in place: every caller passes a fresh array)."""
    u = rng.random() * p.sum()
    cdf = np.cumsum(p, out=p)
    return int(min(np.searchsorted(cdf, u, side="right"), p.shape[-1] - 1))


def next_token(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    if params.greedy:
        return int(np.argmax(logits))
    return sample(probabilities(logits, params), rng)
