"""Where decoding should happen: split decoding against the centralized streaming it replaces.

N devices at once against one `edgespec serve` (the server's best mode; its CPU time read from
its own process, so the devices sharing the machine do not distort it), per channel condition
(an RTT at `--bandwidth`, and with `--trace` a time-varying channel replayed from its start for
every measurement) through the channel emulator. Rows: device-only (N local devices at once:
on one host they share its cores, as the split devices' local rounds do), centralized streaming
(each device an app streaming the server's `/v1/completions`), split fixed:3 and channel-aware,
and `placement` (the split default: split rounds, server streaming or local). The rows of a
condition are measured interleaved: `--repeats` passes over all of them, each pass in a rotated
order, so a load that moves on the host affects all alike; every figure is the median over
passes, and the placement ratio is also given per pass (its spread). Per device: time to first
token, tokens/s, p50/p99 inter-token gap, bytes up/down per token; per server: CPU seconds per
generated token and devices served at or above the floor.

    python -m benchmarks.placement --rtts 10,50,150 --devices 1,16 --repeats 3 --seconds 3
    python -m benchmarks.placement --rtts 50 --devices 64 --trace --max-new-tokens 16

Uses the trained pair (`python -m benchmarks.train_models`; its bundle: `full`, `draft`, exits),
or with `--bundle B` a bundle of a chat model with a draft model (SmolLM2-135M-Instruct with the
draft of `benchmarks.distill_draft`) on `benchmarks.real`'s instruct prompts, rendered through
its chat template:

    python -m benchmarks.placement --bundle b-draft --rtts 50 --devices 1,4 --max-new-tokens 48
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.lib import flags
from benchmarks.lib.instruct import WORKLOADS
from benchmarks.lib.machine import load_line
from benchmarks.lib.models import TRAINED, load_prompts, pair_bundle, trained_pair
from benchmarks.lib.serving import free_port, start_server, stop_server
from benchmarks.lib.streams import chat_device, cpu_seconds, quantile, run_devices, split_device
from benchmarks.lib.tables import write_result
from edgespec.tools.channel import Channel, ChannelConfig, Trace, TraceRow

ROWS = [
    ("device-only", "local"),
    ("centralized streaming", None),
    ("split fixed:3", "fixed:3"),
    ("split channel-aware", "channel-aware"),
    ("auto placement", "placement"),
]
# a time-varying channel: good Wi-Fi, a congested cell, a mid link (looping)
TRACE = Trace((TraceRow(0.0, 10, 100), TraceRow(2.0, 150, 1), TraceRow(4.0, 50, 10)), loop=True)


def run_placement(args, bundle: Path, prompts: list[str]) -> list[dict]:
    """Every (condition, devices, row) of the placement comparison (the module docstring)."""
    import edgespec
    from edgespec.runtime.registry import make_policy

    n_new, most = args.max_new_tokens, max(args.devices)
    ar = edgespec.load(bundle, threads=1)
    ids = {p: ar.encode(p) for p in prompts}
    reference = {p: ar.generate(p, max_new_tokens=n_new, ignore_eos=True).tokens for p in prompts}
    local = [edgespec.load(bundle, mode="spec", draft_policy="auto", threads=1)
             for _ in range(most)]  # fmt: skip
    conditions: list[tuple[str, ChannelConfig | Trace]] = [
        (f"{rtt:g} ms", ChannelConfig(rtt_ms=rtt, bandwidth_mbit=args.bandwidth))
        for rtt in args.rtts
    ]
    if args.trace:
        conditions.append(("trace 10/150/50 ms, 100/1/10 Mbit/s, 2 s each", TRACE))
    rows: list[dict] = []
    port = free_port()
    extra = ["--max-streams", str(most), "--conversations", str(most)]
    # the split devices stay connected while the streaming apps run: room for both
    proc = start_server(bundle, port, args.server_threads, 2 * most + 2, *extra, quiet=True)
    try:
        with Channel(f"127.0.0.1:{port}") as ch:
            url = f"ws://{ch.address}"
            models = [
                edgespec.load(
                    bundle, mode="split", server=url, threads=1, timeout=60.0, late_after=60.0
                )  # fmt: skip
                for _ in range(most)
            ]
            for name, condition in conditions:
                trace = isinstance(condition, Trace)
                ch.replay(None)
                ch.config = ChannelConfig(rtt_ms=50) if trace else condition  # type: ignore
                for n in args.devices:
                    devs, policies = {}, {}
                    for label, policy in ROWS:
                        if policy is None:
                            devs[label] = [chat_device(ch.host, ch.port, ids, n_new)
                                           for _ in range(n)]  # fmt: skip
                            continue
                        group = local[:n] if policy == "local" else models[:n]
                        if policy != "local":  # a cold start per condition, kept over passes
                            policies[label] = [make_policy(policy) for _ in group]
                            _use(group, policies[label])
                        devs[label] = [split_device(m, prompts, n_new, reference) for m in group]
                        for _ in range(2):  # two generations each: connected, warm, learned
                            run_devices(devs[label], prompts, 0)
                    passes: dict[str, list[dict]] = {label: [] for label, _ in ROWS}
                    for k in range(args.repeats):
                        order = ROWS[k % len(ROWS) :] + ROWS[: k % len(ROWS)]
                        for label, _ in order:
                            if label in policies:  # the split devices take this row's policy
                                _use(models[:n], policies[label])
                                run_devices(devs[label], prompts, 0)  # and settle (unmeasured)
                            if trace:
                                ch.replay(condition)  # type: ignore[arg-type]
                            cpu = cpu_seconds(proc.pid)
                            up, down = ch.stats.bytes_up, ch.stats.bytes_down
                            out = run_devices(devs[label], prompts, args.seconds)
                            moved = (ch.stats.bytes_up - up, ch.stats.bytes_down - down)
                            cpu = cpu_seconds(proc.pid) - cpu
                            passes[label].append(_row(name, n, label, out, cpu, moved))
                    rows += _summary(passes)
                    for m in models:
                        m.remote.drop()
            ch.replay(None)
    finally:
        stop_server(proc)
    return rows


def chat_prompts(bundle: Path, n: int) -> list[str]:
    """The first `n` of benchmarks.real's conversations, rendered through the bundle's chat
    template (a conversation's text up to the assistant's turn)."""
    import edgespec
    from edgespec.runtime.chat.template import ChatTemplate

    model = edgespec.load(bundle, mode="ar", threads=1)
    if model.manifest.chat is None:
        raise SystemExit(f"{bundle} has no chat template: give a chat model's bundle")
    template = ChatTemplate.from_bundle(model.folder, model.manifest)
    convs = [c for convs in WORKLOADS.values() for c in convs][:n]
    return [template.render(c, add_generation_prompt=True) for c in convs]


def _use(models: list, policies: list) -> None:
    for m, p in zip(models, policies, strict=True):
        m.policy = p


def _summary(passes: dict[str, list[dict]]) -> list[dict]:
    """One row per engine: the median of each figure over the passes; the placement row
    also gets its ratio to the better of device-only and streaming (and to split
    channel-aware) per pass."""
    out = []
    for got in passes.values():
        row = dict(got[0])
        for key, value in got[0].items():
            if isinstance(value, float | int) and not isinstance(value, bool):
                row[key] = quantile([g[key] for g in got], 0.5)
        row["passes"] = [g["tokens_per_s"] for g in got]
        places: dict[str, int] = {}
        for g in got:
            for k, v in g["places"].items():
                places[k] = places.get(k, 0) + v
        row["places"] = places
        out.append(row)
    auto, only = passes["auto placement"], passes["device-only"]
    stream, split = passes["centralized streaming"], passes["split channel-aware"]
    best = [max(a["tokens_per_s"], b["tokens_per_s"]) for a, b in zip(only, stream, strict=True)]
    out[-1]["ratio_to_best"] = [a["tokens_per_s"] / b for a, b in zip(auto, best, strict=True)]
    out[-1]["ratio_to_split"] = [
        a["tokens_per_s"] / max(s["tokens_per_s"], 1e-9) for a, s in zip(auto, split, strict=True)
    ]
    for r in out:
        print(f"  {r['condition']:<12} {r['devices']:>2} dev  {r['engine']:<22} "
              f"{r['tokens_per_s']:6.1f} tok/s/dev {_spread(r['passes'])}  ttft "
              f"{r['ttft_ms']:.0f} ms  {r['server_cpu_ms_per_token']:.2f} server ms/token  "
              f"lost {r['lost']}  {r['places']}", flush=True)  # fmt: skip
    print(f"  placement / better of device-only and streaming, per pass: "
          f"{_spread(out[-1]['ratio_to_best'], 2)}; / split channel-aware: "
          f"{_spread(out[-1]['ratio_to_split'], 2)}", flush=True)  # fmt: skip
    return out


def _spread(xs: list[float], digits: int = 1) -> str:
    return f"[{', '.join(f'{x:.{digits}f}' for x in xs)}]"


def _row(condition: str, n: int, label: str, devs: list, cpu: float,
         moved: tuple[int, int]) -> dict:  # fmt: skip
    tokens = sum(d.tokens for d in devs) or 1
    places: dict[str, int] = {}
    for d in devs:
        for k, v in d.places.items():
            places[k] = places.get(k, 0) + v
    rates = sorted(d.tokens_per_s for d in devs)
    return {
        "condition": condition, "devices": n, "engine": label,
        "ttft_ms": quantile([quantile(d.ttft, 0.5) for d in devs], 0.5) * 1000,
        "tokens_per_s": quantile(rates, 0.5), "slowest_tokens_per_s": rates[0],
        "p50_gap_ms": quantile([g for d in devs for g in d.gaps], 0.5) * 1000,
        "p99_gap_ms": quantile([g for d in devs for g in d.gaps], 0.99) * 1000,
        "up_bytes_per_token": moved[0] / tokens, "down_bytes_per_token": moved[1] / tokens,
        "server_cpu_ms_per_token": 1000 * cpu / tokens,
        "served_at_15": sum(r >= 15 for r in rates), "lost": sum(d.lost for d in devs),
        "places": places,
    }  # fmt: skip


def placement_table(rows: list[dict]) -> str:
    out = [
        "| channel | devices | engine | TTFT ms | tok/s per device (median, slowest; per pass)"
        " | gap p50 / p99 ms | B up / down per token | server CPU ms per token | devices ≥ 15 "
        "tok/s |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r['condition']} | {r['devices']} | {r['engine']} | {r['ttft_ms']:.0f} | "
            f"{r['tokens_per_s']:.1f} ({r['slowest_tokens_per_s']:.1f}; "
            f"{_spread(r['passes'])}) | "
            f"{r['p50_gap_ms']:.0f} / {r['p99_gap_ms']:.0f} | "
            f"{r['up_bytes_per_token']:.0f} / {r['down_bytes_per_token']:.0f} | "
            f"{r['server_cpu_ms_per_token']:.2f} | {r['served_at_15']}/{r['devices']} |"
        )
    for r in rows:
        if "ratio_to_best" in r:
            out.append(f"\n{r['condition']}, {r['devices']} devices: placement / better of "
                       f"device-only and streaming per pass {_spread(r['ratio_to_best'], 2)}, "
                       f"/ split channel-aware {_spread(r['ratio_to_split'], 2)}")  # fmt: skip
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = flags.parser(__doc__)
    ap.add_argument("--models", type=Path, default=TRAINED)
    ap.add_argument("--bundle", type=Path, help="a chat model's bundle with a draft instead")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=3.0, help="wall time per row and pass")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved passes over the rows")
    ap.add_argument("--trace", action="store_true", help="also the time-varying channel")
    ap.add_argument("--device-threads", type=int, default=1, help="the device's threads")
    ap.add_argument("--server-threads", type=int, default=1)
    ap.add_argument("--rtts", default="10,50,150", help="ms, comma-separated")
    ap.add_argument("--devices", default="1,16", help="devices at once, comma-separated")
    ap.add_argument("--bandwidth", type=float, default=10.0, help="Mbit/s")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    args.rtts = [float(x) for x in args.rtts.split(",") if x]
    args.devices = [int(x) for x in args.devices.split(",") if x]
    if args.bundle:
        bundle, prompts = args.bundle, chat_prompts(args.bundle, args.prompts)
    else:
        models = trained_pair(args.models)
        bundle = pair_bundle(models)
        prompts = load_prompts(args.models / "prompts_code.jsonl", args.prompts)
    print(load_line(), flush=True)
    rows = run_placement(args, bundle, prompts)
    print(f"\n{placement_table(rows)}\n\n{load_line()}")
    write_result(args.json, args, {"rows": rows})


if __name__ == "__main__":
    main()
