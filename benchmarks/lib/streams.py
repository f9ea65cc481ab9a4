"""Per-device measurements of where decoding happens: N devices at once against one server,
each a thread, as split devices (`edgespec.load(mode="split")`, any policy) or as apps reading
the server's `/v1/chat/completions` stream (centralized serving); and the server process's own
CPU time (`/proc/PID/stat`), so devices sharing the machine do not count as server work.

Per device: time to first token (request to its first token), decode tokens/s (tokens after
the first over the time after it), the gaps between arrivals (a chunk of several tokens is one
arrival: p50 / p99 over arrivals after the first).
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` (Linux), its threads included."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Device:
    """What one device saw over its generations."""

    ttft: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    tokens: int = 0
    lost: int = 0  # generations that differ from the reference or failed
    places: dict[str, int] = field(default_factory=dict)  # split: rounds per verifier

    @property
    def tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds else 0.0

    def add(self, start: float, arrivals: list[tuple[float, int]]) -> None:
        """One generation: its request time and (arrival time, tokens) of each chunk."""
        if not arrivals:
            return
        self.ttft.append(arrivals[0][0] - start)
        self.tokens += sum(n for _, n in arrivals)
        self.decode_tokens += sum(n for _, n in arrivals[1:])
        self.decode_seconds += arrivals[-1][0] - arrivals[0][0]
        self.gaps += [b[0] - a[0] for a, b in zip(arrivals, arrivals[1:], strict=False)]


def quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[int(q * (len(xs) - 1))] if xs else float("nan")


def split_device(model, prompts: list[str], n_new: int, reference: dict | None) -> Callable:
    """A device's generation: (prompt) -> [(arrival, tokens)], checked against `reference`."""

    def once(prompt: str, dev: Device) -> list[tuple[float, int]]:
        arrivals, tokens = [], []
        for chunk in model.stream(prompt, max_new_tokens=n_new, ignore_eos=True):
            arrivals.append((time.perf_counter(), len(chunk.tokens)))
            tokens += chunk.tokens
            v = chunk.stats.verifier
            dev.places[v] = dev.places.get(v, 0) + 1
        dev.lost += reference is not None and tokens != reference[prompt]
        return arrivals

    return once


def chat_device(host: str, port: int, ids: dict[str, list[int]], n_new: int) -> Callable:
    """An app streaming /v1/completions (token-id prompts, so the same tokens as the split
    devices) over one keep-alive HTTP connection through `host:port`."""
    conn = http.client.HTTPConnection(host, port, timeout=120)

    def once(prompt: str, dev: Device) -> list[tuple[float, int]]:
        body = {"prompt": ids[prompt], "max_tokens": n_new, "stream": True, "ignore_eos": True,
                "temperature": 0}  # fmt: skip
        for attempt in (0, 1):  # a keep-alive connection the server closed while idle: again
            try:
                conn.request("POST", "/v1/completions", json.dumps(body),
                             {"Content-Type": "application/json"})  # fmt: skip
                r = conn.getresponse()
                break
            except (http.client.RemoteDisconnected, ConnectionError):
                conn.close()
                if attempt:
                    raise
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
        arrivals = []
        for line in r:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            event = json.loads(line[6:])
            if event.get("choices") and event["choices"][0].get("text"):
                arrivals.append((time.perf_counter(), 1))
        r.read()
        return arrivals

    return once


def run_devices(devices: list[Callable], prompts: list[str], seconds: float) -> list[Device]:
    """Every device (a `once(prompt, Device)`) in its own thread, generating over the prompts
    in turn until `seconds` pass (the generation running then is finished and counted; at
    least one each)."""
    out = [Device() for _ in devices]
    go = threading.Event()  # every thread started first: with many devices starting them
    stop_at = [0.0]  # takes a while, and the window must not close on the last ones

    def run(i: int) -> None:
        k = i
        go.wait()
        while True:  # at least one generation each (seconds = 0: exactly one)
            prompt = prompts[k % len(prompts)]
            k += 1
            start = time.perf_counter()
            try:
                out[i].add(start, devices[i](prompt, out[i]))
            except Exception:  # noqa: BLE001 - a lost generation is a result
                out[i].lost += 1
            if time.monotonic() >= stop_at[0]:
                break

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(devices))]
    for t in threads:
        t.start()
    stop_at[0] = time.monotonic() + seconds
    go.set()
    for t in threads:
        t.join()
    return out
