"""The server under load: batched verification, chunked prefills, devices against a batched
server, and a verifier fleet.

    python -m benchmarks.serving batching [--bundle B] [--gammas 0,4] [--sessions 1,2,4,8,16]
    python -m benchmarks.serving prefill [--chunks 0,256] [--budgets-ms 0,20]
    python -m benchmarks.serving load [--devices 1,2,4,8] [--gammas 0,4]
    python -m benchmarks.serving fleet [--devices 16 32] [--seconds 20]
    python -m benchmarks.serving batching --sessions 1,4 --batches 3 --repeats 1   # smoke runs
    python -m benchmarks.serving prefill --prompts 2 --prompt-len 300 --idle-rounds 5
    python -m benchmarks.serving load --devices 2 --seconds 3 --new-tokens 16
    python -m benchmarks.serving fleet --devices 2 --seconds 4 --skip-failover

* `batching`: N sessions (random 150-token prompts prefilled into a `KVPool`) each send one
  round of γ random drafts per batch; `verify_rounds` runs the N rounds in one batched plan or
  each alone (what `--max-batch 1` does), alternately `--repeats` times (the order flips every
  repeat); median ms per batch of N rounds and rounds/s. No devices, no network.
* `prefill`: one session decodes (γ = 0 rounds, one after another) on the server's worker,
  alone (idle latency) and while `--prompts` other sessions START with `--prompt-len`-token
  prompts; per `--chunks` (most positions per chunk; 0: a prefill in one piece) and
  `--budgets-ms` (chunks sized to take about that long): the running session's round latency
  (p50 / p99 / max) during the prefills, its ratio to idle, and the prefills' time.
* `load`: N emulated devices (`lib.serving.run_devices`: threads, split decoding with the
  lookup drafter at fixed γ) through a channel emulator at `--rtt` ms against a batched server
  (`--max-batch 16`: rounds that arrive together share forwards) and an unbatched one
  (`--max-batch 1`), both up for the whole test, measured alternately for every N (the order
  flips from N to N): total tok/s, p50 / p99 of a round, and the batched server's rounds per
  batch and per forward (its /health).
* `fleet`: N emulated devices (threads, split decoding with the lookup drafter, fixed:3,
  each through its own channel emulator at `--rtt` ms) against `edgespec serve` as a plain
  server, a 1-replica and a 2-replica Ray Serve fleet, then a run that SIGKILLs the busiest
  replica mid-load: tokens/s over all devices, p50 / p99 of a round as the device saw it,
  and sessions lost (a generation that failed or differs from the bundle's greedy output).
  On one small machine the replicas share its cores: the rows measure the Ray ingress's
  overhead and the failover, not scaling.

`batching` and `load` take the trained pair's bundle by default, the others a small random
llama.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np

import edgespec
from benchmarks.lib import flags
from benchmarks.lib.machine import load_line
from benchmarks.lib.models import TRAINED, load_prompts, pair_bundle, small_bundle
from benchmarks.lib.serving import health, run_devices, server
from benchmarks.lib.tables import table, write_result
from edgespec.protocol import Start, Verify


# --------------------------------------------------------------------------- batching
def batch_time(model: Any, n: int, gamma: int, batched: bool, batches: int, context: int) -> float:
    """Seconds per batch of n rounds (after one warm-up batch)."""
    from edgespec.serve.batching import KVPool
    from edgespec.serve.session import release, start, verify_rounds

    stages, m = model.target.stages, model.target.model
    pool = KVPool.allocate(
        list(range(m.num_layers)), m.num_kv_heads, m.head_dim, context, n, stages[0].kv_dtype
    )
    rng = np.random.default_rng(n)
    sessions = []
    for _ in range(n):
        prompt = [int(t) for t in rng.integers(1, m.vocab_size, 150)]
        sessions.append(start(pool, stages, Start(prompt, context, temperature=0.0), context)[0])
    times = []
    for b in range(batches + 1):
        drafts = [[int(t) for t in rng.integers(1, m.vocab_size, gamma)] for _ in sessions]
        rounds = [(s, Verify(len(s.seq), d)) for s, d in zip(sessions, drafts, strict=True)]
        t0 = time.perf_counter()
        if batched:
            outcomes = verify_rounds(pool, stages, rounds)
        else:
            outcomes = [verify_rounds(pool, stages, [r])[0] for r in rounds]
        if b:
            times.append(time.perf_counter() - t0)
        if any(e is not None for _, e in outcomes):
            raise SystemExit(f"a verify round failed: {outcomes}")
    for s in sessions:
        release(pool, s)
    return float(np.median(times))


def batching(args: Any) -> list[dict[str, Any]]:
    model = edgespec.load(args.bundle or pair_bundle(), threads=args.threads)
    gammas, sessions = flags.listed(args.gammas, int), flags.listed(args.sessions, int)
    # room for every round even if all its drafts were accepted
    context = min(150 + (args.batches + 2) * (max(gammas) + 1), model.target.max_positions)
    rows = []
    for gamma in gammas:
        for n in sessions:
            alone, batched = [], []
            for r in range(args.repeats):
                for b in (False, True) if r % 2 == 0 else (True, False):
                    t = batch_time(model, n, gamma, b, args.batches, context)
                    (batched if b else alone).append(t)
            rows.append({"gamma": gamma, "sessions": n, "alone_s": float(np.median(alone)),
                         "batched_s": float(np.median(batched))})  # fmt: skip
    print(table(
        ["γ", "sessions", "alone ms/batch", "batched ms/batch", "alone rounds/s",
         "batched rounds/s", "batched / alone"], "rrrrrrr",
        [[r["gamma"], r["sessions"], f"{r['alone_s'] * 1e3:.1f}", f"{r['batched_s'] * 1e3:.1f}",
          f"{r['sessions'] / r['alone_s']:.0f}", f"{r['sessions'] / r['batched_s']:.0f}",
          f"{r['alone_s'] / r['batched_s']:.2f}x"] for r in rows],
    ))  # fmt: skip
    return rows


# --------------------------------------------------------------------------- prefill
async def prefill_scenario(state: Any, prompts: list[list[int]], idle_rounds: int) -> dict:
    from edgespec.serve.session import prefill

    worker, pool_stages = state.worker, (state.pool, state.stages)
    chunk, context = state.config.prefill_chunk, state.max_context
    budget = state.config.prefill_budget_ms / 1000
    running, _ = await worker.steps(
        prefill, *pool_stages, Start([1, 2, 3], context), context, [], chunk, budget
    )

    async def one_round() -> float:
        t = time.perf_counter()
        await worker.round((running, Verify(len(running.seq), [])))
        return time.perf_counter() - t

    idle = [await one_round() for _ in range(idle_rounds)]
    t0 = time.perf_counter()
    longs = [
        asyncio.ensure_future(
            worker.steps(prefill, *pool_stages, Start(p, len(p) + 2), context, [], chunk, budget)
        )
        for p in prompts
    ]
    busy = []
    while not all(t.done() for t in longs):
        busy.append(await one_round())
    await asyncio.gather(*longs)
    return {"idle": idle, "busy": busy, "prefill_s": time.perf_counter() - t0}


def prefills(args: Any) -> list[dict[str, Any]]:
    from edgespec.serve.state import ServerConfig, load_state

    bundle = args.bundle or small_bundle(256, 4, args.prompt_len + 304)
    rng = np.random.default_rng(0)
    rows = []
    for chunk in flags.listed(args.chunks, int):
        for budget in flags.listed(args.budgets_ms, float):
            if chunk == 0 and budget:
                continue  # unchunked: no budget applies
            config = ServerConfig(str(bundle), threads=args.threads, max_sessions=args.prompts + 1,
                                  prefill_chunk=chunk, prefill_budget_ms=budget)  # fmt: skip
            state = load_state(config)
            vocab = state.manifest.target.vocab_size
            prompts = [[int(t) for t in rng.integers(1, vocab, args.prompt_len)]
                       for _ in range(args.prompts)]  # fmt: skip
            try:
                r = asyncio.run(prefill_scenario(state, prompts, args.idle_rounds))
            finally:
                state.worker.stop()
            idle, busy = float(np.median(r["idle"])) * 1e3, np.asarray(r["busy"]) * 1e3
            rows.append({"chunk": chunk, "budget_ms": budget, "idle_p50_ms": idle,
                         "p50_ms": float(np.percentile(busy, 50)),
                         "p99_ms": float(np.percentile(busy, 99)), "max_ms": float(busy.max()),
                         "rounds": len(busy), "prefill_s": r["prefill_s"]})  # fmt: skip
    print(table(
        ["chunk", "budget ms", "idle p50 ms", "p50 ms", "p99 ms", "max ms", "p50 / idle",
         "rounds", "prefills s"], "rrrrrrrrr",
        [[r["chunk"], f"{r['budget_ms']:g}", f"{r['idle_p50_ms']:.2f}", f"{r['p50_ms']:.1f}",
          f"{r['p99_ms']:.1f}", f"{r['max_ms']:.1f}", f"{r['p50_ms'] / r['idle_p50_ms']:.1f}x",
          r["rounds"], f"{r['prefill_s']:.2f}"] for r in rows],
    ))  # fmt: skip
    return rows


# --------------------------------------------------------------------------- fleet
PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return",
    "for i in range(10):\n    print(i)\nfor j in range(10):\n    print(",
    "import os\nimport sys\nimport json\nimport time\nimport",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y =",
]


def fleet(args: Any) -> list[dict[str, Any]]:
    from edgespec.tools.channel import Channel, ChannelConfig

    bundle = args.bundle or small_bundle(args.hidden, args.layers, 512)
    ar = edgespec.load(bundle, threads=1)
    reference = {p: ar.generate(p, max_new_tokens=args.new_tokens, ignore_eos=True).tokens
                 for p in PROMPTS}  # fmt: skip
    rows = []
    for name, replicas in (("plain server", None), ("fleet, 1 replica", 1), ("fleet, 2", 2)):
        with server(bundle, 1, max(args.devices) + 8, replicas=replicas, quiet=True) as port:
            runs = [(n, False) for n in args.devices]
            if replicas == 2 and not args.skip_failover:
                runs.append((max(args.devices), True))
            for n, kill in runs:
                seen: dict[str, Any] = {}

                def midway(port: int = port, kill: bool = kill, seen: dict = seen) -> None:
                    replicas_now = health(port).get("per_replica", [])
                    seen["split"] = "/".join(str(r["sessions"]) for r in replicas_now) or "-"
                    if kill:  # the busiest replica
                        victim = max(replicas_now, key=lambda r: r["sessions"])
                        seen["killed_sessions"] = victim["sessions"]
                        os.kill(victim["pid"], signal.SIGKILL)

                config = ChannelConfig(rtt_ms=args.rtt)
                with contextlib.ExitStack() as stack:
                    chans = [stack.enter_context(Channel(f"127.0.0.1:{port}", config))
                             for _ in range(n)]  # fmt: skip
                    urls = [f"ws://{ch.address}" for ch in chans]
                    r = run_devices(bundle, urls, PROMPTS, args.new_tokens, 3, args.seconds,
                                    reference, midway)  # fmt: skip
                rows.append(dict(r, **seen, server=name + (", one killed" if kill else "")))
                print(rows[-1], flush=True)
    plain = {r["devices"]: r["tokens_per_s"] for r in rows if r["server"] == "plain server"}
    print(table(
        ["server", "devices", "sessions per replica", "tokens/s", "x plain", "round p50 ms",
         "round p99 ms", "generations", "lost", "reconnects", "local rounds"], "llrrrrrrrrr",
        [[r["server"], r["devices"], r["split"], f"{r['tokens_per_s']:.0f}",
          f"{r['tokens_per_s'] / plain[r['devices']]:.2f}" if plain.get(r["devices"]) else "-",
          f"{r['p50_ms']:.0f}", f"{r['p99_ms']:.0f}", r["generations"], r["lost"],
          r["reconnects"], r["local_rounds"]] for r in rows],
    ))  # fmt: skip
    for r in rows:
        if "killed_sessions" in r:
            print(f"\nkilled a replica holding {r['killed_sessions']} sessions: {r['lost']} "
                  f"generations lost, the slowest round within 2 s of the kill "
                  f"{r['max_near_midway_ms']:.0f} ms")  # fmt: skip
    return rows


# --------------------------------------------------------------------------- load
def load(args: Any) -> list[dict[str, Any]]:
    """N devices at once against a batched and an unbatched server, each behind its own
    channel (`--rtt`, 10 Mbit/s), measured alternately for each γ and N (the order flips)."""
    from edgespec.tools.channel import Channel, ChannelConfig

    bundle = args.bundle or pair_bundle()
    prompts = load_prompts(TRAINED / "prompts_code.jsonl", 4) if args.bundle is None else PROMPTS
    servers = {
        "unbatched": ["--max-batch", "1"],
        "batched": ["--max-batch", str(args.max_batch), "--batch-window-ms",
                    str(args.batch_window_ms)],
    }  # fmt: skip
    sessions = max(16, max(args.devices))
    config = ChannelConfig(rtt_ms=args.rtt, bandwidth_mbit=10)
    rows, flip = [], False
    with contextlib.ExitStack() as stack:
        ports = {n: stack.enter_context(server(bundle, args.threads, sessions, *extra))
                 for n, extra in servers.items()}  # fmt: skip
        urls = {n: f"ws://{stack.enter_context(Channel(f'127.0.0.1:{p}', config)).address}"
                for n, p in ports.items()}  # fmt: skip
        for gamma in args.gammas:
            for n in args.devices:
                order = ["batched", "unbatched"] if flip else ["unbatched", "batched"]
                flip = not flip
                for name in order:
                    before = health(ports[name])
                    r = run_devices(bundle, [urls[name]] * n, prompts, args.new_tokens, gamma,
                                    args.seconds)  # fmt: skip
                    r |= {"server": name, "gamma": gamma} | batch_stats(before, health(ports[name]))
                    rows.append(r)
    by = {(r["gamma"], r["devices"], r["server"]): r for r in rows}
    cells = []
    for gamma, n, _ in sorted(k for k in by if k[2] == "batched"):
        b, u = by[(gamma, n, "batched")], by[(gamma, n, "unbatched")]
        cells.append([gamma, n, f"{u['tokens_per_s']:.1f}", f"{b['tokens_per_s']:.1f}",
                      f"{b['tokens_per_s'] / u['tokens_per_s']:.2f}x",
                      f"{u['p50_ms']:.0f} / {u['p99_ms']:.0f}",
                      f"{b['p50_ms']:.0f} / {b['p99_ms']:.0f}",
                      f"{b['mean_drafted']:.1f}", f"{b['mean_batch']:.2f}",
                      f"{b['rounds_per_forward']:.2f}"])  # fmt: skip
    print(table(
        ["γ", "devices", "unbatched tok/s", "batched tok/s", "batched / unbatched",
         "unbatched p50 / p99 ms", "batched p50 / p99 ms", "drafts per round",
         "rounds per batch", "rounds per forward"], "rrrrrllrrr", cells,
    ))  # fmt: skip
    return rows


def batch_stats(before: dict, after: dict) -> dict:
    """Mean rounds per batch and per forward between two /health reports."""

    def mean(key: str) -> float:
        diff = {int(k): v - before.get(key, {}).get(k, 0) for k, v in after.get(key, {}).items()}
        count = sum(diff.values())
        return sum(k * v for k, v in diff.items()) / count if count else 0.0

    return {"mean_batch": mean("batches"), "rounds_per_forward": mean("rounds_per_forward")}


def main(argv: list[str] | None = None) -> None:
    p = flags.parser(__doc__)
    sub = p.add_subparsers(dest="scenario", required=True)
    b = sub.add_parser("batching", help="batched vs one-by-one verify rounds")
    b.add_argument("--sessions", default="1,2,4,8,16")
    b.add_argument("--gammas", default="0,4")
    b.add_argument("--batches", type=int, default=20, help="batches timed per measurement")
    b.add_argument("--repeats", type=int, default=2, help="alternations of batched / alone")
    f = sub.add_parser("prefill", help="chunked prefills beside a decoding session")
    f.add_argument("--chunks", default="0,256")
    f.add_argument("--budgets-ms", default="0,20", help="prefill_budget_ms values to try")
    f.add_argument("--prompts", type=int, default=6)
    f.add_argument("--prompt-len", type=int, default=2000)
    f.add_argument("--idle-rounds", type=int, default=50)
    d = sub.add_parser("load", help="devices against a batched and an unbatched server")
    d.add_argument("--devices", default="1,2,4,8", type=lambda x: flags.listed(x, int))
    d.add_argument("--gammas", default="4", type=lambda x: flags.listed(x, int))
    d.add_argument("--seconds", type=float, default=5.0)
    d.add_argument("--new-tokens", type=int, default=64)
    d.add_argument("--rtt", type=float, default=50.0, help="channel RTT, ms")
    d.add_argument("--max-batch", type=int, default=16, help="the batched server's --max-batch")
    d.add_argument("--batch-window-ms", type=float, default=0.0)
    r = sub.add_parser("fleet", help="devices against a plain server and Ray Serve fleets")
    r.add_argument("--hidden", type=int, default=256, help="random model: hidden size")
    r.add_argument("--layers", type=int, default=4, help="random model: layers")
    r.add_argument("--devices", type=int, nargs="+", default=[16, 32])
    r.add_argument("--seconds", type=float, default=20.0)
    r.add_argument("--new-tokens", type=int, default=64)
    r.add_argument("--rtt", type=float, default=20.0, help="channel RTT per device, ms")
    r.add_argument("--skip-failover", action="store_true")
    for s in (b, f, d, r):
        flags.add_common(s, threads=1)
        s.add_argument("--bundle", type=Path, default=None, help=f"default: see above ({TRAINED})")
    args = p.parse_args(argv)
    print(load_line(), flush=True)
    run = {"batching": batching, "prefill": prefills, "load": load, "fleet": fleet}
    rows = run[args.scenario](args)
    print(f"\n{load_line()}")
    write_result(args.json, args, {"rows": rows})


if __name__ == "__main__":
    main()
