"""Where decoding should happen: split decoding against the centralized streaming it replaces.

N devices at once against one `edgespec serve` (the server's best mode; its CPU time read from
its own process, so the devices sharing the machine do not distort it), per RTT at
`--bandwidth`, through the channel emulator: device-only (one device alone: a device is its own
hardware), centralized streaming (each device an app streaming the server's
`/v1/completions`), split fixed:3 and channel-aware, and `placement` (the split default: split
rounds, server streaming or local, as measured). Per device: time to first token, tokens/s,
p50/p99 inter-token gap, bytes up/down per token; per server: CPU seconds per generated token
and devices served at or above the floor.

    python -m benchmarks.placement --rtts 10,50,150 --devices 1,4,16 --seconds 6

Uses the trained pair (`python -m benchmarks.train_models`; its bundle: `full`, `draft`, exits).
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.lib import flags
from benchmarks.lib.machine import load_line
from benchmarks.lib.models import TRAINED, load_prompts, pair_bundle, trained_pair
from benchmarks.lib.serving import free_port, start_server, stop_server
from benchmarks.lib.streams import chat_device, cpu_seconds, quantile, run_devices, split_device
from benchmarks.lib.tables import write_result
from edgespec.tools.channel import Channel, ChannelConfig

PLACEMENT_ROWS = [
    ("centralized streaming", None),
    ("split fixed:3", "fixed:3"),
    ("split channel-aware", "channel-aware"),
    ("auto placement", "placement"),
]


def run_placement(args, bundle: Path, prompts: list[str]) -> list[dict]:
    """Every (RTT, devices, row) of the placement comparison (see the module docstring)."""
    import edgespec
    from edgespec.runtime.registry import make_policy

    n_new, most = args.max_new_tokens, max(args.devices)
    ar = edgespec.load(bundle, threads=1)
    ids = {p: ar.encode(p) for p in prompts}
    reference = {p: ar.generate(p, max_new_tokens=n_new, ignore_eos=True).tokens for p in prompts}
    local = edgespec.load(bundle, mode="spec", draft_policy="auto", threads=1)
    run_devices([split_device(local, prompts, n_new, reference)], prompts, 0)  # warm-up
    alone = run_devices([split_device(local, prompts, n_new, reference)], prompts, args.seconds)
    rows: list[dict] = []
    port = free_port()
    extra = ["--max-streams", str(most), "--conversations", str(most)]
    proc = start_server(bundle, port, args.server_threads, most + 2, *extra, quiet=True)
    try:
        with Channel(f"127.0.0.1:{port}") as ch:
            url = f"ws://{ch.address}"
            models = [
                edgespec.load(bundle, mode="split", server=url, threads=1, timeout=60.0,
                              late_after=60.0)  # fmt: skip
                for _ in range(most)
            ]
            for rtt in args.rtts:
                ch.config = ChannelConfig(rtt_ms=rtt, bandwidth_mbit=args.bandwidth)
                for n in args.devices:
                    rows.append(_row(rtt, n, "device-only", alone * n, 0.0, (0, 0), False))
                    for label, policy in PLACEMENT_ROWS:
                        if policy is None:
                            devs = [chat_device(ch.host, ch.port, ids, n_new) for _ in range(n)]
                        else:
                            for m in models[:n]:
                                m.policy = make_policy(policy)  # a cold start per condition
                            devs = [split_device(m, prompts, n_new, reference) for m in models[:n]]
                        for _ in range(2):  # two generations each: connected, warm, learned
                            run_devices(devs, prompts, 0)
                        cpu = cpu_seconds(proc.pid)
                        up, down = ch.stats.bytes_up, ch.stats.bytes_down
                        out = run_devices(devs, prompts, args.seconds)
                        moved = (ch.stats.bytes_up - up, ch.stats.bytes_down - down)
                        row = _row(rtt, n, label, out, cpu_seconds(proc.pid) - cpu, moved, True)
                        rows.append(row)
                        print(f"  {rtt:g} ms {n:>2} dev  {label:<22} {row['tokens_per_s']:6.1f} "
                              f"tok/s/dev  ttft {row['ttft_ms']:.0f} ms  "
                              f"{row['server_cpu_ms_per_token']:.2f} server ms/token  "
                              f"lost {row['lost']}  {row['places']}", flush=True)  # fmt: skip
                    for m in models:
                        m.remote.drop()
    finally:
        stop_server(proc)
    return rows


def _row(rtt: float, n: int, label: str, devs: list, cpu: float, moved: tuple[int, int],
         served: bool) -> dict:  # fmt: skip
    tokens = sum(d.tokens for d in devs) or 1
    places: dict[str, int] = {}
    for d in devs:
        for k, v in d.places.items():
            places[k] = places.get(k, 0) + v
    rates = sorted(d.tokens_per_s for d in devs)
    return {
        "rtt_ms": rtt, "devices": n, "engine": label,
        "ttft_ms": quantile([quantile(d.ttft, 0.5) for d in devs], 0.5) * 1000,
        "tokens_per_s": quantile(rates, 0.5), "slowest_tokens_per_s": rates[0],
        "p50_gap_ms": quantile([g for d in devs for g in d.gaps], 0.5) * 1000,
        "p99_gap_ms": quantile([g for d in devs for g in d.gaps], 0.99) * 1000,
        "up_bytes_per_token": moved[0] / tokens, "down_bytes_per_token": moved[1] / tokens,
        "server_cpu_ms_per_token": 1000 * cpu / tokens if served else 0.0,
        "served_at_15": sum(r >= 15 for r in rates), "lost": sum(d.lost for d in devs),
        "places": places,
    }  # fmt: skip


def placement_table(rows: list[dict]) -> str:
    out = [
        "| RTT | devices | engine | TTFT ms | tok/s per device (median, slowest) | gap p50 / "
        "p99 ms | B up / down per token | server CPU ms per token | devices ≥ 15 tok/s |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r['rtt_ms']:g} | {r['devices']} | {r['engine']} | {r['ttft_ms']:.0f} | "
            f"{r['tokens_per_s']:.1f} ({r['slowest_tokens_per_s']:.1f}) | "
            f"{r['p50_gap_ms']:.0f} / {r['p99_gap_ms']:.0f} | "
            f"{r['up_bytes_per_token']:.0f} / {r['down_bytes_per_token']:.0f} | "
            f"{r['server_cpu_ms_per_token']:.2f} | {r['served_at_15']}/{r['devices']} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = flags.parser(__doc__)
    ap.add_argument("--models", type=Path, default=TRAINED)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=5.0, help="wall time per configuration")
    ap.add_argument("--device-threads", type=int, default=1, help="the device's threads")
    ap.add_argument("--server-threads", type=int, default=1)
    ap.add_argument("--rtts", default="10,50,150", help="ms, comma-separated")
    ap.add_argument("--devices", default="1,4,16", help="devices at once, comma-separated")
    ap.add_argument("--bandwidth", type=float, default=10.0, help="Mbit/s")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    args.rtts = [float(x) for x in args.rtts.split(",") if x]
    args.devices = [int(x) for x in args.devices.split(",") if x]
    models = trained_pair(args.models)
    bundle = pair_bundle(models)
    prompts = load_prompts(args.models / "prompts_code.jsonl", args.prompts)
    print(load_line(), flush=True)
    rows = run_placement(args, bundle, prompts)
    print(f"\n{placement_table(rows)}\n\n{load_line()}")
    write_result(args.json, args, {"rows": rows})


if __name__ == "__main__":
    main()
