"""Plain decoding with the weights in 2 MiB pages (the default) and in 4 KiB pages, A/B.

`Model.load` asks Linux to collapse the memory onnxruntime just allocated for a bundle's
weights into huge pages (`runtime/huge_pages.py`); `huge_pages=False` leaves them in 4 KiB
pages. Which pages a process got is process-wide and sticks to memory the allocator reuses,
so each measurement is a process of its own: load the bundle, one warm-up generation, then
`--repeats` generations of `--new-tokens` after a `--prompt-len` prompt; the two settings
take turns `--rounds` times per bundle. Prints decode tok/s (median of each process, then
the median over the rounds), load seconds and the MB that sit in huge pages, per setting,
and the ratio measured in the same run.

    python benchmarks/bench_huge_pages.py --shapes smollm2-135m,qwen2.5-0.5b \\
        --precisions fp32,int8,int4 --json benchmarks/results/bench_huge_pages.json

The bundles are bench_ar.py's (`--cache`, built by `bench_ar.py` first).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from common import BENCH_CACHE, loadavg, table_header, table_row

# name: (LoadConfig.huge_pages, glibc's malloc asked for huge pages at interpreter start)
SETTINGS = {
    "2 MiB pages": (True, False),
    "4 KiB pages": (False, False),
    # GLIBC_TUNABLES=glibc.malloc.hugetlb=1: malloc marks what it maps MADV_HUGEPAGE, so the
    # weights land in huge pages as onnxruntime writes them, with nothing left to collapse
    "malloc hugetlb": (True, True),
    "malloc hugetlb only": (False, True),
}
TUNABLE = "glibc.malloc.hugetlb=1"


def one_process(
    bundle: Path, huge: bool, tunable: bool, args: argparse.Namespace
) -> dict[str, float]:
    """Load and decode in a fresh interpreter; its median decode tok/s, load s, huge MB."""
    code = f"""
import json, statistics, time
import edgespec
start = time.perf_counter()
model = edgespec.load({str(bundle)!r}, threads={args.threads}, huge_pages={huge})
load = time.perf_counter() - start
prompt = list(range(100, 100 + {args.prompt_len}))
model.generate(prompt, max_new_tokens=8, ignore_eos=True)
rates = [
    model.generate(prompt, max_new_tokens={args.new_tokens}, ignore_eos=True)
    .stats.decode_tokens_per_s
    for _ in range({args.repeats})
]
huge = sum(
    int(line.split()[1]) for line in open("/proc/self/smaps_rollup")
    if line.startswith("AnonHugePages:")
)
print(json.dumps({{"tps": statistics.median(rates), "load_s": load, "huge_mb": huge / 1024}}))
"""
    env = dict(os.environ)
    env.pop("GLIBC_TUNABLES", None)
    if tunable:
        env["GLIBC_TUNABLES"] = TUNABLE
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True, text=True, check=False, timeout=900, env=env,
    )  # fmt: skip
    if out.returncode != 0:
        raise SystemExit(f"bench_huge_pages.py: {bundle} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="smollm2-135m,qwen2.5-0.5b")
    ap.add_argument("--precisions", default="fp32,int8,int4")
    ap.add_argument("--rounds", type=int, default=3, help="turns of the two settings")
    ap.add_argument("--repeats", type=int, default=5, help="timed generations per process")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache", type=Path, default=BENCH_CACHE, help="bench_ar.py's checkpoints")
    ap.add_argument(
        "--settings",
        default="2 MiB pages,4 KiB pages",
        help="comma list of: " + ", ".join(SETTINGS) + " (the first two make the table's ratio)",
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    settings = {}
    for name in args.settings.split(","):
        if name not in SETTINGS:
            raise SystemExit(f"unknown setting {name!r}: pick from {', '.join(SETTINGS)}")
        settings[name] = SETTINGS[name]
    if len(settings) < 2:
        raise SystemExit("--settings needs two settings at least: the table compares them")
    start_load = loadavg()
    rows = []
    for shape in args.shapes.split(","):
        found = sorted(args.cache.expanduser().glob(f"{shape}-seed*"))
        if not found:
            raise SystemExit(f"no {shape} checkpoint under {args.cache}: run bench_ar.py first")
        for precision in args.precisions.split(","):
            bundle = found[0] / f"edgespec-{precision}"
            if not (bundle / "manifest.json").exists():
                raise SystemExit(f"no bundle {bundle}: run bench_ar.py --precisions {precision}")
            runs: dict[str, list[dict[str, float]]] = {name: [] for name in settings}
            for _ in range(args.rounds):
                for name, (huge, tunable) in settings.items():
                    runs[name].append(one_process(bundle, huge, tunable, args))
                    r = runs[name][-1]
                    print(f"{shape} {precision} {name}: {r['tps']:.1f} tok/s", file=sys.stderr)
            row: dict[str, object] = {"shape": shape, "precision": precision}
            for name, got in runs.items():
                keys = ("tps", "load_s", "huge_mb")
                row[name] = {key: statistics.median(g[key] for g in got) for key in keys}
                row[name]["rounds_tps"] = [g["tps"] for g in got]  # type: ignore[index]
            rows.append(row)
    print(
        f"\n{args.threads} threads, {args.new_tokens} new tokens after {args.prompt_len}, median "
        f"of {args.repeats} per process, {args.rounds} processes per setting in turns; load "
        f"average {start_load:.1f} at start, {loadavg():.1f} at end\n"
    )
    names = list(settings)  # the first two make the ratio
    print(table_header(["shape", "precision", *(f"{n} tok/s" for n in names), "ratio",
                        f"load s ({' / '.join(names)})", "MB in huge pages"],
                       "ll" + "r" * (len(names) + 3)))  # fmt: skip
    for row in rows:
        got = [row[n] for n in names]  # type: ignore[index]
        ratio = got[0]["tps"] / got[1]["tps"]
        load = " / ".join(f"{g['load_s']:.2f}" for g in got)
        huge = " / ".join(f"{g['huge_mb']:.0f}" for g in got)
        print(table_row([row["shape"], row["precision"], *(f"{g['tps']:.1f}" for g in got),
                         f"**{ratio:.3f}x**", load, huge]))  # fmt: skip
    if args.json:
        meta = {"threads": args.threads, "new_tokens": args.new_tokens, "rounds": args.rounds,
                "repeats": args.repeats, "load_start_end": [start_load, loadavg()]}  # fmt: skip
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
