"""The target's own replies and what a feature head learns from them, made through the edgespec
runtime (a bundle whose `full` graph declares its features).

`generate(model, prompts, folder, ...)` has the target answer each prompt (greedy, through its
chat template when it has one, in its fastest lossless mode), then scores prompt + reply in one
call of its `full` graph: per position the target's features and its top-k next-token
log-probabilities. Each sample is one `.npz` file in `folder`, written whole (a stopped run
loses at most the reply in flight and resumes with the next prompt). `load(folder)` reads them
back as `Sample`s; `held_out_indices` says which are held out, `split` parts them.

`teacher_force(model, pairs, folder, ...)` scores (prompt, reply text) pairs the target did
not write (texts.teacher_texts) the same way, prompt and text in one call: the target's
features and distribution over text it reads, at prefill's speed rather than decoding's.
They train; they are never held out (the held-out acceptance is on the target's own replies).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgespec.distill.own import OwnPrompts
from edgespec.distill.own import held_out as own_held_out

TOP_K = 16  # target log-probs kept per position (the head's KL target)
HELD_OUT_EVERY = 10  # a tenth of the prompts (of their sources) is held out


@dataclass
class Sample:
    index: int  # the prompt's index
    ids: np.ndarray  # int32 [S]: prompt + reply
    start: int  # where the reply starts
    features: np.ndarray  # float16 [S, F]: the target's features at each position
    top_ids: np.ndarray  # int32 [S, K]: the target's most likely next tokens at each position
    top_logp: np.ndarray  # float16 [S, K]: their log-probabilities


def held_out_indices(conversations: list[list[dict[str, str]]], built_in: bool) -> list[int]:
    """The sample indices held out, chats (numbered by `chats_after`) with their first turns.
    A user's prompts: every tenth. The built-in ones: per kind, every tenth source
    (`prompts.prompt_source`: the second, the twelfth, ...) with every prompt made from it,
    so that no held-out reply shares its topic, task, code or text with a training reply.
    Held out by prompt, a reply the head had all but seen in another style counted as held
    out: on the same 307 replies and 400 steps, 1.91 tokens a round at γ = 4 by prompt
    against 1.58 by source."""
    from edgespec.distill.prompts import prompt_kind, prompt_source

    held: list[int] = []
    seen: dict[str, dict[str, int]] = {}
    for i, conversation in enumerate(conversations):
        text = conversation[-1]["content"] if conversation else ""
        if built_in:
            per_kind = seen.setdefault(prompt_kind(text), {})
            out = per_kind.setdefault(prompt_source(text), len(per_kind)) % HELD_OUT_EVERY == 1
        else:
            out = i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1
        if out:
            held.append(i)
    first = _first_chat(conversations)
    return held + [first + i for i in held]


def split(samples: list[Sample], listed: list[int]) -> tuple[list[Sample], list[Sample]]:
    """(training, held-out) samples: held out are the `listed` indices (`held_out_indices`,
    kept in the distill state) and every tenth own prompt (`own.held_out`)."""
    out = set(listed)
    held = [s for s in samples if s.index in out or own_held_out(s.index)]
    return [s for s in samples if s.index not in out and not own_held_out(s.index)], held


def _first_chat(conversations: list) -> int:
    """The index of the first chat: the first multiple of HELD_OUT_EVERY past the prompts."""
    return len(conversations) + (-len(conversations) % HELD_OUT_EVERY)


def conversation_ids(model: Any, conversation: list[dict[str, str]], chat: Any = None) -> list[int]:
    """The conversation through the bundle's chat template (plain text without one); `chat`:
    a chat session of `model` to render with (opening one per conversation costs a target)."""
    if model.manifest.chat:
        return (chat or model.chat_session()).prepare(conversation).ids
    return model.encode("\n".join(m["content"] for m in conversation))


def score(model: Any, ids: list[int], top_k: int = TOP_K) -> tuple[np.ndarray, ...]:
    """(features float16 [S, F], top ids int32 [S, K], top log-probs float16 [S, K]) of the
    target over `ids`, in one call of its full graph."""
    from edgespec.runtime.graphs.stack import Stack

    stack = Stack([model.graphs.open("full")], step_width=model.manifest.step_width)
    stack.reset(len(ids))
    logits = stack.forward(np.asarray(ids, np.int64), keep=len(ids))
    features = stack.features[: len(ids)].astype(np.float16)
    return (features, *top_k_logp(logits, top_k))


def top_k_logp(logits: np.ndarray, top_k: int = TOP_K) -> tuple[np.ndarray, np.ndarray]:
    """(top ids int32 [S, K], their log-probs float16 [S, K]), most likely first, of logits
    [S, vocab] (torch: numpy's partition was a fifth of generating)."""
    import torch

    x = torch.from_numpy(np.ascontiguousarray(logits, np.float32))
    values, top = torch.topk(x, top_k, dim=-1)
    logp = values - torch.logsumexp(x, -1, keepdim=True)
    return top.numpy().astype(np.int32), logp.numpy().astype(np.float16)


ROWS = 16  # replies generated together, one row each of a KV pool


@dataclass
class _Row:
    index: int
    prompt: list[int]
    budget: int  # reply tokens at most
    reply: list[int]
    top: list[tuple[np.ndarray, np.ndarray]]  # per call: its positions' top_k_logp
    asking: np.random.Generator | None = None  # an own prompt's user turn being sampled


Conversation = list[dict[str, str]]
# after a reply (its index, ids, where the reply starts): the next conversation to answer and
# its index (a chat that continues it), or None
FollowUp = Callable[[int, np.ndarray, int], "tuple[int, Conversation] | None"]


def generate(
    model: Any,
    conversations: list[Conversation],
    folder: Path,
    deadline: float,
    new_tokens: int = 192,
    on_sample: Callable[[Sample], None] | None = None,
    at_least: int = 2,
    rows: int = ROWS,
    follow: FollowUp | None = None,
    own: OwnPrompts | None = None,
) -> None:
    """Replies to the conversations not yet in `folder`, until time.monotonic() > deadline
    once `folder` holds at least `at_least` (a head needs some replies to train on, however
    loaded the machine). `follow`: a conversation to answer next after each reply (also
    after the replies already in `folder` whose follow-up is not), before the others. `own`:
    up to its share of the rows answer a prompt the target writes itself (own.py).

    Greedy, `rows` replies at a time: each is a row of one KV pool, prefilled alone, and the
    rows step together, one position each in one forward (GroupQueryAttention's
    `query_seqlens`, as the server batches verify rounds): on SmolLM2's Q4_1 blocks (2 cores)
    a step of 16 rows took 51 ms against 8.5 for one, 3.0x the tokens a second. Each row's
    features and top-k log-probabilities come from the same calls. The replies are the
    target's greedy ones up to near ties (a row in a batch may round differently from the row
    alone; training data needs no bitwise guarantee). A target whose graphs cannot batch
    (static, Core ML, older exports) replies one prompt at a time in its own decoding loop,
    without own prompts."""
    from collections import deque

    from edgespec.runtime.graphs.kv_cache import KVPool
    from edgespec.serve.batching import batchable, forward_alone, forward_batch

    folder.mkdir(parents=True, exist_ok=True)
    saved = {int(p.stem): p for p in folder.glob("[0-9]*.npz")}
    done = set(saved)
    context = model.manifest.target.max_position_embeddings
    capacity = min(context, 2048)  # a pool row's positions: prompt and reply fit in it
    chat = model.chat_session() if model.manifest.chat else None
    todo: deque[tuple[int, Conversation]] = deque(
        (i, c) for i, c in enumerate(conversations) if i not in done
    )
    if follow is not None:  # the follow-ups of replies made before, first
        for i in sorted(saved):
            with np.load(saved[i]) as z:
                nxt = follow(i, z["ids"], int(z["start"]))
            if nxt is not None and nxt[0] not in done:
                todo.appendleft(nxt)
    have = len(done)

    def take() -> tuple[int, list[int], int] | None:
        """The next conversation that fits: (index, prompt ids, reply budget)."""
        while todo:
            index, conversation = todo.popleft()
            if index in done:
                continue
            done.add(index)
            prompt = conversation_ids(model, conversation, chat)
            budget = min(new_tokens, capacity - len(prompt) - 2)
            if budget >= 8:  # else too long for the context: skipped
                return index, prompt, budget
        return None

    def finish(sample: Sample) -> None:
        nonlocal have
        save(sample, folder)
        have += 1
        if on_sample is not None:
            on_sample(sample)
        nxt = follow(sample.index, sample.ids, sample.start) if follow is not None else None
        if nxt is not None and nxt[0] not in done:
            todo.appendleft(nxt)

    target = model.target
    if (
        target is None
        or target.fixed_capacity
        or not target.feature_width
        or rows < 2
        or not batchable(target.stages)
    ):
        while (time.monotonic() <= deadline or have < at_least) and (nxt := take()):
            index, prompt, budget = nxt
            ids = prompt + model.generate(prompt, max_new_tokens=budget).tokens
            finish(Sample(index, np.asarray(ids, np.int32), len(prompt), *score(model, ids)))
        return

    stages, m = target.stages, target.model
    pool = KVPool.allocate(target.layers, m.num_kv_heads, m.head_dim, capacity, rows,
                           stages[0].kv_dtype, target.step_width)  # fmt: skip
    pool.with_features(target.feature_width)
    stop = set(model.manifest.eos_token_ids)
    live: dict[int, _Row] = {}
    started = {"all": 0, "own": 0}
    # an own prompt's user turn at most: the prefix, the opening and a short reply fit
    room = capacity - len(own.prefix) - len(own.opening) - 10 if own is not None else 0

    def ask(slot: int) -> _Row:
        """A row sampling its own prompt's user turn (own.py) after the template's prefix."""
        assert own is not None
        index, own.next_index = own.next_index, own.next_index + 1
        rng = np.random.default_rng(index)
        logits = forward_alone(stages, pool, slot, np.asarray(own.prefix, np.int64))
        first = own.sample(logits, rng)
        return _Row(index, list(own.prefix), new_tokens, [first], [top_k_logp(logits)], rng)

    def answer(slot: int, row: _Row) -> None:
        """The user turn is complete: the rest of the template's opening, then the reply."""
        assert own is not None
        rest = np.asarray(own.opening[1:], np.int64)
        top = top_k_logp(forward_alone(stages, pool, slot, rest)) if len(rest) else row.top[-1]
        row.prompt = row.prompt + row.reply + own.opening[1:]
        row.budget = min(new_tokens, capacity - len(row.prompt) - 2)
        row.reply, row.asking = [int(top[0][-1, 0])], None
        if len(rest):
            row.top.append(top)

    while True:
        while pool.free and (time.monotonic() <= deadline or have + len(live) < at_least):
            mine = own is not None and (started["own"] < own.share * (started["all"] + 1)
                                        or not todo)  # fmt: skip
            nxt = None if mine else take()
            if nxt is None and not mine:
                break
            slot = pool.acquire()
            assert slot is not None
            started["all"] += 1
            if nxt is None:
                started["own"] += 1
                live[slot] = ask(slot)
                continue
            index, prompt, budget = nxt
            top = top_k_logp(forward_alone(stages, pool, slot, np.asarray(prompt, np.int64)))
            live[slot] = _Row(index, prompt, budget, [int(top[0][-1, 0])], [top])
        if not live:
            return
        slots = list(live)
        step = [(slot, np.asarray(live[slot].reply[-1:], np.int64)) for slot in slots]
        logits = forward_batch(stages, pool, step, False)
        top_ids, top_logp = top_k_logp(np.concatenate(logits))
        for j, slot in enumerate(slots):
            row = live[slot]
            row.top.append((top_ids[j : j + 1], top_logp[j : j + 1]))
            if row.asking is not None:  # an own prompt's user turn (own.py)
                assert own is not None
                verdict = own.ended(row.reply, stop, room)
                if verdict == "drop":
                    del live[slot]
                    pool.release(slot)
                elif verdict == "answer":
                    answer(slot, row)
                else:
                    row.reply.append(own.sample(logits[j], row.asking))
                continue
            if row.reply[-1] in stop or len(row.reply) >= row.budget:
                ids = row.prompt + row.reply
                features = pool.features[slot, : len(ids)].astype(np.float16)
                del live[slot]
                pool.release(slot)
                finish(Sample(row.index, np.asarray(ids, np.int32), len(row.prompt), features,
                              np.concatenate([t[0] for t in row.top]),
                              np.concatenate([t[1] for t in row.top])))  # fmt: skip
            else:
                row.reply.append(int(top_ids[j, 0]))


def chats_after(model: Any, conversations: list[Conversation]) -> FollowUp:
    """A `FollowUp` that continues the reply of every other single-turn conversation (the
    odd indices: a third of the replies are chats) as a chat (prompts.follow_up: the reply
    as the assistant's turn, then a second question of its kind), numbered from the first
    multiple of HELD_OUT_EVERY past the conversations: a chat is held out where its first
    turn is (no held-out reply's text trains)."""
    from edgespec.distill.prompts import follow_up

    stop = set(model.manifest.eos_token_ids)
    first = _first_chat(conversations)

    def after(index: int, ids: np.ndarray, start: int) -> tuple[int, Conversation] | None:
        if index >= len(conversations) or len(conversations[index]) != 1 or index % 2 == 0:
            return None
        text = model.tokenizer.decode([int(t) for t in ids[start:] if int(t) not in stop])
        if not text.strip():
            return None
        return first + index, follow_up(conversations[index], text.strip(), index)

    return after


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
    chat = model.chat_session() if model.manifest.chat else None
    have = len(done)
    for index, (prompt_text, reply_text) in enumerate(pairs):
        if index in done:
            continue
        if time.monotonic() > deadline and have >= at_least:
            return
        prompt = conversation_ids(model, [{"role": "user", "content": prompt_text}], chat)
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
