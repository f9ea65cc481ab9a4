"""The verify cost per width T(w): a chain in the chain graph, the same chain in the tree
graph, and a bushy tree of the same width in the tree graph.

Is a tree forward dearer than a chain forward of the same width? For each `--widths` w (new
positions per call, the root included) on a `--shape` model (`lib.models.SHAPES`, random
weights, exported with `--tree-verify`) after a `--past`-token cache: the CPU time of one
call (time.process_time of a single-threaded run: the other processes on a shared machine
do not count), median over `--repeats` calls, each followed by a truncation back to the
past; the three calls take turns, and the ratio is the median of each turn's ratio (with
its interquartile range: the run's spread).

    python -m benchmarks.tree_cost --shape smollm2-135m --widths 1,2,4,8,16 \\
        --json benchmarks/results/tree_cost.json

`--bundle B` times a bundle's own graphs instead (a real model's quantized blocks: what a
verify round costs there against a one-token step, `over_one`); the tree columns only where
the bundle was exported with `--tree-verify`.
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
    p.add_argument("--bundle", default=None, help="a bundle's graphs instead of --shape's")
    p.add_argument("--widths", default="1,2,4,8,16")
    p.add_argument("--past", type=int, default=256)
    p.add_argument("--repeats", type=int, default=30)
    args = p.parse_args()

    from edgespec.runtime.graphs.opener import GraphOptions, open_bundle
    from edgespec.runtime.graphs.stack import Stack
    from edgespec.runtime.graphs.tree_verify import tree_feed
    from edgespec.runtime.tree import TokenTree

    bundle = args.bundle or shape_bundle(checkpoint(args.shape), "fp32", tree_verify=True)
    graphs = open_bundle(bundle, GraphOptions(threads=args.threads))
    trees = bool(graphs.manifest.tree_graphs)
    stack = Stack([graphs.open("full")],
                  tree_stages=(lambda: [graphs.open_tree("full")]) if trees else None)  # fmt: skip
    stack.reset(args.past + 64)
    stack.forward(np.arange(args.past, dtype=np.int64) % 1000 + 5, keep=0)

    def cpu_ms(calls: list) -> list[list[float]]:
        """Per call, its CPU ms in each repeat; the calls take turns, so a busy spell of the
        machine falls on all of them alike."""
        times: list[list[float]] = [[] for _ in calls]
        for r in range(args.repeats + 3):
            for j, call in enumerate(calls):
                t = time.process_time()
                call()
                if r >= 3:  # the first calls bind and allocate
                    times[j].append(1000 * (time.process_time() - t))
                stack.truncate(args.past)
        return times

    rows, start = [], args.past + 1
    for w in flags.listed(args.widths, int):
        ids = np.arange(w, dtype=np.int64) + 5
        chain, tree = TokenTree.chain(ids[1:].tolist()), TokenTree(*bushy(w))
        calls = [lambda ids=ids, w=w: stack.forward(ids, keep=w)]
        if trees:
            calls += [
                lambda t=chain, w=w: stack.forward_tree(*tree_feed(5, t, start), keep=w),
                lambda t=tree, w=w: stack.forward_tree(*tree_feed(5, t, start), keep=w),
            ]
        c, *more = cpu_ms(calls)
        row = {"width": w, "chain_ms": statistics.median(c)}
        row["over_one"] = row["chain_ms"] / rows[0]["chain_ms"] if rows else 1.0
        if trees:
            tc, tb = more
            ratio = [b / a for a, b in zip(c, tb, strict=True)]
            q1, _, q3 = statistics.quantiles(ratio, n=4)
            row.update(
                tree_graph_chain_ms=statistics.median(tc),
                tree_graph_bushy_ms=statistics.median(tb),
                bushy_over_chain=statistics.median(ratio),
                bushy_over_chain_iqr=[q1, q3],
            )
        rows.append(row)
        log(f"w={w}: {row}")
    what = f"{args.bundle}" if args.bundle else f"{args.shape}, fp32"
    setup = f"{what}, {args.threads} thread(s), past {args.past}"
    print(f"{setup}; {cpu_name()}; {load_line()}")
    if not trees:
        print(table(["width", "chain graph ms", "over width 1"], "rrr",
                    [[r["width"], f"{r['chain_ms']:.2f}", f"{r['over_one']:.2f}"]
                     for r in rows]))  # fmt: skip
        write_result(args.json, args, {"rows": rows})
        return
    print(
        table(
            ["width", "chain graph ms", "tree graph, chain ms", "tree graph, bushy ms",
             "bushy / chain (median of pairs)", "IQR"],
            "rrrrrr",
            [
                [r["width"], f"{r['chain_ms']:.2f}", f"{r['tree_graph_chain_ms']:.2f}",
                 f"{r['tree_graph_bushy_ms']:.2f}", f"{r['bushy_over_chain']:.2f}",
                 "{:.2f}-{:.2f}".format(*r["bushy_over_chain_iqr"])]
                for r in rows
            ],
        )
    )  # fmt: skip
    write_result(args.json, args, {"rows": rows})


if __name__ == "__main__":
    main()
