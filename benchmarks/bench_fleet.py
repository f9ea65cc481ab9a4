"""Verifier fleet benchmark: N emulated devices against 1 plain server, a 1-replica fleet and a
2-replica fleet (Ray Serve), then a run that kills a replica mid-load.

Each device is a thread running split decoding (greedy, the prompt-lookup drafter: devices
cost little CPU) through the channel emulator (`edgespec.tools.channel`, one link per device, all
at `--rtt` ms) to `edgespec serve` started as a subprocess (with `--replicas R` for a fleet).
Devices generate for `--seconds`; the table gives tokens/s over all devices, p50/p99 of a
decode round's latency (draft + wire + verify, as the device saw it), and the fleet's cost
against the plain server. Every generation is checked against the bundle's own greedy
output; a session that fails or differs is "lost".

On one small machine the replicas share its cores: the rows measure the Ray ingress's
overhead and the failover, not scaling.

    python benchmarks/bench_fleet.py --devices 16 32 --seconds 20
    python benchmarks/bench_fleet.py --bundle BUNDLE --devices 64
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
from common import free_port, load_line

import edgespec
from edgespec.tools.channel import Channel, ChannelConfig

PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return",
    "for i in range(10):\n    print(i)\nfor j in range(10):\n    print(",
    "import os\nimport sys\nimport json\nimport time\nimport",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y =",
]


def health(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
        return json.load(r)


def start_server(bundle: Path, port: int, replicas: int | None, max_sessions: int):
    cmd = [sys.executable, "-m", "edgespec.cli", "serve", str(bundle), "--port", str(port)]
    cmd += ["--threads", "1", "--max-sessions", str(max_sessions), "--log-level", "warning"]
    if replicas:
        cmd += ["--replicas", str(replicas)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}: {' '.join(cmd)}")
        try:
            if health(port).get("replicas", 1) == (replicas or 1):
                return proc
        except (OSError, ValueError):
            pass
        time.sleep(0.5)
    proc.terminate()
    raise SystemExit("the server did not become healthy within 240 s")


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)  # a fleet deletes its application and stops its Ray
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def make_bundle(folder: Path, hidden: int, layers: int) -> Path:
    from edgespec.export import export_bundle
    from edgespec.export.builtin import write_checkpoint

    ckpt = write_checkpoint(
        folder / "ckpt",
        "llama",
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        num_key_value_heads=max(1, hidden // 128),
        max_position_embeddings=512,
    )
    export_bundle(ckpt, folder / "bundle", progress=False)
    return folder / "bundle"


def load_run(
    bundle: Path,
    port: int,
    devices: int,
    seconds: float,
    n_new: int,
    rtt: float,
    reference: dict,
    kill_at: float | None = None,
) -> dict:
    """`devices` devices for `seconds`; with kill_at, SIGKILL the busiest replica then."""
    rounds: list[tuple[float, float]] = []  # (end time, latency) of every decode round
    stats = {"tokens": 0, "generations": 0, "lost": 0, "reconnects": 0, "local_rounds": 0}
    lock = threading.Lock()
    start = time.monotonic() + 2.0  # devices connect first
    stop_at = start + seconds
    killed: dict = {}

    def device(i: int, url: str) -> None:
        model = edgespec.load(
            bundle, mode="split", server=url, threads=1, drafter="lookup", draft_policy="fixed:3"
        )
        model.remote.retries = 6
        while time.monotonic() < start:
            time.sleep(0.01)
        k = i
        while time.monotonic() < stop_at:
            prompt = PROMPTS[k % len(PROMPTS)]
            k += 1
            tokens, mine, reconnects, local, counted = [], [], 0, 0, 0
            try:
                last = time.monotonic()
                for chunk in model.stream(prompt, max_new_tokens=n_new, ignore_eos=True):
                    now = time.monotonic()
                    tokens += chunk.tokens
                    s = chunk.stats
                    reconnects += s.reconnected
                    local += s.verifier == "local"
                    if start <= now <= stop_at:
                        counted += len(chunk.tokens)
                        if s.phase == "decode":
                            mine.append((now, now - last))
                    last = now
                ok = tokens == reference[prompt]
            except Exception:
                ok = False
            with lock:
                rounds.extend(mine)
                stats["tokens"] += counted
                stats["generations"] += 1
                stats["lost"] += not ok
                stats["reconnects"] += reconnects
                stats["local_rounds"] += local
        model.remote.drop()

    channels = [Channel(f"127.0.0.1:{port}", ChannelConfig(rtt_ms=rtt)) for _ in range(devices)]
    for ch in channels:
        ch.__enter__()
    threads = [
        threading.Thread(target=device, args=(i, f"ws://{ch.address}"))
        for i, ch in enumerate(channels)
    ]
    for t in threads:
        t.start()
    time.sleep(max(0.0, start + (kill_at or seconds / 2) - time.monotonic()))
    replicas = health(port).get("per_replica", [])
    split = [r["sessions"] for r in replicas]  # sessions per replica at mid-run
    if kill_at is not None:
        victim = max(replicas, key=lambda r: r["sessions"])
        killed.update(victim, at=time.monotonic())
        os.kill(victim["pid"], signal.SIGKILL)
    for t in threads:
        t.join()
    for ch in channels:
        ch.__exit__(None, None, None)
    lat = np.array([x for _, x in rounds]) * 1000
    out = dict(stats, devices=devices, split="/".join(map(str, split)) or "-")
    out["tokens_per_s"] = stats["tokens"] / seconds
    out["p50_ms"] = float(np.percentile(lat, 50)) if len(lat) else float("nan")
    out["p99_ms"] = float(np.percentile(lat, 99)) if len(lat) else float("nan")
    if killed:
        near = np.array([x for t, x in rounds if abs(t - killed["at"]) <= 2.0]) * 1000
        out["killed_sessions"] = killed["sessions"]
        out["p99_near_kill_ms"] = float(np.percentile(near, 99)) if len(near) else float("nan")
        out["max_near_kill_ms"] = float(near.max()) if len(near) else float("nan")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", type=Path, default=None, help="default: a random llama")
    ap.add_argument("--hidden", type=int, default=256, help="random model: hidden size")
    ap.add_argument("--layers", type=int, default=4, help="random model: layers")
    ap.add_argument("--devices", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rtt", type=float, default=20.0, help="channel RTT per device, ms")
    ap.add_argument("--skip-failover", action="store_true")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        bundle = args.bundle or make_bundle(Path(tmp), args.hidden, args.layers)
        ar = edgespec.load(bundle, threads=1)
        reference = {
            p: ar.generate(p, max_new_tokens=args.new_tokens, ignore_eos=True).tokens
            for p in PROMPTS
        }
        max_sessions = max(args.devices) + 8
        rows = []
        for name, replicas in (("plain server", None), ("fleet, 1 replica", 1), ("fleet, 2", 2)):
            port = free_port()
            proc = start_server(bundle, port, replicas, max_sessions)
            try:
                for n in args.devices:
                    r = load_run(
                        bundle, port, n, args.seconds, args.new_tokens, args.rtt, reference
                    )
                    rows.append(dict(r, server=name))
                    print(json.dumps(rows[-1]), flush=True)
                if replicas == 2 and not args.skip_failover:
                    n = max(args.devices)
                    r = load_run(
                        bundle,
                        port,
                        n,
                        args.seconds,
                        args.new_tokens,
                        args.rtt,
                        reference,
                        kill_at=args.seconds / 2,
                    )
                    rows.append(dict(r, server="fleet, 2, one killed"))
                    print(json.dumps(rows[-1]), flush=True)
            finally:
                stop_server(proc)
    print(table(rows))
    print(load_line())


def table(rows: list[dict]) -> str:
    plain = {r["devices"]: r for r in rows if r["server"] == "plain server"}
    lines = [
        "| server | devices | sessions per replica | tokens/s | × plain | round p50 ms "
        "| round p99 ms | generations | lost | reconnects | local rounds |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        base = plain.get(r["devices"])
        ratio = r["tokens_per_s"] / base["tokens_per_s"] if base else float("nan")
        lines.append(
            f"| {r['server']} | {r['devices']} | {r['split']} | {r['tokens_per_s']:.0f} "
            f"| {ratio:.2f} "
            f"| {r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {r['generations']} | {r['lost']} "
            f"| {r['reconnects']} | {r['local_rounds']} |"
        )
    for r in rows:
        if "killed_sessions" in r:
            lines.append(
                f"\nkilled a replica holding {r['killed_sessions']} sessions: "
                f"{r['lost']} generations lost, p99 of rounds within ±2 s of the kill "
                f"{r['p99_near_kill_ms']:.0f} ms (max {r['max_near_kill_ms']:.0f} ms)"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
