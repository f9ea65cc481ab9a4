"""Edge-cloud split decoding over emulated channels, in one run.

Starts `edgespec serve BUNDLE` (the cloud), puts the channel emulator (`edgespec.tools.channel`,
a TCP proxy on loopback) in front of it, and for each channel condition — RTT 10/50/150 ms ×
bandwidth 1/10/100 Mbit/s, plus a time-varying trace — measures on the device side (greedy,
same prompts, device threads fixed):

  one token per round trip   split with γ = 0: the server generates one token per round
                  trip (not how a cloud serves: `benchmarks.placement` has centralized streaming)
  device-only     the best local mode (ar, spec auto), no network (the same for every row)
  split fixed:γ   draft γ = 1..8 here with the bundle's draft model, verify on the server
  channel-aware   split with the FlexSpec policy (`edgespec.runtime.policies.channel`)

Each configuration runs for a fixed wall time (`--seconds`) over the prompts (prefill
included), so every one sees the same stretch of a time-varying trace (replayed from its start
for each). Many devices against one server: `python -m benchmarks.serving load`.

    python -m benchmarks.split --quick          # RTT 10/50/150 at 10 Mbit/s, γ 1,2,4,8
    python -m benchmarks.split                  # the full grid (~15 minutes)
    python -m benchmarks.split --rtts 50 --temperature 0.8 --no-trace
                                      # sampling: rounds carry q rows, bandwidth matters
    python -m benchmarks.split --rtts 50 --temperature 0.8 --draft-top-k 64,0 \
        --compare-greedy --policies fixed:4,channel-aware --no-trace
                                      # sampled drafts' supports (top-64, uncapped) vs greedy,
                                      # uplink bytes per drafted token
    python -m benchmarks.split --rtts 50 --bandwidths 10 --no-trace --seconds 2 --prompts 1 \
        --policies fixed:0,fixed:2,channel-aware      # a smoke run

Split decoding against the centralized streaming it replaces, N devices at once:
`python -m benchmarks.placement`.

Uses the trained pair (`python -m benchmarks.train_models`; its bundle: `full`, `draft`, exits).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks.lib import flags
from benchmarks.lib.machine import load_line
from benchmarks.lib.models import TRAINED, load_prompts, pair_bundle, trained_pair
from benchmarks.lib.serving import server
from benchmarks.lib.tables import write_result
from edgespec.tools.channel import Channel, ChannelConfig, Trace, TraceRow

# a time-varying channel: good Wi-Fi, a congested cell, a mid link (looping)
TRACE = Trace(
    (
        TraceRow(0.0, 10, 100),
        TraceRow(4.0, 150, 1),
        TraceRow(8.0, 50, 10),
    ),
    loop=True,
)


@dataclass
class Row:
    condition: str
    engine: str
    tokens_per_s: float
    tokens_per_round: float
    mean_gamma: float
    acceptance: float
    rtt_estimate_ms: float | None = None
    bytes_per_draft: float | None = None  # uplink bytes of drafting rounds per drafted token
    extra: dict = field(default_factory=dict)


def timed(model, prompts: list[str], n_new: int, seconds: float, **sampling) -> dict:
    """Generate over the prompts (repeating) for `seconds` of wall time; round stats summed."""
    tokens = rounds = drafted = accepted = up = 0
    rtt = None
    start = time.perf_counter()
    i = 0
    while time.perf_counter() - start < seconds:
        stream = model.stream(
            prompts[i % len(prompts)], max_new_tokens=n_new, ignore_eos=True, **sampling
        )
        for chunk in stream:
            tokens += len(chunk.tokens)
            s = chunk.stats
            if s.phase == "decode":
                rounds += 1
                drafted += s.drafted
                accepted += s.accepted
                up += s.bytes_up if s.drafted else 0  # the rounds that carried drafts
                rtt = s.rtt_estimate if s.rtt_estimate is not None else rtt
            if time.perf_counter() - start >= seconds:
                break
        i += 1
    elapsed = time.perf_counter() - start
    return {
        "tokens_per_s": tokens / elapsed,
        "tokens_per_round": (accepted + rounds) / rounds if rounds else 1.0,
        "mean_gamma": drafted / rounds if rounds else 0.0,
        "acceptance": accepted / drafted if drafted else 0.0,
        "rtt_estimate_ms": None if rtt is None else rtt * 1000,
        "bytes_per_draft": up / drafted if drafted else None,
    }


def split_engines(fixed: list[int], policies: list[str] | None = None) -> list[tuple[str, str]]:
    if policies:
        one = "one token per round trip (γ=0)"
        return [(f"split {p}" if p != "fixed:0" else one, p) for p in policies]
    return [
        ("one token per round trip (γ=0)", "fixed:0"),
        *[(f"split fixed:{g}", f"fixed:{g}") for g in fixed],
        ("split channel-aware", "channel-aware"),
    ]


def decodings(args) -> list[tuple[str, dict, object]]:
    """(label, sampling options, the drafter's DraftSupport) for each way of decoding: greedy,
    and with --temperature one per --draft-top-k value (0: uncapped)."""
    from edgespec.runtime.draft_q import DraftSupport

    if not args.temperature:
        return [("", {}, None)]
    sampled = [
        (f"T={args.temperature:g} top-{k or 'all'} ", {"temperature": args.temperature, "seed": 0},
         DraftSupport(top_k=k))
        for k in args.draft_top_k
    ]  # fmt: skip
    if len(sampled) == 1 and not args.compare_greedy:
        sampled = [("", *sampled[0][1:])]
    return ([("greedy ", {}, None)] if args.compare_greedy else []) + sampled


def run_conditions(args, bundle: Path, prompts: list[str], port: int) -> list[Row]:
    import edgespec
    from edgespec.runtime.registry import make_policy

    fixed = [1, 2, 4, 8] if args.quick else list(range(1, 9))
    ways = decodings(args)
    engines = [
        (prefix + label, policy, options, support)
        for prefix, options, support in ways
        for label, policy in split_engines(fixed, args.policies)
    ]
    rtts, bws = args.rtts, args.bandwidths
    sampling = ways[-1][1]
    conditions: list[tuple[str, ChannelConfig | Trace]] = [
        (f"{rtt:g} ms, {bw:g} Mbit/s", ChannelConfig(rtt_ms=rtt, bandwidth_mbit=bw))
        for rtt in rtts
        for bw in bws
    ]
    if not args.no_trace:
        conditions.append(("trace 10/150/50 ms, 100/1/10 Mbit/s, 4 s each", TRACE))
    rows: list[Row] = []

    # device-only: local modes, no network (both cores are the device's here)
    local = {
        "device-only ar": edgespec.load(bundle, threads=args.device_threads),
        "device-only spec auto": edgespec.load(
            bundle, mode="spec", draft_policy="auto", threads=args.device_threads
        ),
    }
    device_rows = []
    for label, model in local.items():
        model.generate(prompts[0], max_new_tokens=8, ignore_eos=True)
        r = timed(model, prompts, args.max_new_tokens, args.seconds, **sampling)
        device_rows.append((label, r))
    reference = (
        local["device-only ar"]
        .generate(prompts[0], max_new_tokens=args.max_new_tokens, ignore_eos=True)
        .tokens
    )

    with Channel(f"127.0.0.1:{port}") as channel:
        server = f"ws://{channel.address}"
        models = {
            label: edgespec.load(
                bundle,
                mode="split",
                server=server,
                drafter=args.drafter,
                draft_policy=policy,
                threads=args.device_threads,
                local_fallback=False,
                timeout=30.0,
                **({"draft_support": support} if support else {}),
            )
            for label, policy, _, support in engines
        }
        out = models[engines[-1][0]].generate(
            prompts[0], max_new_tokens=args.max_new_tokens, ignore_eos=True
        )
        print(f"lossless (greedy split == local ar): {out.tokens == reference}", flush=True)
        for name, condition in conditions:
            is_trace = isinstance(condition, Trace)
            if not is_trace:
                channel.config = condition
            for label, policy, sampling, _ in engines:
                model = models[label]
                model.policy = make_policy(policy)  # each condition from a cold start
                channel.replay(None)
                if is_trace:
                    channel.config = ChannelConfig(rtt_ms=10, bandwidth_mbit=100)
                # warm-up, on the same traffic (sampling sends q rows: far bigger rounds)
                model.generate(prompts[0], max_new_tokens=16, ignore_eos=True, **sampling)
                if is_trace:
                    channel.replay(condition)
                r = timed(
                    model,
                    prompts,
                    args.max_new_tokens,
                    args.trace_seconds if is_trace else args.seconds,
                    **sampling,
                )
                rows.append(Row(name, label, **r))
                per_draft = r["bytes_per_draft"]
                print(
                    f"  {name:<28} {label:<22} {r['tokens_per_s']:7.1f} tok/s  "
                    f"γ̄ {r['mean_gamma']:.1f}  α {r['acceptance']:.2f}  "
                    + (f"{per_draft:.0f} B up/draft" if per_draft else ""),
                    flush=True,
                )
            for label, r in device_rows:
                rows.append(Row(name, label, **r))
        channel.replay(None)
    return rows


def tables(rows: list[Row], decoding: str = "greedy") -> str:
    out = []
    conditions = list(dict.fromkeys(r.condition for r in rows))
    engines = list(dict.fromkeys(r.engine for r in rows))
    table = {(r.condition, r.engine): r for r in rows}
    out.append("| engine | " + " | ".join(conditions) + " |")
    out.append("|---|" + "---:|" * len(conditions))
    for e in engines:
        cells = []
        for c in conditions:
            r = table.get((c, e))
            cells.append("-" if r is None else f"{r.tokens_per_s:.1f}")
        out.append(f"| {e} | " + " | ".join(cells) + " |")
    out.append("")
    out.append(
        f"tokens/s ({decoding}, prefill included). Per condition: channel-aware vs one token "
        "per round trip "
        "and vs the best fixed γ:"
    )
    out.append("")
    out.append(
        "| condition | channel-aware | γ̄ | one token per round trip | × that | best fixed γ | "
        "aware / best fixed |"
    )
    out.append("|---|---:|---:|---:|---:|---|---:|")
    for c in conditions:
        aware = table.get((c, "split channel-aware"))
        cloud = table.get((c, "one token per round trip (γ=0)"))
        fixed = [r for (cc, e), r in table.items() if cc == c and e.startswith("split fixed:")]
        if not (aware and cloud and fixed):
            continue
        best = max(fixed, key=lambda r: r.tokens_per_s)
        out.append(
            f"| {c} | {aware.tokens_per_s:.1f} | {aware.mean_gamma:.1f} | "
            f"{cloud.tokens_per_s:.1f} | {aware.tokens_per_s / cloud.tokens_per_s:.2f}x | "
            f"{best.engine.split(':')[1]} ({best.tokens_per_s:.1f}) | "
            f"{aware.tokens_per_s / best.tokens_per_s:.2f} |"
        )
    if any(r.bytes_per_draft for r in rows):
        out += ["", "Uplink bytes per drafted token (rounds with drafts, framing included):", ""]
        out.append("| engine | " + " | ".join(conditions) + " |")
        out.append("|---|" + "---:|" * len(conditions))
        for e in engines:
            cells = []
            for c in conditions:
                r = table.get((c, e))
                ok = r is not None and r.bytes_per_draft
                cells.append(f"{r.bytes_per_draft:,.0f}" if ok else "-")  # type: ignore[union-attr]
            out.append(f"| {e} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = flags.parser(__doc__)
    ap.add_argument("--models", type=Path, default=TRAINED)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=5.0, help="wall time per configuration")
    ap.add_argument("--trace-seconds", type=float, default=24.0, help="per config on the trace")
    ap.add_argument("--device-threads", type=int, default=1, help="the device's threads")
    ap.add_argument("--server-threads", type=int, default=1)
    ap.add_argument("--rtts", default="10,50,150", help="ms, comma-separated")
    ap.add_argument("--bandwidths", default="1,10,100", help="Mbit/s, comma-separated")
    ap.add_argument("--no-trace", action="store_true")
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy; > 0: sampling")
    ap.add_argument(
        "--draft-top-k", default="64", help="sampling: the drafter's support sizes (0: uncapped)"
    )
    ap.add_argument("--compare-greedy", action="store_true", help="greedy rows in the same run")
    ap.add_argument("--drafter", default="draft", help="the device's drafter: draft | exit:K")
    ap.add_argument("--policies", default=None, help="e.g. fixed:4,channel-aware (default all)")
    ap.add_argument("--quick", action="store_true", help="a small subset (~3 minutes)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    args.rtts = [float(x) for x in args.rtts.split(",") if x]
    args.bandwidths = [float(x) for x in args.bandwidths.split(",") if x]
    if args.quick:
        args.bandwidths = [10.0] if args.bandwidths == [1.0, 10.0, 100.0] else args.bandwidths
        args.seconds, args.trace_seconds = min(args.seconds, 3.0), min(args.trace_seconds, 12.0)
    args.draft_top_k = [int(k) for k in args.draft_top_k.split(",") if k]
    args.policies = args.policies.split(",") if args.policies else None
    bundle = pair_bundle(trained_pair(args.models))
    print(load_line(), flush=True)
    prompts = load_prompts(args.models / "prompts_code.jsonl", args.prompts)
    with server(bundle, args.server_threads, 16) as port:
        rows = run_conditions(args, bundle, prompts, port)
    decoding = f"sampling at T={args.temperature:g}" if args.temperature else "greedy"
    print(f"\n{tables(rows, decoding)}\n\n{load_line()}")
    write_result(args.json, args, {"rows": [asdict(r) for r in rows]}, plot="split")


if __name__ == "__main__":
    main()
