"""Prompts the target writes itself: user turns sampled from its own chat template, answered by
it in the same row of `data.generate` (Magpie's way of making instruct data from nothing but
the model: Xu et al., 2024).

The built-in prompts (prompts.py) are a few hundred templated styles of a few hundred sources:
a head trained only on their replies learns that set (on SmolLM2, 2.4 tokens a round at γ = 4
on its training replies, 1.24 on the prompts of `benchmarks.vs_llama_server`). A user turn the
target samples after its template's opening of a user turn is what a user of such a model asks
(a career change, a road trip, a Python script, a recipe, ...): 400 steps on the same
replies with 30% of them swapped for replies to the target's own prompts kept 1.45 tokens a
round on those benchmark prompts instead of 1.24, at the same figure on the built-in
held-out sources (1.54 against 1.57).

`OwnPrompts.of(model)` reads the template's two halves around a user message: `prefix` (the
system turn, if the template adds one, and the opening of the user turn) and `opening` (the
end of the user turn and the opening of the assistant's). A row of `data.generate` starts
with `prefix`, samples the user turn (`temperature`, `top_p`, seeded by the sample's index)
until the token that ends a user turn (`opening[0]`), feeds the rest of `opening`, and then
answers greedily like any other row. A user turn that ends otherwise (another stop token,
longer than `max_tokens`, shorter than `min_tokens`) or repeats one made before is dropped.
Samples get indices from `FIRST` up; every tenth (the second, the twelfth, ...) is held out.
A target without a chat template has no user turn to sample: `of` gives None.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

FIRST = 1_000_000  # the first own prompt's sample index (the built-in ones and chats are below)
PLACEHOLDER = "\u2063QQ\u2063"  # a user message no template rewrites


def held_out(index: int) -> bool:
    """Whether the own-prompt sample `index` is held out (every tenth, the second first)."""
    return index >= FIRST and (index - FIRST) % 10 == 1


@dataclass
class OwnPrompts:
    prefix: list[int]  # the template up to a user message's text
    opening: list[int]  # from the end of a user message to the assistant's reply
    share: float = 0.5  # of the rows started, at most this share ask their own prompt
    temperature: float = 1.0
    top_p: float = 0.95
    min_tokens: int = 4
    max_tokens: int = 96
    next_index: int = FIRST
    seen: set[tuple[int, ...]] = field(default_factory=set)

    @classmethod
    def of(cls, model: Any, share: float, existing: list[int]) -> OwnPrompts | None:
        """From `model`'s chat template (None without one, or if the template's rendering of
        a user message does not split around it); `existing`: the own-prompt sample indices
        already made (numbering goes on after them)."""
        if not model.manifest.chat or share <= 0:
            return None
        ids = model.chat_session().prepare([{"role": "user", "content": PLACEHOLDER}]).ids
        marker = model.tokenizer.encode(PLACEHOLDER, add_special_tokens=False)
        at = next((i for i in range(len(ids)) if ids[i : i + len(marker)] == marker), None)
        if at is None or at + len(marker) >= len(ids):
            return None
        after = max((i for i in existing if i >= FIRST), default=FIRST - 1) + 1
        return cls(list(ids[:at]), list(ids[at + len(marker) :]), share, next_index=after)

    def sample(self, logits: np.ndarray, rng: np.random.Generator) -> int:
        """A token from the last row of `logits` at `temperature`, within `top_p`."""
        x = np.asarray(logits, np.float64).reshape(-1, logits.shape[-1])[-1] / self.temperature
        p = np.exp(x - x.max())
        p /= p.sum()
        order = np.argsort(-p)
        keep = int(np.searchsorted(np.cumsum(p[order]), self.top_p)) + 1
        top = p[order[:keep]]
        return int(order[rng.choice(keep, p=top / top.sum())])

    def ended(self, asked: list[int], stop: set[int], room: int) -> str | None:
        """After the sampled token asked[-1]: "answer" (the user turn is complete: feed the
        rest of `opening` and answer), "drop" (it ended badly, reached `max_tokens` or
        `room`, or was made before), or None (sample on)."""
        last = asked[-1]
        if last == self.opening[0]:
            turn = tuple(asked[:-1])
            if len(turn) < self.min_tokens or turn in self.seen:
                return "drop"
            self.seen.add(turn)
            return "answer"
        if last in stop or len(asked) >= min(self.max_tokens, room):
            return "drop"
        return None


__all__ = ["FIRST", "OwnPrompts", "held_out"]
