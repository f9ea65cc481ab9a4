"""The JavaScript package (`js/`, onnxruntime-node) beside the Python runtime on one bundle.

Per mode, decode tokens/s (tokens after the first over the decode seconds, summed over the
prompts; one warm-up generation first) in Python (`Model.generate`) and in Node
(`js/bench.mjs`), and each mode's ratio over its own runtime's `ar`: the speculative
speed-up is what must carry over, the absolute rates depend on each binding's per-call cost.
Beside them, tokens per CPU second (the process's CPU time over the same generations,
prefill included: on a loaded machine, with one thread, the steadier measure of work).
The runtimes take turns mode by mode (Python, then a Node process for that mode per
`--node-kv` path), so both sides of a row are measured minutes apart at most; `--repeats`
runs the whole alternation again. `--node-kv default,bound` sets the package's KV path
(`KVOutputs`, js/src/graph.ts: where onnxruntime-node copies every output back, `default`
opens graphs that return only new positions; `bound` passes the cache as preallocated
outputs, which that binding copies back whole each call) beside each other.
A mode is MODE[:POLICY]; a chain of drafters in its place (`lookup+eagle:fixed:3`) is the mode
of its last member with that drafter. Greedy, `ignore_eos`, one run each, the host's load
average printed beside the table. Any
bundle serves (a default export's `query_seqlens` attention input is dropped at load in
Node); build `js/` first (`cd js && npm ci && npm run build`).

    edgespec export ~/.cache/edgespec-bench/trained/target --out /tmp/js-bundle \\
        --draft ~/.cache/edgespec-bench/trained/draft --no-batched-verify
    python -m benchmarks.js_runtime /tmp/js-bundle \\
        --prompts ~/.cache/edgespec-bench/trained/prompts_code.jsonl --threads 1
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.lib.machine import load_line
from benchmarks.lib.tables import write_result

JS = Path(__file__).resolve().parent.parent / "js"


def python_rates(bundle: str, prompts: list[str], spec: str, max_new: int, threads: int):
    """{rate: decode tokens/s, cpu: CPU seconds of the generations, tokens: generated}."""
    from edgespec.runtime.model import Model

    mode, _, policy = spec.partition(":")
    options = {"draft_policy": policy} if policy else {}
    if "+" in mode:  # a chain: the mode of its last member (lookup+eagle: eagle)
        mode, options["drafter"] = mode.rpartition("+")[2], mode
    model = Model.load(bundle, mode=mode, threads=threads or None, **options)
    model.generate(prompts[0], max_new_tokens=16, ignore_eos=True)
    decoded, tokens, seconds = 0, 0, 0.0
    start = time.process_time()
    for p in prompts:
        g = model.generate(p, max_new_tokens=max_new, ignore_eos=True)
        decoded += len(g.tokens) - 1
        tokens += len(g.tokens)
        seconds += g.stats.decode_seconds
    return {"rate": decoded / seconds, "cpu": time.process_time() - start, "tokens": tokens}


def node_rates(
    bundle: str, prompts: list[str], spec: str, max_new: int, threads: int, kv: str = "default"
):
    """The same, measured by `js/bench.mjs` in a Node process of its own (`kv`: its KV path)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(prompts, f)
        f.flush()
        args = [bundle, f.name, str(max_new), str(threads), kv, spec]
        run = subprocess.run(
            ["node", str(JS / "bench.mjs"), *args], capture_output=True, text=True, check=False
        )
    if run.returncode:
        raise SystemExit(f"node failed:\n{run.stderr[-2000:]}")
    return json.loads(run.stdout)[spec]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("--prompts", required=True, help="a .jsonl of {'prompt': ...} lines")
    ap.add_argument("--count", type=int, default=4, help="prompts used (the first N)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=0, help="0: each runtime's default")
    ap.add_argument("--modes", default="ar,spec:fixed:4")
    ap.add_argument("--node-kv", default="default", help="Node KV paths: default,bound,appended")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json", type=Path, help="write the rates and the machine's facts here")
    a = ap.parse_args()
    lines = Path(a.prompts).read_text().splitlines()[: a.count]
    prompts = [json.loads(line)["prompt"] for line in lines]
    modes, kvs = a.modes.split(","), a.node_kv.split(",")
    runs = []
    for _ in range(a.repeats):
        before = load_line()
        py: dict = {}
        node: dict = {kv: {} for kv in kvs}
        for m in modes:  # taking turns: both sides of a row see about the same load
            py[m] = python_rates(a.bundle, prompts, m, a.max_new_tokens, a.threads)
            for kv in kvs:
                node[kv][m] = node_rates(a.bundle, prompts, m, a.max_new_tokens, a.threads, kv)
        after = load_line()
        runs.append({"python": py, "node": node, "load_before": before, "load_after": after})
        table(modes, py, node, a.threads, before, after)
    write_result(a.json, a, {"runs": runs})


def table(modes: list[str], py: dict, node: dict, threads: int, before: str, after: str) -> None:
    print(f"threads {threads or 'default'}; before: {before}; after: {after}")
    sides = {"Python": py, **{f"Node {kv}": r for kv, r in node.items()}}
    head = " | ".join(f"{s} tok/s | / own ar | tok per CPU s | / own ar" for s in sides)
    print(f"| mode | {head} |")
    print("|---" * (1 + 4 * len(sides)) + "|")
    ar = modes[0]
    for m in modes:
        cells = []
        for r in sides.values():
            per_cpu, ar_cpu = r[m]["tokens"] / r[m]["cpu"], r[ar]["tokens"] / r[ar]["cpu"]
            cells += [
                f"{r[m]['rate']:.1f}",
                f"{r[m]['rate'] / r[ar]['rate']:.2f}x",
                f"{per_cpu:.1f}",
                f"{per_cpu / ar_cpu:.2f}x",
            ]
        print(f"| {m} | " + " | ".join(cells) + " |")
    for kv, r in node.items():
        rate = r[ar]["rate"] / py[ar]["rate"]
        cpu = (r[ar]["tokens"] / r[ar]["cpu"]) / (py[ar]["tokens"] / py[ar]["cpu"])
        print(f"Node ({kv}) {ar} over Python's: {rate:.2f}x tokens/s, {cpu:.2f}x per CPU second")


if __name__ == "__main__":
    main()
