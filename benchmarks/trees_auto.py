"""Trees sized by measurement, end to end: each model-free drafter with `trees="auto"` (the tree
policy choosing the best chain or a tree each round from T(nodes) and acceptance per depth and
rank measured as it decodes) against the same drafter on chains (`trees="off"`, policy `auto`),
on the chat workloads of `benchmarks.trees` (multi-turn quoting, code editing, rewriting,
agent-like requests) with a bundle exported with `--tree-verify`.

Per workload and mode: decode tokens per CPU second of this single-threaded process (after the
prefill; modes in turns, request by request), the ratio trees-auto / chains in the same run,
the share of rounds that verified a tree, and whether the text equals `ar`'s. Then the tree
policy's own projection on a flat cost curve: with the acceptance per depth and rank it
measured, every round priced at its measured one-node cost (a launch-bound step), the
expected tokens per second of its best tree over its best chain.

    python -m benchmarks.trees_auto --bundle B --json benchmarks/results/trees_auto.json
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from benchmarks.lib.copy_workloads import CHAT, requests
from benchmarks.lib.flags import add_common, parser
from benchmarks.lib.machine import load_line, log
from benchmarks.lib.tables import write_result

DRAFTERS = ("lookup", "suffix", "recycle")


def decode(models: dict[str, Any], prompts: list[list[int]], n_new: int, repeats: int):
    """Per mode: decode tokens per CPU second, tree rounds / rounds, texts of the first pass."""
    cpu = {m: 0.0 for m in models}
    counts = {m: [0, 0, 0] for m in models}  # tokens, rounds, tree rounds
    texts: dict[str, list[list[int]]] = {m: [] for m in models}
    for r in range(repeats):
        for i, ids in enumerate(prompts):
            order = list(models)[i + r :] + list(models)[: i + r]
            for mode in order:
                got, first, start = [], None, time.process_time()
                for chunk in models[mode].stream(ids, max_new_tokens=n_new):
                    if first is None:
                        first = time.process_time()
                    else:
                        counts[mode][1] += 1
                        counts[mode][2] += chunk.stats.tree_nodes > 0
                    got += chunk.tokens
                cpu[mode] += time.process_time() - (first or start)
                counts[mode][0] += len(got) - 1
                if r == 0:
                    texts[mode].append(got)
    out = {}
    for mode in models:
        tokens, rounds, trees = counts[mode]
        out[mode] = {
            "decode_tokens_per_cpu_s": round(tokens / cpu[mode], 2) if cpu[mode] else 0.0,
            "rounds": rounds,
            "tree_rounds": trees,
            "same_as_ar": texts[mode] == texts["ar"],
        }
    return out


def flat_projection(policy: Any) -> dict[str, Any] | None:
    """The tree policy's best chain and best tree, every round priced at its one-node cost."""
    from edgespec.runtime.tree_policy import TreePolicy, best_shapes

    if not isinstance(policy, TreePolicy) or policy.cost.t_draft is None:
        return None
    one = policy.cost.cost(1)
    chain, tree = best_shapes(policy.acceptance.table(), lambda n: one, policy.max_length)
    ratio = tree.rate / chain.rate if tree is not None else 1.0
    return {
        "chain_nodes": chain.nodes,
        "tree": None if tree is None else f"{tree.nodes} nodes, {tree.depth} deep",
        "tree_over_chain": round(ratio, 3),
        "rank1_offers": round(policy.acceptance.measured(1), 1),
    }


def main() -> None:
    p = parser(__doc__)
    add_common(p, threads=1)
    p.add_argument("--bundle", type=Path, required=True, help="a chat bundle with tree graphs")
    p.add_argument("--n-new", type=int, default=128)
    p.add_argument("--repeats", type=int, default=2, help="passes over the requests")
    p.add_argument("--workloads", default=",".join(CHAT), help="which of " + ",".join(CHAT))
    args = p.parse_args()
    from edgespec.runtime.model import Model

    log(load_line())
    load = {"threads": args.threads}
    data: dict[str, Any] = {}
    for name in args.workloads.split(","):
        # fresh models per workload: what a drafter learned elsewhere does not carry over
        models = {"ar": Model.load(args.bundle, mode="ar", **load)}
        for d in DRAFTERS:
            models[d] = Model.load(args.bundle, mode=d, trees="off", **load)
            models[f"{d}+trees"] = Model.load(args.bundle, mode=d, trees="auto", **load)
        ar = models["ar"]
        prompts = requests(ar, ar, CHAT[name], True, args.n_new)
        rows = decode(models, prompts, args.n_new, args.repeats)
        for d in DRAFTERS:
            auto, chain = rows[f"{d}+trees"], rows[d]
            auto["x_chain"] = round(
                auto["decode_tokens_per_cpu_s"] / chain["decode_tokens_per_cpu_s"], 3
            )
            auto["flat_projection"] = flat_projection(models[f"{d}+trees"].policy)
            log(
                f"{name:10} {d:8} chains {chain['decode_tokens_per_cpu_s']:7.1f} tok/CPU-s  "
                f"trees-auto {auto['decode_tokens_per_cpu_s']:7.1f} (x{auto['x_chain']:.2f}, "
                f"{auto['tree_rounds']}/{auto['rounds']} tree rounds)  same as ar "
                f"{chain['same_as_ar']}/{auto['same_as_ar']}  flat projection "
                f"{auto['flat_projection']}"
            )
        data[name] = {"requests": len(prompts), "end_to_end": rows}
    log(load_line())
    write_result(args.json, args, data)


if __name__ == "__main__":
    main()
