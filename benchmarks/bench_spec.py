"""Speculative decoding benchmark: every edgespec mode and policy against plain decoding and
transformers' assisted generation, on the trained benchmark pair, in one run.

Takes the models made by `benchmarks/train_models.py` (a LayerSkip-trained Llama target and a
distilled draft, plus held-out code prompts and high-entropy text prompts), exports them to
one bundle (draft + exits), and for each prompt set measures end-to-end tokens/s (prefill
included, greedy, same prompts, same thread count) of:
  edgespec ar, spec / self-spec (each exit) / lookup under fixed:γ, confidence, acceptance,
  dynamic-exit; transformers generate plain, with assistant_model, with assistant_early_exit.
Every edgespec mode's output is checked against edgespec ar token for token (lossless).
The edgespec rows are timed interleaved (every config on each prompt in turn, several passes),
so ratios between them hold on a shared, noisy machine.

    python benchmarks/bench_spec.py                      # 8 prompts x 128 tokens x 3 passes
    python benchmarks/bench_spec.py --prompts 16 --json results.json
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from common import DEFAULT_MODELS, cached_bundle, load_line, load_prompts, table_header, table_row

EXITS = [2, 4]
FIXED = [1, 2, 3, 4, 6, 8]


@dataclass
class Row:
    prompts: str
    engine: str
    tokens_per_s: float
    tokens_per_round: float  # tokens produced per target verification (1.0 for ar)
    acceptance: float
    lossless: str  # "yes" / "no" / "-" (not edgespec)


def edgespec_configs(exits: list[int]) -> list[tuple[str, dict]]:
    configs: list[tuple[str, dict]] = [("ar", {"mode": "ar"})]
    for mode, extra in [("spec", {}), *[("self-spec", {"exit_layer": k}) for k in exits]]:
        label = mode if mode == "spec" else f"self-spec@{extra['exit_layer']}"
        for g in FIXED:
            configs.append(
                (f"{label} fixed:{g}", {"mode": mode, "draft_policy": f"fixed:{g}", **extra})
            )
        for policy in ("confidence:0.5", "acceptance", "auto"):
            configs.append((f"{label} {policy}", {"mode": mode, "draft_policy": policy, **extra}))
    configs.append(
        ("self-spec dynamic-exit", {"mode": "self-spec", "draft_policy": "dynamic-exit"})
    )
    for policy in ("fixed:4", "fixed:8", "acceptance", "auto"):
        configs.append((f"lookup {policy}", {"mode": "lookup", "draft_policy": policy}))
    configs.append(
        ("spec+lookup auto", {"mode": "spec", "drafter": "lookup+draft", "draft_policy": "auto"})
    )
    return configs


@dataclass
class Tally:
    tokens: int = 0
    seconds: float = 0.0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    lossless: bool = True


def bench_edgespec(
    bundle: Path,
    prompts: list[str],
    n_new: int,
    threads: int,
    configs: list[tuple[str, dict]],
    set_name: str,
    reference: dict[int, list[int]],
    repeats: int,
) -> list[Row]:
    """Every config on every prompt, `repeats` times, interleaved: for each (repeat, prompt)
    each config runs once, in a rotating order. On a shared machine a burst of load from
    other tenants then lands on all rows alike instead of on whichever row ran at the time."""
    import edgespec

    models = {}
    for label, options in configs:
        models[label] = edgespec.load(bundle, threads=threads, **options)
        models[label].generate(prompts[0], max_new_tokens=8, ignore_eos=True)  # warm-up
    tallies = {label: Tally() for label, _ in configs}
    labels = [label for label, _ in configs]
    turn = 0
    for rep in range(repeats):
        for i, prompt in enumerate(prompts):
            turn += 1
            for label in labels[turn % len(labels) :] + labels[: turn % len(labels)]:
                start = time.perf_counter()
                out = models[label].generate(prompt, max_new_tokens=n_new, ignore_eos=True)
                t = tallies[label]
                t.seconds += time.perf_counter() - start
                t.tokens += len(out.tokens)
                t.rounds += out.stats.rounds
                t.drafted += out.stats.drafted
                t.accepted += out.stats.accepted
                t.lossless &= out.tokens == reference[i]
        print(f"{set_name}: repeat {rep + 1}/{repeats} done", flush=True)
    rows = []
    for label in labels:
        t = tallies[label]
        row = Row(
            set_name,
            f"edgespec {label}",
            t.tokens / t.seconds,
            (t.accepted + t.rounds) / t.rounds if t.rounds else 1.0,
            t.accepted / t.drafted if t.drafted else 0.0,
            "yes" if t.lossless else "NO",
        )
        print(
            f"{set_name:5s} {row.engine:40s} {row.tokens_per_s:8.1f} tok/s "
            f"{row.tokens_per_round:5.2f} tok/round  lossless={row.lossless}",
            flush=True,
        )
        rows.append(row)
    return rows


def reference_tokens(bundle: Path, prompts: list[str], n_new: int, threads: int) -> dict:
    import edgespec

    model = edgespec.load(bundle, threads=threads)
    return {
        i: model.generate(p, max_new_tokens=n_new, ignore_eos=True).tokens
        for i, p in enumerate(prompts)
    }


def run_transformers(
    models: Path, prompts: list[str], n_new: int, threads: int, set_name: str
) -> list[Row]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(models / "target")
    target = AutoModelForCausalLM.from_pretrained(models / "target").eval()
    draft = AutoModelForCausalLM.from_pretrained(models / "draft").eval()
    variants = [
        ("plain", {}),
        ("assistant_model", {"assistant_model": draft}),
        *[(f"assistant_early_exit={k}", {"assistant_early_exit": k}) for k in EXITS],
    ]
    rows = []
    for name, extra in variants:

        def run(prompt: str, extra: dict = extra) -> tuple[float, int]:
            ids = tok(prompt, return_tensors="pt").input_ids
            start = time.perf_counter()
            with torch.no_grad():
                out = target.generate(
                    ids,
                    max_new_tokens=n_new,
                    min_new_tokens=n_new,
                    do_sample=False,
                    pad_token_id=tok.eos_token_id,
                    **extra,
                )
            return time.perf_counter() - start, out.shape[1] - ids.shape[1]

        run(prompts[0])  # warm-up
        timings = [run(p) for p in prompts]
        seconds, tokens = sum(t for t, _ in timings), sum(n for _, n in timings)
        rows.append(
            Row(set_name, f"transformers {name}", tokens / seconds, float("nan"), float("nan"), "-")
        )
    return rows


def export(models: Path, bundle: Path) -> None:
    cached_bundle(models / "target", bundle, draft=models / "draft", exit_layers=EXITS)


def print_table(rows: list[Row]) -> None:
    for set_name in dict.fromkeys(r.prompts for r in rows):
        part = [r for r in rows if r.prompts == set_name]
        ar = next(r.tokens_per_s for r in part if r.engine == "edgespec ar")
        print(f"\n### {set_name} prompts\n")
        columns = ["engine", "tokens/s", "vs edgespec ar", "tokens/verification"]
        print(table_header([*columns, "acceptance", "lossless"], "lrrrrc"))
        for r in part:
            tpr = "-" if r.tokens_per_round != r.tokens_per_round else f"{r.tokens_per_round:.2f}"
            acc = "-" if r.acceptance != r.acceptance else f"{r.acceptance:.0%}"
            speed = f"{r.tokens_per_s:.1f}"
            print(table_row([r.engine, speed, f"{r.tokens_per_s / ar:.2f}x", tpr, acc, r.lossless]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models", type=Path, default=DEFAULT_MODELS / "trained")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per set")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sets", default="code,text", help="prompt sets: code,text")
    ap.add_argument("--no-transformers", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated substrings of engine labels")
    ap.add_argument("--repeats", type=int, default=3, help="passes over the prompts per config")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    if not (args.models / "target" / "config.json").exists():
        raise SystemExit(f"no trained models in {args.models}: run benchmarks/train_models.py")
    bundle = args.models / "bundle"
    export(args.models, bundle)
    rows: list[Row] = []
    only = [s for s in args.only.split(",") if s]
    configs = [
        (label, options)
        for label, options in edgespec_configs(EXITS)
        if label == "ar" or not only or any(s in label for s in only)
    ]
    for set_name in args.sets.split(","):
        prompts = load_prompts(args.models / f"prompts_{set_name}.jsonl", args.prompts)
        ref = reference_tokens(bundle, prompts, args.max_new_tokens, args.threads)
        rows += bench_edgespec(
            bundle, prompts, args.max_new_tokens, args.threads, configs, set_name, ref, args.repeats
        )
        if not args.no_transformers:
            for row in run_transformers(
                args.models, prompts, args.max_new_tokens, args.threads, set_name
            ):
                rows.append(row)
                print(f"{set_name:5s} {row.engine:40s} {row.tokens_per_s:8.1f} tok/s", flush=True)
    print_table(rows)
    print(f"\n{load_line()}")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2))


if __name__ == "__main__":
    main()
