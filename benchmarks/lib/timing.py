"""Timed generations: `Run` (prefill and decode times of one generation), `measure` (warm-up,
then runs started on a quiet machine and tagged with the CPU others used meanwhile), and the
runs a figure counts; `decode_in_turns` (modes streaming the same requests by turns, decode
CPU time per token). Standard library only: the onnxruntime-genai and llama.cpp workers
import it in their own interpreters."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from benchmarks.lib.machine import QUIET_CORES, CpuMonitor, wait_for_quiet


@dataclass
class Run:
    """One timed generation."""

    prefill_s: float
    decode_s: float
    prompt_tokens: int
    decode_tokens: int  # tokens after the first one
    tokens: list[int]
    wall_s: float = 0.0  # the whole call, setup included, for sanity checks
    other_cpu: float = 0.0  # mean cores other processes kept busy during this run
    decode_cpu_s: float = 0.0  # the engine process's CPU time over the decode (0: not taken)

    @property
    def prefill_tps(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tps(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0


def measure(
    once: Callable[[], Run], warmup: int, repeats: int, quiet_wait: float, retries: int = 0
) -> list[Run]:
    """Warm up, then time `repeats` runs, each started when the machine is quiet (or after
    `quiet_wait` seconds of waiting for that); up to `retries` extra runs replace runs that
    other processes disturbed."""
    wait_for_quiet(quiet_wait)
    for _ in range(warmup):
        once()
    runs: list[Run] = []
    while len(runs) < repeats + retries and sum(map(undisturbed, runs)) < repeats:
        wait_for_quiet(quiet_wait)
        monitor = CpuMonitor()
        start = time.perf_counter()
        run = once()
        run.wall_s = time.perf_counter() - start
        run.other_cpu = monitor.other_cores()
        runs.append(run)
    return runs


def undisturbed(run: Run) -> bool:
    return run.other_cpu <= QUIET_CORES


def counted(runs: list[Run]) -> list[Run]:
    """The runs a row's figures come from: the undisturbed ones, or all if every one was."""
    return [r for r in runs if undisturbed(r)] or runs


def leading_match(a: list[int], b: list[int]) -> int:
    """How many leading tokens two outputs share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@dataclass
class Decoded:
    """One mode's decoding over a set of requests (`decode_in_turns`)."""

    cpu_s: float = 0.0  # this process's CPU time after each first token
    tokens: int = 0  # tokens after each first one
    rounds: int = 0
    tree_rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    texts: list[list[int]] = field(default_factory=list)  # the first pass's tokens

    @property
    def tokens_per_cpu_s(self) -> float:
        return round(self.tokens / self.cpu_s, 2) if self.cpu_s else 0.0

    def row(self, ar: Decoded, *counts: str) -> dict[str, Any]:
        """A result row: the rate, these counts (field names), whether the texts are `ar`'s."""
        return {
            "decode_tokens_per_cpu_s": self.tokens_per_cpu_s,
            **{c: getattr(self, c) for c in counts},
            "same_as_ar": self.texts == ar.texts,
        }


def decode_in_turns(
    models: dict[str, Any], prompts: list[list[int]], n_new: int, repeats: int
) -> dict[str, Decoded]:
    """Stream every prompt through every model, `repeats` passes, the models' order rotated
    request by request so load drifts hit all alike; decode time only (the first token,
    the prefill's, is left out)."""
    out = {m: Decoded() for m in models}
    for r in range(repeats):
        for i, ids in enumerate(prompts):
            for mode in list(models)[i + r :] + list(models)[: i + r]:
                d, got, first, start = out[mode], [], None, time.process_time()
                for chunk in models[mode].stream(ids, max_new_tokens=n_new):
                    if first is None:
                        first = time.process_time()
                    else:
                        d.rounds += 1
                        d.tree_rounds += chunk.stats.tree_nodes > 0
                        d.drafted += chunk.stats.drafted
                        d.accepted += chunk.stats.accepted
                    got += chunk.tokens
                d.cpu_s += time.process_time() - (first or start)
                d.tokens += len(got) - 1
                if r == 0:
                    d.texts.append(got)
    return out
