"""Plain (greedy, autoregressive) decoding across engines: edgespec `ar`, transformers,
onnxruntime-genai and llama.cpp, on random-weight models in the shapes of real small LLMs.

For each `--shapes` model (`lib.models.SHAPES`: SmolLM2-135M, Qwen2.5-0.5B, Qwen3-0.6B,
Gemma-3-1B, ...) and `--precisions` (fp32 for every engine; fp16 / int8 / int4 for edgespec
and llama.cpp's F16 / Q8_0 / Q4_0; `int4@32`: edgespec's int4 with blocks of 32), the same
prompt ids, threads and N new tokens (EOS ignored) for every engine:

* prefill tok/s: prompt tokens / (prompt pass + choosing token 1);
* decode tok/s: (N - 1) / time from token 1 to token N (how each engine is timed:
  `lib.engines`);
* % of the memory-bandwidth bound: bytes of weights read per token (every tensor but the
  embedding gather; a tied LM head read in full) / the machine's bandwidth (best of a copy and
  a read over 1 GiB on the same threads, before and after the engines);
* same tokens: leading new tokens equal to transformers' (fp32) or edgespec's at the same
  precision (llama.cpp); random weights may flip a late token, so it is reported.

Each timed run waits (up to `--quiet-wait` s) for a quiet second and records the cores other
processes used; `--rounds R` runs every engine R times in turns, a row is the median over all.

    python -m benchmarks.decode --shapes smollm2-135m,qwen2.5-0.5b --engines edgespec,llamacpp \\
        --precisions fp32,int8,int4 --rounds 3 --json benchmarks/results/decode.json
    python -m benchmarks.decode --shapes tiny-llama --engines edgespec,transformers \\
        --new-tokens 8 --repeats 1 --quiet-wait 0          # a smoke run

onnxruntime-genai runs in this interpreter if it imports here, else in `--genai-python`'s;
llama.cpp in the venv `benchmarks/setup_llamacpp.sh` builds (`--llamacpp-venv`).
"""

from __future__ import annotations

import gc
import os
import statistics
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.lib import flags
from benchmarks.lib.engines import (
    ENGINES,
    EngineSkipped,
    edgespec_runner,
    export_genai,
    genai_engine,
    genai_python,
    genai_runs,
    transformers_engine,
)
from benchmarks.lib.llamacpp import BYTES_PER_WEIGHT, LlamaCppEnv, gguf_for, llamacpp_runs
from benchmarks.lib.llamacpp import PRECISIONS as GGUF
from benchmarks.lib.machine import load_line, log, memory_bandwidth, wait_for_quiet
from benchmarks.lib.models import (
    CACHE,
    PRECISIONS,
    SHAPES,
    base_precision,
    block_of,
    checkpoint,
    prompt_ids,
    shape_bundle,
    weight_bytes_per_token,
)
from benchmarks.lib.tables import write_result
from benchmarks.lib.timing import Run, counted, leading_match, measure


@dataclass
class Row:
    engine: str
    precision: str = "fp32"
    status: str = "ok"  # "ok" | "skipped" | "error"
    message: str = ""
    prefill_tps: float = 0.0
    decode_tps: float = 0.0
    same_tokens: int | None = None  # leading new tokens equal to the reference's
    same_as: str = ""
    tokens: list[int] = field(default_factory=list)
    round_decode_tps: list[float] = field(default_factory=list)  # median of each round
    other_cpu: float = 0.0  # most cores other processes kept busy during a counted run


def summarize(row: Row, runs: list[Run], n_new: int) -> None:
    """Median over the undisturbed runs (or all, if every one was disturbed)."""
    used = counted(runs)
    row.prefill_tps = statistics.median(r.prefill_tps for r in used)
    row.decode_tps = statistics.median(r.decode_tps for r in used)
    row.tokens = runs[0].tokens
    row.other_cpu = max(r.other_cpu for r in used)
    notes = []
    if {len(r.tokens) for r in runs} != {n_new}:
        notes.append(f"produced {sorted({len(r.tokens) for r in runs})} tokens, not {n_new}")
    if any(r.tokens != runs[0].tokens for r in runs):
        notes.append("tokens differ between repeats")
    if len(used) < len(runs):
        notes.append(f"{len(runs) - len(used)} disturbed run(s) left out")
    elif row.other_cpu > 0.25:
        notes.append(f"busy machine: other jobs used up to {row.other_cpu:.1f} cores")
    row.message = "; ".join(notes)


def run_engine(
    engine: str, precision: str, folder: Path, prompt: list[int], args: Any
) -> list[Run]:
    timing = (args.warmup, args.repeats, args.quiet_wait, args.retries)
    if engine == "edgespec":
        import edgespec

        bundle = shape_bundle(folder, precision, rebuild="edgespec" in args.rebuild)
        model = edgespec.load(str(bundle), threads=args.threads)
        try:
            return measure(edgespec_runner(model, prompt, args.new_tokens), *timing)
        finally:
            del model
            gc.collect()
    if engine == "transformers":
        try:
            with transformers_engine(folder, prompt, args.new_tokens, args.threads) as once:
                return measure(once, *timing)
        finally:
            gc.collect()
    if engine == "llamacpp":
        try:
            env = LlamaCppEnv.from_venv(args.llamacpp_venv)
        except FileNotFoundError as e:
            raise EngineSkipped(str(e)) from None
        gguf = gguf_for(folder, precision, env, rebuild="llamacpp" in args.rebuild)
        return llamacpp_runs(env, gguf, prompt, args)
    python = genai_python(args.genai_python)
    out = export_genai(folder, folder.parent / "genai-fp32", python, args.threads)
    if args.genai_python:
        return genai_runs(python, out, prompt, args)
    try:
        with genai_engine(out, prompt, args.new_tokens) as once:
            return measure(once, *timing)
    finally:
        gc.collect()


def bench_shape(shape: str, args: Any) -> dict[str, Any]:
    log(f"[{shape}] checkpoint")
    folder = checkpoint(shape, args.seed, args.cache, "checkpoint" in args.rebuild)
    params, read_bytes = weight_bytes_per_token(folder)
    prompt = prompt_ids(args.seed, args.prompt_len)
    jobs = [
        (engine, precision)
        for precision in args.precisions
        for engine in ENGINES
        if engine in args.engines
        and (
            precision == "fp32"
            or engine == "edgespec"
            or (engine == "llamacpp" and not block_of(precision))
        )
    ]
    rows: dict[str, Row] = {}
    runs_of: dict[str, list[Run]] = {}
    for round_no in range(args.rounds):  # engines in turns: a slow spell hits them alike
        for engine, precision in jobs:
            key = f"{engine} {precision}"
            row = rows.setdefault(key, Row(engine, precision))
            if row.status != "ok":
                continue
            try:
                runs = run_engine(engine, precision, folder, prompt, args)
            except EngineSkipped as e:
                row.status, row.message = "skipped", str(e)
                log(f"[{shape}] {key}: skipped: {e}")
                continue
            except Exception as e:  # noqa: BLE001 - report the row, keep benchmarking
                row.status, row.message = "error", f"{type(e).__name__}: {e}"
                log(f"[{shape}] {key}: error\n{traceback.format_exc()}")
                continue
            runs_of.setdefault(key, []).extend(runs)
            row.round_decode_tps.append(statistics.median(r.decode_tps for r in counted(runs)))
            summarize(row, runs_of[key], args.new_tokens)
            log(f"[{shape}] {key} (round {round_no + 1}/{args.rounds}): prefill "
                f"{row.prefill_tps:.1f} tok/s, decode {row.decode_tps:.2f} tok/s")  # fmt: skip
    hf = rows.get("transformers fp32")
    for r in rows.values():  # llama.cpp against edgespec at its precision, the rest against HF
        peer = rows.get(f"edgespec {r.precision}")
        if r.status != "ok":
            continue
        if r.engine == "llamacpp" and peer is not None and peer.status == "ok":
            r.same_tokens, r.same_as = leading_match(r.tokens, peer.tokens), "edgespec"
        elif hf is not None and hf.status == "ok" and r.precision == "fp32" and r is not hf:
            r.same_tokens, r.same_as = leading_match(r.tokens, hf.tokens), "transformers"
    return {
        "shape": shape,
        "title": f"{shape} shape",
        "parameters": params,
        "weights_read_per_token": read_bytes // 4,  # the checkpoint is fp32
        "bound_decode_tps": {},  # precision -> tok/s, once the bandwidth is known
        "engines": [asdict(r) for r in rows.values()],
    }


def format_table(shape: dict[str, Any], n_new: int) -> str:
    """One row per (engine, precision): ratios against transformers / genai (fp32) and
    llama.cpp at the row's precision; % of that precision's bandwidth bound."""
    rows = {f"{r['engine']} {r['precision']}": r for r in shape["engines"]}

    def tps(key: str) -> float:
        r = rows.get(key)
        return r["decode_tps"] if r and r["status"] == "ok" else 0.0

    head = ["engine", "prefill tok/s", "decode tok/s", "x HF", "x genai", "x llama.cpp",
            "% bound", "same tokens", "note"]  # fmt: skip
    lines = [f"{shape['title']} ({shape['parameters'] / 1e6:.1f}M params)"]
    lines.append(f"| {' | '.join(head)} |\n|---|---:|---:|---:|---:|---:|---:|---|---|")
    for r in rows.values():
        llama = r["engine"] == "llamacpp"
        name = (
            f"llama.cpp {GGUF[r['precision']][0]}" if llama else f"{r['engine']} {r['precision']}"
        )
        if r["status"] != "ok":
            lines.append(f"| {name} | - | - | | | | | | {r['status']}: {r['message'][:160]} |")
            continue
        d, bound = r["decode_tps"], shape["bound_decode_tps"][base_precision(r["precision"])]
        fp32 = r["precision"] == "fp32"
        ratios = [
            f"{d / b:.2f}" if b and (fp32 or i == 2) else "-"
            for i, b in enumerate([tps("transformers fp32"), tps("genai fp32"),
                                   tps(f"llamacpp {base_precision(r['precision'])}")])
        ]  # fmt: skip
        same = f"{r['same_tokens']}/{n_new} vs {r['same_as']}" if r["same_as"] else "n/a"
        rounds = r["round_decode_tps"]
        note = f"rounds {'/'.join(f'{x:.1f}' for x in rounds)} " if len(rounds) > 1 else ""
        cells = [name, f"{r['prefill_tps']:.1f}", f"{d:.2f}", *ratios, f"{100 * d / bound:.0f}%",
                 same, note + r["message"]]  # fmt: skip
        lines.append(f"| {' | '.join(cells)} |")
    for precision, bound in shape["bound_decode_tps"].items():
        per = BYTES_PER_WEIGHT[precision]
        lines.append(f"| bound {precision} | | {bound:.2f} | | | | 100% | | {per:.3g} B a weight |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> Any:
    p = flags.parser(__doc__)
    flags.add_common(p)
    p.add_argument("--shapes", default="smollm2-135m,qwen2.5-0.5b", help=", ".join(SHAPES))
    p.add_argument("--engines", default=",".join(ENGINES), help=", ".join(ENGINES))
    p.add_argument("--precisions", default="fp32", help="fp32, fp16, int8, int4; int4@32: a block")
    p.add_argument("--llamacpp-venv", type=Path, default=Path("/work/venv-llamacpp"))
    p.add_argument("--genai-python", default=None, help="a venv's interpreter with genai")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1, help="every engine this many times, in turns")
    p.add_argument("--quiet-wait", type=float, default=30.0, help="seconds to wait for quiet")
    p.add_argument("--retries", type=int, default=None, help="extra runs for disturbed ones")
    p.add_argument("--seed", type=int, default=0, help="of the weights and the prompt")
    p.add_argument("--cache", type=Path, default=CACHE)
    p.add_argument("--rebuild", default="", help="checkpoint, edgespec, genai, llamacpp")
    p.add_argument("--bw-bytes", type=int, default=1 << 30, help="bandwidth test's buffer")
    args = p.parse_args(argv)
    args.shapes, args.engines = flags.listed(args.shapes), flags.listed(args.engines)
    args.precisions, args.rebuild = flags.listed(args.precisions), flags.listed(args.rebuild)
    for x in args.precisions:
        base, _, block = x.partition("@")
        if base not in PRECISIONS or (
            block and (base not in ("int8", "int4") or not block.isdigit())
        ):
            p.error(f"unknown precision {x!r}: {', '.join(PRECISIONS)} (a block: int4@32)")
    for name, given, known in (("shape", args.shapes, SHAPES), ("engine", args.engines, ENGINES)):
        for x in given:
            if x not in known:
                p.error(f"unknown {name} {x!r}; choose from {', '.join(known)}")
    if args.new_tokens < 2 or args.repeats < 1 or args.rounds < 1:
        p.error("--new-tokens must be at least 2, --repeats and --rounds at least 1")
    args.retries = args.repeats if args.retries is None else args.retries
    args.cache = args.cache.expanduser()
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may touch the network
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    print(load_line(), flush=True)

    def bandwidth() -> dict[str, float]:
        wait_for_quiet(args.quiet_wait)
        return memory_bandwidth(args.bw_bytes, args.threads)

    samples = [bandwidth()]
    started = time.time()
    shapes = [bench_shape(s, args) for s in args.shapes]
    samples.append(bandwidth())  # before and after; the bound takes the best
    bound = max(b["bound"] for b in samples)
    for shape in shapes:
        shape["bound_decode_tps"] = {
            p: bound / (shape["weights_read_per_token"] * BYTES_PER_WEIGHT[p])
            for p in dict.fromkeys(map(base_precision, args.precisions))
        }
        print(f"\n{format_table(shape, args.new_tokens)}")
    print(f"\ngreedy, {args.threads} threads, prompt {args.prompt_len}, {args.new_tokens} new "
          f"tokens, median of {args.repeats}; bandwidth {bound / 1e9:.1f} GB/s; "
          f"{time.time() - started:.0f} s; {load_line()}")  # fmt: skip
    write_result(args.json, args, {"bandwidth": samples, "shapes": shapes}, plot="decode")


if __name__ == "__main__":
    main()
