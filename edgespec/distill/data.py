"""The target's own replies and what a feature head learns from them, made through the edgespec
runtime (a bundle whose `full` graph declares its features).

`generate(model, prompts, folder, ...)` has the target answer each prompt (greedy, through its
chat template when it has one, in its fastest lossless mode), then scores prompt + reply in one
call of its `full` graph: per position the target's features and its top-k next-token
log-probabilities. Each sample is one `.npz` file in `folder`, written whole (a stopped run
loses at most the reply in flight and resumes with the next prompt). `load(folder)` reads them
back as `Sample`s; every tenth prompt is held out (`held_out`).

`teacher_force(model, pairs, folder, ...)` scores (prompt, reply text) pairs the target did
not write (prompts.teacher_texts) the same way, prompt and text in one call: the target's
features and distribution over text it reads, at prefill's speed rather than decoding's.
They train; they are never held out (the held-out acceptance is on the target's own replies).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgespec.runtime.errors import InputError

TOP_K = 16  # target log-probs kept per position (the head's KL target)
HELD_OUT_EVERY = 10  # prompt i is held out when i % 10 == 9


@dataclass
class Sample:
    index: int  # the prompt's index
    ids: np.ndarray  # int32 [S]: prompt + reply
    start: int  # where the reply starts
    features: np.ndarray  # float16 [S, F]: the target's features at each position
    top_ids: np.ndarray  # int32 [S, K]: the target's most likely next tokens at each position
    top_logp: np.ndarray  # float16 [S, K]: their log-probabilities

    @property
    def held_out(self) -> bool:
        return held_out(self.index)


def held_out(index: int) -> bool:
    return index % HELD_OUT_EVERY == HELD_OUT_EVERY - 1


def read_prompts(path: Path) -> list[list[dict[str, str]]]:
    """A JSONL file of {"prompt": text} or {"messages": [{"role", "content"}, ...]} lines as
    conversations; an InputError naming the line that is neither."""
    out = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"--prompts {path}: cannot read it ({e})") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"--prompts {path}, line {n}: not JSON ({e})") from None
        if isinstance(row, dict) and isinstance(row.get("prompt"), str):
            out.append([{"role": "user", "content": row["prompt"]}])
        elif (
            isinstance(row, dict)
            and isinstance(row.get("messages"), list)
            and all(
                isinstance(m, dict) and isinstance(m.get("content"), str) for m in row["messages"]
            )
        ):
            out.append([{"role": str(m.get("role", "user")), "content": m["content"]}
                        for m in row["messages"]])  # fmt: skip
        else:
            raise InputError(
                f'--prompts {path}, line {n}: expected {{"prompt": "..."}} or '
                '{"messages": [{"role": "user", "content": "..."}]}'
            )
    if not out:
        raise InputError(f"--prompts {path} holds no prompts")
    return out


def conversation_ids(model: Any, conversation: list[dict[str, str]]) -> list[int]:
    """The conversation through the bundle's chat template (plain text without one)."""
    if model.manifest.chat:
        return model.chat_session().prepare(conversation).ids
    return model.encode("\n".join(m["content"] for m in conversation))


def score(model: Any, ids: list[int], top_k: int = TOP_K) -> tuple[np.ndarray, ...]:
    """(features float16 [S, F], top ids int32 [S, K], top log-probs float16 [S, K]) of the
    target over `ids`, in one call of its full graph."""
    from edgespec.runtime.graphs.stack import Stack

    stack = Stack([model.graphs.open("full")], step_width=model.manifest.step_width)
    stack.reset(len(ids))
    logits = stack.forward(np.asarray(ids, np.int64), keep=len(ids))
    features = stack.features[: len(ids)].astype(np.float16)
    top = np.argpartition(-logits, top_k, axis=-1)[:, :top_k]
    rows = np.take_along_axis(logits, top, -1).astype(np.float64)
    norm = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
    logp = rows - logits.max(-1, keepdims=True) - norm
    order = np.argsort(-logp, -1)
    top, logp = np.take_along_axis(top, order, -1), np.take_along_axis(logp, order, -1)
    return features, top.astype(np.int32), logp.astype(np.float16)


def generate(
    model: Any,
    conversations: list[list[dict[str, str]]],
    folder: Path,
    deadline: float,
    new_tokens: int = 192,
    on_sample: Callable[[Sample], None] | None = None,
    at_least: int = 2,
) -> None:
    """Replies to the conversations not yet in `folder`, until time.monotonic() > deadline
    once `folder` holds at least `at_least` (a head needs some replies to train on, however
    loaded the machine)."""
    folder.mkdir(parents=True, exist_ok=True)
    done = {int(p.stem) for p in folder.glob("*.npz")}
    context = model.manifest.target.max_position_embeddings
    have = len(done)
    for index, conversation in enumerate(conversations):
        if index in done:
            continue
        if time.monotonic() > deadline and have >= at_least:
            return
        prompt = conversation_ids(model, conversation)
        budget = min(new_tokens, context - len(prompt) - 1)
        if budget < 8:
            continue  # too long for the context: skipped
        reply = model.generate(prompt, max_new_tokens=budget).tokens
        ids = prompt + reply
        features, top_ids, top_logp = score(model, ids)
        sample = Sample(index, np.asarray(ids, np.int32), len(prompt), features, top_ids,
                        top_logp)  # fmt: skip
        save(sample, folder)
        have += 1
        if on_sample is not None:
            on_sample(sample)


def teacher_force(
    model: Any,
    pairs: list[tuple[str, str]],
    folder: Path,
    deadline: float,
    max_tokens: int = 256,
    on_sample: Callable[[Sample], None] | None = None,
    at_least: int = 1,
) -> None:
    """Scores of the (prompt, reply text) pairs not yet in `folder` (the reply cut to
    `max_tokens` and closed with the end-of-turn token), until time.monotonic() > deadline
    once `folder` holds at least `at_least`."""
    folder.mkdir(parents=True, exist_ok=True)
    done = {int(p.stem) for p in folder.glob("*.npz")}
    context = model.manifest.target.max_position_embeddings
    eos = list(model.manifest.eos_token_ids[:1])
    have = len(done)
    for index, (prompt_text, reply_text) in enumerate(pairs):
        if index in done:
            continue
        if time.monotonic() > deadline and have >= at_least:
            return
        prompt = conversation_ids(model, [{"role": "user", "content": prompt_text}])
        reply = model.tokenizer.encode(reply_text, add_special_tokens=False)[:max_tokens] + eos
        ids = (prompt + reply)[: context - 1]
        if len(ids) - len(prompt) < 8:
            continue
        features, top_ids, top_logp = score(model, ids)
        sample = Sample(index, np.asarray(ids, np.int32), len(prompt), features, top_ids,
                        top_logp)  # fmt: skip
        save(sample, folder)
        have += 1
        if on_sample is not None:
            on_sample(sample)


def save(s: Sample, folder: Path) -> None:
    tmp = folder / f".{s.index:06d}.tmp.npz"
    np.savez(tmp, ids=s.ids, start=np.int64(s.start), features=s.features, top_ids=s.top_ids,
             top_logp=s.top_logp)  # fmt: skip
    os.replace(tmp, folder / f"{s.index:06d}.npz")


def load(folder: Path) -> list[Sample]:
    out = []
    for path in sorted(folder.glob("[0-9]*.npz")):
        with np.load(path) as z:
            out.append(
                Sample(
                    int(path.stem),
                    z["ids"],
                    int(z["start"]),
                    z["features"],
                    z["top_ids"],
                    z["top_logp"],
                )  # fmt: skip
            )
    return out
