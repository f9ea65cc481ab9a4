"""edgespec `ar` against `llama-bench` on the same GGUF files: decode and prefill tokens/s.

Takes GGUF files (`--files`, default the demo's Q4_1 file) and the llama.cpp build of
`setup_llamacpp.sh` (`--llamacpp-venv`). Each file is exported once as a user would
(`edgespec export FILE --out CACHE/NAME`: its blocks kept) into `--cache`. Per file and
thread count, in alternating turns (`--repeats`, so load drifts hit both engines):

* llama.cpp: `llama-bench -m FILE -t T -n N -p 0` (decode from an empty context) and
  `-p P -n 0` (prefill), its mean tokens/s;
* edgespec: the runtime's own `ar` (`edgespec.load(bundle, mode="ar")`), N tokens generated
  from the file's BOS token with `ignore_eos`: decode tokens/s from the generation's stats
  (every token after the first over their time); prefill: P token ids in one call. Each
  measurement runs in a fresh process, as each llama-bench does: onnxruntime's process-wide
  thread pool keeps the thread count of the first model a process loads.

Prints one row per file and thread count: both engines' best decode and prefill rate over
the turns, and their ratio; the CPU and the load average are printed with the table.

    python -m benchmarks.gguf_speed --files a.gguf,b.gguf --threads-list 1,2 --repeats 3 \\
        --json benchmarks/results/gguf_speed.json
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.lib.flags import listed, parser
from benchmarks.lib.llamacpp import LlamaCppEnv
from benchmarks.lib.machine import cpu_name, load_line, log
from benchmarks.lib.tables import table_header, table_row, write_result


def llama_bench(env: LlamaCppEnv, gguf: Path, threads: int, n: int, p: int) -> float:
    cmd = [str(env.bin / "llama-bench"), "-m", str(gguf), "-t", str(threads), "-n", str(n),
           "-p", str(p), "-r", "3", "-o", "json"]  # fmt: skip
    out = subprocess.run(cmd, env=env.subprocess_env(), capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout)[0]["avg_ts"])


def edgespec_rates(bundle: Path, threads: int, n: int, p: int) -> tuple[float, float]:
    import numpy as np

    import edgespec

    model = edgespec.load(bundle, mode="ar", threads=threads)
    bos = model.manifest.bos_token_id or 1
    model.generate([bos], max_new_tokens=8, ignore_eos=True)  # warm-up
    g = model.generate([bos], max_new_tokens=n, ignore_eos=True)
    decode = g.stats.decode_tokens / g.stats.decode_seconds
    ids = np.random.default_rng(0).integers(100, model.manifest.target.vocab_size, p)
    target = model.target
    best = float("inf")
    for _ in range(3):
        target.reset(p + 1)
        start = time.perf_counter()
        target.forward(ids, keep=1)
        best = min(best, time.perf_counter() - start)
    return decode, p / best


def edgespec_in_child(bundle: Path, threads: int, n: int, p: int) -> tuple[float, float]:
    cmd = [sys.executable, "-m", "benchmarks.gguf_speed", "--worker", str(bundle), str(threads),
           str(n), str(p)]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    decode, prefill = json.loads(out.stdout.strip().splitlines()[-1])
    return decode, prefill


def main() -> None:
    if len(sys.argv) == 6 and sys.argv[1] == "--worker":
        bundle, t, n, p = Path(sys.argv[2]), *map(int, sys.argv[3:6])
        print(json.dumps(edgespec_rates(bundle, t, n, p)))
        return
    a = parser(__doc__)
    a.add_argument("--files", default="", help="GGUF files (comma list; default the demo's)")
    a.add_argument("--threads-list", default="1,2")
    a.add_argument("--repeats", type=int, default=3)
    a.add_argument("-n", "--new-tokens", type=int, default=64)
    a.add_argument("--prompt-tokens", type=int, default=512)
    a.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "edgespec-bench" / "gguf")
    a.add_argument("--llamacpp-venv", type=Path, default=Path("/work/venv-llamacpp"))
    a.add_argument("--json", type=Path, default=None)
    args = a.parse_args()
    from edgespec.demo import demo_gguf
    from edgespec.export import export_bundle

    env = LlamaCppEnv.from_venv(args.llamacpp_venv)
    files = [Path(f) for f in listed(args.files)] or [demo_gguf(fetch=False)]
    rows, data = [], []
    for f in files:
        bundle = args.cache / f.stem
        if not (bundle / "manifest.json").is_file():
            log(f"exporting {f} -> {bundle}")
            export_bundle(f, bundle)
        for t in listed(args.threads_list, int):
            ours: list[tuple[float, float]] = []
            theirs: list[tuple[float, float]] = []
            for _ in range(args.repeats):
                theirs.append((llama_bench(env, f, t, args.new_tokens, 0),
                               llama_bench(env, f, t, 0, args.prompt_tokens)))  # fmt: skip
                ours.append(edgespec_in_child(bundle, t, args.new_tokens, args.prompt_tokens))
            d_ours, p_ours = max(o[0] for o in ours), max(o[1] for o in ours)
            d_them, p_them = max(o[0] for o in theirs), max(o[1] for o in theirs)
            row = [f.name, t, f"{d_ours:.1f}", f"{d_them:.1f}", f"{d_ours / d_them:.2f}x",
                   f"{p_ours:.0f}", f"{p_them:.0f}", f"{p_ours / p_them:.2f}x"]  # fmt: skip
            rows.append(row)
            ratios = {"decode_ratio": d_ours / d_them, "prefill_ratio": p_ours / p_them}
            data.append({"file": f.name, "threads": t, "edgespec": ours, "llamacpp": theirs,
                         **ratios})  # fmt: skip
            log(" | ".join(map(str, row)))
    print(f"\n{cpu_name()}; {load_line()}; llama.cpp {env.version()}")
    print(table_header(["file", "threads", "edgespec decode", "llama.cpp decode", "ratio",
                        "edgespec prefill", "llama.cpp prefill", "ratio"], "lrrrrrrr"))  # fmt: skip
    for row in rows:
        print(table_row(row))
    write_result(args.json, args, {"rows": data})


if __name__ == "__main__":
    main()
