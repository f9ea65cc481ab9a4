"""What the benchmarks share: where things are, prompts, bundles, a verifier server, tables.

The benchmarks run as `python benchmarks/bench_x.py` from a checkout where edgespec is
installed (`pip install -e .`); this module is imported as their sibling (the script's own
folder is on `sys.path`), so no benchmark edits `sys.path`. Nothing here times anything:
each benchmark measures its own way and reports the machine's load next to its figures.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
# trained models, prompts and bundles (benchmarks/train_models.py writes them)
DEFAULT_MODELS = Path(os.environ.get("EDGESPEC_BENCH", Path.home() / ".cache" / "edgespec-bench"))
# bench_ar.py's checkpoints and bundles of the real shapes (bench_oracle, bench_huge_pages)
BENCH_CACHE = Path(os.environ.get("EDGESPEC_BENCH_CACHE", "~/.cache/edgespec-bench"))


def base_precision(precision: str) -> str:
    """The llama.cpp type and bound a bench_ar precision is measured against: "int4@32"
    (edgespec's int4 with blocks of 32, not the export's default) -> "int4"."""
    return precision.split("@", 1)[0]


def load_prompts(path: Path, n: int) -> list[str]:
    """The first `n` prompts of a JSON-lines file (a prompt string or {"prompt": ...} a line)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["prompt"] if isinstance(r, dict) else r for r in rows][:n]


def outdated(product: Path, *sources: Path | str | None) -> bool:
    """Whether `product` (a file the benchmarks cache) is missing, or older than a file of the
    checkpoint folders it was made from (train_models.py retrained one since)."""
    if not product.exists():
        return True
    made = product.stat().st_mtime
    for source in sources:
        if source is None or not Path(source).is_dir():
            continue  # a hub id, or no such input
        if any(f.stat().st_mtime > made for f in Path(source).iterdir() if f.is_file()):
            return True
    return False


def cached_bundle(model: Path | str, out: Path, **options: Any) -> bool:
    """Export `model` to `out` unless an export of the same checkpoints is already there;
    True when it exported."""
    from edgespec.export import export_bundle

    if not outdated(out / "manifest.json", model, options.get("draft")):
        return False
    export_bundle(model, out, overwrite=True, **options)
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(bundle: Path, port: int, threads: int | None, max_sessions: int, *extra: str):
    """`edgespec serve` on 127.0.0.1:`port` in a subprocess, returned once /health answers."""
    cmd = [sys.executable, "-m", "edgespec.cli", "serve", str(bundle), "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--max-sessions", str(max_sessions), "--log-level", "warning"]
    cmd += list(extra)
    if threads:
        cmd += ["--threads", str(threads)]
    server = subprocess.Popen(cmd)
    deadline = time.time() + 120
    while time.time() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited with {server.returncode}: {' '.join(cmd)}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return server
        except OSError:
            time.sleep(0.5)
    server.terminate()
    raise SystemExit("the server did not become healthy within 120 s")


def table_header(columns: Iterable[str], align: str) -> str:
    """A markdown table's header and rule; `align` has one of l (---), r (---:), c (:---:)
    per column."""
    rule = {"l": "---", "r": "---:", "c": ":---:"}
    return f"| {' | '.join(columns)} |\n|{'|'.join(rule[a] for a in align)}|"


def table_row(cells: Iterable[object]) -> str:
    return f"| {' | '.join(map(str, cells))} |"


def loadavg() -> float:
    """The 1-minute load average (other jobs on the machine skew every number)."""
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return float("nan")


def load_line() -> str:
    """The machine's load, for the line printed next to a table of figures."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return f"machine: {os.cpu_count()} cores, load average unknown"
    return f"machine: {os.cpu_count()} cores, load average {one:.2f}, {five:.2f}, {fifteen:.2f}"


def set_estimates(values: dict[str, Any], flag: str) -> dict[str, Any]:
    """Refused: the estimators' constants are the cost model's `Priors` (a frozen dataclass),
    and an A/B passes a variant of it instead of patching module state."""
    raise SystemExit(
        f"{flag}: the estimators' constants are fields of edgespec.runtime.estimates.Priors; "
        "A/B them as `bench_gamma.py --variants FIELD=VALUE` or `bench_real.py --priors`"
    )


def worker_answer(
    cmd: list[str],
    model: dict[str, str],
    prompt: list[int],
    args: Any,
    what: str,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Timed generations of another engine in its own interpreter: `cmd + [SPEC.json]` reads
    the spec (the model entry, the prompt and the timing options of `args`) and writes its
    answer (`runs`, and whatever else it reports) to the spec's `out` file."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bench_worker_") as tmp:
        spec = {
            **model,
            "prompt": prompt,
            "n_new": args.new_tokens,
            "threads": args.threads,
            "warmup": args.warmup,
            "repeats": args.repeats,
            "quiet_wait": args.quiet_wait,
            "retries": args.retries,
            "out": str(Path(tmp) / "runs.json"),
        }
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec))
        proc = subprocess.run([*cmd, str(spec_path)], env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{what} worker failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
        return json.loads(Path(spec["out"]).read_text())
