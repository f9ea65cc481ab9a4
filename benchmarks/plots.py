"""PNG plots of the benchmarks' JSON results (matplotlib: `pip install -e ".[bench]"`).

Takes a result JSON written by one of the benchmarks and writes a PNG next to it (same stem):

* `ar`     (bench_ar.py --json): decode tok/s of every engine and precision, side by side per
           model shape, each bar labelled with its % of that precision's memory-bandwidth bound
           (the bound drawn as a tick).
* `auto`   (bench_auto.py --json): tokens/s relative to edgespec `ar` for every row, per prompt
           set (edgespec, onnxruntime-genai and llama.cpp rows side by side).
* `split`  (bench_split.py --json): the channel-aware split's tokens/s over the RTT x bandwidth
           grid (a heat map, device-only and cloud-only in the title), and every engine on the
           time-varying trace.
* `gamma`  (bench_gamma.py --json): per setup, tok/s of every fixed γ against `auto`'s (a
           line, with the goal's 3% band under it), all on one loaded model.
* `oracle` (bench_oracle.py --json): tok/s vs γ at each acceptance α, measured (dots) against
           the ideal N(γ)·t_target / (γ·t_draft + t_verify(γ)) from measured step times (lines).

The benchmarks call `plot(kind, json_path)` after writing their JSON when matplotlib is
importable; `python benchmarks/plots.py KIND JSON` redraws one. Never imported by edgespec.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from common import base_precision


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def plot(kind: str, json_path: Path, out: Path | None = None) -> Path:
    """Draw `kind` from `json_path` into `out` (default: the JSON's path with .png)."""
    data = json.loads(Path(json_path).read_text())
    out = out or Path(json_path).with_suffix(".png")
    PLOTS[kind](data, out)
    return out


def try_plot(kind: str, json_path: Path) -> None:
    """plot(), or a one-line note on stderr when matplotlib is missing (plots are optional)."""
    try:
        out = plot(kind, json_path)
    except ImportError:
        print("(no plot: pip install matplotlib, or the [bench] extra)", file=sys.stderr)
        return
    print(f"wrote {out}", file=sys.stderr)


def plot_ar(data: dict[str, Any], out: Path) -> None:
    plt = _pyplot()
    shapes = data["shapes"]
    fig, axes = plt.subplots(1, len(shapes), figsize=(6.5 * len(shapes), 4.2), squeeze=False)
    colors = {"edgespec": "#1f77b4", "llamacpp": "#d62728", "genai": "#2ca02c"}
    for ax, shape in zip(axes[0], shapes, strict=True):
        rows = [r for r in shape["engines"] if r["status"] == "ok"]
        labels, values, bounds = [], [], []
        for r in rows:
            name = "llama.cpp" if r["engine"] == "llamacpp" else r["engine"]
            labels.append(f"{name}\n{r['precision']}")
            values.append(r["decode_tps"])
            bounds.append(shape["bound_decode_tps"][base_precision(r["precision"])])
        x = range(len(rows))
        ax.bar(x, values, color=[colors.get(r["engine"], "#7f7f7f") for r in rows])
        ax.scatter(x, bounds, marker="_", s=400, color="black", label="bandwidth bound")
        for i, (v, b) in enumerate(zip(values, bounds, strict=True)):
            ax.annotate(
                f"{v:.0f}\n{100 * v / b:.0f}%", (i, v), ha="center", va="bottom", fontsize=7
            )
        ax.set_xticks(list(x), labels, fontsize=7)
        ax.set_ylabel("decode tokens/s")
        ax.set_title(f"{shape['title']}: greedy decode, {data['meta']['threads']} threads")
        ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def plot_auto(data: list[dict[str, Any]], out: Path) -> None:
    plt = _pyplot()
    sets = list(dict.fromkeys(r["prompts"] for r in data))
    fig, axes = plt.subplots(1, len(sets), figsize=(6 * len(sets), 5), squeeze=False)
    for ax, name in zip(axes[0], sets, strict=True):
        rows = [r for r in data if r["prompts"] == name]
        color = [
            "#d62728" if "llama.cpp" in r["engine"] else
            "#2ca02c" if r["engine"].startswith("genai") else "#1f77b4"
            for r in rows
        ]  # fmt: skip
        ax.barh(range(len(rows)), [r["vs_ar"] for r in rows], color=color)
        ax.set_yticks(range(len(rows)), [r["engine"] for r in rows], fontsize=7)
        ax.axvline(1.0, color="black", lw=0.8)
        ax.invert_yaxis()
        ax.set_xlabel("tokens/s vs edgespec ar (same run)")
        ax.set_title(f"{name} prompts")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def plot_gamma(data: dict[str, Any], out: Path) -> None:
    plt = _pyplot()
    setups = data["setups"]
    fig, axes = plt.subplots(1, len(setups), figsize=(4.2 * len(setups), 3.8), squeeze=False)
    for ax, setup in zip(axes[0], setups, strict=True):
        rates = setup["rates"]
        fixed = sorted((int(n.split(":")[1]), r) for n, r in rates.items() if n.startswith("fixed"))
        ax.plot([g for g, _ in fixed], [r for _, r in fixed], "o-", label="fixed γ")
        ax.axhline(rates["auto"], color="#d62728", label="auto")
        best = max(r for _, r in fixed)
        ax.axhspan(0.97 * best, best, color="#2ca02c", alpha=0.15, label="within 3% of the best")
        ax.set_xlabel("γ")
        ax.set_ylabel("tokens/s (end to end)")
        ax.set_title(f"{setup['setup']}: auto {setup['held_out']:.3f} held out", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def plot_split(data: dict[str, Any], out: Path) -> None:
    plt = _pyplot()
    rows = data["rows"]
    grid: dict[tuple[float, float], float] = {}
    device = max((r["tokens_per_s"] for r in rows if r["engine"].startswith("device-only")),
                 default=0.0)  # fmt: skip
    trace = [r for r in rows if r["condition"].startswith("trace")]
    for r in rows:
        m = re.match(r"([\d.]+) ms, ([\d.]+) Mbit/s", r["condition"])
        if m and r["engine"] == "channel-aware":
            grid[(float(m[1]), float(m[2]))] = r["tokens_per_s"]
    rtts = sorted({k[0] for k in grid})
    bws = sorted({k[1] for k in grid})
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    values = [[grid.get((rtt, bw), float("nan")) for bw in bws] for rtt in rtts]
    image = ax.imshow(values, cmap="viridis", origin="lower", aspect="auto")
    for i, rtt in enumerate(rtts):
        for j, bw in enumerate(bws):
            v = grid.get((rtt, bw))
            if v is not None:
                ax.text(j, i, f"{v:.0f}\n{v / device:.2f}x dev" if device else f"{v:.0f}",
                        ha="center", va="center", color="white", fontsize=8)  # fmt: skip
    ax.set_xticks(range(len(bws)), [f"{b:g}" for b in bws])
    ax.set_yticks(range(len(rtts)), [f"{r:g}" for r in rtts])
    ax.set_xlabel("bandwidth (Mbit/s)")
    ax.set_ylabel("RTT (ms)")
    ax.set_title(f"split, channel-aware: tokens/s (device-only best {device:.0f})")
    fig.colorbar(image, ax=ax)
    if trace:
        ax2.barh(range(len(trace)), [r["tokens_per_s"] for r in trace])
        ax2.set_yticks(range(len(trace)), [r["engine"] for r in trace], fontsize=7)
        ax2.invert_yaxis()
        ax2.set_xlabel("tokens/s")
        ax2.set_title("time-varying trace (10/150/50 ms, 100/1/10 Mbit/s)")
    else:
        ax2.axis("off")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def plot_oracle(data: dict[str, Any], out: Path) -> None:
    plt = _pyplot()
    setups = list(dict.fromkeys(r["setup"] for r in data["rows"]))
    fig, axes = plt.subplots(1, len(setups), figsize=(6 * len(setups), 4.5), squeeze=False)
    for ax, setup in zip(axes[0], setups, strict=True):
        by_alpha: dict[float, list[dict[str, Any]]] = defaultdict(list)
        for r in data["rows"]:
            if r["setup"] == setup and r.get("policy", "fixed:").startswith("fixed:"):
                by_alpha[r["alpha"]].append(r)
        for alpha, rows in sorted(by_alpha.items()):
            rows.sort(key=lambda r: r["gamma"])
            g = [r["gamma"] for r in rows]
            line = ax.plot(g, [r["ideal_tps"] for r in rows], label=f"α={alpha:g} ideal")[0]
            ax.scatter(g, [r["tokens_per_s"] for r in rows], color=line.get_color(),
                       label=f"α={alpha:g} measured")  # fmt: skip
        ar = data["ar_tps"].get(setup) if isinstance(data.get("ar_tps"), dict) else None
        if ar:
            ax.axhline(ar, color="black", lw=0.8, ls="--", label="ar")
        ax.set_xlabel("γ (drafted tokens per round)")
        ax.set_ylabel("tokens/s")
        ax.set_title(setup)
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


PLOTS = {
    "ar": plot_ar, "auto": plot_auto, "split": plot_split, "oracle": plot_oracle,
    "gamma": plot_gamma,
}  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4) or sys.argv[1] not in PLOTS:
        sys.exit(f"usage: plots.py {'|'.join(PLOTS)} RESULT.json [OUT.png]")
    print(plot(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]) if len(sys.argv) == 4 else None))
