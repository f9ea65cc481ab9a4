"""bench_auto's results: the tallies of a run, the rows they make, the table it prints and
the issue's targets checked on them (`bench_auto.py` runs the rows and calls these)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from auto_rows import PromptSet, row_of
from auto_workers import Sample


def verify_rate(samples: list[Sample]) -> float:
    """Decode tokens per second of the target's calls alone (edgespec rows)."""
    return _decode_tokens_per(samples, sum(s.verify_seconds for s in samples))


def decode_rate(samples: list[Sample]) -> float:
    """Tokens per second after the prefill's token (edgespec rows): the prompt's prefill is
    the same target call in every mode, so this is the part a decoding mode can speed up."""
    return _decode_tokens_per(samples, sum(s.decode_seconds for s in samples))


def _decode_tokens_per(samples: list[Sample], seconds: float) -> float:
    return sum(s.decode_tokens for s in samples) / seconds if seconds else float("nan")


@dataclass
class Tally:
    samples: list[list[Sample]] = field(default_factory=list)  # [pass][prompt]

    def total(self, passes: list[int] | None = None) -> tuple[int, float]:
        rows = [r for p, r in enumerate(self.samples) if passes is None or p in passes]
        picked = [s for r in rows for s in r]
        return sum(s.n for s in picked), sum(s.seconds for s in picked)

    def rate(self, passes: list[int] | None = None) -> float:
        tokens, seconds = self.total(passes)
        return tokens / seconds if seconds else 0.0

    def flat(self) -> list[Sample]:
        return [s for row in self.samples for s in row]


@dataclass
class Row:
    prompts: str
    engine: str
    tokens_per_s: float
    vs_ar: float  # aggregate tokens/s over edgespec ar's, same passes
    vs_ar_passes: list[float]  # the same ratio pass by pass
    tokens_per_verification: float
    acceptance: float
    same_as_ar: str  # greedy: "yes" / "NO" / "k/n" (genai); sampled: "-"
    gammas: dict[int, int] = field(default_factory=dict)  # edgespec: rounds per draft length
    note: str = ""
    # edgespec: the speed-up over ar's decoding if drafting and the loop cost nothing, at the
    # tokens per verification this row realized: its rounds' target calls alone
    verify_bound: float = float("nan")
    # edgespec: decode tokens/s (after the prompt's prefill) over ar's, as bench_ar splits them
    decode_vs_ar: float = float("nan")


def same_text(sample: Sample, prompt: str, reference: str) -> bool:
    """llama.cpp's CLI prints the prompt, then the new text: does it continue like ar?"""
    printed = (sample.text or "").lstrip("\n")
    return printed.startswith(prompt) and printed[len(prompt) :].startswith(reference)


def rows_for(
    pset: PromptSet, tallies: dict[str, Tally], notes: dict[str, str], decode: Any = None
) -> list[Row]:
    ar = tallies["ar"]
    reference = [s.tokens for s in ar.samples[0]]
    passes = range(len(ar.samples))
    ar_verify_rate = verify_rate(ar.flat())
    ar_decode_rate = decode_rate(ar.flat())
    rows = []
    for label, t in tallies.items():
        samples = t.flat()
        verifications = sum(s.verifications for s in samples)
        produced = sum(s.n - 1 for s in samples)  # after the prefill's token
        drafted, accepted = sum(s.drafted for s in samples), sum(s.accepted for s in samples)
        same = "-"
        if pset.temperature == 0:
            hits = sum(s.tokens == reference[i] for row in t.samples for i, s in enumerate(row))
            if label.startswith("llama.cpp") and samples[0].text is not None and decode:
                hits = sum(
                    same_text(s, pset.texts[i], decode(reference[i]))
                    for row in t.samples
                    for i, s in enumerate(row)
                )
            if label.startswith(("genai", "llama.cpp")):
                same = f"{hits}/{len(samples)}"
            else:
                same = "yes" if hits == len(samples) else "NO"
        gammas: Counter = Counter()
        for s in samples:
            gammas.update(s.gammas)
        edgespec = not label.startswith(("genai", "llama.cpp"))
        bound = verify_rate(samples) / ar_verify_rate if edgespec else float("nan")
        decoding = decode_rate(samples) / ar_decode_rate if edgespec else float("nan")
        rows.append(
            Row(
                pset.name,
                label if label.startswith(("genai", "llama.cpp")) else f"edgespec {label}",
                t.rate(),
                t.rate() / ar.rate(),
                [t.rate([p]) / ar.rate([p]) for p in passes],
                produced / verifications if verifications else 1.0,
                accepted / drafted if drafted else float("nan"),
                same,
                dict(sorted(gammas.items())),
                notes.get(label, ""),
                bound,
                decoding,
            )
        )
    return rows


def gamma_summary(gammas: dict[int, int]) -> str:
    total = sum(gammas.values())
    if not total or set(gammas) <= {0}:
        return ""
    mean = sum(g * n for g, n in gammas.items()) / total
    return f"γ=0 in {gammas.get(0, 0) / total:.0%} of rounds, mean γ {mean:.1f}"


def print_table(pset: PromptSet, rows: list[Row], n_new: int, threads: int) -> None:
    how = "greedy" if pset.temperature == 0 else f"sampled, temperature {pset.temperature:g}"
    print(
        f"\n### {pset.name} prompts ({len(pset.ids)} prompts, {how}, {n_new} new tokens, "
        f"{threads} threads; other processes used {pset.other_cores:.1f} cores meanwhile)\n"
    )
    greedy = pset.temperature == 0
    head = "| engine | tokens/s | vs edgespec ar | decoding vs ar | tokens/verification |"
    print(head + " acceptance |" + (" = ar |" if greedy else "") + " note |")
    print("|---|---:|---:|---:|---:|---:|" + (":---:|" if greedy else "") + "---|")
    for r in rows:
        acc = "-" if r.acceptance != r.acceptance else f"{r.acceptance:.0%}"
        speculative = r.engine != "edgespec ar" and r.verify_bound == r.verify_bound  # not nan
        bound = f"verify-bound {r.verify_bound:.2f}x" if speculative else ""
        note = "; ".join(x for x in (gamma_summary(r.gammas), bound, r.note) if x)
        same = f" {r.same_as_ar} |" if greedy else ""
        decoding = "-" if r.decode_vs_ar != r.decode_vs_ar else f"{r.decode_vs_ar:.2f}x"
        print(
            f"| {r.engine} | {r.tokens_per_s:.1f} | {r.vs_ar:.2f}x "
            f"({min(r.vs_ar_passes):.2f}-{max(r.vs_ar_passes):.2f}) | {decoding} | "
            f"{r.tokens_per_verification:.2f} | {acc} |{same} {note} |"
        )


def check_targets(pset: PromptSet, rows: list[Row]) -> list[str]:
    """The issue's targets, as measured: bad set, auto >= 0.97x ar; good set, each auto row
    within 3% of the best fixed γ of its mode in hindsight (>= 0.97x) and faster than genai's
    fastest speculative row."""
    by = {r.engine: r for r in rows}
    peers = [r for r in rows if r.engine.startswith("genai") and "plain" not in r.engine]
    out = []
    autos = [r.engine for r in rows if r.engine.startswith("edgespec") and " auto" in r.engine]
    for auto in autos:
        a = by[auto]
        base = row_of(auto)
        setup = base[len("edgespec ") :].split(" auto")[0]  # "spec", "self-spec@2", ...
        if base.endswith(" draft)"):  # "spec auto (int8 draft)": fixed rows "spec:int8 fixed:N"
            setup += ":" + base.rpartition("(")[2].split()[0]
        fixed = [r for r in rows if r.engine.startswith(f"edgespec {setup} fixed:")]
        if pset.name != "code":
            if setup == "spec":
                out.append(
                    _check(pset, auto, a.vs_ar >= 0.97, f"{a.vs_ar:.2f}x ar (target >= 0.97x)")
                )
            continue
        if fixed:
            best = max(fixed, key=lambda r: r.tokens_per_s)
            ratio = a.tokens_per_s / best.tokens_per_s
            what = (
                f"{a.tokens_per_s:.1f} tok/s = {ratio:.3f}x best fixed {best.engine[9:]} "
                f"{best.tokens_per_s:.1f}"
            )
            judged = held_out_ratio(a, fixed)
            if judged is not None:
                what += f"; {judged:.3f}x the fixed row picked on the other passes"
                ratio = judged
            out.append(_check(pset, auto, ratio >= 0.97, what + " (target >= 0.97x)"))
        if peers and setup == "spec":
            top = max(peers, key=lambda r: r.tokens_per_s)
            what = f"{a.tokens_per_s:.1f} tok/s vs {top.engine} {top.tokens_per_s:.1f}"
            out.append(_check(pset, auto, a.tokens_per_s > top.tokens_per_s, what))
    for r in rows:  # --one-policy: the chain priced per member against priced as one
        apart = by.get(r.engine.replace(", one policy", ""))
        if ", one policy" in r.engine and apart is not None:
            ratio = apart.tokens_per_s / r.tokens_per_s
            out.append(f"{pset.name}: {apart.engine[9:]}: {ratio:.3f}x its chain under one policy")
    if pset.name == "code":  # on-device speculation: >= 2x ar on code for the trained pair
        # the shipping rows: an --ab-estimates row runs other constants than the package's
        mine = [r for r in rows if r.engine.startswith("edgespec") and row_of(r.engine) == r.engine]
        best = max(mine, key=lambda r: r.vs_ar)
        what = (
            f"{best.vs_ar:.2f}x ar end to end (target >= 2x; its verify-bound: "
            f"{best.verify_bound:.2f}x, the best row's "
            f"{max(r.verify_bound for r in rows if r.verify_bound > 0):.2f}x)"
        )
        out.append(_check(pset, best.engine, best.vs_ar >= 2.0, what))
        # the same goal on decoding alone (the prompt's prefill, one target call that no mode
        # changes, is 6-12% of a greedy code run and dilutes every speed-up)
        best = max(mine, key=lambda r: r.decode_vs_ar)
        what = f"{best.decode_vs_ar:.2f}x ar decoding alone (target >= 2x)"
        out.append(_check(pset, best.engine, best.decode_vs_ar >= 2.0, what))
    return out


def held_out_ratio(auto: Row, fixed: list[Row]) -> float | None:
    """auto over the best fixed γ in hindsight, with hindsight taken on other passes: for each
    pass, auto's tok/s over that of the fixed row that the other passes rank first, averaged
    over the passes. The best of six noisy rows, judged on the runs that made it the best,
    reads above what that γ delivers (stop 30's A/A run: twins differed by up to 6.6%), so
    `auto` as good as the best γ would read 0.97-0.98x. Picked on other passes, it does not.
    The passes are independent draws only with --fresh-processes: without, a row's process
    keeps its placement in memory for every pass, and this reads as the plain ratio. None
    with fewer than two passes."""
    n = len(auto.vs_ar_passes)
    if n < 2:
        return None
    ratios = []
    for p in range(n):
        others = [q for q in range(n) if q != p]
        pick = max(fixed, key=lambda r: sum(r.vs_ar_passes[q] for q in others))
        ratios.append(auto.vs_ar_passes[p] / pick.vs_ar_passes[p])  # ar's pass p cancels
    return sum(ratios) / n


def _check(pset: PromptSet, row: str, ok: bool, what: str) -> str:
    return f"{pset.name}: {row[9:]}: {what}: {'met' if ok else 'MISSED'}"
