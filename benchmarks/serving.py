"""The server under load: batched verification, chunked prefills, and a verifier fleet.

    python -m benchmarks.serving batching [--bundle B] [--gammas 0,4] [--sessions 1,2,4,8,16]
    python -m benchmarks.serving prefill [--chunks 0,256] [--budgets-ms 0,20]
    python -m benchmarks.serving fleet [--devices 16 32] [--seconds 20]
    python -m benchmarks.serving batching --sessions 1,4 --batches 3 --repeats 1   # smoke runs
    python -m benchmarks.serving prefill --prompts 2 --prompt-len 300 --idle-rounds 5
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
* `fleet`: N emulated devices (threads, split decoding with the lookup drafter, fixed:3,
  each through its own channel emulator at `--rtt` ms) against `edgespec serve` as a plain
  server, a 1-replica and a 2-replica Ray Serve fleet, then a run that SIGKILLs the busiest
  replica mid-load: tokens/s over all devices, p50 / p99 of a round as the device saw it,
  and sessions lost (a generation that failed or differs from the bundle's greedy output).
  On one small machine the replicas share its cores: the rows measure the Ray ingress's
  overhead and the failover, not scaling.

`batching` takes the trained pair's bundle by default, the others a small random llama.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

import edgespec
from benchmarks.lib import flags
from benchmarks.lib.machine import load_line
from benchmarks.lib.models import TRAINED, pair_bundle, small_bundle
from benchmarks.lib.serving import health, server
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
    from edgespec.serve.server import ServerConfig, load_state

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


def load_run(bundle: Path, port: int, devices: int, args: Any, reference: dict,
             kill: bool = False) -> dict:  # fmt: skip
    """`devices` devices for `args.seconds`; with `kill`, SIGKILL the busiest replica midway."""
    from edgespec.tools.channel import Channel, ChannelConfig

    rounds: list[tuple[float, float]] = []  # (end time, latency) of every decode round
    stats = {"tokens": 0, "generations": 0, "lost": 0, "reconnects": 0, "local_rounds": 0}
    lock = threading.Lock()
    start = time.monotonic() + 2.0  # devices connect first
    stop_at = start + args.seconds
    killed: dict = {}

    def device(i: int, url: str) -> None:
        model = edgespec.load(bundle, mode="split", server=url, threads=1, drafter="lookup",
                              draft_policy="fixed:3")  # fmt: skip
        model.remote.retries = 6
        while time.monotonic() < start:
            time.sleep(0.01)
        k = i
        while time.monotonic() < stop_at:
            prompt = PROMPTS[k % len(PROMPTS)]
            k += 1
            tokens, mine, reconnects, local, counted = [], [], 0, 0, 0
            try:
                last = time.monotonic()
                for chunk in model.stream(prompt, max_new_tokens=args.new_tokens, ignore_eos=True):
                    now = time.monotonic()
                    tokens += chunk.tokens
                    s = chunk.stats
                    reconnects += s.reconnected
                    local += s.verifier == "local"
                    if start <= now <= stop_at:
                        counted += len(chunk.tokens)
                        if s.phase == "decode":
                            mine.append((now, now - last))
                    last = now
                ok = tokens == reference[prompt]
            except Exception:
                ok = False
            with lock:
                rounds.extend(mine)
                stats["tokens"] += counted
                stats["generations"] += 1
                stats["lost"] += not ok
                stats["reconnects"] += reconnects
                stats["local_rounds"] += local
        model.remote.drop()

    config = ChannelConfig(rtt_ms=args.rtt)
    channels = [Channel(f"127.0.0.1:{port}", config) for _ in range(devices)]
    for ch in channels:
        ch.__enter__()
    threads = [threading.Thread(target=device, args=(i, f"ws://{ch.address}"))
               for i, ch in enumerate(channels)]  # fmt: skip
    for t in threads:
        t.start()
    time.sleep(max(0.0, start + args.seconds / 2 - time.monotonic()))
    replicas = health(port).get("per_replica", [])
    split = [r["sessions"] for r in replicas]  # sessions per replica at mid-run
    if kill:
        victim = max(replicas, key=lambda r: r["sessions"])
        killed.update(victim, at=time.monotonic())
        os.kill(victim["pid"], signal.SIGKILL)
    for t in threads:
        t.join()
    for ch in channels:
        ch.__exit__(None, None, None)
    lat = np.array([x for _, x in rounds]) * 1000
    out = dict(stats, devices=devices, split="/".join(map(str, split)) or "-")
    out["tokens_per_s"] = stats["tokens"] / args.seconds
    out["p50_ms"] = float(np.percentile(lat, 50)) if len(lat) else float("nan")
    out["p99_ms"] = float(np.percentile(lat, 99)) if len(lat) else float("nan")
    if killed:
        near = np.array([x for t, x in rounds if abs(t - killed["at"]) <= 2.0]) * 1000
        out["killed_sessions"] = killed["sessions"]
        out["p99_near_kill_ms"] = float(np.percentile(near, 99)) if len(near) else float("nan")
    return out


def fleet(args: Any) -> list[dict[str, Any]]:
    bundle = args.bundle or small_bundle(args.hidden, args.layers, 512)
    ar = edgespec.load(bundle, threads=1)
    reference = {p: ar.generate(p, max_new_tokens=args.new_tokens, ignore_eos=True).tokens
                 for p in PROMPTS}  # fmt: skip
    rows = []
    for name, replicas in (("plain server", None), ("fleet, 1 replica", 1), ("fleet, 2", 2)):
        with server(bundle, 1, max(args.devices) + 8, replicas=replicas, quiet=True) as port:
            for n in args.devices:
                rows.append(dict(load_run(bundle, port, n, args, reference), server=name))
                print(rows[-1], flush=True)
            if replicas == 2 and not args.skip_failover:
                r = load_run(bundle, port, max(args.devices), args, reference, kill=True)
                rows.append(dict(r, server="fleet, 2, one killed"))
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
                  f"generations lost, p99 of rounds within ±2 s of the kill "
                  f"{r['p99_near_kill_ms']:.0f} ms")  # fmt: skip
    return rows


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
    r = sub.add_parser("fleet", help="devices against a plain server and Ray Serve fleets")
    r.add_argument("--hidden", type=int, default=256, help="random model: hidden size")
    r.add_argument("--layers", type=int, default=4, help="random model: layers")
    r.add_argument("--devices", type=int, nargs="+", default=[16, 32])
    r.add_argument("--seconds", type=float, default=20.0)
    r.add_argument("--new-tokens", type=int, default=64)
    r.add_argument("--rtt", type=float, default=20.0, help="channel RTT per device, ms")
    r.add_argument("--skip-failover", action="store_true")
    for s in (b, f, r):
        flags.add_common(s, threads=1)
        s.add_argument("--bundle", type=Path, default=None, help=f"default: see above ({TRAINED})")
    args = p.parse_args(argv)
    print(load_line(), flush=True)
    rows = {"batching": batching, "prefill": prefills, "fleet": fleet}[args.scenario](args)
    print(f"\n{load_line()}")
    write_result(args.json, args, {"rows": rows})


if __name__ == "__main__":
    main()
