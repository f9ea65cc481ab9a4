"""The OpenAI endpoints' decoder: requests on a pool of conversations, each on a thread.

Takes a `Model` opened on the server's own bundle graphs with a local decoding mode (ar, spec,
self-spec, lookup) and one `Verifier` per conversation slot: the server's `PoolVerifier`, a
row of its KV pool whose rounds the server's worker verifies in the same batched forwards as
the split sessions' rounds. So the target's weights are in the process once, and each slot's
`ChatSession` keeps only its drafter's state here. A request goes to the idle slot whose
cache shares the longest token prefix with its prompt, so the next turn of a conversation
lands where its last turn left the cache and prefills only the new messages; requests
beyond the slots wait in arrival order. Each running request decodes on a thread of its
own with the one decode loop: their rounds reach the worker together and share forwards,
and the worker serves what is queued in arrival order, so a long reply never stalls a short
one, and no two requests ever touch the same caches. Chunks are handed to the requesting
event loop; a request whose client went away is closed after its current round.
With a prefix cache on disk (`disk`, `serve.prefix_cache`), a request whose prompt shares a
longer prefix with a file than with its conversation's caches has that file's positions put
into them before it decodes (a restarted server resumes long prompts), and when a request
ends its conversation's positions are queued to be written (`serve.cache_rows`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from edgespec.runtime.chat.session import ChatChunk, ChatSession, Prompt
from edgespec.runtime.config import LoadConfig
from edgespec.runtime.drafters.base import EarlyExitDrafter
from edgespec.runtime.drafters.eagle import read_features_of
from edgespec.runtime.graphs.opener import BundleGraphs
from edgespec.runtime.model import Model
from edgespec.runtime.modes import DEFAULT_EAGLE_DRAFTER, DEFAULT_SPEC_DRAFTER
from edgespec.runtime.policies.costs import best_local, calibration_entry
from edgespec.runtime.registry import MODES
from edgespec.runtime.round import Verifier
from edgespec.serve import cache_rows
from edgespec.serve.prefix_cache import PrefixCache

log = logging.getLogger("edgespec.serve")


@dataclass
class Job:
    prompt: Prompt
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue  # ("chunk", ChatChunk) ... then ("done", ChatReply) | ("error", exc)
    cancelled: bool = False
    session: ChatSession | None = None


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


LOCAL_MODES = tuple(m for m in MODES if m != "split")


def load_model(
    graphs: BundleGraphs, mode: str | None, draft_policy: str | None, threads: int | None
) -> Model:
    """The OpenAI endpoints' model on the server's opened graphs: `model.target.stages` are
    the server's verifier stages. Self-spec drafts with head@k alone on the conversation's
    own small cache and is verified by head@k + tail@k over the pool row (one forward that
    can share a batch; LayerSkip's reuse of the head's KV needs a target cache of its own)."""
    m = graphs.manifest
    best_exit, chosen = None, mode is None
    if mode is None:  # the mode this device's calibration favours (costs.best_local)
        calibration = calibration_entry(graphs.folder, graphs.options.device, threads)
        mode, best_exit = best_local(m, calibration)
    if mode not in LOCAL_MODES:
        raise ValueError(f"--mode {mode!r}: the OpenAI endpoints decode with one of {LOCAL_MODES}")
    if mode == "ar" and draft_policy:
        raise ValueError("--draft-policy: mode ar drafts nothing")
    policy = None if mode == "ar" else (draft_policy or "auto")
    # the server's batched pool verifies chains: its rows carry no tree (trees="off")
    device = graphs.options.device
    config = LoadConfig(mode=mode, draft_policy=policy, threads=threads, device=device, trees="off")
    if mode == "self-spec":
        if not m.exit_layers:
            raise ValueError(
                "--mode self-spec needs early-exit graphs: re-export with --exit-layers K"
            )
        if draft_policy == "dynamic-exit":  # a pool row is verified whole: one exit drafts
            raise ValueError("--draft-policy dynamic-exit: the server drafts from its deepest exit")
        exit_layer = f"exit:{best_exit if best_exit is not None else m.exit_layers[-1]}"
        config.mode, config.drafter, config.verifier = "spec", exit_layer, exit_layer
    elif mode == "spec" and chosen:
        config.drafter = DEFAULT_SPEC_DRAFTER
    elif mode == "eagle" and chosen:
        config.drafter = DEFAULT_EAGLE_DRAFTER
    model = Model.from_graphs(graphs, config)
    model.mode = mode
    return model


class ChatEngine:
    def __init__(
        self, model: Model, verifiers: Sequence[Verifier], max_context: int | None = None
    ) -> None:
        if not verifiers:
            raise ValueError("the chat engine needs at least one conversation (a verifier each)")
        if model.remote is not None:
            raise ValueError("the OpenAI endpoints decode locally: load a local mode")
        if any(
            isinstance(d, EarlyExitDrafter)
            for d in getattr(model.drafter, "drafters", [model.drafter])
        ):
            raise ValueError(
                "the early-exit drafter writes into a local target cache: see load_model"
            )
        self.model = model
        self.sessions = [model.chat_session(max_context=max_context, verifier=v) for v in verifiers]
        for session, verifier in zip(self.sessions, verifiers, strict=True):
            read_features_of(session.drafter, verifier)  # a feature head reads its row's
        self.busy: set[int] = set()
        self.last_used = [0] * len(verifiers)
        self.clock = 0
        self.waiting: deque[Job] = deque()
        self.active: list[Job] = []
        self.threads: list[threading.Thread] = []
        self.stats = EngineStats()
        self.lock = threading.Lock()
        self.stopping = False
        self.disk: PrefixCache | None = None  # the prefix cache on disk (`keep_on_disk`)

    def keep_on_disk(self, disk: PrefixCache) -> None:
        self.disk = disk

    # -- event-loop side --------------------------------------------------------------------
    @property
    def load(self) -> int:
        with self.lock:
            return len(self.active) + len(self.waiting)

    def submit(self, prompt: Prompt) -> Job:
        job = Job(prompt, asyncio.get_running_loop(), asyncio.Queue())
        with self.lock:
            if self.stopping:
                self._deliver(job, "error", RuntimeError("the server is shutting down"))
                return job
            self.waiting.append(job)
            self.stats.requests += 1
            self._admit()
        return job

    def cancel(self, job: Job) -> None:
        with self.lock:
            job.cancelled = True  # a running one stops after the round it is in
            if job in self.waiting:
                self.waiting.remove(job)

    def stop(self) -> None:
        """Cancel every request (those running end after their current round) and wait for
        their threads: the worker must outlive them, it answers their rounds."""
        with self.lock:
            self.stopping = True
            for job in self.waiting:
                self._deliver(job, "error", RuntimeError("the server is shutting down"))
            self.waiting.clear()
            for job in self.active:
                job.cancelled = True
            threads = list(self.threads)
        for t in threads:
            t.join(timeout=30)
        if self.disk is not None:  # what the requests queued is written before the exit
            self.disk.close()

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
            "prefix_cache": self.disk.report() if self.disk else None,
        }

    # -- request threads --------------------------------------------------------------------
    def _admit(self) -> None:
        """Give waiting requests idle sessions (the longest shared prefix first), each on a
        thread of its own (the caller holds `lock`)."""
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
            self.active.append(job)
            thread = threading.Thread(
                target=self._run, args=(job,), name=f"edgespec-chat-{best}", daemon=True
            )
            self.threads.append(thread)
            thread.start()

    def _run(self, job: Job) -> None:
        assert job.session is not None
        if self.disk is not None:
            try:
                self._from_disk(job.session, job.prompt.ids)
            except Exception:  # the request goes on with what its caches hold
                log.exception("restoring a prefix from the disk cache failed")
                job.session.seq = []
        steps = job.session.stream_prompt(job.prompt)
        # the last message goes out only once the session is idle again: a client's next
        # turn, sent the moment this reply ends, must find its conversation's cache free
        last: tuple[str, Any] | None = None
        try:
            while not job.cancelled:
                try:
                    chunk = next(steps)
                except StopIteration:
                    raise RuntimeError("the reply ended without a finish reason") from None
                self._count(chunk)
                if chunk.finish_reason:
                    steps.close()  # the session's bookkeeping of what its caches hold
                    self._deliver(job, "chunk", chunk)
                    last = ("done", job.session.last)
                    break
                self._deliver(job, "chunk", chunk)
        except Exception as e:  # this request's problem only: answer it, keep serving
            log.exception("a chat request failed")
            last = ("error", e)
        finally:
            steps.close()
            if self.disk is not None and job.session.seq:
                try:  # before the slot is free: no other request may touch its caches yet
                    snap = cache_rows.snapshot(job.session, self.disk.wants)
                    if snap is not None:
                        self.disk.store(snap)
                except Exception:
                    log.exception("keeping a conversation in the disk cache failed")
            with self.lock:
                self.active.remove(job)
                self.busy.discard(self.sessions.index(job.session))
                self.threads.remove(threading.current_thread())
                if not self.stopping:
                    self._admit()
            if last is not None:
                self._deliver(job, *last)

    def _from_disk(self, session: ChatSession, ids: list[int]) -> None:
        assert self.disk is not None
        hit = self.disk.lookup(ids, session.shared_prefix(ids))
        if hit is not None:
            cache_rows.restore(session, hit)

    def _count(self, chunk: ChatChunk) -> None:
        s = chunk.stats
        with self.lock:
            if s.phase == "prefill":
                self.stats.prompt_positions += s.input_tokens + s.cached_tokens
                self.stats.cached_positions += s.cached_tokens
                self.stats.prefilled_positions += s.input_tokens
            else:
                self.stats.rounds += 1
                self.stats.drafted += s.drafted
                self.stats.accepted += s.accepted
            self.stats.tokens += len(chunk.tokens)

    def _deliver(self, job: Job, kind: str, payload: Any) -> None:
        # RuntimeError: the event loop is gone (the server is shutting down)
        with contextlib.suppress(RuntimeError):
            job.loop.call_soon_threadsafe(job.queue.put_nowait, (kind, payload))
