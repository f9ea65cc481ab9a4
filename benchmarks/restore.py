"""A conversation that survives a restart: time to first token of the next turn after
`ChatSession.load`, against a cold prefill of the whole conversation.

    python -m benchmarks.restore [--shape smollm2-135m] [--tokens 2000] [--repeats 3]

A random-weight model of a real shape (`lib.models.checkpoint`, fp32 bundle), a conversation
of `--tokens` token ids, then a next turn of 24 new ids. Per repeat, in one process: a fresh
session prefills all of it (cold); another saves after the conversation, and a fresh model
loads that file and answers the next turn (load time and TTFT reported apart; the same first
token is checked).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import edgespec
from benchmarks.lib.machine import cpu_name, load_line
from benchmarks.lib.models import checkpoint, prompt_ids, shape_bundle
from benchmarks.lib.tables import table, write_result
from edgespec.runtime.chat import ChatOptions

ONE = ChatOptions(max_new_tokens=1, temperature=0)


def first_token(session, ids: list[int]) -> tuple[float, int]:
    start = time.perf_counter()
    chunk = next(iter(session.stream_prompt(session.prepare_ids(ids, ONE))))
    return time.perf_counter() - start, chunk.tokens[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    bundle = shape_bundle(checkpoint(args.shape))
    history = prompt_ids(0, args.tokens)
    turn = [*history, *prompt_ids(1, 24)]
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
