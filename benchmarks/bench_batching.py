"""Server-side cost of verify rounds, batched vs one by one, without devices or network.

N sessions (random prompts of 150 tokens prefilled into a `KVPool`) each send one round of
γ greedy drafts per batch; `verify_rounds` runs the N rounds with the batching plan
(`batched`) or each alone (`alone`, what `--max-batch 1` does), alternately, `--repeats`
times each (the machine may be shared: the order flips every repeat). Every round has width
γ + 1 (the drafts are random ids, so rows grow by about one token a round). Prints the median
ms per batch of N rounds and rounds/s.

    python benchmarks/bench_batching.py                    # trained bundle, γ 0 and 4
    python benchmarks/bench_batching.py --bundle B --gammas 0,2,4 --sessions 1,2,4,8,16
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from common import DEFAULT_MODELS, load_line, table_header, table_row

import edgespec
from edgespec.protocol import Start, Verify
from edgespec.serve.batching import KVPool
from edgespec.serve.session import ServerSession, release, start, verify_rounds


def measure(model, n: int, gamma: int, batched: bool, batches: int, context: int) -> float:
    """Seconds per batch of n rounds (after one warm-up batch)."""
    stages, m = model.target.stages, model.target.model
    pool = KVPool.allocate(
        list(range(m.num_layers)), m.num_kv_heads, m.head_dim, context, n, stages[0].kv_dtype
    )
    rng = np.random.default_rng(n)
    sessions: list[ServerSession] = []
    for _ in range(n):
        prompt = [int(t) for t in rng.integers(1, m.vocab_size, 150)]
        sessions.append(start(pool, stages, Start(prompt, context, temperature=0.0), context)[0])
    times = []
    for b in range(batches + 1):
        drafts = [[int(t) for t in rng.integers(1, m.vocab_size, gamma)] for _ in sessions]
        rounds = [(s, Verify(len(s.seq), d)) for s, d in zip(sessions, drafts, strict=True)]
        t0 = time.perf_counter()
        if batched:
            outcomes = verify_rounds(pool, stages, rounds)
        else:
            outcomes = [verify_rounds(pool, stages, [r])[0] for r in rounds]
        if b:
            times.append(time.perf_counter() - t0)
        assert all(e is None for _, e in outcomes), outcomes
    for s in sessions:
        release(pool, s)
    return float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--bundle", type=Path, default=DEFAULT_MODELS / "trained" / "bundle")
    ap.add_argument("--sessions", default="1,2,4,8,16")
    ap.add_argument("--gammas", default="0,4")
    ap.add_argument("--batches", type=int, default=20, help="batches timed per measurement")
    ap.add_argument("--repeats", type=int, default=2, help="alternations of batched / alone")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    model = edgespec.load(args.bundle, threads=args.threads)
    gammas = [int(g) for g in args.gammas.split(",")]
    # room for every round even if all its drafts were accepted
    context = min(150 + (args.batches + 2) * (max(gammas) + 1), model.target.max_positions)
    columns = ["γ", "sessions", "alone ms/batch", "batched ms/batch", "alone rounds/s"]
    print(table_header([*columns, "batched rounds/s", "batched / alone"], "rrrrrrr"))
    for gamma in gammas:
        for n in [int(x) for x in args.sessions.split(",")]:
            alone, batched = [], []
            for r in range(args.repeats):
                order = (False, True) if r % 2 == 0 else (True, False)
                for b in order:
                    t = measure(model, n, gamma, b, args.batches, context)
                    (batched if b else alone).append(t)
            a, b = float(np.median(alone)), float(np.median(batched))
            cells = [gamma, n, f"{a * 1000:.1f}", f"{b * 1000:.1f}", f"{n / a:.0f}", f"{n / b:.0f}"]
            print(table_row([*cells, f"{a / b:.2f}x"]), flush=True)
    print(f"\n{load_line()}")


if __name__ == "__main__":
    main()
