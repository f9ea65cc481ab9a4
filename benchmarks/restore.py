"""A conversation that survives a restart: time to first token of the next turn after
`ChatSession.load`, against a cold prefill of the whole conversation.

    python -m benchmarks.restore [--shape smollm2-135m] [--tokens 2000] [--repeats 3] [--server]

A random-weight model of a real shape (`lib.models.checkpoint`, fp32 bundle), a conversation
of `--tokens` token ids, then a next turn of 24 new ids. Per repeat, in one process: a fresh
session prefills all of it (cold); another saves after the conversation, and a fresh model
loads that file and answers the next turn (load time and TTFT reported apart; the same first
token is checked). `--server`: the same through `edgespec serve` processes on loopback
(/v1/completions with token ids): a cold server against one restarted on the `--cache-dir`
files a first server wrote (the file's read counts in the restarted TTFT), with the
server's CPU seconds for the request beside the wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

import edgespec
from benchmarks.lib.machine import cpu_name, load_line
from benchmarks.lib.models import checkpoint, prompt_ids, shape_bundle
from benchmarks.lib.serving import free_port, health, start_server, stop_server
from benchmarks.lib.tables import table, write_result
from edgespec.runtime.chat.session import ChatOptions

ONE = ChatOptions(max_new_tokens=1, temperature=0)


def first_token(session, ids: list[int]) -> tuple[float, int]:
    start = time.perf_counter()
    chunk = next(iter(session.stream_prompt(session.prepare_ids(ids, ONE))))
    return time.perf_counter() - start, chunk.tokens[0]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def serve_first(bundle: Path, ids: list[int], threads: int, *extra: str) -> dict:
    """A fresh server process answers `ids` with one token: wall and server CPU seconds, the
    text, the cached prompt tokens and the server's prefill counts."""
    port = free_port()
    proc = start_server(bundle, port, threads, 4, "--conversations", "1", *extra)
    try:
        body = {"model": "m", "prompt": ids, "max_tokens": 1, "temperature": 0}
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        cpu, start = cpu_seconds(proc.pid), time.perf_counter()
        with urllib.request.urlopen(req, timeout=1200) as r:
            out = json.load(r)
        wall, cpu = time.perf_counter() - start, cpu_seconds(proc.pid) - cpu
        engine = health(port)["openai"]
    finally:
        stop_server(proc)  # SIGINT: a drained exit writes what the cache queued
    details = out["usage"].get("prompt_tokens_details") or {}
    return {
        "wall": wall,
        "cpu": cpu,
        "text": out["choices"][0]["text"],
        "cached": details.get("cached_tokens", 0),
        "prefilled": engine["prefilled_positions"],
    }


def through_server(args: argparse.Namespace, bundle: Path, history: list[int], turn: list[int]):
    runs: dict[str, list[dict]] = {"cold": [], "restarted": []}
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as folder:
            runs["cold"].append(serve_first(bundle, turn, args.threads))
            cache = ("--cache-dir", folder)
            serve_first(bundle, history, args.threads, *cache)  # writes the prefix at the end
            runs["restarted"].append(serve_first(bundle, turn, args.threads, *cache))
    for cold, warm in zip(runs["cold"], runs["restarted"], strict=True):
        assert warm["text"] == cold["text"], "the restarted server answered differently"
        assert warm["cached"] == len(history) and warm["prefilled"] == len(turn) - len(history)
    med = {
        (k, m): statistics.median(r[m] for r in v) for k, v in runs.items() for m in ("wall", "cpu")
    }
    setup = f"{args.shape}, {args.tokens} + 24 tokens, {args.threads} thread(s), edgespec serve"
    print(f"{setup}; {cpu_name()}; {load_line()}")
    rows = [
        [
            k,
            f"{med[k, 'wall']:.3f}",
            f"{med[k, 'cpu']:.3f}",
            str(runs[k][0]["prefilled"]),
        ]
        for k in runs
    ]
    rows.append(
        [
            "cold / restarted",
            f"{med['cold', 'wall'] / med['restarted', 'wall']:.1f}x",
            f"{med['cold', 'cpu'] / med['restarted', 'cpu']:.1f}x",
            "",
        ]
    )
    print(table(["server", "TTFT s (median)", "server CPU s", "prefilled"], "lrrr", rows))
    write_result(args.json, args, runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--server", action="store_true", help="through edgespec serve --cache-dir")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    bundle = shape_bundle(checkpoint(args.shape))
    history = prompt_ids(0, args.tokens)
    turn = [*history, *prompt_ids(1, 24)]
    if args.server:
        through_server(args, bundle, history, turn)
        return
    cold, load, warm = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "conversation.npz"
        for _ in range(args.repeats):
            seconds, want = first_token(
                edgespec.load(bundle, threads=args.threads).chat_session(), turn
            )
            cold.append(seconds)
            saver = edgespec.load(bundle, threads=args.threads).chat_session()
            first_token(saver, history)
            saver.save(path)
            session = edgespec.load(bundle, threads=args.threads).chat_session()
            start = time.perf_counter()
            session.load(path)
            load.append(time.perf_counter() - start)
            seconds, got = first_token(session, turn)
            warm.append(seconds)
            assert got == want, "the restored conversation answered differently"
    med = {k: statistics.median(v) for k, v in (("cold", cold), ("load", load), ("warm", warm))}
    ratio = med["cold"] / (med["load"] + med["warm"])
    setup = f"{args.shape}, {args.tokens} + 24 tokens, {args.threads} thread(s)"
    print(f"{setup}; {cpu_name()}; {load_line()}")
    rows = [
        ["cold prefill TTFT", f"{med['cold']:.3f}"],
        ["load the saved conversation", f"{med['load']:.3f}"],
        ["TTFT after load", f"{med['warm']:.3f}"],
        ["cold / (load + TTFT)", f"{ratio:.1f}x"],
    ]
    print(table(["", "seconds (median)"], "lr", rows))
    write_result(args.json, args, {"cold": cold, "load": load, "warm": warm, "ratio": ratio})


if __name__ == "__main__":
    main()
