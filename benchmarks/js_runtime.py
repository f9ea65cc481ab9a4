"""The JavaScript package (`js/`, onnxruntime-node) beside the Python runtime on one bundle.

Per mode, decode tokens/s (tokens after the first over the decode seconds, summed over the
prompts; one warm-up generation first) in Python (`Model.generate`) and in Node
(`js/bench.mjs`), and each mode's ratio over its own runtime's `ar`: the speculative
speed-up is what must carry over, the absolute rates depend on each binding's per-call cost.
Beside them, tokens per CPU second (the process's CPU time over the same generations,
prefill included: on a loaded machine, with one thread, the steadier measure of work).
The runtimes take turns mode by mode (Python, then a Node process for that mode), so
both sides of a row are measured minutes apart at most.
A mode is MODE[:POLICY]; a chain of drafters in its place (`lookup+eagle:fixed:3`) is the mode
of its last member with that drafter. Greedy, `ignore_eos`, one run each, the host's load
average printed beside the table. The
bundle must load in onnxruntime 1.30 (exported with `--no-batched-verify`); build `js/`
first (`cd js && npm ci && npm run build`).

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


def node_rates(bundle: str, prompts: list[str], spec: str, max_new: int, threads: int):
    """The same, measured by `js/bench.mjs` in a Node process of its own."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(prompts, f)
        f.flush()
        args = [bundle, f.name, str(max_new), str(threads), spec]
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
    ap.add_argument("--json", type=Path, help="write the rates and the machine's facts here")
    a = ap.parse_args()
    lines = Path(a.prompts).read_text().splitlines()[: a.count]
    prompts = [json.loads(line)["prompt"] for line in lines]
    modes = a.modes.split(",")
    before = load_line()
    py, node = {}, {}
    for m in modes:  # taking turns: both sides of a row see about the same load
        py[m] = python_rates(a.bundle, prompts, m, a.max_new_tokens, a.threads)
        node[m] = node_rates(a.bundle, prompts, m, a.max_new_tokens, a.threads)
    print(f"threads {a.threads or 'default'}; before: {before}; after: {load_line()}")
    print(
        "| mode | Python tok/s | / own ar | tok per CPU s | / own ar "
        "| Node tok/s | / own ar | tok per CPU s | / own ar |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    ar = modes[0]
    for m in modes:
        cells = []
        for r in (py, node):
            per_cpu, ar_cpu = r[m]["tokens"] / r[m]["cpu"], r[ar]["tokens"] / r[ar]["cpu"]
            cells += [
                f"{r[m]['rate']:.1f}",
                f"{r[m]['rate'] / r[ar]['rate']:.2f}x",
                f"{per_cpu:.1f}",
                f"{per_cpu / ar_cpu:.2f}x",
            ]
        print(f"| {m} | " + " | ".join(cells) + " |")
    rate = node[ar]["rate"] / py[ar]["rate"]
    cpu = (node[ar]["tokens"] / node[ar]["cpu"]) / (py[ar]["tokens"] / py[ar]["cpu"])
    print(f"Node {ar} over Python's: {rate:.2f}x decode tokens/s, {cpu:.2f}x tokens per CPU second")
    write_result(a.json, a, {"python": py, "node": node, "load_before": before})


if __name__ == "__main__":
    main()
