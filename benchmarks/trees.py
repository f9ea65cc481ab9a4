"""Model-free drafters as chains and as trees: prompt lookup, SuffixDecoding, Token Recycling.

Workloads where a model with no draft model can only speed up by copying: a multi-turn chat
whose later turns quote the earlier replies, code editing (return the whole function again,
changed), rewriting / summarising a given text, and repeated agent-like requests (the same
extraction over and over). Per bundle (a chat model: SmolLM2-135M-Instruct; a completion model:
the trained code model of tests/fixtures/code_model), three measurements:

* replay (offline, `lib.tree_replay`): the target's greedy output of each request is the truth;
  each drafter proposes chains and trees round by round against it, giving tokens per target
  forward, the mean verify width, the drafting CPU time, and acceptance per depth and branch;
* the verify cost curve T(width): the target's forward over `width` new positions after a
  256-token context, CPU seconds of this single-threaded process, median of several;
* end to end: each chain drafter decoding for real (`Model.load(mode=...)`, policy `auto`),
  modes in turns request by request, decode tokens per CPU second (after the prefill), as a
  ratio to prompt lookup and to `ar` in the same run, and whether its text equals `ar`'s.

From replay and the curve, the projection: tokens/s = tokens per forward / (t_draft +
T(width)), with T measured here and with T flat (every width costs T(1), a launch-bound step).

    python -m benchmarks.trees --chat-bundle B --json benchmarks/results/trees.json
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.lib.copy_workloads import CHAT, CODE, requests
from benchmarks.lib.flags import add_common, listed, parser
from benchmarks.lib.machine import load_line, log
from benchmarks.lib.tables import write_result
from benchmarks.lib.timing import decode_in_turns
from benchmarks.lib.tree_replay import ReplayStats, projected, replay, verify_curve

CODE_MODEL = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "code_model"
DRAFTERS = ("lookup", "suffix", "recycle")  # modes, end to end
# replayed: the modes' drafters, SuffixDecoding from the longest match alone, and Token
# Recycling's trees scored by the recorded softmax instead of by rank
REPLAYED = ("lookup", "suffix", "suffix-longest", "recycle", "recycle-softmax")


def target_rows(ar: Any, ids: list[int]) -> Any:
    """The target's logits after each prefix of ids (what verifying them would score)."""
    import numpy as np

    target = ar.target
    target.reset(len(ids) + 1)
    return target.forward(np.asarray(ids, np.int64), keep=len(ids))


def new_drafter(name: str) -> Any:
    from edgespec.runtime.drafters.lookup import LookupDrafter
    from edgespec.runtime.drafters.recycling import RECYCLE, RecyclingDrafter
    from edgespec.runtime.drafters.suffix import SUFFIX, SuffixDrafter, SuffixStore

    if name == "lookup":
        return LookupDrafter()
    if name.startswith("suffix"):
        config = replace(SUFFIX, backoff=name == "suffix")
        return SuffixDrafter(SuffixStore(config), config)
    if name == "recycle-softmax":
        return RecyclingDrafter(config=replace(RECYCLE, rank_scores=()))
    return RecyclingDrafter()


def replays(
    truths: list[tuple[list[int], int, Any]], shapes: list[tuple[str, int, int]]
) -> dict[str, dict[str, ReplayStats]]:
    """Per drafter and shape ("chain:γ" or "tree:budget/depth"): the workload's requests
    replayed in order by one drafter (its store or table carried from request to request)."""
    out: dict[str, dict[str, ReplayStats]] = {}
    for name in REPLAYED:
        for kind, budget, depth in shapes:
            drafter, total = new_drafter(name), ReplayStats()
            for tokens, prompt_length, rows in truths:
                rows = rows if name.startswith("recycle") else None
                total.add(
                    replay(drafter, tokens, prompt_length, budget, depth, kind == "tree", rows)
                )
            label = f"chain:{depth}" if kind == "chain" else f"tree:{budget}/{depth}"
            out.setdefault(name, {})[label] = total
    return out


def end_to_end(models: dict[str, Any], prompts: list[list[int]], n_new: int, repeats: int):
    """Decode tokens per CPU second per mode (modes in turns, request by request)."""
    runs = decode_in_turns(models, prompts, n_new, repeats)
    out = {mode: d.row(runs["ar"], "drafted", "accepted") for mode, d in runs.items()}
    for mode in models:
        for base in ("ar", "lookup"):
            b = out[base]["decode_tokens_per_cpu_s"]
            out[mode][f"x_{base}"] = round(out[mode]["decode_tokens_per_cpu_s"] / b, 3)
    return out


def _best(rows: dict[str, Any], kind: str, curve: str) -> tuple[str, float]:
    kept = {k: v["projected_tokens_per_s"][curve] for k, v in rows.items() if k.startswith(kind)}
    label = max(kept, key=lambda k: kept[k])
    return label, kept[label]


def best_shapes(table: dict[str, Any]) -> dict[str, Any]:
    """Per drafter and cost curve: the best chain and the best tree by projected tokens/s,
    and the tree's ratio to the chain."""
    out: dict[str, Any] = {}
    for drafter in REPLAYED:
        rows = {k.split(" ", 1)[1]: v for k, v in table.items() if k.split(" ", 1)[0] == drafter}
        if not rows:
            continue
        for curve in ("measured", "flat"):
            (chain, c), (tree, t) = _best(rows, "chain", curve), _best(rows, "tree", curve)
            out.setdefault(drafter, {})[curve] = {
                "chain": chain,
                "tree": tree,
                "tree_over_chain": round(t / c, 3),
            }
    return out


def run_bundle(bundle: Path, chat: bool, args: Any) -> dict[str, Any]:
    from edgespec.runtime.model import Model

    log(f"{bundle}: loading")
    threads = args.threads
    ar = Model.load(bundle, mode="ar", threads=threads)
    workloads = CHAT if chat else CODE
    shapes = [("chain", 0, g) for g in listed(args.chains, int)]
    shapes += [("tree", b, d) for b, d in (listed(s, int) for s in args.trees.split(";"))]
    curve = verify_curve(ar, listed(args.widths, int), args.repeats_curve)
    log(f"verify cost (CPU ms): { {w: round(1e3 * t, 2) for w, t in curve.items()} }")
    models = {m: Model.load(bundle, mode=m, threads=threads) for m in ("ar", *DRAFTERS)}
    result: dict[str, Any] = {"verify_cpu_s": {str(w): t for w, t in curve.items()}}
    for name, workload in workloads.items():
        prompts = requests(ar, ar, workload, chat, args.n_new)
        truths = []
        for ids in prompts:
            reply = ar.generate(ids, max_new_tokens=args.n_new)
            tokens = ids + reply.tokens
            truths.append((tokens, len(ids), target_rows(ar, tokens)))
        replayed = replays(truths, shapes)
        table: dict[str, Any] = {}
        for drafter, by_shape in replayed.items():
            for label, stats in by_shape.items():
                row = stats.as_json()
                row["projected_tokens_per_s"] = {
                    k: round(v, 1) for k, v in projected(stats, curve).items()
                }
                table[f"{drafter} {label}"] = row
                log(
                    f"{name:10} {drafter:8} {label:12} tokens/forward "
                    f"{stats.tokens_per_forward:5.2f}  width {stats.mean_width:5.1f}  "
                    f"draft {stats.draft_ms_per_round:6.3f} ms  "
                    f"projected tok/s measured {row['projected_tokens_per_s']['measured']:7.1f}"
                    f" flat {row['projected_tokens_per_s']['flat']:7.1f}"
                )
        best = best_shapes(table)
        for drafter, curves in best.items():
            log(
                f"{name:10} {drafter:15} tree/chain measured "
                f"{curves['measured']['tree_over_chain']:.2f}  flat "
                f"{curves['flat']['tree_over_chain']:.2f} ({curves['flat']['tree']} vs "
                f"{curves['flat']['chain']})"
            )
        e2e = end_to_end(models, prompts, args.n_new, args.repeats)
        for mode, row in e2e.items():
            log(
                f"{name:10} e2e {mode:8} {row['decode_tokens_per_cpu_s']:7.1f} tok/CPU-s  "
                f"x lookup {row['x_lookup']:.2f}  x ar {row['x_ar']:.2f}  "
                f"same as ar {row['same_as_ar']}"
            )
        result[name] = {
            "requests": len(prompts),
            "output_tokens": sum(len(t) - p for t, p, _ in truths),
            "replay": table,
            "best": best,
            "end_to_end": e2e,
        }
    return result


def main() -> None:
    p = parser(__doc__)
    add_common(p, threads=1)
    p.add_argument("--chat-bundle", type=Path, default=None, help="a chat model's bundle")
    p.add_argument("--code-bundle", type=Path, default=CODE_MODEL, help="a completion model")
    p.add_argument("--n-new", type=int, default=128)
    p.add_argument("--repeats", type=int, default=2, help="end-to-end passes")
    p.add_argument("--chains", default="4,8", help="chain lengths replayed")
    p.add_argument("--trees", default="8,4;16,6;32,8;64,8", help="budget,depth;... replayed")
    p.add_argument("--widths", default="1,2,4,8,16,32,64", help="verify widths measured")
    p.add_argument("--repeats-curve", type=int, default=7)
    args = p.parse_args()
    log(load_line())
    data: dict[str, Any] = {}
    if args.code_bundle:
        data["code"] = run_bundle(args.code_bundle, chat=False, args=args)
    if args.chat_bundle:
        data["chat"] = run_bundle(args.chat_bundle, chat=True, args=args)
    log(load_line())
    write_result(args.json, args, data)


if __name__ == "__main__":
    main()
