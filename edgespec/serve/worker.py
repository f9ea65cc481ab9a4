"""All model work of the server on one thread: rounds from every session, back to back.

The ONNX graphs are batch-1 with a KV cache per session, so verify rounds from devices that
arrive together cannot share one forward; what they can share is a thread that never idles
between them. Handlers on the event loop submit jobs; this thread drains every job that is
ready and runs them one after another (no per-request thread hop, no two forwards fighting
over onnxruntime's thread pool), then hands each result back to its handler's future.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("edgespec.serve")

_STOP = object()


class Worker:
    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.busy = 0  # jobs submitted and not yet answered
        self.served = 0
        self.largest_batch = 0
        self.thread = threading.Thread(target=self._loop, name="edgespec-worker", daemon=True)
        self.thread.start()

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run fn(*args) on the worker thread; its exception is raised here."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.busy += 1
        try:
            self.jobs.put((fn, args, future, loop))
            return await future
        finally:
            self.busy -= 1

    def stop(self) -> None:
        self.jobs.put(_STOP)
        self.thread.join(timeout=30)

    def _loop(self) -> None:
        while True:
            batch = [self.jobs.get()]
            while True:  # everything that arrived together is served in this pass
                try:
                    batch.append(self.jobs.get_nowait())
                except queue.Empty:
                    break
            self.largest_batch = max(self.largest_batch, len(batch))
            for job in batch:
                if job is _STOP:
                    return
                fn, args, future, loop = job
                try:
                    result, error = fn(*args), None
                except Exception as e:  # handed to the session's handler, never kills the loop
                    result, error = None, e
                self.served += 1
                loop.call_soon_threadsafe(_settle, future, result, error)


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.cancelled():  # the session went away while its round ran
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
