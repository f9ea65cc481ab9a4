"""Constrained decoding: a grammar's token mask at every position, kept lossless under
speculation.

Takes a `Matcher` (the grammar engine's state over the output so far: the mask of tokens it
allows next, advance by one token, rollback n) and gives the decode loop, the drafters and
the verifiers one object, `Constraint`, asked by absolute sequence:

  allowed(seq)            bool [V]: the tokens the grammar allows after `seq`
  allowed_prefix(seq, d)  how many of the drafts d_1..d_γ after `seq` the grammar allows in a
                          row (a lookup draft it forbids is cut before verification)
  forced(seq, limit)      the tokens that follow `seq` because each is the grammar's only
                          allowed token (`"}`, a schema's keys): no drafter and no target
                          choice can change them
  mask_rows(logits, seq, d)  the verifier's logits rows for [seq, seq+d_1, ..] with every
                          forbidden token at -inf (a copy)

Because every call names the sequence it asks about, the matcher follows the caller: asked
after a rejected draft it rolls back, asked after new tokens it advances, and a mask once
computed for a position is kept until that position is rolled back. So the drafter's mask at
draft position i and the verifier's mask for row i are the same array, whichever asked
first: the draft distribution and the target's verification are masked alike, and greedy
constrained output is the constrained target's greedy output in every mode (sampling: the
masked target distribution). A lock makes the calls safe from a request thread (drafting)
and the server's worker thread (verifying) at once. A token the grammar forbids is never fed
to the matcher (an engine that took one would stay in its error state).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from edgespec.runtime.errors import InputError


class GrammarError(InputError):
    """A grammar or schema cannot be used as given, or the grammar reached a dead end."""


class Matcher(Protocol):
    """A grammar engine's state over the tokens consumed so far."""

    def mask(self) -> np.ndarray:
        """bool [V]: the tokens allowed next."""

    def advance(self, token: int) -> None:
        """Consume an allowed token."""

    def rollback(self, n: int) -> None:
        """Forget the last n consumed tokens."""

    def stopped(self) -> bool:
        """Whether the grammar is complete: only its end (an end-of-sequence id) may follow."""


class Constraint:
    def __init__(self, matcher: Matcher, start: int, grammar: str = "") -> None:
        self.matcher = matcher
        self.start = start  # seq[start:] is what the grammar constrains (the output)
        self.grammar = grammar  # the engine's grammar text (a split server rebuilds it)
        self.consumed: list[int] = []
        self.masks: list[np.ndarray | None] = [None]  # masks[k]: allowed after consumed[:k]
        self.lock = threading.Lock()

    # -- the matcher follows the sequence asked about ------------------------------------
    def _mask_here(self) -> np.ndarray:
        k = len(self.consumed)
        mask = self.masks[k]
        if mask is None:
            mask = self.masks[k] = self.matcher.mask()
            if not mask.any():
                raise GrammarError("the grammar allows no token here (its end was not reached)")
        return mask

    def _follow(self, out: Sequence[int]) -> int:
        """Bring the matcher to `out` (the output tokens) as far as the grammar allows it;
        return how many of them it holds."""
        n = min(len(out), len(self.consumed))
        k = n
        if list(out[:n]) != self.consumed[:n]:
            k = next(i for i in range(n) if out[i] != self.consumed[i])
        if k < len(self.consumed):
            self.matcher.rollback(len(self.consumed) - k)
            del self.consumed[k:]
            del self.masks[k + 1 :]
        for t in out[k:]:
            if not self._mask_here()[t]:
                break
            self.matcher.advance(t)
            self.consumed.append(t)
            self.masks.append(None)
        return len(self.consumed)

    def _output(self, seq: Sequence[int], more: Sequence[int] = ()) -> list[int]:
        if len(seq) < self.start:
            raise ValueError(f"a sequence of {len(seq)} is shorter than the prompt {self.start}")
        return [*seq[self.start :], *more]

    # -- what the decode loop, drafters and verifiers ask --------------------------------
    def allowed(self, seq: Sequence[int]) -> np.ndarray:
        with self.lock:
            out = self._output(seq)
            if self._follow(out) < len(out):
                raise GrammarError(f"token {out[len(self.consumed)]} is not allowed here")
            return self._mask_here()

    def allowed_prefix(self, seq: Sequence[int], drafts: Sequence[int]) -> int:
        with self.lock:
            base = len(seq) - self.start
            return max(0, self._follow(self._output(seq, drafts)) - base)

    def forced(self, seq: Sequence[int], limit: int) -> list[int]:
        """At most `limit` tokens after `seq`, each the only one the grammar allows."""
        out: list[int] = []
        with self.lock:
            while len(out) < limit:
                follow = self._output(seq, out)
                if self._follow(follow) < len(follow):
                    break
                mask = self._mask_here()
                if np.count_nonzero(mask) != 1:
                    break
                out.append(int(mask.argmax()))
                if self.matcher.stopped():  # complete: that token was its end
                    break
        return out

    def mask_rows(
        self, logits: np.ndarray, seq: Sequence[int], drafts: Sequence[int]
    ) -> np.ndarray:
        """Logits rows [len(rows), V] for positions after seq, seq + d_1, ... with the
        forbidden tokens at -inf (rows past a draft the grammar forbids are left as they
        are: acceptance stops at that draft, which the masked row before it cannot choose)."""
        out = np.array(logits, dtype=np.float32, copy=True)
        for i in range(out.shape[0]):
            with self.lock:
                follow = self._output(seq, drafts[:i])
                if self._follow(follow) < len(follow):
                    break
                mask = self._mask_here()
            row = out[i]
            row[~mask[: row.shape[0]]] = -np.inf
        return out
