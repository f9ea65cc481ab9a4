"""`edgespec distill TARGET --out BUNDLE`: a feature head for a model without a draft, trained on
the CPU within `--minutes` (the [distill] extra), resumable: run the same command again after
Ctrl-C. Progress: one line, rewritten in place on a terminal, a line every 10 s in a log."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import click

from edgespec.cli.common import _friendly


class ProgressLine:
    """Renders `distill.Progress`: tokens generated, loss, held-out acceptance, time."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.last = 0.0
        self.phase = ""

    def __call__(self, p) -> None:
        now = time.monotonic()
        changed = p.phase != self.phase
        self.phase = p.phase
        if not changed and not self.tty and now - self.last < 10:
            return
        if not changed and self.tty and now - self.last < 0.5:
            return
        self.last = now
        parts = [f"{p.phase:8s}", f"{p.seconds / 60:5.1f}/{p.budget / 60:g} min"]
        parts.append(f"replies {p.samples} ({p.tokens} tokens)")
        if p.text_tokens:
            parts.append(f"text read {p.text_tokens} tokens")
        if p.steps:
            parts.append(f"step {p.steps}")
        if p.loss is not None:
            parts.append(f"loss {p.loss:.3f}")
        if p.accepted is not None:
            parts.append(f"held-out accepted/round at γ=4 {p.accepted:.2f}")
        if p.message:
            parts.append(p.message)
        line = " | ".join(parts)
        if self.tty:
            click.echo("\r\033[K" + line, nl=p.phase in ("done", "export", "write"), err=True)
        else:
            click.echo(line, err=True)


def _text(record: dict) -> str:
    n = record.get("text_tokens", 0)
    return f" and {n} of text" if n else ""


def _vocab(record: dict) -> str:
    if "draft_vocab" not in record:
        return ""
    return (f", a draft vocabulary of {record['draft_vocab']} ids "
            f"({record['coverage']:.1%} of held-out reply tokens)")  # fmt: skip


@click.command()
@click.argument("target", type=click.Path())
@click.option("--out", "-o", required=True, type=click.Path(), help="The bundle to write.")
@click.option(
    "--minutes",
    default=10.0,
    show_default=True,
    type=float,
    help="The whole budget: generating replies and training, over every run.",
)
@click.option(
    "--prompts",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help='A JSONL file of {"prompt": ...} or {"messages": [...]} lines (default: '
    "the built-in set).",
)
@click.option("--new-tokens", default=192, show_default=True, type=int, help="Reply length cap.")
@click.option(
    "--feature-layers",
    default=None,
    help="Comma-separated target layers the head reads (default: a low, a middle, the last).",
)
@click.option("--threads", default=None, type=int)
@_friendly
def distill(target: str, out: str, minutes: float, prompts: str | None, new_tokens: int,
            feature_layers: str | None, threads: int | None) -> None:  # fmt: skip
    """Train a feature head (EAGLE style) for TARGET (a GGUF file, a Hugging Face folder or
    a bundle) and write it, with the target, into the bundle OUT."""
    # torch's OpenMP threads sleep when idle instead of spinning: on a shared 2-core machine
    # a spinning thread waits out a preempted peer (a training step took 3.2 s spinning, 1.1 s
    # passive, 0.9 s on one thread, under a load of 7); set before torch loads
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        import torch  # noqa: F401

        from edgespec.distill.pipeline import DistillConfig
        from edgespec.distill.pipeline import distill as run
    except ImportError as e:
        raise click.ClickException(
            f"distill needs the [distill] extra ({e.name} is missing): "
            "pip install 'edgespec[distill]'"
        ) from None
    layers = None
    if feature_layers:
        try:
            layers = tuple(int(k) for k in feature_layers.split(",") if k.strip())
        except ValueError:
            raise click.BadParameter(
                f"{feature_layers!r} is not a comma-separated list of layer numbers",
                param_hint="--feature-layers",
            ) from None
    config = DistillConfig(
        minutes=minutes,
        prompts=Path(prompts) if prompts else None,
        new_tokens=new_tokens,
        feature_layers=layers,
        threads=threads,
        on_progress=ProgressLine(),
    )
    try:
        record = run(target, out, config)
    except KeyboardInterrupt:
        click.echo(
            f"\ninterrupted: the replies and the checkpoint are kept in {out} (its head is the "
            "latest); run the same command again to resume",
            err=True,
        )
        sys.exit(130)
    held = record.get("held_out", {})
    curve = ", ".join(f"γ={g}: {n}" for g, n in held.get("tokens_per_round", {}).items())
    click.echo(
        f"{out}: feature head on layers {record['feature_layers']}, {record['steps']} steps "
        f"on {record['train_tokens']} tokens of replies{_text(record)}{_vocab(record)}; "
        "held-out drafts kept per round at γ=4: "
        f"{held.get('accepted', 0):.2f} (tokens per round {curve}); a head step costs "
        f"{record['step_cost']:.2f} target steps"
    )
    from edgespec.bundle import load_manifest
    from edgespec.runtime.policies.costs import eagle_pays

    measured = record.get("decode_speedup", {})
    speeds = ", ".join(f"{k} {x:.2f}x" for k, x in measured.items())
    pays = eagle_pays(load_manifest(out))
    verdict = "drafts with lookup+eagle" if pays else "keeps prompt lookup (the head does not pay)"
    click.echo(f"decoding here, x ar: {speeds}; a load without --mode {verdict}")
