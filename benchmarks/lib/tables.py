"""Markdown tables, and result files: every scenario writes one JSON with the machine's facts
(`machine.facts()`) beside its rows, and a plot where it has one (`lib.plots`)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from benchmarks.lib.machine import facts, log


def table(columns: Iterable[str], align: str, rows: Iterable[Iterable[object]]) -> str:
    """A markdown table; `align` has one of l (---), r (---:), c (:---:) per column."""
    lines = [table_header(columns, align)] + [table_row(r) for r in rows]
    return "\n".join(lines)


def table_header(columns: Iterable[str], align: str) -> str:
    rule = {"l": "---", "r": "---:", "c": ":---:"}
    return f"| {' | '.join(columns)} |\n|{'|'.join(rule[a] for a in align)}|"


def table_row(cells: Iterable[object]) -> str:
    return f"| {' | '.join(map(str, cells))} |"


def write_result(path: Path | None, args: Any, data: dict[str, Any], plot: str = "") -> None:
    """`data` with the run's arguments and the machine's facts as JSON at `path` (if given),
    and the scenario's plot beside it (`plot`: a kind of `lib.plots`)."""
    if path is None:
        return
    options = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    result = {"machine": facts(), "args": options, **data}
    path.write_text(json.dumps(result, indent=1, default=str))
    log(f"wrote {path}")
    if plot:
        from benchmarks.lib.plots import try_plot

        try_plot(plot, path)
