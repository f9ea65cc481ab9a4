"""Back the process's large anonymous memory with 2 MiB pages (Linux), after sessions open.

Decoding streams every weight once a token, so a 4 KiB page is a TLB miss every 4 KiB of a
few hundred MB. onnxruntime allocates its weights (prepacked for its kernels) with malloc,
which on a kernel whose transparent huge pages are `madvise` (the common default) gets 4 KiB
pages. Asking the kernel afterwards to collapse those regions into huge pages
(`MADV_COLLAPSE`, Linux 6.1+) made plain decoding 5-12% faster on this project's Xeon VM
(bench_huge_pages.py: SmolLM2-135M fp32 45.3 -> 48.7 tok/s, int8 117.6 -> 132.1; Qwen2.5-0.5B
fp32 13.2 -> 13.8, 2 threads, stop 30). It costs load time: 1.3 s for SmolLM2-135M's 500 MB
of fp32 weights and 5 s for Qwen2.5-0.5B's 1.9 GB on that VM, whose guest memory the host
backs lazily (4 ms a 2 MiB page); 0.15 s per 500 MB where the memory had been used before.
`huge_pages=False` (LoadConfig) skips it. numpy already asks for huge pages for its own large
arrays (the KV cache). Nothing changes but where pages sit in memory: the same bytes, the
same results.

Best effort: on other systems, on older kernels, or with huge pages off (`never`), nothing
happens and nothing is raised.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Callable
from pathlib import Path

HUGE = 2 << 20
MIN_REGION = 8 << 20  # smaller regions are not worth a scan (and hold little of the weights)
MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")

# libc's madvise once looked up; False: this system cannot (not Linux, or huge pages off)
_madvise: Callable[[int, int, int], int] | bool | None = None


def regions() -> set[tuple[int, int]]:
    """(start, end) of the anonymous read-write mappings (and the heap) of MIN_REGION or
    more: what `collapse` would look at."""
    found = set()
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        parts = line.split()
        if len(parts) < 5 or not parts[1].startswith("rw"):
            continue
        path = parts[5] if len(parts) > 5 else ""
        if path and path != "[heap]":
            continue
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        if hi - lo >= MIN_REGION:
            found.add((lo, hi))
    return found


def collapse(before: set[tuple[int, int]] | None = None) -> int:
    """Collapse the anonymous read-write regions of at least MIN_REGION into huge pages,
    those not in `before` (`regions()` taken before allocating) or all; returns the bytes
    now backed by them (0 where this system cannot)."""
    madvise = _libc_madvise()
    if madvise is None:
        return 0
    done = 0
    for lo, hi in regions() - (before or set()):
        start, end = -(-lo // HUGE) * HUGE, hi // HUGE * HUGE  # whole huge pages inside
        if end - start < HUGE:
            continue
        # MADV_HUGEPAGE first: the region stays eligible for huge pages as it changes
        madvise(start, end - start, MADV_HUGEPAGE)
        if madvise(start, end - start, MADV_COLLAPSE) == 0:
            done += end - start
    return done


def _libc_madvise() -> Callable[[int, int, int], int] | None:
    global _madvise
    if _madvise is None:
        _madvise = False
        if sys.platform.startswith("linux") and _thp_possible():
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
                fn = libc.madvise
                fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
                fn.restype = ctypes.c_int
                _madvise = fn
            except (OSError, AttributeError):
                pass
    return _madvise if callable(_madvise) else None


def _thp_possible() -> bool:
    try:
        return "[never]" not in THP.read_text()
    except OSError:
        return False
