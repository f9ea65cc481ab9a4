"""What the verifier server's even-width calls cost on a bundle with int8 activations.

A bundle of `step_width` 2 (runtime/graphs/stack.py) pads every server-side target call to an even
number of positions (serve/batching.py): an odd verify round [last, d_1..d_γ] runs one copy
of its last token more. This runs the server's own round function (`forward_rounds`, the
worker's forward) on the bundle's verifier graphs over a KV pool padded as the server pads
it (`step_width` 2) and over one that is not (`step_width` 1, what the server ran before;
not lossless on such bundles), for rounds of γ = 0..4 drafts, one session alone and
`--sessions` sessions batched, each row `--context` positions deep. It reports the CPU time
of this (single-threaded) process per round, the two pools alternating round by round so
load drifts hit both, and their ratio.

    python -m benchmarks.server_steps BUNDLE --threads 1 --json benchmarks/results/server_steps.json
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np

from benchmarks.lib.flags import add_common, listed, parser
from benchmarks.lib.machine import load_line, log
from benchmarks.lib.tables import table_header, table_row, write_result


def main() -> None:
    import edgespec
    from edgespec.runtime.graphs.kv_cache import KVPool
    from edgespec.serve.batching import forward_alone, forward_rounds

    ap = parser(__doc__)
    ap.add_argument("bundle", type=Path)
    add_common(ap, threads=1)
    ap.add_argument("--context", type=int, default=96, help="positions in each row")
    ap.add_argument("--sessions", type=int, default=4, help="rows verified together")
    ap.add_argument("--gammas", default="0,1,2,3,4")
    ap.add_argument("--repeats", type=int, default=40, help="rounds per pool and γ")
    args = ap.parse_args()
    model = edgespec.load(args.bundle, mode="ar", threads=args.threads)
    target = model.target
    assert target is not None
    stages, m = target.stages, target.model
    log(f"{args.bundle}: step_width {target.step_width}; {load_line()}")
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, m.vocab_size, args.context) for _ in range(args.sessions)]

    def pool(step: int) -> KVPool:
        p = KVPool.allocate(target.layers, m.num_kv_heads, m.head_dim, args.context + 16,
                            args.sessions, stages[0].kv_dtype, step)  # fmt: skip
        for slot, ids in enumerate(prompts):
            forward_alone(stages, p, slot, ids)
        return p

    pools = {1: pool(1), 2: pool(2)}
    rows = []
    print(table_header(["γ", "sessions", "ms CPU / round, step 1", "step 2", "ratio"], "rrrrr"))
    for gamma in listed(args.gammas, int):
        for sessions in (1, args.sessions):
            ms: dict[int, list[float]] = {1: [], 2: []}
            for _ in range(args.repeats):
                for step, p in pools.items():
                    work = [(s, rng.integers(3, m.vocab_size, gamma + 1)) for s in range(sessions)]
                    start = time.process_time()
                    forward_rounds(stages, p, work)
                    ms[step].append((time.process_time() - start) * 1e3 / sessions)
                    for s in range(sessions):
                        p.truncate(s, args.context)
            a, b = statistics.median(ms[1]), statistics.median(ms[2])
            spread = [statistics.quantiles(ms[k], n=4) for k in (1, 2)]
            rows.append(dict(gamma=gamma, sessions=sessions, step1_ms=a, step2_ms=b,
                             ratio=b / a, quartiles=spread))  # fmt: skip
            print(table_row([gamma, sessions, f"{a:.2f}", f"{b:.2f}", f"{b / a:.2f}x"]))
    print(load_line())
    write_result(args.json, args, {"rounds": rows})


if __name__ == "__main__":
    main()
