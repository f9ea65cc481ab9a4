"""Speculative decoding at a known acceptance on real shapes: tok/s vs α and γ beside the ideal.

The trained benchmark pair is tiny (a 2.4 ms target step), so its speed-ups say little about the
runtime's own overhead on the models people run. This benchmark takes real shapes with random
weights — a SmolLM2-360M-shaped target (Llama, 32 layers, hidden 960) with a SmolLM2-135M-shaped
draft, and the 360M target's own early exits (self-spec at layers 8 and 16) — and an **oracle
drafter**: it proposes the target's own greedy continuation (computed once by `ar`), each drafted
token right with a controlled probability α (seeded; a wrong token is the right one + 1), while
paying the real drafter's time: every drafted token runs the real draft graph (or head@k) on the
token it proposes, whose logits are thrown away. So the accepted length per round follows
N(γ) = (1 − α^(γ+1)) / (1 − α) in expectation, and the time is the real one.

For each setup, α ∈ `--alphas` and γ ∈ `--gammas` (fixed draft length) and `--policies`
(adaptive), greedy, `--new-tokens` tokens after a `--prompt-len` prompt, the policies taking
turns `--repeats` times (median; each repeat on coins of its own, the same for every policy),
it records decode tok/s (the prefill left out), the realized tokens per round, and from the
same runs' stats (pooled) the step times t_draft (per drafted
token), t_verify(γ) (per round) and t_target (per `ar` token, in the same cell), and compares with

    ideal speed-up = N(γ) · t_target / (γ · t_draft + t_verify(γ))

(N(γ) from α) — the speed-up if a round cost nothing but its draft steps and its verify. For
self-spec the verify is the tail over [last, d_1..d_γ] plus the head step on d_γ that gives
the tail its input (at γ = 0 the two are one plain target step).
Where measured < 90% of ideal, the row's `where the time goes` says how each round's time
splits: drafting, verifying, and everything else (the decode loop: acceptance, cache
bookkeeping, policy), and how far the realized tokens per round fell from N(γ) (luck, not
overhead). `of ideal at realized tokens/round` puts the realized tokens per round in place of
N(γ): the share of each round spent drafting and verifying, the runtime's own overhead
without the coins' luck (64 tokens hold a few dozen rounds; their acceptance strays from α).
Every run's tokens are checked against `ar` (the oracle drafts never change them).

    python benchmarks/bench_oracle.py --json benchmarks/results/oracle.json   # writes a PNG too

Checkpoints and the bundle are cached under `--cache` (~/.cache/edgespec-bench).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from bench_ar import SHAPES, build_checkpoint, cpu_name, loadavg, prompt_ids
from common import BENCH_CACHE, set_estimates

SHAPES.setdefault(
    "smollm2-360m",
    (
        "LlamaConfig",
        dict(
            hidden_size=960,
            num_hidden_layers=32,
            num_attention_heads=15,
            num_key_value_heads=5,
            intermediate_size=2560,
            vocab_size=49152,
            tie_word_embeddings=True,
            max_position_embeddings=2048,
            rope_theta=100000.0,
        ),
    ),
)
EXITS = [8, 16]


class Oracle:
    """The target's greedy continuation; each drafted token right with probability α.

    Whether the draft at a position is right is one seeded coin per position, drawn once:
    every policy (and every γ) meets the same hard positions, as with a real drafter, which
    misses the same tokens whatever γ it drafts. Coins drawn per draft call instead gave each
    policy its own luck, and compared policies by more than their choice of γ.

    Over the `n` positions a run decodes, the coins are dealt, not tossed: exactly round(α·n)
    of them are right, in a seeded random order (past them, independent coins). Independent
    coins over a 64-token run realized 0.75 in the α = 0.8 cell and 0.83 in the α = 0.9 cell
    (0.95 in its warm-up), so `auto` learned another α than the cell's and was judged against a
    γ fitted to that luck. Dealing keeps the mean tokens per round at N(γ) and halves their
    spread from one seed (one alignment of rounds on the coins) to another: γ = 5 at α = 0.8,
    3.58 ± 0.19 tokens a round over 1,000 seeds, against 3.65 ± 0.47 with independent coins."""

    def __init__(
        self, reference: list[int], alpha: float, seed: int, vocab: int, start: int, n: int
    ) -> None:
        """`start`: the first position ever drafted (the prompt's length); `n`: tokens a run
        decodes."""
        self.reference, self.alpha, self.vocab = reference, alpha, vocab
        rng = np.random.default_rng(seed)
        self.right = rng.random(len(reference)) < alpha
        self.right[:start] = True  # never drafted
        self.right[start : start + n] = rng.permutation(n) < round(alpha * n)

    def token(self, position: int) -> int:
        truth = self.reference[position]
        return truth if self.right[position] else (truth + 1) % self.vocab


def oracle_drafter(inner: Any, oracle: Oracle) -> Any:
    """The drafter `inner` with the oracle's tokens in place of its own, its graph calls kept:
    each drafted token runs the real draft step on the token proposed before it."""
    from edgespec.runtime.drafters import EarlyExitDrafter, ModelDrafter
    from edgespec.runtime.round import Proposal, TailInput

    if isinstance(inner, ModelDrafter):

        class OracleDraft(ModelDrafter):
            def propose(self, seq, plan, params, rng):  # type: ignore[override]
                start = time.perf_counter()
                plan = plan.capped(self.model.max_positions - len(seq))
                feed, catchup = self.catch_up(seq, plan)  # as the real drafter feeds
                tokens: list[int] = []
                for i in range(plan.length):
                    self.model.forward(np.asarray(feed, np.int64), keep=1)  # real draft step
                    tokens.append(oracle.token(len(seq) + i))
                    feed = [tokens[-1]]
                seconds = time.perf_counter() - start - catchup
                return Proposal(tokens, "greedy", None, seconds, catchup_seconds=catchup)

        return OracleDraft(inner.model)
    assert isinstance(inner, EarlyExitDrafter), type(inner)

    class OracleExit(EarlyExitDrafter):
        def propose(self, seq, plan, params, rng):  # type: ignore[override]
            start = time.perf_counter()
            k = plan.exit_layer or self.exit_layer
            head, cache, past = self.heads[k], self.target.cache, self.target.length
            hidden: list[np.ndarray] = []

            def run_head(ids: list[int], keep: int) -> None:
                nonlocal past
                out = head.run(cache, past, input_ids=np.asarray([ids], np.int64), keep=keep)
                hidden.append(out["hidden"][0])
                past += len(ids)

            feed, tokens = seq[past:], []
            for i in range(plan.length):
                run_head(feed, 1)  # real head@k step on the token it proposes
                tokens.append(oracle.token(len(seq) + i))
                feed = [tokens[-1]]
            drafting = time.perf_counter() - start  # as EarlyExitDrafter counts it
            run_head(feed, 0)  # the tail verifies the last draft's hidden state too
            head = time.perf_counter() - start - drafting  # counted in the verify
            tail = TailInput(np.concatenate(hidden), self.tails[k], k, head)
            return Proposal(tokens, "greedy", None, drafting, tail=tail)

    return OracleExit(inner.target, inner.heads, inner.tails, inner.exit_layer)


@dataclass
class Row:
    setup: str
    alpha: float
    policy: str  # "fixed:γ" or an adaptive policy
    gamma: float  # drafted tokens per round (γ for fixed:γ, the mean for adaptive ones)
    tokens_per_s: float  # decode only
    speedup: float  # vs ar's decode tok/s
    ideal_speedup: float
    ideal_tps: float
    of_ideal: float  # speedup / ideal_speedup
    # the same with the realized tokens per round in place of N(γ): 1 − the round's time
    # outside drafting and verifying, i.e. the runtime's own overhead without the coins' luck
    of_ideal_realized: float
    tokens_per_round: float  # realized
    expected_per_round: float  # N(γ) from α
    t_draft_ms: float  # per drafted token
    t_verify_ms: float  # per round
    other_ms: float  # per round: decode time not spent drafting or verifying
    ar_tps: float  # plain `ar` in the same cell, taking turns with the policies (median)
    same_as_ar: bool  # every run
    runs_tps: list[float]  # each timed run's decode tok/s (tokens_per_s: their median)
    # decode tok/s with every round priced at the cell's median step times (`Prices`): the
    # policy's choices of γ without the host's noise (mean over the runs: their coins differ)
    priced_tps: float = 0.0
    where: str = ""


@dataclass
class Run:
    """One timed generation and its decode rounds."""

    tokens: list[int]
    stats: Any  # GenerationStats
    rounds: list[Any]  # RoundStats of each decode round


def timed(model: Any, prompt: list[int], opts: dict[str, Any]) -> Run:
    from edgespec.runtime.stats import GenerationStats

    run = Run([], GenerationStats(), [])
    for chunk in model.stream(prompt, **opts):
        run.tokens += chunk.tokens
        run.stats.add(chunk.stats)
        if chunk.stats.phase == "decode":
            run.rounds.append(chunk.stats)
    return run


class Prices:
    """What a round costs in one cell, from the median step times of every timed run in it
    (all policies and `ar`): a drafted token t_draft, a verify of γ + 1 positions t_verify(γ)
    (γ = 0: a plain step), the loop's own time per round; skipped tokens a drafter catches up
    on keep their measured time (only adaptive policies skip). A run repriced this way keeps
    its own γ choices and acceptance but not the host's noise, which spreads one policy's runs
    by ~20% here, more than the 3% the adaptive policy is asked to stay within."""

    def __init__(self, runs: list[Run]) -> None:
        rounds = [r for run in runs for r in run.rounds]
        self.t_draft = float(np.median([r.draft_seconds / r.drafted for r in rounds if r.drafted]))
        self.other = float(
            np.median(
                [r.seconds - r.draft_seconds - r.verify_seconds - r.catchup_seconds for r in rounds]
            )
        )
        by_gamma: dict[int, list[float]] = {}
        for r in rounds:
            by_gamma.setdefault(r.drafted, []).append(r.verify_seconds)
        self.verify = {g: float(np.median(v)) for g, v in by_gamma.items() if len(v) >= 3}
        # γ drafted too rarely to have a median of its own: the line through the others
        spec = sorted(g for g in self.verify if g > 0)
        self.line = np.polyfit(spec, [self.verify[g] for g in spec], 1) if len(spec) > 1 else None

    def t_verify(self, gamma: int) -> float:
        if gamma in self.verify or self.line is None:
            return self.verify.get(gamma, max(self.verify.values()))
        return float(np.polyval(self.line, gamma))

    def rate(self, run: Run) -> float:
        seconds = sum(
            r.drafted * self.t_draft + self.t_verify(r.drafted) + self.other + r.catchup_seconds
            for r in run.rounds
        )
        return run.stats.decode_tokens / seconds


@contextmanager
def estimates_of(policy: str) -> Iterator[None]:
    """`auto[NAME=VALUE;...]`: runtime/estimates.py's constants set to those values while
    this policy decodes, the package's otherwise: an A/B of the estimators in one run, each
    variant learning only from its own rounds."""
    spec = policy.partition("[")[2].rstrip("]")
    values = dict(item.split("=") for item in filter(None, spec.split(";")))
    saved = set_estimates(values, f"--policies {policy}")
    try:
        yield
    finally:
        set_estimates(saved, f"--policies {policy}")


def coin_seed(args: argparse.Namespace, repeat: int) -> int:
    """The coins of timed run `repeat`: every policy's run `repeat` meets the same ones, and
    each repeat another alignment of rounds on them (the warm-up's are `--seed` + 1). With one
    alignment for every repeat (`--same-coins`, what stop 29 measured) the best fixed γ in
    hindsight is partly the γ whose rounds happened to fall well on those 64 coins: at α = 0.9
    fixed:8 realized 6.30 tokens a round (N = 6.13) and fixed:6 4.85 (N = 5.22), a 10% swing
    between neighbours that `auto` was judged against."""
    return args.seed if args.same_coins else args.seed + 100 + repeat


def expected_tokens(alpha: float, gamma: float) -> float:
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def bundle_for(args: argparse.Namespace, draft_quantize: str | None = None) -> Path:
    """The 360M target (`--dtype`) with exits 8, 16 and the 135M draft, in the target's dtype
    or `draft_quantize`."""
    target = build_checkpoint("smollm2-360m", args.seed, args.cache, False)
    draft = build_checkpoint("smollm2-135m", args.seed, args.cache, False)
    bundle = target.parent / "edgespec-oracle-bundle"
    if args.dtype != "fp32":
        bundle = bundle.with_name(f"{bundle.name}-{args.dtype}")
    if draft_quantize:
        bundle = bundle.with_name(f"{bundle.name}-draft-{draft_quantize}")
    if not (bundle / "manifest.json").exists():
        from edgespec.export import export_bundle

        print(
            f"exporting the 360M target ({args.dtype}) + 135M draft "
            f"({draft_quantize or args.dtype}) + exits 8, 16",
            file=sys.stderr,
        )
        export_bundle(
            target, bundle, draft=draft, exit_layers=EXITS, draft_quantize=draft_quantize,
            dtype=args.dtype, overwrite=True,
        )  # fmt: skip
    return bundle


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--alphas", default="0.5,0.7,0.8,0.9")
    ap.add_argument("--gammas", default="1,2,3,4,6,8", help="fixed γ values")
    ap.add_argument(
        "--policies",
        default="auto",
        help="adaptive policies run beside them ('' for none); 'auto[SHRINK=3;STATE_PRIOR=2]' "
        "runs auto with runtime/estimates.py's constants set so, an A/B in one run",
    )
    ap.add_argument(
        "--setups",
        default="spec,self-spec@8,self-spec@16",
        help="modes; spec:int8 / spec:int4: the fp32 target with the draft quantized apart",
    )
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument(
        "--warmup-tokens",
        type=int,
        default=None,
        help="tokens of the untimed generation before each timed one (default: --new-tokens)",
    )
    ap.add_argument(
        "--repeats", type=int, default=3, help="timed runs per policy, taken in turns (median)"
    )
    ap.add_argument(
        "--same-coins",
        action="store_true",
        help="every timed run on the coins of --seed (default: each repeat its own)",
    )
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--device", default="cpu", help="a device profile (cuda: onnxruntime-gpu and a GPU)"
    )
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "fp16"], help="the bundle's")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache", type=Path, default=BENCH_CACHE, help="bench_ar.py's checkpoints")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    args.cache = args.cache.expanduser()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import edgespec
    from edgespec.devices import DeviceError, get_profile
    from edgespec.runtime.registry import make_policy

    try:  # before the exports, which take minutes
        get_profile(args.device)
    except DeviceError as e:
        raise SystemExit(f"bench_oracle.py: {e}") from None
    load_start = loadavg()
    bundle = bundle_for(args)
    prompt = prompt_ids(args.seed, args.prompt_len)
    n = args.new_tokens
    opts = {"max_new_tokens": n, "ignore_eos": True}
    warmup = {"max_new_tokens": args.warmup_tokens or n, "ignore_eos": True}
    ar = edgespec.load(bundle, threads=args.threads, device=args.device)
    ar.generate(prompt, max_new_tokens=4, ignore_eos=True)  # warm-up
    longest = max(n, warmup["max_new_tokens"]) + 16  # the oracle's drafts come from here
    reference = prompt + list(ar.generate(prompt, max_new_tokens=longest, ignore_eos=True).tokens)
    ar_tokens = reference[len(prompt) : len(prompt) + n]  # what every run must produce
    vocab = ar.manifest.target.vocab_size
    rows: list[Row] = []
    ar_cells: dict[str, list[float]] = {}  # setup -> each cell's ar tok/s
    policies = [f"fixed:{g}" for g in args.gammas.split(",")]
    policies += [p for p in args.policies.split(",") if p]
    for setup in args.setups.split(","):
        mode, _, exit_layer = setup.partition("@")
        mode, _, draft_quantize = mode.partition(":")
        extra = {"exit_layer": int(exit_layer)} if exit_layer else {}
        folder = bundle_for(args, draft_quantize) if draft_quantize else bundle
        model = edgespec.load(folder, mode=mode, threads=args.threads, device=args.device, **extra)
        drafter = model.drafter
        for alpha in [float(a) for a in args.alphas.split(",")]:
            # a fresh policy per α, warmed up by one generation at that α (other coins): what
            # an app sees once its model has decoded a little with this drafter; then the
            # policies take turns, `--repeats` times each, so that the machine's drift falls
            # on all of them alike, and each keeps learning across its runs as in an app
            learned = {p: make_policy(p.partition("[")[0]) for p in policies}
            runs: dict[str, list[Any]] = {p: [] for p in policies}
            for p in policies:
                model.policy = learned[p]
                warm = Oracle(
                    reference, alpha, args.seed + 1, vocab, len(prompt), warmup["max_new_tokens"]
                )
                model.drafter = oracle_drafter(drafter, warm)
                with estimates_of(p):
                    model.generate(prompt, **warmup)
            ar_runs = []  # plain `ar` takes its turn too: each speed-up is within one cell
            for repeat in range(args.repeats):
                coins = Oracle(reference, alpha, coin_seed(args, repeat), vocab, len(prompt), n)
                model.drafter = oracle_drafter(drafter, coins)
                ar_runs.append(timed(ar, prompt, opts))
                for p in policies:
                    model.policy = learned[p]
                    with estimates_of(p):
                        runs[p].append(timed(model, prompt, opts))
            cell_ar = float(np.median([r.stats.decode_tokens_per_s for r in ar_runs]))
            prices = Prices([*ar_runs, *(r for p in policies for r in runs[p])])
            ar_cells.setdefault(setup, []).append(cell_ar)
            print(f"{setup} α={alpha} ar: {cell_ar:.2f} tok/s", file=sys.stderr, flush=True)
            for p in policies:
                rows.append(row_for(setup, alpha, p, runs[p], ar_tokens, cell_ar, prices))
                r = rows[-1]
                print(
                    f"{setup} α={alpha} {p}: {r.tokens_per_s:.2f} tok/s "
                    f"({min(r.runs_tps):.2f}-{max(r.runs_tps):.2f}), {r.speedup:.2f}x "
                    f"(ideal {r.ideal_speedup:.2f}x, {r.of_ideal:.0%}; at the realized "
                    f"tokens/round {r.of_ideal_realized:.0%}) {r.where}",
                    file=sys.stderr,
                    flush=True,
                )
        del model, drafter
    print_table(rows, float(np.median([r.ar_tps for r in rows])), args, load_start)
    print_adaptive(rows)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        meta = {
            "threads": args.threads,
            "device": args.device,
            "dtype": args.dtype,
            "host": host_name(args.device),
            "new_tokens": n,
            "warmup_tokens": warmup["max_new_tokens"],
            "repeats": args.repeats,
            "same_coins": args.same_coins,
            "load_start_end": [load_start, loadavg()],
        }
        ar_by_setup = {s: float(np.median(v)) for s, v in ar_cells.items()}
        args.json.write_text(
            json.dumps(
                {"meta": meta, "ar_tps": ar_by_setup, "rows": [asdict(r) for r in rows]}, indent=1
            )
        )
        from plots import try_plot

        try_plot("oracle", args.json)
    return 0


def host_name(device: str) -> str:
    """The processor, and the GPU too where the device is CUDA (nvidia-smi's name)."""
    import subprocess

    if device != "cuda":
        return cpu_name()
    try:
        gpu = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        gpu = "unknown GPU"
    return f"{gpu} ({cpu_name()})"


def row_for(
    setup: str,
    alpha: float,
    policy: str,
    outs: list[Run],
    ar_tokens: list[int],
    ar_tps: float,
    prices: Prices,
) -> Row:
    """tok/s: the median run's; step times and tokens per round pooled over the runs (each
    repeat meets other coins, see `coin_seed`); priced tok/s: the mean over the runs (no
    host noise left in it, only the coins')."""
    from edgespec.runtime.stats import GenerationStats

    rates = [o.stats.decode_tokens / o.stats.decode_seconds for o in outs]
    s = GenerationStats()
    for o in outs:
        for r in o.rounds:
            s.add(r)
    rounds = max(s.rounds, 1)
    fixed = policy.startswith("fixed:")
    gamma = float(policy.partition(":")[2]) if fixed else s.drafted / rounds
    tps = float(np.median(rates))
    t_target = 1 / ar_tps
    t_draft = s.draft_seconds / max(s.drafted, 1)
    t_verify = s.verify_seconds / rounds
    expected = expected_tokens(alpha, gamma)
    ideal = expected * t_target / (gamma * t_draft + t_verify)
    other = (s.decode_seconds - s.draft_seconds - s.verify_seconds) / rounds
    per_round = s.decode_tokens / rounds
    row = Row(
        setup,
        alpha,
        policy,
        gamma,
        tps,
        tps / ar_tps,
        ideal,
        ideal / t_target,
        (tps / ar_tps) / ideal,
        # tokens / (draft + verify time) against tokens / decode time: exact where γ·t_draft
        # is not (the last rounds draft fewer than γ, capped by the token budget)
        (s.draft_seconds + s.verify_seconds) / s.decode_seconds,
        per_round,
        expected,
        1e3 * t_draft,
        1e3 * t_verify,
        1e3 * other,
        ar_tps,
        all(list(o.tokens) == list(ar_tokens) for o in outs),
        rates,
        float(np.mean([prices.rate(o) for o in outs])),
    )
    if row.of_ideal < 0.9:
        round_ms = 1e3 * s.decode_seconds / rounds
        row.where = (
            f"per round {round_ms:.1f} ms: draft {gamma * row.t_draft_ms:.1f}, verify "
            f"{row.t_verify_ms:.1f}, other {row.other_ms:.1f}; tokens/round "
            f"{per_round:.2f} vs N(γ) {expected:.2f}"
        )
    return row


def print_table(rows: list[Row], ar_tps: float, args: argparse.Namespace, load: float) -> None:
    print(
        f"\nar {ar_tps:.2f} tok/s decode, median over the cells (each row's speed-up is over "
        f"`ar` run in turns within its cell); {args.device}, {args.dtype}, {args.threads} threads; "
        f"{args.new_tokens} new tokens; load average {load:.1f} at start, {loadavg():.1f} at end\n"
    )
    print(
        "| setup | α | policy | γ | tok/s | ar tok/s | speed-up | ideal | of ideal | "
        "of ideal at realized "
        "tokens/round | tokens/round (N(γ)) | "
        "t_draft ms | t_verify(γ) ms | other ms/round | = ar | where the time goes |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for r in rows:
        print(
            f"| {r.setup} | {r.alpha:g} | {r.policy} | {r.gamma:.2f} | {r.tokens_per_s:.2f} | "
            f"{r.ar_tps:.2f} | "
            f"{r.speedup:.2f}x | {r.ideal_speedup:.2f}x | {r.of_ideal:.0%} | "
            f"{r.of_ideal_realized:.0%} | "
            f"{r.tokens_per_round:.2f} ({r.expected_per_round:.2f}) | {r.t_draft_ms:.1f} | "
            f"{r.t_verify_ms:.1f} | {r.other_ms:.1f} | {'yes' if r.same_as_ar else 'NO'} | "
            f"{r.where} |"
        )


def print_adaptive(rows: list[Row]) -> None:
    """Each adaptive policy against the best fixed γ in hindsight, same setup and α."""
    adaptive = [r for r in rows if not r.policy.startswith("fixed:")]
    if not adaptive:
        return
    print(
        "\n| setup | α | best fixed | its tok/s | policy | tok/s | vs best fixed | mean γ "
        "| priced: best fixed | vs it |"
    )
    print("|---|---:|---|---:|---|---:|---:|---:|---|---:|")
    for r in adaptive:
        fixed = [f for f in rows if f.setup == r.setup and f.alpha == r.alpha and f is not r]
        best = max(
            (f for f in fixed if f.policy.startswith("fixed:")), key=lambda f: f.tokens_per_s
        )
        # the same comparison with every run repriced at the cell's median step times
        priced = max(
            (f for f in fixed if f.policy.startswith("fixed:")), key=lambda f: f.priced_tps
        )
        print(
            f"| {r.setup} | {r.alpha:g} | {best.policy} | {best.tokens_per_s:.2f} | {r.policy} | "
            f"{r.tokens_per_s:.2f} | {r.tokens_per_s / best.tokens_per_s:.3f} | {r.gamma:.2f} "
            f"| {priced.policy} | {r.priced_tps / priced.priced_tps:.3f} |"
        )


if __name__ == "__main__":
    sys.exit(main())
