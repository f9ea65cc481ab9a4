"""Speculative decoding: modes × γ × policies on one loaded model, against plain decoding.

Each setup (`--setups`) loads ONE model of the trained pair (`python -m benchmarks.train_models`)
and swaps its draft-length policy between generations, so every policy decodes on the same
sessions in the same memory; on each prompt the policies take their turns in a shuffled order,
so a slow phase of a shared machine falls on all of them alike, and policies keep what they
learned across prompts, as in an app. Plain decoding (`ar`, its own model) takes its turn too.

Rows per setup: `ar`, `auto`, each `--policies` entry (confidence:0.4, acceptance,
dynamic-exit, ...), each fixed γ of `--gammas`, and each `--variants` of `auto`: a copy of the
model's fresh `auto` whose cost models price with those `Priors` fields (`warm_rounds=0`; variants
apart by ';'), an A/B in one run. Reported: end-to-end tok/s (prefill + `--max-new-tokens`),
the ratio to `ar`, tokens per round, whether every greedy output equals `ar`'s token for
token, and `auto` (and each variant) over the best fixed γ: in hindsight, and held out (the γ
best on the even prompts judged on the odd ones and the other way round, averaged).

    python -m benchmarks.speculative --json benchmarks/results/speculative.json
    python -m benchmarks.speculative --setups spec:int4 --gammas 3,4,5,6 --passes 2
    python -m benchmarks.speculative --variants 'warm_rounds=0'
    python -m benchmarks.speculative --setups spec,self-spec@2 --gammas 2,4 --prompts 2 \\
        --passes 1 --max-new-tokens 32                     # a smoke run

Setups: `spec` (the fp32 draft), `spec:int4` / `spec:int8` (the draft quantized apart from the
fp32 target), `self-spec@K` (the target's exit K), `spec+lookup:int4` (the chain of prompt
lookup and the int4 draft), `lookup`.
"""

from __future__ import annotations

import copy
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.lib import flags
from benchmarks.lib.engines import stream_sample
from benchmarks.lib.machine import load_line
from benchmarks.lib.models import TRAINED, load_prompts, pair_bundle, trained_pair
from benchmarks.lib.tables import table, write_result

SETUPS = "spec,self-spec@2,spec:int4"


def load_setup(models: Path, setup: str, threads: int) -> Any:
    """The model one setup decodes with (its policy is swapped per generation)."""
    import edgespec

    mode, _, exit_layer = setup.partition("@")
    mode, _, quantized = mode.partition(":")
    if mode not in ("spec", "self-spec", "spec+lookup", "lookup", "ar") or quantized not in (
        "", "int8", "int4"
    ):  # fmt: skip
        raise SystemExit(
            f"unknown setup {setup!r}: spec, spec+lookup, lookup or self-spec@K, optionally "
            "with :int8 / :int4 (a quantized draft), e.g. spec:int4"
        )
    if (mode == "self-spec") != bool(exit_layer) or (exit_layer and not exit_layer.isdigit()):
        raise SystemExit(f"setup {setup!r}: self-spec takes an exit layer (self-spec@2), no other")
    options: dict[str, Any] = {"mode": {"spec+lookup": "spec"}.get(mode, mode)}
    if exit_layer:
        options["exit_layer"] = int(exit_layer)
    if mode == "spec+lookup":
        options["drafter"] = "lookup+draft"
    if mode != "ar":
        options["draft_policy"] = "auto"
    return edgespec.load(pair_bundle(models, quantized), threads=threads, **options)


def policies_for(model: Any, args: Any) -> dict[str, Any]:
    from edgespec.runtime.policies.draft_length import set_priors
    from edgespec.runtime.policies.estimates import PRIORS
    from edgespec.runtime.registry import make_policy

    policies = {"auto": model.policy}
    for fields in args.variants:
        policy = copy.deepcopy(model.policy)
        try:
            set_priors(policy, PRIORS.with_values(fields))
        except ValueError as e:
            raise SystemExit(f"--variants: {e}") from None
        policies[f"auto [{','.join(f'{k}={v}' for k, v in fields.items())}]"] = policy
    exits = model.manifest.exit_layers
    for spec in args.policies:
        policies[spec] = make_policy(spec, exits=exits)
    for g in args.gammas:
        policies[f"fixed:{g}"] = make_policy(f"fixed:{g}")
    return policies


def bench_setup(ar: Any, model: Any, policies: dict[str, Any], prompts: list[list[int]],
                args: Any) -> dict[str, Any]:  # fmt: skip
    """`ar` and every policy on every prompt, in turns, `passes` times: tokens, seconds and
    rounds per row and prompt (summed over passes), drafted lengths, and lossless checks."""
    rows: dict[str, tuple[Any, Any]] = {"ar": (ar, None)}
    rows.update({n: (model, p) for n, p in policies.items()})
    names = list(rows)
    tokens = {n: [0] * len(prompts) for n in names}
    seconds = {n: [0.0] * len(prompts) for n in names}
    rounds = {n: 0 for n in names}
    gammas: dict[str, Counter[int]] = {n: Counter() for n in names}
    outputs: dict[tuple[str, int], list[int]] = {}
    order = random.Random(args.seed)

    def generate(name: str, ids: list[int]) -> Any:
        m, policy = rows[name]
        if policy is not None:
            m.policy = policy
        return stream_sample(m, ids, args.max_new_tokens)

    for n in names:  # warm-up, untimed (auto starts learning here)
        generate(n, prompts[0])
    for _ in range(args.passes):
        for i, ids in enumerate(prompts):
            turn = names[:]
            order.shuffle(turn)
            for n in turn:
                time.sleep(args.pause)  # each generation starts from the same idle state
                s = generate(n, ids)
                tokens[n][i] += s.n
                seconds[n][i] += s.seconds
                rounds[n] += sum(s.gammas.values())
                gammas[n].update(s.gammas)
                outputs.setdefault((n, i), s.tokens)
    lossless = {
        n: all(outputs[(n, i)] == outputs[("ar", i)] for i in range(len(prompts))) for n in names
    }
    return {"tokens": tokens, "seconds": seconds, "rounds": rounds, "lossless": lossless,
            "gammas": {n: dict(sorted(g.items())) for n, g in gammas.items()}}  # fmt: skip


def rate(run: dict[str, Any], name: str, which: list[int]) -> float:
    return sum(run["tokens"][name][i] for i in which) / sum(run["seconds"][name][i] for i in which)


def judge(run: dict[str, Any], n_prompts: int, name: str) -> dict[str, Any]:
    """A policy's tok/s over the best fixed γ's: in hindsight, and held out."""
    fixed = [n for n in run["tokens"] if n.startswith("fixed")]
    every = list(range(n_prompts))
    best = max(fixed, key=lambda n: rate(run, n, every))
    halves = [every[0::2], every[1::2]]
    held = []
    for pick, judged in (halves, halves[::-1]):
        if pick and judged:
            chosen = max(fixed, key=lambda n: rate(run, n, pick))
            held.append(rate(run, name, judged) / rate(run, chosen, judged))
    hindsight = rate(run, name, every) / rate(run, best, every)
    return {"best": best, "hindsight": hindsight,
            "held_out": sum(held) / len(held) if held else hindsight}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = flags.parser(__doc__)
    flags.add_common(p)
    p.add_argument("--models", type=Path, default=TRAINED, help="train_models.py's output")
    p.add_argument("--setups", default=SETUPS, help=f"comma list (default {SETUPS})")
    p.add_argument("--gammas", default="1,2,3,4,5,6,7,8", help="the fixed γ rows")
    p.add_argument("--policies", default="", help="more policies: confidence:0.4,dynamic-exit")
    p.add_argument("--variants", default="", help="auto with Priors fields set: a=1;a=2,b=3")
    p.add_argument("--prompts", type=int, default=32, help="held-out code prompts (of 32)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--pause", type=float, default=0.05, help="seconds before each generation")
    p.add_argument("--seed", type=int, default=0, help="of the turns' order")
    args = p.parse_args(argv)
    models = trained_pair(args.models)
    args.gammas = flags.listed(args.gammas, int)
    args.policies = flags.listed(args.policies)
    args.variants = flags.parse_variants(args.variants)
    texts = load_prompts(models / "prompts_code.jsonl", args.prompts)
    print(load_line(), flush=True)
    ar = load_setup(models, "ar", args.threads)
    prompts = [ar.encode(t) for t in texts]
    results = []
    for setup in flags.listed(args.setups):
        model = load_setup(models, setup, args.threads)
        run = bench_setup(ar, model, policies_for(model, args), prompts, args)
        every = list(range(len(prompts)))
        rates = {n: rate(run, n, every) for n in run["tokens"]}
        judged = {n: judge(run, len(prompts), n) for n in rates if n.startswith("auto")}
        results.append({"setup": setup, **run, "rates": rates, "judged": judged,
                        **judged["auto"]})  # fmt: skip
        print(f"\n### {setup}: {len(prompts)} code prompts x {args.passes} passes, in turns")
        rows = []
        for n, r in rates.items():
            made = sum(run["tokens"][n]) - len(prompts) * args.passes  # after the prefill's
            per_round = made / run["rounds"][n] if run["rounds"][n] and n != "ar" else 1.0
            rows.append([n, f"{r:.1f}", f"{r / rates['ar']:.3f}", f"{per_round:.2f}",
                         "yes" if run["lossless"][n] else "NO"])  # fmt: skip
        print(table(["policy", "tok/s", "x ar", "tokens/round", "= ar"], "lrrrc", rows))
        for n, v in judged.items():
            print(f"{setup}: {n} / best fixed γ ({v['best']}) {v['hindsight']:.3f} in hindsight, "
                  f"{v['held_out']:.3f} held out")  # fmt: skip
        del model
    print(f"\n{load_line()}")
    write_result(args.json, args, {"setups": results}, plot="speculative")


if __name__ == "__main__":
    main()
