"""Dynamic trees from a drafting model against its chains, on the trained pair.

The draft model (`spec`) and a standalone early exit (`exit:K`, head@K alone) draft a spine as
their chain and add runner-ups where their row splits (`runtime/drafters/model_tree.py`). Three
measurements on the trained pair's held-out code and text prompts:

* replay (offline, `lib.tree_replay`): the target's greedy output of each prompt is the truth;
  the drafter proposes chains of γ and trees (spine `depth`, at most `budget` nodes) round by
  round against it: tokens per target forward, the mean verify width, drafting CPU ms a round
  (one draft step per spine token; the side leaves cost a softmax over the row), and
  acceptance per depth and rank (rank 0: the spine, rank r: the r-th runner-up);
* the verify cost curve T(width): the target's forward over `width` new positions after a
  256-token context, CPU seconds of this single-threaded process, median of several;
* end to end on a copy of the bundle with tree graphs: `--mode spec` with trees off (the
  `auto` chain), `auto` and `on` (a tree every drafting round), modes in turns prompt by
  prompt, decode tokens per CPU second after the prefill, as a ratio to trees off and to
  `ar` in the same run, and whether the text equals `ar`'s (after one untimed generation
  each: the first tree opens the tree graphs, a one-off second of CPU).

From replay and the curve, the projection: tokens/s = tokens per forward / (t_draft +
T(width)), with T measured here and with T flat (every width costs T(1), a launch-bound step).

    python -m benchmarks.model_trees --json benchmarks/results/model_trees.json
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from benchmarks.lib.flags import add_common, listed, parser
from benchmarks.lib.machine import load_line, log
from benchmarks.lib.models import EXITS, TRAINED, cached_bundle, load_prompts, trained_pair
from benchmarks.lib.tables import write_result
from benchmarks.lib.tree_replay import ReplayStats, projected, replay, verify_curve

# "trees off again": a second copy of the baseline, whose ratio to the first is the spread
# between two identical adaptive runs (each policy follows its own measurements)
MODES = {"trees off": "off", "trees off again": "off", "trees auto": "auto", "trees on": "on"}


def tree_bundle(models: Path) -> Path:
    """The trained pair with tree-verification graphs (draft, exits, `--tree-verify`)."""
    folder = models / "bundle-trees"
    cached_bundle(
        models / "target", folder, draft=models / "draft", exit_layers=EXITS, tree_verify=True
    )
    return folder


def drafter(graphs: Any, role: str) -> Any:
    """The `draft` graph, or `head@K` alone, as a model drafter that also drafts trees."""
    from edgespec.runtime.drafters.base import ModelDrafter
    from edgespec.runtime.drafters.model_tree import ModelTrees
    from edgespec.runtime.graphs.stack import Stack

    logits = "logits" if role == "draft" else "exit_logits"
    return ModelTrees(ModelDrafter(Stack([graphs.open(role)], logits=logits)))


def replays(
    graphs: Any, roles: list[str], truths: list[tuple[list[int], int]], shapes: list[tuple]
) -> dict[str, ReplayStats]:
    out = {}
    for role in roles:
        d = drafter(graphs, role)
        for kind, budget, depth in shapes:
            total = ReplayStats()
            for tokens, prompt_length in truths:
                total.add(replay(d, tokens, prompt_length, budget, depth, kind == "tree"))
            label = f"chain:{depth}" if kind == "chain" else f"tree:{budget}/{depth}"
            out[f"{role} {label}"] = total
    return out


def best(table: dict[str, Any], roles: list[str]) -> dict[str, Any]:
    """Per drafter and cost curve: the best chain and the best tree by projected tokens/s,
    and the tree's ratio to the chain."""
    out: dict[str, Any] = {}
    for role in roles:
        for curve in ("measured", "flat"):
            rates = {
                k.split(" ", 1)[1]: v["projected_tokens_per_s"][curve]
                for k, v in table.items()
                if k.split(" ", 1)[0] == role
            }
            chain = max((k for k in rates if k.startswith("chain")), key=rates.__getitem__)
            tree = max((k for k in rates if k.startswith("tree")), key=rates.__getitem__)
            out.setdefault(role, {})[curve] = {
                "chain": chain,
                "tree": tree,
                "tree_over_chain": round(rates[tree] / rates[chain], 3),
            }
    return out


def end_to_end(
    bundle: Path, prompts: list[list[int]], n_new: int, threads: int, repeats: int
) -> dict:
    import edgespec

    models = {"ar": edgespec.load(bundle, mode="ar", threads=threads)}
    for name, trees in MODES.items():
        models[name] = edgespec.load(bundle, mode="spec", trees=trees, threads=threads)
    for model in models.values():  # untimed: opening the tree graphs is a one-off
        model.generate(prompts[0], max_new_tokens=16, ignore_eos=True)
    cpu = dict.fromkeys(models, 0.0)
    tokens = dict.fromkeys(models, 0)
    texts: dict[str, list[list[int]]] = {m: [] for m in models}
    tree_rounds = dict.fromkeys(models, 0)
    for i, ids in enumerate(prompts * repeats):
        order = list(models)[i % len(models) :] + list(models)[: i % len(models)]
        for mode in order:
            got, first, start = [], None, time.process_time()
            for chunk in models[mode].stream(ids, max_new_tokens=n_new, ignore_eos=True):
                if first is None:
                    first = time.process_time()
                else:
                    tree_rounds[mode] += chunk.stats.tree_nodes > 0
                got += chunk.tokens
            cpu[mode] += time.process_time() - (first or start)
            tokens[mode] += len(got) - 1
            if i < len(prompts):
                texts[mode].append(got)
    out: dict[str, Any] = {}
    for mode in models:
        out[mode] = {
            "decode_tokens_per_cpu_s": round(tokens[mode] / cpu[mode], 1),
            "tree_rounds": tree_rounds[mode],
            "same_as_ar": texts[mode] == texts["ar"],
        }
    for mode in models:
        for base in ("ar", "trees off"):
            rate = out[base]["decode_tokens_per_cpu_s"]
            out[mode][f"x_{base.replace(' ', '_')}"] = round(
                out[mode]["decode_tokens_per_cpu_s"] / rate, 3
            )
    return out


def main() -> None:
    p = parser(__doc__)
    add_common(p, threads=1)
    p.add_argument("--prompts", type=int, default=4, help="per style (code, text)")
    p.add_argument("--n-new", type=int, default=96)
    p.add_argument("--roles", default="draft,head@2,head@4", help="drafters replayed")
    p.add_argument("--chains", default="2,3,4,6", help="chain lengths replayed")
    p.add_argument("--trees", default="5,2;6,3;8,3;7,4;10,4;9,6", help="budget,depth;...")
    p.add_argument("--widths", default="1,2,3,4,5,6,7,8,10,12,16", help="verify widths")
    p.add_argument("--repeats-curve", type=int, default=7)
    p.add_argument("--repeats", type=int, default=2, help="end-to-end passes")
    p.add_argument("--no-end-to-end", action="store_true")
    args = p.parse_args()
    log(load_line())
    import edgespec
    from edgespec.runtime.graphs.opener import GraphOptions, open_bundle

    models = trained_pair(TRAINED)
    bundle = tree_bundle(models)
    ar = edgespec.load(bundle, mode="ar", threads=args.threads)
    curve = verify_curve(ar, listed(args.widths, int), args.repeats_curve)
    log(f"verify cost (CPU ms): { {w: round(1e3 * t, 3) for w, t in curve.items()} }")
    graphs = open_bundle(bundle, GraphOptions(threads=args.threads))
    shapes = [("chain", 0, g) for g in listed(args.chains, int)]
    shapes += [("tree", b, d) for b, d in (listed(s, int) for s in args.trees.split(";"))]
    data: dict[str, Any] = {"verify_cpu_s": {str(w): t for w, t in curve.items()}}
    for style in ("code", "text"):
        texts = load_prompts(models / f"prompts_{style}.jsonl", args.prompts)
        prompts = [ar.encode(t) for t in texts]
        truths = []
        for ids in prompts:
            reply = ar.generate(ids, max_new_tokens=args.n_new, ignore_eos=True)
            truths.append((ids + reply.tokens, len(ids)))
        table: dict[str, Any] = {}
        roles = listed(args.roles)
        for label, stats in replays(graphs, roles, truths, shapes).items():
            row = stats.as_json()
            row["projected_tokens_per_s"] = {
                k: round(v, 1) for k, v in projected(stats, curve).items()
            }
            table[label] = row
            log(
                f"{style:5} {label:20} tokens/forward {stats.tokens_per_forward:5.2f}  "
                f"width {stats.mean_width:5.1f}  draft {stats.draft_ms_per_round:6.3f} ms  "
                f"projected tok/s measured {row['projected_tokens_per_s']['measured']:7.1f}"
                f" flat {row['projected_tokens_per_s']['flat']:7.1f}"
            )
        summary = best(table, roles)
        for role, curves in summary.items():
            log(
                f"{style:5} {role:8} best tree / best chain: measured "
                f"{curves['measured']['tree_over_chain']:.2f} ({curves['measured']['tree']} vs "
                f"{curves['measured']['chain']}), flat {curves['flat']['tree_over_chain']:.2f} "
                f"({curves['flat']['tree']} vs {curves['flat']['chain']})"
            )
        data[style] = {"replay": table, "best": summary}
        if not args.no_end_to_end:
            e2e = end_to_end(bundle, prompts, args.n_new, args.threads, args.repeats)
            for mode, row in e2e.items():
                log(
                    f"{style:5} e2e {mode:15} {row['decode_tokens_per_cpu_s']:8.1f} tok/CPU-s  "
                    f"x trees off {row['x_trees_off']:.2f}  x ar {row['x_ar']:.2f}  "
                    f"tree rounds {row['tree_rounds']}  same as ar {row['same_as_ar']}"
                )
            data[style]["end_to_end"] = e2e
    log(load_line())
    write_result(args.json, args, data)


if __name__ == "__main__":
    main()
