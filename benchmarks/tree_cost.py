"""The verify cost per width T(w): a chain in the chain graph, the same chain in the tree
graph, and a bushy tree of the same width in the tree graph.

Is a tree forward dearer than a chain forward of the same width? For each `--widths` w (new
positions per call, the root included) on a `--shape` model (`lib.models.SHAPES`, random
weights, exported with `--tree-verify`) after a `--past`-token cache: the CPU time of one
call (time.process_time of a single-threaded run: the other processes on a shared machine
do not count), median over `--repeats` calls, each followed by a truncation back to the past.

    python -m benchmarks.tree_cost --shape smollm2-135m --widths 1,2,4,8,16 \\
        --json benchmarks/results/tree_cost.json
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from benchmarks.lib import flags
from benchmarks.lib.machine import cpu_name, load_line, log
from benchmarks.lib.models import checkpoint, shape_bundle
from benchmarks.lib.tables import table, write_result


def bushy(width: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A tree of width - 1 nodes, two children per node (breadth first)."""
    parents = tuple((i - 1) // 2 if i > 1 else -1 for i in range(width - 1))
    return tuple(range(7, 7 + width - 1)), parents


def main() -> None:
    p = flags.parser(__doc__)
    flags.add_common(p, threads=1)
    p.add_argument("--shape", default="smollm2-135m")
    p.add_argument("--widths", default="1,2,4,8,16")
    p.add_argument("--past", type=int, default=256)
    p.add_argument("--repeats", type=int, default=30)
    args = p.parse_args()

    from edgespec.runtime.opener import GraphOptions, open_bundle
    from edgespec.runtime.stack import Stack
    from edgespec.runtime.tree import TokenTree
    from edgespec.runtime.tree_verify import tree_feed

    bundle = shape_bundle(checkpoint(args.shape), "fp32", tree_verify=True)
    graphs = open_bundle(bundle, GraphOptions(threads=args.threads))
    stack = Stack([graphs.open("full")], tree_stages=lambda: [graphs.open_tree("full")])
    stack.reset(args.past + 64)
    stack.forward(np.arange(args.past, dtype=np.int64) % 1000 + 5, keep=0)

    def cpu_ms(call) -> float:
        times = []
        for _ in range(args.repeats + 3):
            t = time.process_time()
            call()
            times.append(time.process_time() - t)
            stack.truncate(args.past)
        return 1000 * statistics.median(times[3:])  # the first calls bind and allocate

    rows, start = [], args.past + 1
    for w in flags.listed(args.widths, int):
        ids = np.arange(w, dtype=np.int64) + 5
        chain = TokenTree.chain(ids[1:].tolist())
        tree = TokenTree(*bushy(w))
        c = cpu_ms(lambda ids=ids, w=w: stack.forward(ids, keep=w))
        tc = cpu_ms(lambda t=chain, w=w: stack.forward_tree(*tree_feed(5, t, start), keep=w))
        tb = cpu_ms(lambda t=tree, w=w: stack.forward_tree(*tree_feed(5, t, start), keep=w))
        rows.append(
            {"width": w, "chain_ms": c, "tree_graph_chain_ms": tc, "tree_graph_bushy_ms": tb}
        )
        log(f"w={w}: chain {c:.2f} ms, tree graph (chain) {tc:.2f} ms, (bushy) {tb:.2f} ms")
    setup = f"{args.shape}, fp32, {args.threads} thread(s), past {args.past}"
    print(f"{setup}; {cpu_name()}; {load_line()}")
    print(
        table(
            ["width", "chain graph ms", "tree graph, chain ms", "tree graph, bushy ms",
             "bushy / chain"],
            "rrrrr",
            [
                [r["width"], f"{r['chain_ms']:.2f}", f"{r['tree_graph_chain_ms']:.2f}",
                 f"{r['tree_graph_bushy_ms']:.2f}",
                 f"{r['tree_graph_bushy_ms'] / r['chain_ms']:.2f}"]
                for r in rows
            ],
        )
    )  # fmt: skip
    write_result(args.json, args, {"rows": rows})


if __name__ == "__main__":
    main()
