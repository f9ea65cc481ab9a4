"""All model work of the server on one thread; verify rounds that arrive together run together.

Handlers on the event loop submit jobs: calls (`run(fn, *args)`: a slot release), rounds
(`round(item)`) and stepped jobs (`steps(gen_fn, *args)`: a prefill, one chunk per step);
threads post the same jobs with `post(kind, payload)` and wait on a `concurrent.futures`
future (the OpenAI conversations' verifier, `serve.pool_verifier`).
The thread takes every job queued when it becomes free, in arrival order; consecutive rounds
(at most `max_batch`) go to `run_rounds` in one call, which shares forwards between them
(continuous batching: a round that arrives while a batch runs joins the next one).
`max_batch = 1` runs every round alone, as an unbatched server.

Stepped jobs never hold the thread for more than one step while other work waits: a started
one is parked, and the thread alternates: the next queued call or batch of rounds, then one
step of the oldest parked job (which then goes to the back, so long prefills share the
thread round-robin). A round therefore waits for at most one step (one prefill chunk) plus
the batch ahead of it, however many long prompts are being prefilled. `trace` (a list, or
None) records what ran, in order: "round", "call" or "step" per job (for tests and stats).

`window` (seconds, default 0): when the thread finds fewer than `max_batch` rounds, it waits
up to this long for more before running them. At 0 a batch is whatever queued up while the
previous one ran, which under load is already most devices; a window of a millisecond or two
catches rounds that were a moment late, at the price of that delay on every round when the
server is idle (with one device, the window is pure added latency).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Generator
from typing import Any

log = logging.getLogger("edgespec.serve")

_STOP = object()
Outcome = tuple[Any, BaseException | None]


class Worker:
    def __init__(
        self,
        run_rounds: Callable[[list[Any]], list[Outcome]] | None = None,
        max_batch: int = 16,
        window: float = 0.0,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch={max_batch}: at least 1 round per batch")
        if window < 0:
            raise ValueError(f"batch window {window} s: must be 0 or more")
        self.run_rounds, self.max_batch, self.window = run_rounds, max_batch, window
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.busy = 0  # jobs submitted and not yet answered
        self.served = 0
        self.steps_run = 0  # steps of stepped jobs (prefill chunks) run so far
        # what those steps did: the sum of the ints they yield (prefill: positions); a round
        # notes it when queued, so `most_step_work_before_a_round` is the largest amount of
        # stepped work that ran while a round waited (the interleaving bound, measured)
        self.step_work = 0
        self.most_step_work_before_a_round = 0
        self.trace: list[str] | None = None
        self.thread = threading.Thread(target=self._loop, name="edgespec-worker", daemon=True)
        self.thread.start()

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run fn(*args) on the worker thread; its exception is raised here."""
        return await self._submit("call", (fn, args))

    async def round(self, item: Any) -> Any:
        """Run one round in the next batch; its own error (only) is raised here."""
        assert self.run_rounds is not None, "Worker(run_rounds=...) runs rounds"
        return await self._submit("round", item)

    async def steps(self, fn: Callable[..., Generator[Any, None, Any]], *args: Any) -> Any:
        """Run the generator fn(*args) one step at a time, interleaved with other jobs; its
        return value (or exception) comes back here. A caller that is cancelled closes it
        (its `finally` runs on the thread) before its next step."""
        return await self._submit("steps", (fn, args))

    def post(self, kind: str, payload: Any) -> concurrent.futures.Future:
        """From any thread: queue a "round" (payload: the item), a "call" or a "steps" job
        (payload: (fn, args)), in order with the jobs queued before; its outcome arrives on
        the returned future."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self.jobs.put((kind, payload, future, None, self.step_work))
        return future

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue fn(*args) without waiting for it (in order with the jobs queued before)."""
        self.jobs.put(("call", (fn, args), None, None, 0))

    async def _submit(self, kind: str, payload: Any) -> Any:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.busy += 1
        try:
            self.jobs.put((kind, payload, future, loop, self.step_work))
            return await future
        finally:
            self.busy -= 1

    def stop(self) -> None:
        self.jobs.put(_STOP)
        self.thread.join(timeout=30)

    def _loop(self) -> None:
        pending: deque = deque()  # queued jobs, in arrival order
        parked: deque = deque()  # started stepped jobs: (generator, future, loop)
        while True:
            if not pending and not parked:
                pending.append(self.jobs.get())
            if pending:
                self._gather(pending)
            else:
                self._drain(pending)
            if pending:
                job = pending.popleft()
                if job is _STOP:
                    stopped = RuntimeError("the server stopped")
                    for gen, future, loop in parked:
                        gen.close()
                        self._answer(future, loop, None, stopped)
                    for _, _, future, loop, _ in (j for j in pending if j is not _STOP):
                        self._answer(future, loop, None, stopped)  # nobody waits forever
                    return
                if job[0] == "round":
                    self._run_batch(job, pending)
                elif job[0] == "call":
                    self._call(job)
                else:  # a stepped job starts: its generator is made now, in arrival order
                    _, (fn, args), future, loop, _ = job
                    try:
                        parked.append((fn(*args), future, loop))
                    except Exception as e:
                        self._answer(future, loop, None, e)
                    continue  # starting is not a turn: queued rounds still go first
            if parked:
                self._step(parked)

    def _call(self, job: tuple) -> None:
        _, (fn, args), future, loop, _ = job
        self._note("call")
        try:
            result, error = fn(*args), None
        except Exception as e:  # handed to the session's handler, never kills the loop
            result, error = None, e
            if future is None:
                log.exception("background job %s failed", getattr(fn, "__name__", fn))
        self._answer(future, loop, result, error)

    def _run_batch(self, job: tuple, pending: deque) -> None:
        batch = [job]
        while pending and pending[0] is not _STOP and pending[0][0] == "round":
            if len(batch) >= self.max_batch:
                break
            batch.append(pending.popleft())
        for job in batch:
            self._note("round")
            waited = self.step_work - job[4]
            self.most_step_work_before_a_round = max(self.most_step_work_before_a_round, waited)
        try:
            outcomes = self.run_rounds([j[1] for j in batch])  # type: ignore[misc]
        except Exception as e:  # run_rounds answers per round; this is a bug in it
            log.exception("a batch of %d rounds failed", len(batch))
            outcomes = [(None, e)] * len(batch)
        for (_, _, future, loop, _), (result, error) in zip(batch, outcomes, strict=True):
            self._answer(future, loop, result, error)

    def _step(self, parked: deque) -> None:
        """One step of the oldest parked job; it goes to the back unless it finished."""
        gen, future, loop = parked.popleft()
        if future is not None and future.cancelled():  # its caller is gone: stop it here
            gen.close()
            self._answer(None, loop, None, None)
            return
        self._note("step")
        self.steps_run += 1
        try:
            work = next(gen)
            self.step_work += work if isinstance(work, int) else 1
        except StopIteration as done:
            self._answer(future, loop, done.value, None)
        except Exception as e:
            self._answer(future, loop, None, e)
        else:
            parked.append((gen, future, loop))

    def _note(self, kind: str) -> None:
        if self.trace is not None:
            self.trace.append(kind)

    def _drain(self, pending: deque) -> None:
        """Move what is queued now into `pending`, without waiting."""
        while True:
            try:
                pending.append(self.jobs.get_nowait())
            except queue.Empty:
                return

    def _gather(self, pending: deque) -> None:
        """Move what is queued into `pending`; with a window, wait a little for more rounds."""
        deadline = time.monotonic() + self.window
        while True:
            try:
                pending.append(self.jobs.get_nowait())
                continue
            except queue.Empty:
                pass
            rounds = sum(1 for j in pending if j is not _STOP and j[0] == "round")
            head_is_round = pending[0] is not _STOP and pending[0][0] == "round"
            left = deadline - time.monotonic()
            if not head_is_round or rounds >= self.max_batch or left <= 0:
                return
            try:
                pending.append(self.jobs.get(timeout=left))
            except queue.Empty:
                return

    def _answer(self, future, loop, result: Any, error: BaseException | None) -> None:
        self.served += 1
        if future is None:
            return
        if loop is None:  # a thread's (`post`)
            _settle(future, result, error)
        else:
            loop.call_soon_threadsafe(_settle, future, result, error)


def _settle(
    future: asyncio.Future | concurrent.futures.Future, result: Any, error: BaseException | None
) -> None:
    if future.cancelled():  # the session went away while its round ran
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
