"""Flags every scenario spells the same way, and A/Bs as variants of a config object.

`--variants 'name=value,...;...'` names fields of a config object (the speculative scenario:
`Priors`, whose `with_values` converts and checks them); an A/B runs the copy beside the
original in the same run; nothing patches a module's globals.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def parser(doc: str | None) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)


def add_common(p: argparse.ArgumentParser, threads: int = 2) -> None:
    """--threads (for every engine) and --json (the result file; a plot goes beside it)."""
    p.add_argument("--threads", type=int, default=threads, help="intra-op threads, every engine")
    p.add_argument("--json", type=Path, default=None, help="write the results here")


def listed(text: str, kind: type = str) -> list[Any]:
    """A comma list ("1,2,,3" -> [1, 2, 3] with kind=int)."""
    return [kind(x.strip()) for x in text.split(",") if x.strip()]


def parse_variants(text: str) -> list[dict[str, str]]:
    """'a=1;b=2,c=3' -> [{"a": "1"}, {"b": "2", "c": "3"}]: variants apart by ';', the fields
    of one variant by ','."""
    out = []
    for variant in filter(None, (v.strip() for v in text.split(";"))):
        fields = {}
        for item in variant.split(","):
            name, eq, value = item.partition("=")
            if not eq or not name.strip() or not value.strip():
                raise SystemExit(f"--variants: {item!r} is not name=value")
            fields[name.strip()] = value.strip()
        out.append(fields)
    return out
