"""The built-in demo: a small *trained* code model shipped inside the package, decoded plainly and
speculatively, side by side.

Takes a `DemoConfig` (prompt, new tokens, threads, which modes). Guarantees:

* nothing is downloaded and torch is never imported: the bundle is package data
  (`edgespec/demo_bundle/`: an 8-layer 11M-parameter Llama target, fp32, with early exits at
  layers 2 and 4, and a 2-layer distilled draft, int4, trained on the Python standard library's
  source by `benchmarks/train_models.py` and exported by `benchmarks/build_demo_bundle.py`);
* `run_demo()` decodes the prompt greedily with `ar` and then with each speculative mode; every
  mode's tokens are compared with `ar`'s (lossless decoding: they must be equal) and timed
  end to end (prefill included, best of `repeats` after one warm-up), so the speed-up is
  measured on this machine, not quoted;
* a missing bundle (a source checkout that never built it) is refused with the command that
  builds it, never a stack trace.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgespec.runtime.model import InputError

DEFAULT_PROMPT = "def read_config(path):\n    "
# label -> edgespec.load options; the order is the order of the rows.
MODES: dict[str, dict[str, Any]] = {
    "ar": {"mode": "ar"},
    "spec": {"mode": "spec"},
    "self-spec": {"mode": "self-spec"},
    "lookup": {"mode": "lookup"},
    "spec+lookup": {"mode": "spec", "drafter": "lookup+draft"},
}


@dataclass(frozen=True)
class DemoConfig:
    prompt: str = DEFAULT_PROMPT
    max_new_tokens: int = 128
    threads: int | None = None
    modes: tuple[str, ...] = tuple(MODES)
    repeats: int = 3  # timed generations per mode (the best counts), after one warm-up
    bundle: Path | None = None  # default: the bundle shipped in the package

    def __post_init__(self) -> None:
        unknown = [m for m in self.modes if m not in MODES]
        if unknown or "ar" not in self.modes:
            raise InputError(
                f"demo modes must include 'ar' and come from {', '.join(MODES)}; got "
                f"{', '.join(self.modes)}"
            )
        if self.max_new_tokens < 1 or self.repeats < 1:
            raise InputError("max_new_tokens and repeats must be at least 1")


@dataclass
class DemoRow:
    mode: str
    text: str
    tokens: list[int]
    tokens_per_s: float  # end to end: prompt pass + every new token
    speedup: float = 1.0  # vs ar
    same_as_ar: bool = True
    tokens_per_round: float = 1.0  # tokens each target (verification) call produced
    details: dict[str, Any] = field(default_factory=dict)


def bundle_path() -> Path:
    """The demo bundle inside the installed package."""
    return Path(__file__).resolve().parent / "demo_bundle"


def run_demo(config: DemoConfig, progress: Callable[[str], None] | None = None) -> list[DemoRow]:
    """Decode `config.prompt` with every mode; rows in `config.modes` order, `ar` first."""
    import edgespec

    bundle = config.bundle or bundle_path()
    if not (bundle / "manifest.json").exists():
        raise InputError(
            f"the demo bundle is missing ({bundle}); in a source checkout build it once with "
            "`python benchmarks/train_models.py && python benchmarks/build_demo_bundle.py` "
            "(needs the [export] extra)"
        )
    modes = ["ar", *[m for m in config.modes if m != "ar"]]
    rows: list[DemoRow] = []
    for mode in modes:
        if progress is not None:
            progress(mode)
        model = edgespec.load(bundle, threads=config.threads, **MODES[mode])
        ids = model.encode(config.prompt)
        options = {"max_new_tokens": config.max_new_tokens, "ignore_eos": True}
        model.generate(ids, **options)  # warm-up: sessions, allocator, caches
        best, result = float("inf"), None
        for _ in range(config.repeats):
            start = time.perf_counter()
            result = model.generate(ids, **options)
            best = min(best, time.perf_counter() - start)
        assert result is not None
        s = result.stats
        # every round ends in one target call that yields its accepted drafts + one token
        per_round = 1.0 + s.accepted / s.rounds if s.drafted and s.rounds else 1.0
        rows.append(
            DemoRow(
                mode=mode,
                text=result.text,
                tokens=list(result.tokens),
                tokens_per_s=len(result.tokens) / best,
                tokens_per_round=per_round,
            )
        )
    ar = rows[0]
    for row in rows:
        row.speedup = row.tokens_per_s / ar.tokens_per_s
        row.same_as_ar = row.tokens == ar.tokens
    return rows
