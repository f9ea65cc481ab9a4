"""What every `edgespec` command shares: one-line errors instead of tracebacks, the bearer
token file, the stats lines and the edge/cloud compatibility report.

`ExportProgress` renders the export steps the library reports through `on_progress`.

Takes edgespec's own exceptions (`EdgespecError`, named without importing the runtime) and
turns them into `click.ClickException`s (one `Error:` line, exit status 1); never imports a
command module, so the command modules and `edgespec.cli` import it without a circle.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any

import click

from edgespec.errors import EdgespecError


def _friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn edgespec's own errors into a one-line message instead of a traceback."""

    @wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except EdgespecError as e:
            raise click.ClickException(str(e)) from None
        except KeyboardInterrupt:
            click.echo("\ninterrupted", err=True)
            sys.exit(130)

    return run


def _report_compat(edge: str, cloud: str) -> None:
    """One line: can EDGE's frozen draft run against CLOUD's target; exit 1 when not."""
    from edgespec.backbone import compatibility
    from edgespec.bundle import load_manifest

    ok, reason = compatibility(load_manifest(edge), load_manifest(cloud))
    click.echo(f"{'compatible' if ok else 'INCOMPATIBLE'}: {edge} -> {cloud}: {reason}")
    if not ok:
        sys.exit(1)


def format_stats(s: Any, finish: str, split: bool = False) -> str:
    line = (
        f"prefill: {s.prompt_tokens} tokens, {s.prefill_tokens_per_s:.1f} tok/s | "
        f"decode: {s.decode_tokens} tokens, {s.decode_tokens_per_s:.1f} tok/s | finish: {finish}"
    )
    if split:
        line += (
            f"\nsplit: {s.remote_rounds} rounds verified by the server, {s.local_rounds} locally"
            + (" (server unreachable or late)" if s.local_rounds else "")
            + (f", {s.reconnects} reconnects" if s.reconnects else "")
            + f" | network {s.network_seconds:.2f}s, server {s.server_seconds:.2f}s | "
            f"{s.bytes_up} B up, {s.bytes_down} B down"
        )
    if s.drafted:
        lengths = " ".join(f"{k}:{v}" for k, v in sorted(s.accepted_lengths.items()))
        line += (
            f"\nspeculation: {s.rounds} rounds, drafted {s.drafted}, accepted {s.accepted} "
            f"({s.acceptance_rate:.0%}), mean accepted {s.mean_accepted:.2f}/round, "
            f"drafting {s.draft_seconds:.2f}s vs verifying {s.verify_seconds:.2f}s | "
            f"accepted-length histogram {lengths}"
        )
        if s.tree_rounds:
            line += f"\ntrees: {s.tree_rounds} rounds verified a tree ({s.tree_nodes} nodes)"
    return line


def _read_token(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        token = Path(path).read_text().strip()
    except OSError as e:
        raise click.BadParameter(
            f"cannot read {path}: {e.strerror}", param_hint="--token-file"
        ) from None
    if not token:
        raise click.BadParameter(f"{path} is empty", param_hint="--token-file")
    return token


class ExportProgress:
    """The export step being worked on: one live line with the elapsed time on a terminal
    (tqdm), one plain line per step in a log (a redrawn line there is an unreadable run-on).
    Pass it as `ExportConfig.on_progress`; `close()` when the export returns or fails."""

    def __init__(self) -> None:
        self.bar: Any = None
        self.start: float | None = None

    def __call__(self, what: str) -> None:
        if self.start is None:  # the first step: the clock starts, the bar opens
            self.start = time.perf_counter()
            if sys.stderr.isatty():
                from tqdm import tqdm

                self.bar = tqdm(total=0, bar_format="{desc} [{elapsed}]", leave=True)
        if self.bar is not None:
            self.bar.set_description_str(f"export: {what}")
            self.bar.refresh()
        else:
            click.echo(f"export: {what} [{time.perf_counter() - self.start:.1f} s]", err=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def mode_help(modes: list[str]) -> str:
    """`modes` with what each drafts with (`modes.MODES`)."""
    from edgespec.runtime.modes import MODES

    return ", ".join(f"{m} ({MODES[m].help})" for m in modes) + "."


def drafter_help() -> str:
    """--drafter's help: every name of `names.DRAFTER_NAMES` with its help."""
    from edgespec.runtime.names import DRAFTER_NAMES

    names = ", ".join(f"{d.spelling} ({d.help})" for d in DRAFTER_NAMES.values())
    return (
        f"What drafts: {names}; or a chain, as lookup+draft (prompt lookup first, the draft "
        "model where it finds nothing)."
    )


def drafter_default() -> str:
    """Each mode's drafter (`modes.MODES`), as --drafter's default."""
    from edgespec.runtime.modes import MODES

    spelled = {"exit": "exit:K", "": "the best the bundle has"}
    own = [m for m, d in MODES.items() if d.drafter == m]
    other = [f"{m} {spelled.get(d.drafter, d.drafter)}" for m, d in MODES.items() if m not in own]
    return f"the mode's: {', '.join(other)}; {', '.join(own)} their own"


def policy_help(split: bool = True) -> str:
    """--draft-policy's help: every name of `names.POLICY_NAMES` (`split`: the split-only ones
    too, marked)."""
    from edgespec.runtime.names import POLICY_NAMES

    names = [
        p.spelling + (" (split mode)" if p.split_only else "")
        for p in POLICY_NAMES.values()
        if split or not p.split_only
    ]
    return "Draft length per round: " + ", ".join(names) + "."


def policy_default(modes: list[str] | None = None) -> str:
    """The modes' policies (`modes.MODES`), as --draft-policy's default: the most common one,
    then the modes that differ."""
    from edgespec.runtime.modes import MODES

    chosen = {m: MODES[m].policy for m in modes or MODES}
    common = max(set(chosen.values()), key=list(chosen.values()).count)
    others = [f"{m} {p}" for m, p in chosen.items() if p != common]
    return common + (f" ({', '.join(others)})" if others else "")


def decoding_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The flags that choose how a bundle decodes (`generate`, `chat`): device, threads, mode,
    drafter, verifier, policy, split's server and token, the draft support when sampling,
    static / Core ML graphs. Names, their help and defaults come from the runtime's tables
    (`modes.MODES`, `names`)."""
    from edgespec.runtime.modes import MODES
    from edgespec.runtime.names import TREE_MODES

    options = [
        click.option(
            "--device",
            default="cpu",
            show_default=True,
            help="A device profile (`edgespec devices`: cpu, cuda, dml, openvino, ...) or auto.",
        ),
        click.option(
            "--threads",
            default=None,
            type=int,
            show_default="all cores",
            help="Intra-op threads.",
        ),
        click.option(
            "--mode",
            type=click.Choice(MODES),
            default=None,
            show_default="the mode this bundle's calibration here favours (`edgespec bench B "
            "--calibrate`), else spec with its draft model, else lookup",
            help=mode_help(list(MODES)),
        ),
        click.option(
            "--draft-policy", default=None, show_default=policy_default(), help=policy_help()
        ),
        click.option("--exit-layer", default=None, type=int, help="Exit layer for self-spec."),
        click.option(
            "--drafter", default=None, show_default=drafter_default(), help=drafter_help()
        ),
        click.option(
            "--verifier", default=None, show_default="full", help="full | exit:K (local modes)."
        ),
        click.option("--server", default=None, help="split: the verifier server, ws://HOST:PORT."),
        click.option(
            "--token-file", default=None, type=click.Path(), help="split: bearer token file."
        ),
        click.option("--energy-budget", default=None, type=float, help="split: joules per token."),
        click.option("--timeout", default=None, type=float, help="split: seconds per answer [10]."),
        click.option(
            "--late-after",
            default=None,
            type=float,
            help="split: a round unanswered this long (seconds) is verified here while its "
            "answer is awaited [adaptive: 4x the round trip, at least 0.5 s; --timeout or "
            "more: never early].",
        ),
        click.option(
            "--draft-top-k",
            default=None,
            type=int,
            help="Sampling: model drafters draw from their top-k ids only (split mode sends "
            "them; lossless) [128; 0 = no cap].",
        ),
        click.option(
            "--draft-top-p", default=None, type=float, help="... then top-p of those [1]."
        ),
        click.option(
            "--trees",
            type=click.Choice(TREE_MODES),
            default="off",
            show_default=True,
            help="Token trees with lookup/suffix/recycle, or the draft model's and early "
            "exits' dynamic trees (spec, self-spec), on a bundle exported with --tree-verify: "
            "auto (a tree only where measured costs say it pays; for devices whose verify "
            "cost is flat in width; in split mode, sent to a server that offers trees where "
            "the link's round time per width says they pay), on (a tree every drafting "
            "round), off.",
        ),
        click.option("--static", is_flag=True, help="Run the bundle's fixed-shape (NPU) graphs."),
        click.option(
            "--coreml", is_flag=True, help="Run the bundle's Core ML packages (macOS 15+)."
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def load_config(options: dict[str, Any]) -> Any:
    """A LoadConfig from the `decoding_options` values (they are popped from `options`)."""
    from edgespec.runtime.config import LoadConfig

    names = ("device", "threads", "mode", "draft_policy", "exit_layer", "drafter", "verifier")
    names += ("server", "energy_budget", "timeout", "late_after", "static", "coreml", "trees")
    chosen = {k: options.pop(k) for k in names}
    chosen["token"] = _read_token(options.pop("token_file"))
    if chosen["timeout"] is None:
        chosen.pop("timeout")  # the library's default
    top_k, top_p = options.pop("draft_top_k"), options.pop("draft_top_p")
    if top_k is not None or top_p is not None:  # else the library's default
        from edgespec.runtime.draft_q import DEFAULT_SUPPORT, DraftSupport

        chosen["draft_support"] = DraftSupport(
            DEFAULT_SUPPORT.top_k if top_k is None else top_k,
            DEFAULT_SUPPORT.top_p if top_p is None else top_p,
        )
    return LoadConfig.from_options(**chosen)
