"""Flags every scenario spells the same way, and A/Bs as variants of a config object.

`--variants 'name=value,...'` names fields of a config object (a dataclass, or a plain object
such as the cost model), dotted for a nested one (`priors.shrink=3`); `with_fields` returns a
copy with those fields set, the value converted to the field's type. An A/B runs the copy
beside the original in the same run; nothing patches a module's globals.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
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


def with_fields(obj: Any, fields: dict[str, str]) -> Any:
    """A deep copy of `obj` with `fields` set (see `set_fields`)."""
    out = copy.deepcopy(obj)
    set_fields(out, fields)
    return out


def set_fields(obj: Any, fields: dict[str, str]) -> None:
    """Set `fields` on the mutable `obj` (a dotted name reaches a nested object; a frozen
    dataclass on the way is replaced, not mutated); an unknown name is refused with the
    names there are."""
    for name, value in fields.items():
        head, *rest = name.split(".")
        _check(obj, head)
        child = getattr(obj, head)
        setattr(obj, head, _replaced(child, rest, value) if rest else _typed(child, value))


def _replaced(obj: Any, path: list[str], value: str) -> Any:
    head, rest = path[0], path[1:]
    _check(obj, head)
    child = getattr(obj, head)
    new = _replaced(child, rest, value) if rest else _typed(child, value)
    if dataclasses.is_dataclass(obj) and obj.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        return dataclasses.replace(obj, **{head: new})
    setattr(obj, head, new)
    return obj


def _check(obj: Any, name: str) -> None:
    if dataclasses.is_dataclass(obj):
        names = [f.name for f in dataclasses.fields(obj) if not f.name.startswith("_")]
    else:
        names = [n for n in vars(obj) if not n.startswith("_")]
    if name not in names:
        kind = type(obj).__name__
        raise SystemExit(f"--variants: {kind} has no field {name!r} ({', '.join(names)})")


def _typed(current: Any, value: str) -> Any:
    if isinstance(current, bool):
        return value.lower() in ("1", "true", "yes")
    if isinstance(current, int) or (current is None and value.lstrip("-").isdigit()):
        return int(float(value))
    if isinstance(current, float) or current is None:
        return float(value)
    return value
