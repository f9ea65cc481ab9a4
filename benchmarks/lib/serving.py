"""`edgespec serve` as a subprocess on loopback, for the split, serving, chat and backbone
scenarios: `server(bundle, ...)` starts it and waits for /health (a fleet: for its replicas),
stops it on exit (SIGINT: a fleet deletes its application and stops its Ray)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
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


def run_devices(bundle: Path, urls: list[str], prompts: list[str], n_new: int, gamma: int,
                seconds: float, reference: dict | None = None, midway=None) -> dict:  # fmt: skip
    """One emulated device per url, each a thread: split decoding with the lookup drafter at
    fixed:γ (devices cost little CPU), over the prompts in turn for `seconds`, connected and
    warmed up before the clock starts. Returns tokens/s over all devices, p50 / p99 ms of a
    decode round as the device saw it (draft + wire + verify), drafts per round, reconnects,
    rounds verified on the device after a failover, and with `reference` (prompt -> the
    bundle's greedy tokens) generations that failed or differ (`lost`). `midway()` runs
    halfway through (a fleet reads its replicas, or kills one); the slowest round within 2 s
    of it is `max_near_midway_ms`."""
    import edgespec

    models = []
    for url in urls:
        model = edgespec.load(bundle, mode="split", server=url, threads=1, drafter="lookup",
                              draft_policy=f"fixed:{gamma}", timeout=60.0)  # fmt: skip
        model.remote.retries = 6  # a fleet's failover takes a few tries
        model.generate(prompts[0], max_new_tokens=4, ignore_eos=True)
        models.append(model)
    rounds: list[tuple[float, float]] = []  # (end time, latency) of every decode round
    stats = {"tokens": 0, "generations": 0, "lost": 0, "reconnects": 0, "local_rounds": 0}
    drafted = [0]
    lock = threading.Lock()
    start = time.monotonic()
    stop_at = start + seconds

    def device(i: int) -> None:
        k = i
        while time.monotonic() < stop_at:
            prompt = prompts[k % len(prompts)]
            k += 1
            tokens, mine, reconnects, local, counted, drafts = [], [], 0, 0, 0, 0
            try:
                last = time.monotonic()
                for chunk in models[i].stream(prompt, max_new_tokens=n_new, ignore_eos=True):
                    now = time.monotonic()
                    tokens += chunk.tokens
                    s = chunk.stats
                    reconnects += s.reconnected
                    local += s.verifier == "local"
                    if now <= stop_at:
                        counted += len(chunk.tokens)
                        if s.phase == "decode":
                            mine.append((now, now - last))
                            drafts += s.drafted
                    last = now
                ok = reference is None or tokens == reference[prompt]
            except Exception:  # noqa: BLE001 - a lost generation is a result, not a crash
                ok = False
            with lock:
                rounds.extend(mine)
                drafted[0] += drafts
                stats["tokens"] += counted
                stats["generations"] += 1
                stats["lost"] += not ok
                stats["reconnects"] += reconnects
                stats["local_rounds"] += local

    threads = [threading.Thread(target=device, args=(i,)) for i in range(len(models))]
    for t in threads:
        t.start()
    mid = start
    if midway is not None:
        time.sleep(max(0.0, start + seconds / 2 - time.monotonic()))
        midway()
        mid = time.monotonic()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    for model in models:  # close the connections: the next measurement needs the slots
        model.remote.drop()
    lat = sorted(x for _, x in rounds) or [float("nan")]
    near = [x for t, x in rounds if midway is not None and abs(t - mid) <= 2.0]
    return dict(
        stats,
        max_near_midway_ms=max(near, default=float("nan")) * 1000,
        devices=len(urls),
        tokens_per_s=stats["tokens"] / min(elapsed, seconds),
        p50_ms=lat[int(0.50 * (len(lat) - 1))] * 1000,
        p99_ms=lat[int(0.99 * (len(lat) - 1))] * 1000,
        rounds=len(rounds),
        mean_drafted=drafted[0] / max(len(rounds), 1),
    )
