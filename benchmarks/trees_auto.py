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

from pathlib import Path
from typing import Any

from benchmarks.lib.copy_workloads import CHAT, requests
from benchmarks.lib.flags import add_common, parser
from benchmarks.lib.machine import load_line, log
from benchmarks.lib.tables import write_result
from benchmarks.lib.timing import decode_in_turns

DRAFTERS = ("lookup", "suffix", "recycle")


def decode(models: dict[str, Any], prompts: list[list[int]], n_new: int, repeats: int):
    """Per mode: decode tokens per CPU second, tree rounds / rounds, texts of the first pass."""
    runs = decode_in_turns(models, prompts, n_new, repeats)
    return {mode: d.row(runs["ar"], "rounds", "tree_rounds") for mode, d in runs.items()}


def flat_projection(policy: Any) -> dict[str, Any] | None:
    """The tree policy's best chain and best tree, every round priced at its one-node cost."""
    from edgespec.runtime.policies.trees import TreePolicy, best_shapes

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
