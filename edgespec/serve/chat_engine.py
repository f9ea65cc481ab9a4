"""The OpenAI endpoints' decoder: requests on a pool of conversations, one round each in turn.

Takes a `Model` loaded with a local decoding mode (ar, spec, self-spec, lookup) and keeps
`conversations` `ChatSession`s, each with KV caches of its own. A request goes to the idle
session whose caches share the longest token prefix with its prompt, so the next turn of a
conversation lands where its last turn left the cache and prefills only the new messages;
requests beyond the pool wait in arrival order. One thread runs all decoding and advances
every active request by one decode round in turn (round-robin): a long reply never stalls a
short one, and no two requests ever touch the same caches. Chunks are handed to the
requesting event loop; a request whose client went away is closed at its next turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from edgespec.runtime.chat import ChatChunk, ChatReply, ChatSession, Prompt
from edgespec.runtime.model import Model

log = logging.getLogger("edgespec.serve")


@dataclass
class Job:
    prompt: Prompt
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue  # ("chunk", ChatChunk) ... then ("done", ChatReply) | ("error", exc)
    cancelled: bool = False
    session: ChatSession | None = None
    steps: Iterator[ChatChunk] | None = None


@dataclass
class EngineStats:
    requests: int = 0
    prompt_positions: int = 0
    cached_positions: int = 0  # prompt positions kept in a cache, not prefilled
    prefilled_positions: int = 0
    rounds: int = 0
    tokens: int = 0  # tokens produced (the first of each reply included)
    drafted: int = 0
    accepted: int = 0
    sessions_used: dict[int, int] = field(default_factory=dict)


class ChatEngine:
    def __init__(
        self, model: Model, conversations: int = 4, max_context: int | None = None
    ) -> None:
        if conversations < 1:
            raise ValueError(f"conversations={conversations}: at least 1")
        if model.remote is not None:
            raise ValueError("the OpenAI endpoints decode locally: load a local mode")
        self.model = model
        self.sessions = [ChatSession(model, max_context=max_context) for _ in range(conversations)]
        self.busy: set[int] = set()
        self.last_used = [0] * conversations
        self.clock = 0
        self.waiting: deque[Job] = deque()
        self.active: list[Job] = []
        self.stats = EngineStats()
        self.cv = threading.Condition()
        self.stopping = False
        self.thread = threading.Thread(target=self._loop, name="edgespec-chat", daemon=True)
        self.thread.start()

    # -- event-loop side --------------------------------------------------------------------
    @property
    def load(self) -> int:
        with self.cv:
            return len(self.active) + len(self.waiting)

    def submit(self, prompt: Prompt) -> Job:
        job = Job(prompt, asyncio.get_running_loop(), asyncio.Queue())
        with self.cv:
            self.waiting.append(job)
            self.stats.requests += 1
            self.cv.notify()
        return job

    def cancel(self, job: Job) -> None:
        with self.cv:
            job.cancelled = True
            self.cv.notify()

    def stop(self) -> None:
        with self.cv:
            self.stopping = True
            self.cv.notify()
        self.thread.join(timeout=30)

    def report(self) -> dict[str, Any]:
        s = self.stats
        return {
            "mode": self.model.mode,
            "conversations": len(self.sessions),
            "active": len(self.active),
            "waiting": len(self.waiting),
            "requests": s.requests,
            "prompt_positions": s.prompt_positions,
            "cached_positions": s.cached_positions,
            "prefilled_positions": s.prefilled_positions,
            "tokens": s.tokens,
            "drafted": s.drafted,
            "accepted": s.accepted,
        }

    # -- decoding thread --------------------------------------------------------------------
    def _admit(self) -> None:
        """Give waiting requests idle sessions (the longest shared prefix first)."""
        while self.waiting and len(self.busy) < len(self.sessions):
            job = self.waiting.popleft()
            if job.cancelled:
                continue
            idle = [i for i in range(len(self.sessions)) if i not in self.busy]
            ids = job.prompt.ids
            best = max(
                idle, key=lambda i: (self.sessions[i].shared_prefix(ids), -self.last_used[i])
            )
            self.busy.add(best)
            self.clock += 1
            self.last_used[best] = self.clock
            job.session = self.sessions[best]
            job.steps = job.session.stream_prompt(job.prompt)
            self.active.append(job)

    def _loop(self) -> None:
        while True:
            with self.cv:
                self._admit()
                while not self.active and not self.stopping:
                    self.cv.wait()
                    self._admit()
                if self.stopping:
                    for job in [*self.active, *self.waiting]:
                        self._deliver(job, "error", RuntimeError("the server is shutting down"))
                    return
                turn = list(self.active)
            for job in turn:  # one round each, in turn
                self._step(job)

    def _step(self, job: Job) -> None:
        assert job.steps is not None and job.session is not None
        if job.cancelled:
            self._release(job)
            return
        try:
            chunk = next(job.steps)
        except StopIteration:
            self._release(job)
            self._deliver(job, "error", RuntimeError("the reply ended without a finish reason"))
            return
        except Exception as e:  # this request's problem only: answer it, keep serving
            log.exception("a chat request failed")
            self._release(job)
            self._deliver(job, "error", e)
            return
        s = chunk.stats
        if s.phase == "prefill":
            self.stats.prompt_positions += s.input_tokens + s.cached_tokens
            self.stats.cached_positions += s.cached_tokens
            self.stats.prefilled_positions += s.input_tokens
        else:
            self.stats.rounds += 1
            self.stats.drafted += s.drafted
            self.stats.accepted += s.accepted
        self.stats.tokens += len(chunk.tokens)
        self._deliver(job, "chunk", chunk)
        if chunk.finish_reason:
            self._release(job)
            reply: ChatReply | None = job.session.last
            self._deliver(job, "done", reply)

    def _release(self, job: Job) -> None:
        assert job.steps is not None and job.session is not None
        job.steps.close()  # runs the session's bookkeeping of what its caches hold
        with self.cv:
            if job in self.active:
                self.active.remove(job)
            self.busy.discard(self.sessions.index(job.session))

    def _deliver(self, job: Job, kind: str, payload: Any) -> None:
        # RuntimeError: the event loop is gone (the server is shutting down)
        with contextlib.suppress(RuntimeError):
            job.loop.call_soon_threadsafe(job.queue.put_nowait, (kind, payload))
