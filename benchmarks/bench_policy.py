"""Draft-length policies on replayed acceptance, against every fixed γ in hindsight.

A controlled, deterministic testbed for `auto` (issue 17 part 3): no model runs. Greedy
speculative decoding is fully described by one bit per output position, "the drafter's next
token, given the right prefix, equals the target's" — a round at position p drafting γ accepts
the run of 1s starting at p, capped at γ, and adds that many tokens plus one. So a policy can
be replayed against such a trace, with round times from a cost model with noise, and compared
with every fixed γ on the very same trace and the very same noise.

Traces (`--scenarios`):
  geo:A         independent bits with P(1) = A (what bench_oracle.py's oracle drafter does)
  bursty:E,H,S  a two-state Markov regime: acceptance E in easy stretches, H in hard ones,
                switching with probability S per token (real text: runs of predictable code)
  file:PATH     a real trace, one 0/1 per line or a JSON list (acceptance_trace.py writes one)
Costs (`--costs`), seconds per round, each multiplied by lognormal noise (σ `--noise`) and,
with probability `--spikes`, by 3 (another process took the CPU):
  plain step   t_target
  γ ≥ 1 round  overhead + γ·t_draft + t_target·(1 + slope·γ)   (verify γ + 1 positions)
and, with `--cold TOKENS,ROUNDS,FACTOR`, the first ROUNDS rounds of every TOKENS-token
generation FACTOR times slower (an app, or bench_auto, that runs other models in between).
Named cost sets: `360m-135m` (bench_oracle's SmolLM2-360M target, 135M draft), `self-spec@8`,
`self-spec@16` (draft = that share of the target's layers), `trained` (bench_auto's pair),
`trained@2` (its self-spec at exit 2), `360m-135m-int4-step` and `self-spec@8-step` (the Xeon
host's, whose verify steps up at 7 positions).

    python benchmarks/bench_policy.py                      # every scenario, a table
    python benchmarks/bench_policy.py --scenarios geo:0.8 --costs 360m-135m --tokens 4000

Prints per (scenario, costs): tok/s of `auto` and of each fixed γ, the best fixed γ, auto's
ratio to it, and auto's mean γ. This measures the policy's decisions, not the runtime's
speed: the real runs are bench_oracle.py and bench_auto.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgespec.runtime.registry import make_policy
from edgespec.runtime.stats import RoundStats


@dataclass(frozen=True)
class Costs:
    t_target: float  # a plain step (s)
    t_draft: float  # one drafted token (s)
    overhead: float = 0.0  # per speculative round: loop, acceptance, cache bookkeeping (s)
    slope: float = 0.05  # each extra verified position costs this share of a plain step
    # from γ = step_at on, a verify costs `step` more (this share of a plain step): GEMM
    # tiles, e.g. 7 positions cost 8 ms more than 6 on the 360M shape (stop 30)
    step_at: int = 0
    step: float = 0.0


COSTS = {
    # measured step times (bench_oracle / bench_auto rows): 360M target, 135M draft, 2 threads
    "360m-135m": Costs(0.100, 0.040, 0.001, 0.06),
    "self-spec@8": Costs(0.100, 0.025, 0.001, 0.06),
    "self-spec@16": Costs(0.100, 0.050, 0.001, 0.06),
    # the same fp32 target with the 135M draft in int8 / int4 (bench_oracle, stop 26: a 62 ms
    # plain step, 9.5 / 7.5 ms a drafted token, a verify of γ + 1 positions ~+4% a position)
    "360m-135m-int8": Costs(0.062, 0.0095, 0.0001, 0.04),
    "360m-135m-int4": Costs(0.062, 0.0075, 0.0001, 0.04),
    # the same on the Xeon host (bench_oracle, stop 30): a 57.7 ms plain step, 6.2 ms a drafted
    # token, a verify of 4-6 positions +1.2 ms a position, then 8 ms more from 7 positions on
    "360m-135m-int4-step": Costs(0.0577, 0.0062, 0.0001, 0.021, 6, 0.14),
    "self-spec@8-step": Costs(0.0577, 0.0197, 0.0001, 0.021, 6, 0.11),
    # the same shapes in fp16 on an NVIDIA H200 (bench_oracle --device cuda, stop 28): a
    # launch-bound 4.8 ms step, verifying 7 positions costs ~what 1 does, the 30-layer draft
    # 3.5 ms a token, exit 8 1.5 ms, exit 16 2.5 ms
    "h200-360m-135m": Costs(0.0048, 0.0035, 0.0001, 0.015),
    "h200-self-spec@8": Costs(0.0048, 0.0015, 0.0001, 0.015),
    "h200-self-spec@16": Costs(0.0048, 0.0025, 0.0001, 0.015),
    # the trained 11M pair: 2.4 ms target step, a 2-layer draft, per-call overheads matter
    "trained": Costs(0.0024, 0.0006, 0.0003, 0.08),
    # its self-spec at exit 2 of 8 layers: a head step (2 layers + the LM head) per draft
    "trained@2": Costs(0.0024, 0.0008, 0.0003, 0.08),
    # the trained pair with its int4 draft on the Xeon host (stop 32, one process): a 1.55 ms
    # plain step, 0.19 ms a drafted token, +0.06 ms a verified position, and 0.32 ms more
    # from 7 positions on
    "trained-int4-step": Costs(0.00155, 0.00019, 0.00008, 0.04, 6, 0.2),
}


def trace_for(spec: str, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    kind, _, arg = spec.partition(":")
    if kind == "geo":
        return (rng.random(n) < float(arg)).astype(np.int8)
    if kind == "bursty":
        easy, hard, switch = (float(v) for v in arg.split(","))
        bits = np.empty(n, np.int8)
        state = True
        for i in range(n):
            if rng.random() < switch:
                state = not state
            bits[i] = rng.random() < (easy if state else hard)
        return bits
    if kind == "file":
        text = Path(arg).read_text()
        values = json.loads(text) if text.lstrip().startswith("[") else text.split()
        bits = np.asarray([int(v) for v in values], np.int8)
        return np.resize(bits, max(n, len(bits)))
    raise SystemExit(f"unknown scenario {spec!r}: geo:A, bursty:E,H,S or file:PATH")


def replay(
    policy_name: str,
    bits: np.ndarray,
    costs: Costs,
    tokens: int,
    noise: float,
    spikes: float,
    seed: int,
    cold: tuple[int, int, float] = (0, 0, 1.0),
) -> tuple[float, float]:
    """(tokens per second, mean γ) of one policy over the trace. `cold`: (tokens per
    generation, slow rounds at its start, their factor): the first rounds of each generation
    are slow, as in an app (or bench_auto) that runs other models between generations."""
    policy = make_policy(policy_name)
    rng = np.random.default_rng(seed)  # the same noise stream for every policy
    pos, seconds, rounds, drafted_total = 0, 0.0, 0, 0
    per_generation, cold_rounds, cold_factor = cold
    start, since = 0, 0  # this generation's first position, rounds since it
    while pos < tokens:
        if per_generation and pos - start >= per_generation:
            start, since = pos, 0
        g = min(policy.plan().length, tokens - pos - 1)
        run = 0
        while run < g and bits[pos + run]:
            run += 1
        factor = float(np.exp(rng.normal(0.0, noise))) * (3.0 if rng.random() < spikes else 1.0)
        if per_generation and since < cold_rounds:
            factor *= cold_factor
        since += 1
        if g == 0:
            draft_s, verify_s, total = 0.0, costs.t_target * factor, costs.t_target * factor
        else:
            draft_s = g * costs.t_draft * factor
            step = costs.step if costs.step_at and g >= costs.step_at else 0.0
            verify_s = costs.t_target * (1 + costs.slope * g + step) * factor
            total = draft_s + verify_s + costs.overhead * factor
        policy.observe(RoundStats("decode", run + 1, g + 1, total, g, run, draft_s, verify_s))
        pos += run + 1
        seconds += total
        rounds += 1
        drafted_total += g
    return pos / seconds, drafted_total / rounds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenarios", default="geo:0.5,geo:0.7,geo:0.8,geo:0.9,bursty:0.95,0.3,0.05")
    ap.add_argument("--costs", default="360m-135m,self-spec@8,self-spec@16,trained")
    ap.add_argument("--policies", default="auto", help="adaptive policies to compare")
    ap.add_argument("--gammas", default="1,2,3,4,5,6,8,10,12")
    ap.add_argument("--tokens", type=int, default=2000, help="tokens per replay")
    ap.add_argument("--repeats", type=int, default=5, help="traces per scenario (seeds)")
    ap.add_argument("--noise", type=float, default=0.1)
    ap.add_argument("--spikes", type=float, default=0.02)
    ap.add_argument(
        "--cold",
        default="0,0,1",
        help="TOKENS,ROUNDS,FACTOR: each generation of TOKENS starts with ROUNDS rounds FACTOR "
        "times slow (other models ran meanwhile); 0,0,1: one long generation",
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    scenarios = _split_scenarios(args.scenarios)
    t, r, f = args.cold.split(",")
    cold = (int(t), int(r), float(f))
    gammas = [int(g) for g in args.gammas.split(",")]
    adaptive = args.policies.split(",")
    out = []
    print(
        "| scenario | costs | best fixed γ | its tok/s | "
        + " | ".join(f"{p} tok/s | {p} / best | {p} mean γ" for p in adaptive)
        + " |"
    )
    print("|---|---|---:|---:|" + "---:|---:|---:|" * len(adaptive))
    for scenario in scenarios:
        for cost_name in args.costs.split(","):
            costs = COSTS[cost_name]
            fixed = {g: 0.0 for g in gammas}
            rates = {p: [0.0, 0.0] for p in adaptive}
            for r in range(args.repeats):
                bits = trace_for(scenario, args.tokens + 64, seed=r)
                for g in gammas:
                    fixed[g] += replay(
                        f"fixed:{g}", bits, costs, args.tokens, args.noise, args.spikes, r, cold
                    )[0]
                for p in adaptive:
                    tps, mean_g = replay(
                        p, bits, costs, args.tokens, args.noise, args.spikes, r, cold
                    )
                    rates[p][0] += tps
                    rates[p][1] += mean_g
            best = max(fixed, key=lambda g: fixed[g])
            n = args.repeats
            cells = [
                f"{rates[p][0] / n:.2f} | {rates[p][0] / fixed[best]:.3f} | {rates[p][1] / n:.2f}"
                for p in adaptive
            ]
            print(
                f"| {scenario} | {cost_name} | {best} | {fixed[best] / n:.2f} | "
                + " | ".join(cells)
                + " |"
            )
            out.append(
                {
                    "scenario": scenario,
                    "costs": cost_name,
                    "fixed": {g: v / n for g, v in fixed.items()},
                    "adaptive": {
                        p: {"tps": v[0] / n, "mean_gamma": v[1] / n} for p, v in rates.items()
                    },
                }
            )
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


def _split_scenarios(text: str) -> list[str]:
    """`geo:0.5,bursty:0.95,0.3,0.05` -> ["geo:0.5", "bursty:0.95,0.3,0.05"]."""
    parts: list[str] = []
    for piece in text.split(","):
        if ":" in piece or not parts:
            parts.append(piece)
        else:
            parts[-1] += "," + piece
    return parts


if __name__ == "__main__":
    sys.exit(main())
