"""Token trees in split mode against chains, through the channel emulator.

Starts `edgespec serve BUNDLE` (a bundle exported with `--tree-verify`: the server offers
trees), puts the channel emulator (`edgespec.tools.channel`) in front of it at `--rtt` ms and
`--bandwidth` Mbit/s, and decodes the requests of `benchmarks.lib.copy_workloads` (plain
completions where model-free drafting matters: code editing, agent-like requests) greedily
with split mode and a model-free drafter, three ways, request by request in turns:

  chains        `trees="off"`, the channel-aware policy (what split mode did before)
  trees auto    `trees="auto"`: `SplitTrees` plans a tree where its pricing (the drafter's
                measured acceptance per depth and rank, the channel-aware policy's measured
                round time per width) beats the best chain, else the chain
  trees always  every server round a probe tree (the chain the policy plans plus 3 side
                candidates): the shape the mechanism can reach, whatever the pricing says

Per way: decode tokens, round trips (VERIFY rounds the server answered), tokens per round,
round trips saved against chains for the same tokens (1 - trips / chain trips), tree
rounds, side branches kept, tokens/s over the wall time of the decodes (the emulated round
trip dominates it), and whether every text equals `ar`'s.

    python -m benchmarks.split_trees --bundle B --rtt 50 \\
        --json benchmarks/results/split_trees.json
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from benchmarks.lib.copy_workloads import CODE
from benchmarks.lib.flags import add_common, parser
from benchmarks.lib.machine import load_line, log
from benchmarks.lib.serving import server
from benchmarks.lib.tables import write_result
from edgespec.tools.channel import Channel, ChannelConfig

WAYS = ("chains", "trees auto", "trees always")


def load(bundle: Path, url: str, drafter: str, way: str, threads: int) -> Any:
    import edgespec

    model = edgespec.load(
        bundle,
        mode="split",
        server=url,
        drafter=drafter,
        trees="off" if way == "chains" else "auto",
        draft_policy="channel-aware",  # every round on the server
        threads=threads,
        local_fallback=False,
        timeout=30.0,
    )
    if way == "trees always":
        model.policy.probe_every, model.policy.probe_until = 1, float("inf")
    return model


def decode(models: dict[str, Any], prompts: list[list[int]], n_new: int) -> dict[str, Any]:
    sums = {w: {"tokens": 0, "trips": 0, "tree_rounds": 0, "seconds": 0.0} for w in models}
    texts: dict[str, list[list[int]]] = {w: [] for w in models}
    for i, ids in enumerate(prompts):
        order = list(models)[i % len(models) :] + list(models)[: i % len(models)]
        for way in order:
            start = time.perf_counter()
            out = models[way].generate(ids, max_new_tokens=n_new, ignore_eos=True)
            s = sums[way]
            s["seconds"] += time.perf_counter() - start
            s["tokens"] += len(out.tokens)
            s["trips"] += out.stats.remote_rounds
            s["tree_rounds"] += out.stats.tree_rounds
            texts[way].append(out.tokens)
    return {"sums": sums, "texts": texts}


def main() -> None:
    p = parser(__doc__)
    add_common(p, threads=1)
    p.add_argument("--bundle", type=Path, required=True, help="a bundle with tree graphs")
    p.add_argument("--rtt", type=float, default=50.0, help="ms")
    p.add_argument("--bandwidth", type=float, default=10.0, help="Mbit/s")
    p.add_argument("--n-new", type=int, default=64)
    p.add_argument("--drafters", default="suffix,lookup")
    p.add_argument("--workloads", default="code-edit,agent", help="of " + ",".join(CODE))
    args = p.parse_args()
    import edgespec

    log(load_line())
    ar = edgespec.load(args.bundle, threads=args.threads)
    prompts = [ar.encode(t) for w in args.workloads.split(",") for t in CODE[w]]
    want = [ar.generate(ids, max_new_tokens=args.n_new, ignore_eos=True).tokens for ids in prompts]
    data: dict[str, Any] = {"rtt_ms": args.rtt, "bandwidth_mbit": args.bandwidth}
    with (
        server(args.bundle, args.threads, 16, quiet=True) as port,
        Channel(f"127.0.0.1:{port}") as channel,
    ):
        channel.config = ChannelConfig(rtt_ms=args.rtt, bandwidth_mbit=args.bandwidth)
        url = f"ws://{channel.address}"
        for drafter in args.drafters.split(","):
            models = {w: load(args.bundle, url, drafter, w, args.threads) for w in WAYS}
            for m in models.values():  # connected and warm before the clock
                m.generate(prompts[0], max_new_tokens=4, ignore_eos=True)
            got = decode(models, prompts, args.n_new)
            chain_trips = got["sums"]["chains"]["trips"]
            rows = {}
            for way, s in got["sums"].items():
                policy = models[way].policy
                rows[way] = {
                    **s,
                    "tokens_per_round": round(s["tokens"] / max(s["trips"], 1), 3),
                    "trips_saved": round(1 - s["trips"] / max(chain_trips, 1), 3),
                    "side_branches_kept": getattr(policy, "side_taken", 0),
                    "tokens_per_s": round(s["tokens"] / s["seconds"], 2),
                    "same_as_ar": got["texts"][way] == want,
                }
                log(
                    f"{drafter:7} {way:13} {s['tokens']} tokens in {s['trips']} trips "
                    f"({rows[way]['tokens_per_round']:.2f}/trip, saved "
                    f"{rows[way]['trips_saved']:+.1%}), {s['tree_rounds']} tree rounds, "
                    f"{rows[way]['side_branches_kept']} side kept, "
                    f"{rows[way]['tokens_per_s']:.1f} tok/s, same as ar "
                    f"{rows[way]['same_as_ar']}"
                )
            data[drafter] = rows
    log(load_line())
    write_result(args.json, args, data)


if __name__ == "__main__":
    main()
