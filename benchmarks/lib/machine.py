"""The machine a figure was measured on: CPU name, cores, load, versions, commit; quiet waits
and the memory-bandwidth bound. Standard library only, except `memory_bandwidth` (numpy).

Every scenario prints `load_line()` beside its tables and stores `facts()` in its JSON: figures
taken on a shared machine are compared as ratios measured in one run, never across runs.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
QUIET_CORES = 0.25  # other processes' CPU use (cores) above which the machine counts as busy


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_flags() -> set[str]:
    """The CPU's feature flags (/proc/cpuinfo; empty where it cannot be read)."""
    try:
        return set(next(line for line in Path("/proc/cpuinfo").read_text().splitlines()
                        if line.startswith("flags")).split(":", 1)[1].split())  # fmt: skip
    except (OSError, StopIteration):
        return set()


def vector_isa() -> str:
    """The widest vector extensions the CPU offers, as the kernels see them ("AVX-512 (VNNI,
    BF16)", "AVX2", ...): one vendor name covers CPUs with and without AVX-512."""
    flags = cpu_flags()
    if not flags:
        return "unknown"
    if "avx512f" in flags:
        extra = [n for f, n in (("avx512_vnni", "VNNI"), ("avx512_bf16", "BF16"),
                                ("amx_tile", "AMX")) if f in flags]  # fmt: skip
        return "AVX-512" + (f" ({', '.join(extra)})" if extra else "")
    return "AVX2" if "avx2" in flags else "no AVX2"


def loadavg() -> float:
    """The 1-minute load average (other jobs on the machine skew every number)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def load_line() -> str:
    """The machine and its load, for the line printed next to a table of figures."""
    try:
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "unknown"
    return f"machine: {cpu_name()}, {vector_isa()}, {os.cpu_count()} cores, load average {load}"


def versions() -> dict[str, str]:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for dist in ("numpy", "torch", "transformers", "onnxruntime", "onnxruntime-genai", "edgespec"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "-"
    return out


def git_state() -> str:
    """The checkout's commit, "+dirty" when edgespec/ has uncommitted changes."""

    def git(*argv: str) -> str:
        proc = subprocess.run(["git", *argv], cwd=REPO, capture_output=True, text=True, timeout=10)
        return proc.stdout.strip()

    try:
        head, dirty = git("rev-parse", "--short", "HEAD"), git("status", "--porcelain", "edgespec")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + ("+dirty" if dirty else "")


def facts() -> dict[str, Any]:
    """What a result JSON records about where it was measured."""
    return {
        "cpu": cpu_name(),
        "isa": vector_isa(),
        "cores": os.cpu_count(),
        "load_average": list(os.getloadavg()),
        "versions": versions(),
        "commit": git_state(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


class CpuMonitor:
    """CPU time the rest of the machine used since construction (ours and our children's
    excluded), from /proc/stat; steal time counts as used by others."""

    def __init__(self) -> None:
        self.wall, self.busy, self.own = time.perf_counter(), self._busy(), self._own()

    @staticmethod
    def _busy() -> float:
        try:
            fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        except OSError:
            return float("nan")
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
        return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _own() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def other_cores(self) -> float:
        wall = time.perf_counter() - self.wall
        other = (self._busy() - self.busy) - (self._own() - self.own)
        return max(0.0, other / wall) if wall > 0 else 0.0


def wait_for_quiet(max_wait: float) -> float:
    """Wait (up to `max_wait` s) for a 1 s window in which other processes use less than
    QUIET_CORES cores; return the seconds waited."""
    start = time.perf_counter()
    while time.perf_counter() - start < max_wait:
        monitor = CpuMonitor()
        time.sleep(1.0)
        if monitor.other_cores() < QUIET_CORES:
            break
    return time.perf_counter() - start


def memory_bandwidth(nbytes: int, threads: int, repeats: int = 5) -> dict[str, float]:
    """Best-of-`repeats` bandwidths in bytes/s over an `nbytes` buffer split across `threads`
    Python threads (numpy drops the GIL), so the test uses as many cores as the engines:
    copy (`np.copyto`, read + written bytes, STREAM-style) and read (`np.sum`)."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # touch every page first
    edges = np.linspace(0, src.size, threads + 1, dtype=np.int64)
    parts = list(zip(edges[:-1], edges[1:], strict=True))

    def best(work: Callable[[int, int], object]) -> float:
        fastest = float("inf")
        with ThreadPoolExecutor(threads) as pool:
            for _ in range(repeats):
                start = time.perf_counter()
                list(pool.map(lambda ab: work(*ab), parts))
                fastest = min(fastest, time.perf_counter() - start)
        return fastest

    copy = 2 * nbytes / best(lambda a, b: np.copyto(dst[a:b], src[a:b]))
    read = nbytes / best(lambda a, b: src[a:b].sum())
    return {"copy": copy, "read": read, "bound": max(copy, read)}
