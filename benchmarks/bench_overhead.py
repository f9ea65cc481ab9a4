"""The runtime's own time in a round: what decoding spends outside onnxruntime's kernels.

On the trained pair (an 11M-parameter target whose decode step is ~1.3 ms) Python's share of a
round is large enough to show in every speed-up: a round's binding, copies, drafting loop,
acceptance, policy and text streaming run between onnxruntime calls that have just pushed
Python's state out of the CPU caches. This loads each mode once and decodes the same prompts
with `runtime.graph.Narrow` (buffers bound once per width) on and off, in turns prompt by
prompt in a shuffled order; checks that both produce the same tokens; and reports per mode:
tokens/s either way, and per round the µs inside onnxruntime's run (every graph call) and
outside it (everything else the runtime does), with Narrow on.

    python benchmarks/bench_overhead.py --json benchmarks/results/bench_overhead.json

Modes: ar, spec:int4 fixed:5 (the int4 draft's best γ), spec+lookup:int4 auto (the best
mode), self-spec@2 fixed:2. Needs the trained pair (benchmarks/train_models.py).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time
from pathlib import Path
from typing import Any

from auto_rows import load_prompts, pair_bundle
from common import DEFAULT_MODELS, load_line, table_header, table_row

import edgespec
from edgespec.runtime.graph import GraphSession

MODES: dict[str, dict[str, Any]] = {
    "ar": {"mode": "ar"},
    "spec:int4 fixed:5": {"mode": "spec", "draft_policy": "fixed:5"},
    "spec+lookup:int4 auto": {"mode": "spec", "drafter": "lookup+draft", "draft_policy": "auto"},
    "self-spec@2 fixed:2": {"mode": "self-spec", "exit_layer": 2, "draft_policy": "fixed:2"},
}


class Timed:
    """An onnxruntime session (its binding-level object) whose runs are timed."""

    def __init__(self, session: Any) -> None:
        self.session, self.seconds = session, 0.0

    def run_with_iobinding(self, *args: Any) -> None:
        start = time.perf_counter()
        self.session.run_with_iobinding(*args)
        self.seconds += time.perf_counter() - start

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)


def graph_sessions() -> dict[int, GraphSession]:
    """Every graph session alive: a model's are those that appear when it loads."""
    return {id(o): o for o in gc.get_objects() if type(o) is GraphSession}


class Row:
    """One mode's model, its sessions' timers, and Narrow switched per generation."""

    def __init__(self, bundle: Path, options: dict[str, Any], threads: int) -> None:
        before = graph_sessions()
        self.model = edgespec.load(bundle, threads=threads, **options)
        self.sessions = [s for i, s in graph_sessions().items() if i not in before]
        self.narrow = {id(s): s._narrow for s in self.sessions}
        self.timers: list[Timed] = []
        for s in self.sessions:  # both paths' runs: the wrapper's and the binding object's
            s.session = Timed(s.session)  # type: ignore[assignment]
            self.timers.append(s.session)  # type: ignore[arg-type]
            if s._narrow is not None:
                s._narrow.session = Timed(s._narrow.session)
                self.timers.append(s._narrow.session)

    def switch(self, on: bool) -> None:
        for s in self.sessions:
            narrow = self.narrow[id(s)]
            if narrow is not None:
                narrow.unbind()
            s._narrow = narrow if on else None
            s._bound_cache = None  # bind the cache again, after the input and outputs

    def generate(self, ids: list[int], n_new: int) -> tuple[list[int], float, float, int]:
        """Tokens, decode seconds (after the prefill), onnxruntime's seconds in them, rounds."""
        steps = self.model.stream(ids, max_new_tokens=n_new, ignore_eos=True)
        tokens = list(next(steps).tokens)
        inside = sum(t.seconds for t in self.timers)
        start, rounds = time.perf_counter(), 0
        for chunk in steps:
            tokens += chunk.tokens
            rounds += 1
        seconds = time.perf_counter() - start
        return tokens, seconds, sum(t.seconds for t in self.timers) - inside, rounds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=Path, default=DEFAULT_MODELS / "trained")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pause", type=float, default=0.05, help="seconds before each generation")
    ap.add_argument("--modes", default=",".join(MODES), help="of: " + ", ".join(MODES))
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    names = [m.strip() for m in args.modes.split(",") if m.strip()]
    if unknown := [m for m in names if m not in MODES]:
        raise SystemExit(f"unknown mode(s) {unknown}: choose from {', '.join(MODES)}")
    bundle = pair_bundle(args.models, "int4")
    rows = {name: Row(bundle, MODES[name], args.threads) for name in names}
    tokenizer = next(iter(rows.values())).model.tokenizer
    prompts = [tokenizer.encode(p) for p in load_prompts(args.models, "code", args.prompts)]
    # (mode, narrow on) -> [tokens, seconds, onnxruntime seconds, rounds]
    sums = {(n, on): [0, 0.0, 0.0, 0] for n in names for on in (True, False)}
    ar_tokens: dict[int, list[int]] = {}
    rng = random.Random(0)
    for _ in range(args.passes):
        for i, ids in enumerate(prompts):
            turns = [(n, on) for n in names for on in (True, False)]
            rng.shuffle(turns)
            for name, on in turns:
                rows[name].switch(on)
                time.sleep(args.pause)
                tokens, seconds, inside, rounds = rows[name].generate(ids, args.max_new_tokens)
                if ar_tokens.setdefault(i, tokens) != tokens:
                    raise SystemExit(f"{name} (narrow {on}) differs from the others on prompt {i}")
                s = sums[name, on]
                s[0] += len(tokens) - 1
                s[1] += seconds
                s[2] += inside
                s[3] += rounds
    columns = ["mode", "tok/s narrow", "tok/s before", "ratio", "round µs", "in ort", "outside"]
    print(f"decode tokens/s after the prefill; per round µs with Narrow on; {load_line()}")
    print(table_header(columns, "lrrrrrr"))
    out = []
    for name in names:
        on, off = sums[name, True], sums[name, False]
        row = {
            "mode": name,
            "tok_s": on[0] / on[1],
            "tok_s_before": off[0] / off[1],
            "round_us": on[1] / on[3] * 1e6,
            "ort_us": on[2] / on[3] * 1e6,
            "outside_us": (on[1] - on[2]) / on[3] * 1e6,
        }
        row["ratio"] = row["tok_s"] / row["tok_s_before"]
        out.append(row)
        print(
            table_row(
                [
                    name,
                    f"{row['tok_s']:.0f}",
                    f"{row['tok_s_before']:.0f}",
                    f"{row['ratio']:.3f}",
                    f"{row['round_us']:.0f}",
                    f"{row['ort_us']:.0f}",
                    f"{row['outside_us']:.0f} ({row['outside_us'] / row['round_us']:.1%})",
                ]
            )
        )
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
