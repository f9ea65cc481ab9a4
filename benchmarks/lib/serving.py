"""`edgespec serve` as a subprocess on loopback, for the split, serving, chat and backbone
scenarios: `server(bundle, ...)` starts it and waits for /health (a fleet: for its replicas),
stops it on exit (SIGINT: a fleet deletes its application and stops its Ray)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def health(port: int, timeout: float = 10) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=timeout) as r:
        return json.load(r)


def start_server(bundle: Path, port: int, threads: int | None, max_sessions: int, *extra: str,
                 replicas: int | None = None, quiet: bool = False) -> subprocess.Popen:  # fmt: skip
    """`edgespec serve` on 127.0.0.1:`port`, returned once /health answers (with `replicas`)."""
    cmd = [sys.executable, "-m", "edgespec.cli", "serve", str(bundle), "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--max-sessions", str(max_sessions), "--log-level", "warning"]
    cmd += [*extra, *(["--threads", str(threads)] if threads else [])]
    cmd += ["--replicas", str(replicas)] if replicas else []
    out = subprocess.DEVNULL if quiet else None
    proc = subprocess.Popen(cmd, stdout=out, stderr=out)
    wait = 240 if replicas else 120
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}: {' '.join(cmd)}")
        try:
            if health(port, 2).get("replicas", 1) == (replicas or 1):
                return proc
        except (OSError, ValueError):
            pass
        time.sleep(0.5)
    stop_server(proc)
    raise SystemExit(f"the server did not become healthy within {wait} s")


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def server(bundle: Path, threads: int | None = None, max_sessions: int = 16, *extra: str,
           replicas: int | None = None, quiet: bool = False) -> Iterator[int]:  # fmt: skip
    """A running server's port, for the `with` block."""
    port = free_port()
    proc = start_server(bundle, port, threads, max_sessions, *extra, replicas=replicas, quiet=quiet)
    try:
        yield port
    finally:
        stop_server(proc)
