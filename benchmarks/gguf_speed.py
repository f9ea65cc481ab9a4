"""edgespec `ar` against `llama-bench` on the same GGUF files: decode and prefill tokens/s.

Takes GGUF files (`--files`: paths, or llama.cpp type names such as Q4_0, Q8_0, Q4_K_M,
made by `llama-quantize` from the demo's Q4_1 file's F16 conversion; default the demo's
file) and the llama.cpp build of `setup_llamacpp.sh` (`--llamacpp-venv`). Each file is
exported once as a user would (`edgespec export FILE --out CACHE/NAME`: its blocks kept) into
`--cache`. Per file and thread count, in alternating turns (`--repeats`, so load drifts hit
both engines):

* llama.cpp: `llama-bench -m FILE -t T -n N -p 0` (decode from an empty context) and
  `-p P -n 0` (prefill), its mean tokens/s;
* edgespec: the runtime's own `ar` (`edgespec.load(bundle, mode="ar")`), N tokens generated
  from the file's BOS token with `ignore_eos`: decode tokens/s from the generation's stats
  (every token after the first over their time); prefill: P token ids in one call. Each
  measurement runs in a fresh process, as each llama-bench does: onnxruntime's process-wide
  thread pool keeps the thread count of the first model a process loads.

Prints one row per file and thread count: both engines' best decode and prefill rate over
the turns, and their ratio; the CPU and the load average are printed with the table.

Where the time goes (`--profile-steps S`, per file, once, 1 thread): the bytes of weights a
decode step reads in each engine (edgespec: the initializers of the bundle's matrix ops, each
once; llama.cpp: the file's matrices, the tied embedding once as the LM head) and the rate
that makes at the best decode speed; and an onnxruntime profile of S one-position steps
after 100 cached positions (`SessionOptions.enable_profiling` on the bundle's `full` graph):
microseconds a step per op type, with each op type's node count. Profiling adds a timer
around every node, so small nodes read a little dearer there than in the untimed steps.

    python -m benchmarks.gguf_speed --files a.gguf,b.gguf --threads-list 1,2 --repeats 3 \\
        --json benchmarks/results/gguf_speed.json
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
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


MATRIX_OPS = {"MatMulNBits", "MatMul", "Gemm"}


def edgespec_step_bytes(bundle: Path) -> int:
    """Bytes of weights one decode step reads: every initializer a matrix op takes, once."""
    import onnx

    from edgespec.bundle import load_manifest

    graph = onnx.load(str(bundle / load_manifest(bundle).graph("full").file),
                      load_external_data=False).graph  # fmt: skip
    sizes = {}
    for t in graph.initializer:
        length = {e.key: e.value for e in t.external_data}.get("length")
        sizes[t.name] = int(length) if length is not None else len(t.raw_data)
    used = {i for n in graph.node if n.op_type in MATRIX_OPS for i in n.input if i in sizes}
    return sum(sizes[i] for i in used)


def llamacpp_step_bytes(gguf: Path) -> int:
    """Bytes of the file's matrices (a tied embedding read once, as the LM head)."""
    from gguf import GGUFReader

    return sum(int(t.n_bytes) for t in GGUFReader(gguf).tensors if len(t.shape) == 2)


def edgespec_profile(bundle: Path, steps: int, cached: int = 100) -> dict[str, list[float]]:
    """op type -> [microseconds a step, nodes a step] over `steps` one-position calls of the
    `full` graph after `cached` positions, 1 thread, under onnxruntime's profiler."""
    import collections

    import numpy as np

    from edgespec.bundle import load_manifest
    from edgespec.runtime.graphs.kv_cache import KVCache
    from edgespec.runtime.graphs.protocol import Feed
    from edgespec.runtime.graphs.session import GraphSession, session_options

    manifest = load_manifest(bundle)
    graph = manifest.graph("full")
    model = manifest.model_info(graph)
    opts = session_options(1, shared=False)
    opts.enable_profiling = True
    opts.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "steps")
    session = GraphSession(bundle, graph, model, ["CPUExecutionProvider"], opts, np.float32)
    cache = KVCache.allocate(graph.kv_layers, model.num_kv_heads, model.head_dim,
                             cached + steps + 8, np.dtype(np.float32))  # fmt: skip
    ids = np.random.default_rng(0).integers(100, model.vocab_size, cached + steps)
    session.run(cache, 0, Feed(input_ids=ids[None, :cached], keep=1))
    for i in range(cached, cached + steps):
        session.run(cache, i, Feed(input_ids=ids[None, i : i + 1], keep=1))
    events = json.loads(Path(session.session.end_profiling()).read_text())
    runs = [e for e in events if e.get("cat") == "Session" and e["name"] == "model_run"]
    first_step = sorted(e["ts"] for e in runs)[1]  # the prefill is the first run
    time_of: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= first_step:
            time_of[e["args"]["op_name"]] += e["dur"]
            count[e["args"]["op_name"]] += 1
    out = {op: [t / steps, count[op] / steps] for op, t in time_of.most_common()}
    step = sum(e["dur"] for e in runs if e["ts"] >= first_step) / steps
    return {"step": [step, sum(count.values()) / steps], **out}


def edgespec_in_child(bundle: Path, threads: int, n: int, p: int) -> tuple[float, float]:
    cmd = [sys.executable, "-m", "benchmarks.gguf_speed", "--worker", str(bundle), str(threads),
           str(n), str(p)]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    decode, prefill = json.loads(out.stdout.strip().splitlines()[-1])
    return decode, prefill


def file_for(name: str, demo: Path, cache: Path, env: LlamaCppEnv) -> Path:
    """A --files entry as a GGUF path: a path as given; the demo file's own type (Q4_1) is
    the demo file; another llama.cpp type (Q4_0, Q8_0, Q4_K_M, ...) is `llama-quantize`'s
    of the demo file's F16 conversion (`llama-quantize --allow-requantize DEMO F16`: the
    file's values in F16), made once into `cache`."""
    if Path(name).suffix == ".gguf":
        return Path(name)
    if demo.stem.endswith(f".{name}"):
        return demo
    cache.mkdir(parents=True, exist_ok=True)
    out = cache / f"{demo.stem.rsplit('.', 1)[0]}.{name}.gguf"
    f16 = cache / f"{demo.stem.rsplit('.', 1)[0]}.F16.gguf"
    for source, target, ftype, extra in ((demo, f16, "F16", ["--allow-requantize"]),
                                         (f16, out, name, [])):  # fmt: skip
        if not target.is_file():
            log(f"llama-quantize {source.name} -> {target.name}")
            tmp = target.with_suffix(".tmp")
            cmd = [str(env.bin / "llama-quantize"), *extra, str(source), str(tmp), ftype]
            subprocess.run(cmd, env=env.subprocess_env(), capture_output=True, check=True)
            tmp.rename(target)
    return out


def profile_row(f: Path, bundle: Path, steps: int, data: list[dict]) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.gguf_speed", "--profile-worker", str(bundle),
           str(steps)]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    ops = json.loads(out.stdout.strip().splitlines()[-1])
    ours, theirs = edgespec_step_bytes(bundle), llamacpp_step_bytes(f)
    rates = {}
    for row in data:
        if row["file"] == f.name:  # GB/s at each engine's best decode rate
            best_ours = max(o[0] for o in row["edgespec"])
            best_theirs = max(o[0] for o in row["llamacpp"])
            rates[row["threads"]] = [ours * best_ours / 1e9, theirs * best_theirs / 1e9]
    return {"file": f.name, "edgespec_mb": ours / 1e6, "llamacpp_mb": theirs / 1e6,
            "gb_s": rates, "ops": ops}  # fmt: skip


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--profile-worker":
        print(json.dumps(edgespec_profile(Path(sys.argv[2]), int(sys.argv[3]))))
        return
    if len(sys.argv) == 6 and sys.argv[1] == "--worker":
        bundle, t, n, p = Path(sys.argv[2]), *map(int, sys.argv[3:6])
        print(json.dumps(edgespec_rates(bundle, t, n, p)))
        return
    a = parser(__doc__)
    a.add_argument(
        "--files",
        default="",
        help="GGUF files or llama.cpp types made from the demo's (comma list)",
    )
    a.add_argument("--threads-list", default="1,2")
    a.add_argument("--repeats", type=int, default=3)
    a.add_argument("-n", "--new-tokens", type=int, default=64)
    a.add_argument("--prompt-tokens", type=int, default=512)
    a.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "edgespec-bench" / "gguf")
    a.add_argument("--llamacpp-venv", type=Path, default=Path("/work/venv-llamacpp"))
    a.add_argument(
        "--profile-steps",
        type=int,
        default=0,
        help="per file: bytes a step and an onnxruntime profile of this many steps",
    )
    a.add_argument("--json", type=Path, default=None)
    args = a.parse_args()
    from edgespec.demo import demo_gguf
    from edgespec.export import export_bundle

    env = LlamaCppEnv.from_venv(args.llamacpp_venv)
    demo = demo_gguf(fetch=False)
    files = [file_for(name, demo, args.cache, env) for name in listed(args.files)] or [demo]
    rows, data, profiles = [], [], []
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
        if args.profile_steps:
            profiles.append(profile_row(f, bundle, args.profile_steps, data))
    print(f"\n{cpu_name()}; {load_line()}; llama.cpp {env.version()}")
    print(table_header(["file", "threads", "edgespec decode", "llama.cpp decode", "ratio",
                        "edgespec prefill", "llama.cpp prefill", "ratio"], "lrrrrrrr"))  # fmt: skip
    for row in rows:
        print(table_row(row))
    for p in profiles:
        print(
            f"\n{p['file']}: a step reads {p['edgespec_mb']:.1f} MB of weights in edgespec, "
            f"{p['llamacpp_mb']:.1f} MB in llama.cpp"
            + "".join(f"; {t} thread(s) {r[0]:.1f} / {r[1]:.1f} GB/s" for t, r in p["gb_s"].items())
        )
        step = p["ops"]["step"][0]
        print(f"  profiled step (1 thread): {step:.0f} us, {p['ops']['step'][1]:.0f} nodes")
        for op, (us, nodes) in p["ops"].items():
            if op != "step" and us >= 0.005 * step:
                print(f"  {op:34s} {us:7.0f} us {100 * us / step:5.1f}%  {nodes:4.0f} nodes")
    write_result(args.json, args, {"rows": data, "profiles": profiles})


if __name__ == "__main__":
    main()
