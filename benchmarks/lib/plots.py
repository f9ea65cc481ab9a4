"""PNG plots of the scenarios' result JSON (matplotlib: `pip install -e ".[bench]"`), written
next to the JSON (same stem):

* `decode`: decode tok/s of every engine and precision per model shape, each bar labelled with
  its % of that precision's memory-bandwidth bound (drawn as a tick);
* `speculative`: per setup, tok/s of every fixed γ against `auto`'s (a line, with a 3% band
  under the best fixed γ), all on one loaded model;
* `split`: the channel-aware split's tok/s over the RTT x bandwidth grid, and every engine on
  the time-varying trace.

`python -m benchmarks.lib.plots KIND JSON` redraws one.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from benchmarks.lib.models import base_precision


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


def plot_decode(data: dict[str, Any], out: Path) -> None:
    plt = _pyplot()
    shapes = data["shapes"]
    threads = data.get("args", data.get("meta", {})).get("threads", "?")
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
        ax.set_title(f"{shape['title']}: greedy decode, {threads} threads")
        ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def plot_speculative(data: dict[str, Any], out: Path) -> None:
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
        if m and r["engine"].endswith("channel-aware"):
            grid[(float(m[1]), float(m[2]))] = r["tokens_per_s"]
    rtts = sorted({k[0] for k in grid})
    bws = sorted({k[1] for k in grid})
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    values = [[grid.get((rtt, bw), float("nan")) for bw in bws] for rtt in rtts]
    if not grid:
        ax.axis("off")
        values = [[float("nan")]]
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


PLOTS = {"decode": plot_decode, "speculative": plot_speculative, "split": plot_split}


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4) or sys.argv[1] not in PLOTS:
        sys.exit(f"usage: python -m benchmarks.lib.plots {'|'.join(PLOTS)} RESULT.json [OUT.png]")
    print(plot(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]) if len(sys.argv) == 4 else None))
