"""A real `edgespec serve` process on a free loopback port, for the split-decoding tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
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
