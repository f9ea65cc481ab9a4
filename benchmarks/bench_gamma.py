"""`auto` against every fixed γ on one loaded model: the policies in turns, prompt by prompt.

bench_auto.py times each row in a process of its own, as an app would run one mode. For the
question "is `auto` within 3% of the best fixed γ" that costs precision: identical rows in
separate processes differed by up to 6.6% (stop 30), and on a noisy host a fixed row's passes
spread 1.14-1.49x (stop 32). Here each setup loads ONE model and swaps its draft-length policy
(`Model.policy`) between generations, so every policy decodes on the same sessions in the
same memory; on each prompt the policies take their turns in a shuffled order, so a slow
phase of the host falls on all of them alike. The policies keep what they learned across
prompts, as in an app.

Judged per setup: `auto`'s tok/s (end to end: prefill + 128 new tokens) over the best fixed
γ's, in hindsight and held out. Held out: the γ best on the even prompts, judged on the odd
ones, and the other way round (the mean of the two ratios). Greedy rounds land on the same
tokens in every pass, so which fixed γ reads best on a few prompts is partly luck of where
its rounds fall (8 prompts: fixed:5's rounds gave 4.30 tokens a round, fixed:8's cut at 5
only 4.12), and passes alone cannot take that out; other prompts can.

    python benchmarks/bench_gamma.py --json benchmarks/results/bench_gamma.json
    python benchmarks/bench_gamma.py --setups 'spec:int4' --gammas 3,4,5,6 --passes 2
    python benchmarks/bench_gamma.py --variants warm_rounds=0    # + an `auto` row, for an A/B

Setups: `spec` (the fp32 draft), `spec:int4` / `spec:int8` (the bundle whose draft is
quantized apart, as bench_auto's `--draft-quantize`), `self-spec@K` (exit K),
`spec+lookup:int4` (the chain of prompt lookup and the int4 draft; fixed γ for both members).
Needs the trained pair (benchmarks/train_models.py); bundles are exported once, as
bench_auto.py does.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

from auto_rows import load_prompts, pair_bundle
from auto_workers import run_edgespec
from common import DEFAULT_MODELS, load_line, table_header, table_row
from plots import try_plot

import edgespec
from edgespec.runtime.estimates import PRIORS
from edgespec.runtime.model import Model
from edgespec.runtime.policies import set_priors
from edgespec.runtime.registry import make_policy

SETUPS = "spec,self-spec@2,spec:int4"


def load_setup(models: Path, setup: str, threads: int) -> Model:
    """The model one setup decodes with (its policy is swapped per generation)."""
    mode, _, exit_layer = setup.partition("@")
    mode, _, quantized = mode.partition(":")
    if mode not in ("spec", "self-spec", "spec+lookup") or quantized not in ("", "int8", "int4"):
        raise SystemExit(
            f"unknown setup {setup!r}: spec, spec+lookup or self-spec@K, optionally with "
            ":int8 / :int4 (a quantized draft), e.g. spec:int4"
        )
    if (mode == "self-spec") != bool(exit_layer) or (exit_layer and not exit_layer.isdigit()):
        raise SystemExit(f"setup {setup!r}: self-spec takes an exit layer (self-spec@2), no other")
    folder = pair_bundle(models, quantized)
    options: dict[str, Any] = {"mode": "self-spec" if mode == "self-spec" else "spec"}
    if exit_layer:
        options["exit_layer"] = int(exit_layer)
    if mode == "spec+lookup":
        options["drafter"] = "lookup+draft"
    return edgespec.load(folder, threads=threads, draft_policy="auto", **options)


def policies_for(model: Model, gammas: list[int], variants: list[str]) -> dict[str, Any]:
    """`auto` as the bundle builds it (a chain gets one per member), each variant of it
    ("auto [warm_rounds=0]": a copy of that fresh `auto` whose cost models price with that
    `Priors` variant), and each fixed γ."""
    policies = {"auto": model.policy}
    for variant in variants:
        policy = copy.deepcopy(model.policy)
        name, _, value = variant.partition("=")
        try:
            set_priors(policy, PRIORS.with_values({name: value}))
        except ValueError as e:
            raise SystemExit(f"variant {variant!r}: {e}") from None
        policies[f"auto [{variant}]"] = policy
    for g in gammas:
        policies[f"fixed:{g}"] = make_policy(f"fixed:{g}")
    return policies


def bench_setup(
    model: Model, policies: dict[str, Any], prompts: list[list[int]], args: Any
) -> dict[str, Any]:
    """Every policy on every prompt, in turns, `passes` times; tokens and seconds per policy
    and prompt (summed over passes), and auto's drafted lengths."""
    names = list(policies)
    tokens = {n: [0] * len(prompts) for n in names}
    seconds = {n: [0.0] * len(prompts) for n in names}
    gammas: dict[str, Counter[int]] = {n: Counter() for n in names}
    order = random.Random(args.seed)
    for n in names:  # warm-up, untimed: one generation each (auto starts learning here)
        model.policy = policies[n]
        run_edgespec(model, prompts[0], args.max_new_tokens, 0.0, None)
    for _ in range(args.passes):
        for i, ids in enumerate(prompts):
            turn = names[:]
            order.shuffle(turn)
            for n in turn:
                model.policy = policies[n]
                time.sleep(args.pause)  # each generation starts from the same idle state
                s = run_edgespec(model, ids, args.max_new_tokens, 0.0, None)
                tokens[n][i] += s.n
                seconds[n][i] += s.seconds
                gammas[n].update(s.gammas)
    drafted = {n: dict(sorted(gammas[n].items())) for n in names if not n.startswith("fixed")}
    return {"tokens": tokens, "seconds": seconds, "auto_gammas": drafted.pop("auto"),
            "variant_gammas": drafted}  # fmt: skip


def rate(run: dict[str, Any], name: str, which: list[int]) -> float:
    return sum(run["tokens"][name][i] for i in which) / sum(run["seconds"][name][i] for i in which)


def judge(run: dict[str, Any], n_prompts: int, name: str = "auto") -> dict[str, Any]:
    """An `auto` row over the best fixed γ: in hindsight (all prompts) and held out (best on
    one half of the prompts, judged on the other)."""
    fixed = [n for n in run["tokens"] if n.startswith("fixed")]
    every = list(range(n_prompts))
    rates = {n: rate(run, n, every) for n in run["tokens"]}
    best = max(fixed, key=rates.get)
    halves = [every[0::2], every[1::2]]
    held = []
    for pick, judged in (halves, halves[::-1]):
        chosen = max(fixed, key=lambda n: rate(run, n, pick))
        held.append((chosen, rate(run, name, judged) / rate(run, chosen, judged)))
    return {
        "rates": rates,
        "best": best,
        "hindsight": rates[name] / rates[best],
        "held_out": sum(r for _, r in held) / len(held),
        "held_out_picks": [c for c, _ in held],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models", type=Path, default=DEFAULT_MODELS / "trained")
    ap.add_argument("--setups", default=SETUPS, help=f"comma list (default {SETUPS})")
    ap.add_argument("--gammas", default="1,2,3,4,5,6,7,8", help="the fixed γ rows")
    ap.add_argument("--prompts", type=int, default=32, help="code prompts (the file has 32)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pause", type=float, default=0.05, help="seconds before each generation")
    ap.add_argument("--seed", type=int, default=0, help="of the turns' order")
    ap.add_argument(
        "--variants",
        default="",
        help="comma list of Priors field=value: `auto` rows beside the default one (an A/B)",
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if not (args.models / "target" / "config.json").exists():
        raise SystemExit(f"no trained pair in {args.models}: run benchmarks/train_models.py")
    gammas = [int(g) for g in args.gammas.split(",") if g]
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    texts = load_prompts(args.models, "code", args.prompts)
    print(load_line(), flush=True)
    results = []
    for setup in [s for s in args.setups.split(",") if s]:
        model = load_setup(args.models, setup, args.threads)
        prompts = [model.encode(t) for t in texts]
        run = bench_setup(model, policies_for(model, gammas, variants), prompts, args)
        verdict = judge(run, len(prompts))
        others = {f"auto [{v}]": judge(run, len(prompts), f"auto [{v}]") for v in variants}
        results.append({"setup": setup, **run, **verdict, "variants": others})
        print(f"\n### {setup}: {len(prompts)} code prompts x {args.passes} passes, in turns")
        print(table_header(["policy", "tok/s", "vs auto"], "lrr"))
        for name, r in verdict["rates"].items():
            print(table_row([name, f"{r:.1f}", f"{r / verdict['rates']['auto']:.3f}"]))
        total = sum(run["auto_gammas"].values()) or 1
        mean = sum(g * c for g, c in run["auto_gammas"].items()) / total
        met = "met" if verdict["held_out"] >= 0.97 else "MISSED"
        print(
            f"{setup}: auto / best fixed γ ({verdict['best']}) {verdict['hindsight']:.3f} in "
            f"hindsight; {verdict['held_out']:.3f} held out (picked on the other half of the "
            f"prompts: {', '.join(verdict['held_out_picks'])}; target >= 0.97): {met}; "
            f"auto's mean γ {mean:.1f}",
            flush=True,
        )
        for name, v in others.items():
            ratios = f"{v['hindsight']:.3f} in hindsight; {v['held_out']:.3f} held out"
            print(f"{setup}: {name} {ratios}")
        del model
    print(f"\n{load_line()}")
    if args.json:
        options = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        out = {"args": options, "load": load_line(), "setups": results}
        args.json.write_text(json.dumps(out, indent=1))
        try_plot("gamma", args.json)


if __name__ == "__main__":
    main()
