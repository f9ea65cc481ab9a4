"""Training the feature head on the target's replies, within a wall-clock budget, resumable.

`Trainer(head, samples, held, config, text)` fits `FeatureHead` (head.py) on windows of the
training samples (the target's replies, and a `text_weight` share of windows from `text`: text
the target read, data.teacher_force): per pass of the unrolled forward, soft cross-entropy to
the target's top-k next-token distribution (renormalised over its k ids: the KL up to a
constant) plus the regression of the head's state onto the target's last feature layer at the
next position (EAGLE's feature loss, scaled by that feature's RMS). The softmax runs over
the head's draft vocabulary where it has one (`draft_vocabulary`: the ids the target predicts
most often, which its graph scores), else over the ids the target ever ranked in its top k:
the LM head's other rows cost time and carry almost no mass; a position whose teacher has no
id there trains the regression only. `step()` is one
optimizer step; `evaluate()` the held-out acceptance: on the target's own greedy replies, how
many of γ greedy drafts a round keeps (exactly what greedy speculation would accept, from the
same unrolled passes). `state()` / `load_state()` are the checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from edgespec.distill.data import Sample
from edgespec.distill.head import FeatureHead

GAMMA = 4  # drafts per round the held-out acceptance is measured at


@dataclass(frozen=True)
class TrainConfig:
    """Heuristic defaults for a 100M-class target on 2 cores, not tuned for one model."""

    depth: int = 3  # unrolled passes trained (draft steps 1..3; later steps reuse step 3's)
    window: int = 192  # positions per training window
    batch_windows: int = 8  # windows per step
    lr: float = 1e-3  # AdamW, warm-up then cosine over the budget
    warmup: float = 0.05  # of the budget
    feature_weight: float = 0.5  # the regression term against the cross-entropy
    eval_tokens: int = 1024  # held-out positions the periodic evaluation reads
    # the softmax's ids: those the target ranked in its top 4 somewhere (its other top-k ids
    # drop out of the teacher); the LM head's rows cost most of a step
    vocab_k: int = 4
    ce_positions: int = 384  # positions per pass the cross-entropy reads (the regression: all)
    bf16: bool = False  # autocast (where the CPU has AVX-512 BF16)
    # the head's draft vocabulary: the target's N most frequent next tokens (0: the whole
    # vocabulary). A head step's cost is its LM head's rows plus one layer: on SmolLM2 (49,152
    # ids x 576) the whole vocabulary was most of a head step
    draft_vocab: int = 8192
    # the share of windows from teacher-forced text where there is some (DistillConfig.text_share:
    # none by default; on SmolLM2 each share of text held out less than replies alone did)
    text_weight: float = 0.5


def draft_vocabulary(samples: list[Sample], n: int, vocab: int) -> np.ndarray:
    """`n` of the target's `vocab` ids, ascending: those the target most often ranks first over
    the samples' positions (prompts and replies), then those most often in its top k, then the
    lowest ids (a BPE vocabulary's first merges are its most frequent). On SmolLM2 the 2,423
    ids that came first in 30 minutes of replies and text covered 92.7% of the held-out reply
    tokens, filled up to 8,192 97.0%, at the same cost of a head step."""
    first = np.concatenate([s.top_ids[:, 0] for s in samples]).astype(np.int64)
    anywhere = np.concatenate([s.top_ids.reshape(-1) for s in samples]).astype(np.int64)
    top1 = np.bincount(first, minlength=vocab)[:vocab]
    topk = np.bincount(anywhere, minlength=vocab)[:vocab]
    order = np.lexsort((np.arange(vocab), -topk, -top1))  # the last key sorts first
    return np.sort(order[: min(n, vocab)]).astype(np.int64)


def coverage(samples: list[Sample], ids: np.ndarray) -> float:
    """The share of the samples' reply tokens that are among `ids`."""
    replies = np.concatenate([s.ids[s.start :] for s in samples]) if samples else np.zeros(0)
    return round(float(np.isin(replies, ids).mean()), 4) if len(replies) else 0.0


class Trainer:
    def __init__(
        self,
        head: FeatureHead,
        train: list[Sample],
        held: list[Sample],
        config: TrainConfig,
        text: list[Sample] | None = None,
    ) -> None:
        if not train:
            raise ValueError("no training samples")
        self.head, self.train, self.held, self.c = head, train, held, config
        self.text = text or []
        self.rng = np.random.default_rng(0)
        k = config.vocab_k
        if head.draft_ids is not None:
            self.vocab = head.draft_ids
        else:
            top = np.concatenate([s.top_ids[:, :k].reshape(-1) for s in train + held])
            self.vocab = torch.from_numpy(np.unique(top).astype(np.int64))
        self.index = torch.full((head.embed.shape[0],), -1, dtype=torch.long)
        self.index[self.vocab] = torch.arange(len(self.vocab))
        hidden = head.embed.shape[1]
        last = np.concatenate([s.features[:, -hidden:] for s in train[:32]]).astype(np.float32)
        self.feature_rms = float(np.sqrt((last**2).mean())) or 1.0
        params = [p for p in head.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=config.lr, betas=(0.9, 0.95), weight_decay=0.0)
        self.steps = 0

    # -- batches --------------------------------------------------------------------------
    def _window(self, s: Sample, at: int, width: int) -> tuple[np.ndarray, ...]:
        """ids [width + 1], features [width, F], teacher ids / probs [width, K] (position t's:
        the target's distribution of token t + 2), regression targets [width, H], and the
        positions that have a teacher."""
        n = len(s.ids)
        ids = np.zeros(width + 1, np.int64)
        got = s.ids[at : at + width + 1]
        ids[: len(got)] = got
        feats = np.zeros((width, s.features.shape[1]), np.float32)
        f = s.features[at : at + width]
        feats[: len(f)] = f
        k = s.top_ids.shape[1]
        tid, tlp = np.zeros((width, k), np.int64), np.full((width, k), -1e4, np.float32)
        nxt = s.top_ids[at + 1 : at + width + 1]
        tid[: len(nxt)], tlp[: len(nxt)] = nxt, s.top_logp[at + 1 : at + width + 1]
        hidden = self.head.embed.shape[1]
        reg = np.zeros((width, hidden), np.float32)
        r = s.features[at + 1 : at + width + 1, -hidden:]
        reg[: len(r)] = r
        valid = np.arange(width) + at + 2 < n  # token t + 2 exists
        return ids, feats, tid, tlp, reg, valid

    def _batch(self) -> tuple[torch.Tensor, ...]:
        rows = []
        for _ in range(self.c.batch_windows):
            use_text = bool(self.text) and self.rng.random() < self.c.text_weight
            pool = self.text if use_text else self.train
            s = pool[int(self.rng.integers(len(pool)))]
            at = int(self.rng.integers(max(1, len(s.ids) - self.c.window - 1)))
            rows.append(self._window(s, at, self.c.window))
        return tuple(torch.from_numpy(np.stack(col)) for col in zip(*rows, strict=True))

    # -- training -------------------------------------------------------------------------
    def step(self, progress: float) -> float:
        """One optimizer step at `progress` (0..1) of the budget; returns the loss."""
        c = self.c
        warm = min(1.0, progress / c.warmup) if c.warmup else 1.0
        lr = c.lr * warm * (0.5 * (1 + math.cos(math.pi * min(progress, 1.0))) * 0.95 + 0.05)
        for g in self.opt.param_groups:
            g["lr"] = lr
        ids, feats, tid, tlp, reg, valid = self._batch()
        local = self.index[tid]  # the teacher's ids in `vocab` (-1: not there)
        scored = (local >= 0).any(-1)  # a position whose teacher has an id in `vocab`
        teacher = torch.softmax(tlp.masked_fill(local < 0, float("-inf")), -1).nan_to_num(0.0)
        local = local.clamp(min=0)
        gen = torch.Generator().manual_seed(self.steps)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=c.bf16):
            states = self.head.unrolled(ids, feats, c.depth)
            loss = torch.zeros(())
            for s, state in enumerate(states, 1):
                mask = valid.clone()
                mask[:, : s - 1] = False
                err = (state[mask].float() - reg[mask]) / self.feature_rms
                rows = (mask & scored).nonzero()
                pick = rows[torch.randperm(len(rows), generator=gen)[: c.ce_positions]]
                at = (pick[:, 0], pick[:, 1])
                logp = self.head.logits(state[at], self.vocab).log_softmax(-1)
                ce = -(teacher[at] * logp.gather(1, local[at])).sum(-1).mean()
                loss = loss + ce + c.feature_weight * err.pow(2).mean()
            loss = loss / len(states)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.head.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.steps += 1
        return float(loss.item())

    # -- held-out acceptance --------------------------------------------------------------
    @torch.no_grad()
    def evaluate(
        self, tokens: int | None = None, full_vocab: bool = False, samples: list | None = None
    ) -> dict:
        """{"accepted": mean greedy drafts kept per round at GAMMA, "tokens_per_round":
        {γ: 1 + mean kept at γ} for γ = 1..GAMMA, "rounds": how many were scored} over the
        held-out replies (the first `tokens` positions; None: all; `samples`: these instead)."""
        budget = tokens
        kept: list[int] = []
        for s in self.held if samples is None else samples:
            if budget is not None and budget <= 0:
                break
            n = len(s.ids) if budget is None else min(len(s.ids), s.start + budget)
            budget = None if budget is None else budget - (n - s.start)
            ids = torch.from_numpy(s.ids[:n].astype(np.int64))[None]
            feats = torch.from_numpy(s.features[: n - 1].astype(np.float32))[None]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.c.bf16):
                states = self.head.unrolled(ids, feats, GAMMA)
                whole = full_vocab and self.head.draft_ids is None
                rows = None if whole else self.vocab
                guess = [self.head.logits(st[0], rows).argmax(-1) for st in states]
            if not whole:  # positions in `vocab` (the draft vocabulary's: what the graph does)
                guess = [self.vocab[g] for g in guess]
            x = ids[0]
            # a round after L tokens (bonus token L - 1 in the reply): draft s at position
            # L - 3 + s guesses token L - 1 + s
            for length in range(max(s.start + 1, 2), n - GAMMA + 1):
                k = 0
                while k < GAMMA and int(guess[k][length - 2 + k]) == int(x[length + k]):
                    k += 1
                kept.append(k)
        if not kept:
            return {"accepted": 0.0, "tokens_per_round": {}, "rounds": 0}
        arr = np.asarray(kept)
        curve = {g: round(1 + float(np.minimum(arr, g).mean()), 3) for g in range(1, GAMMA + 1)}
        return {"accepted": round(float(arr.mean()), 3), "tokens_per_round": curve,
                "rounds": len(kept)}  # fmt: skip

    # -- checkpoint -----------------------------------------------------------------------
    def state(self) -> dict:
        return {"head": self.head.state_dict(), "opt": self.opt.state_dict(), "steps": self.steps,
                "rng": self.rng.bit_generator.state}  # fmt: skip

    def load_state(self, state: dict) -> None:
        self.head.load_state_dict(state["head"])
        self.opt.load_state_dict(state["opt"])
        self.steps = int(state["steps"])
        self.rng.bit_generator.state = state["rng"]
