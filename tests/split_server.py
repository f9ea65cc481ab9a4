"""A real `edgespec serve` process on a free loopback port, for the split-decoding tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

TOKEN = "test-token-123"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    port: int
    token: str | None

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def health(self, token: bool = True) -> dict:
        """/health; with the server's token (the details), or without (liveness only)."""
        headers = {"Authorization": f"Bearer {self.token}"} if token and self.token else {}
        req = urllib.request.Request(f"{self.http}/health", headers=headers)
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.load(r)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)  # in case a test paused it
            self.proc.kill()
        self.proc.wait(timeout=10)


def start_server(
    bundle: Path, tmp: Path, token: str | None = TOKEN, *args: str, port: int | None = None
) -> ServerProcess:
    """`port`: a given one (a server restarted where its devices connected before)."""
    port = port or free_port()
    cmd = [sys.executable, "-m", "edgespec.cli", "serve", str(bundle), "--port", str(port)]
    cmd += ["--threads", "1", "--log-level", "warning", *args]
    if token:
        (tmp / "token").write_text(token + "\n")
        cmd += ["--token-file", str(tmp / "token")]
    log = open(tmp / f"server-{port}.log", "w")  # noqa: SIM115 (lives as long as the process)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    server = ServerProcess(proc, port, token)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {(tmp / f'server-{port}.log').read_text()}")
        try:
            server.health()
            return server
        except OSError:
            time.sleep(0.1)
    server.stop()
    raise RuntimeError("server did not come up in 60s")


@dataclass
class InProcessServer:
    """The real app (`serve.server.create_app`) under uvicorn on a thread of this process, so
    a test can reach its `state`: e.g. hold the worker with a queued call that waits on an
    event, to arrange which jobs are queued together (`hold_worker`)."""

    state: object
    server: object
    thread: object
    port: int
    token: str | None

    url = ServerProcess.url
    http = ServerProcess.http
    health = ServerProcess.health

    def stop(self) -> None:
        from edgespec.serve.server import stop

        self.server.should_exit = True
        self.thread.join(timeout=30)
        stop(self.state)


def serve_in_process(bundle: Path, token: str | None = TOKEN, **settings) -> InProcessServer:
    """`edgespec serve BUNDLE` with ServerConfig `settings` (threads=1 unless given)."""
    import uvicorn

    from edgespec.serve.server import create_app
    from edgespec.serve.state import ServerConfig, load_state
    from edgespec.serve.transport import uvicorn_config

    config = ServerConfig(str(bundle), token=token, **{"threads": 1, **settings})
    state = load_state(config)
    port = free_port()
    app = create_app(config, state)
    server = uvicorn.Server(uvicorn_config(app, config, "127.0.0.1", port, "warning"))
    thread = threading.Thread(target=server.run, name="edgespec-test-server", daemon=True)
    thread.start()
    out = InProcessServer(state, server, thread, port, token)
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            out.stop()
            raise RuntimeError("the in-process server did not start")
        time.sleep(0.02)
    return out


@dataclass
class Hold:
    """A stepped job blocking the server's worker (`hold_worker`)."""

    released: threading.Event
    holding: threading.Event

    def release(self) -> None:
        self.released.set()

    def wait_held(self) -> None:
        if not self.holding.wait(60):
            self.release()
            raise RuntimeError("the worker did not reach the hold within 60 s")


def hold_worker(state, wait: bool = True, until=None) -> Hold:
    """Block the server's worker thread until `release()`: every job queued after the hold
    waits and runs once it is released, consecutive rounds batched together. A stepped job:
    until `until()` is true it only takes turns with the stepped jobs (prefills) queued before
    it, so that they can finish and their sessions go on to queue their next job (at most
    one round each runs meanwhile). `wait`: return once the worker is blocked (else at
    once)."""
    hold = Hold(threading.Event(), threading.Event())

    def held():
        while until is not None and not until():
            time.sleep(0.001)
            yield 0  # a turn for the stepped jobs ahead, no work counted
        hold.holding.set()
        hold.released.wait()

    state.worker.post("steps", (held, ()))
    if wait:
        hold.wait_held()
    return hold


def queued(state) -> int:
    """Jobs waiting in the worker's queue (behind a hold: everything sent since)."""
    return state.worker.jobs.qsize()
