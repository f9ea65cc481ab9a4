"""bench_auto's rows as worker processes: each edgespec row (`RowWorker`) and onnxruntime-genai
(`GenaiWorker`) in an interpreter of its own, asked for one timed generation at a time.

Takes a worker's spec (JSON, on the command line) and then one JSON request a line on stdin;
guarantees one JSON answer a line on stdout, the first saying the worker is ready (or why it
cannot run), each later one a `Sample`. `LocalRow` runs an edgespec row in the caller's process
behind the same `run`/`close` (`bench_auto.py --no-isolate`).

The parent starts `python benchmarks/auto_workers.py --row-worker SPEC` (`sys.executable`) or
`--genai-worker SPEC` (the genai venv's interpreter, which may lack edgespec): this module
imports only the standard library at the top; edgespec, onnxruntime-genai and numpy are
imported where a worker needs them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GENAI_K = 4  # genai's default max_draft_tokens
# label -> (genai model, speculative options). n-gram runs on the plain model.
GENAI_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "plain": ("plain", {}),
    f"spec K={GENAI_K}": ("spec", {"max_draft_tokens": GENAI_K}),
    "spec adaptive": ("spec", {"max_draft_tokens": GENAI_K, "min_adaptive_k": 2}),
    "ngram": ("plain", {"ngram_size": 3, "max_draft_tokens": GENAI_K}),
}


# --------------------------------------------------------------------------- one generation
@dataclass
class Sample:
    """One timed generation."""

    seconds: float
    tokens: list[int]
    verifications: int  # target calls after the prefill
    drafted: int
    accepted: int
    gammas: Counter = field(default_factory=Counter)  # draft length per round (edgespec)
    count: int = -1  # tokens produced when `tokens` is not known (llama.cpp's CLI: text only)
    text: str | None = None  # llama.cpp's CLI: its printed prompt + output
    # edgespec: after the prefill, tokens produced, seconds spent in the target's calls and
    # seconds in all (from the prefill's token to the last: what bench_ar calls decoding)
    decode_tokens: int = 0
    verify_seconds: float = 0.0
    decode_seconds: float = 0.0

    @property
    def n(self) -> int:
        return self.count if self.count >= 0 else len(self.tokens)


def run_edgespec(model: Any, ids: list[int], n_new: int, temperature: float, seed: int | None):
    tokens: list[int] = []
    gammas: Counter = Counter()
    drafted = accepted = decoded = 0
    verifying = 0.0
    start = prefilled = time.perf_counter()
    for chunk in model.stream(
        ids, max_new_tokens=n_new, temperature=temperature, seed=seed, ignore_eos=True
    ):
        tokens += chunk.tokens
        if chunk.stats.phase == "prefill":
            prefilled = time.perf_counter()
        else:
            gammas[chunk.stats.drafted] += 1
            drafted += chunk.stats.drafted
            accepted += chunk.stats.accepted
            decoded += chunk.stats.new_tokens
            verifying += chunk.stats.verify_seconds
    end = time.perf_counter()
    return Sample(
        end - start, tokens, sum(gammas.values()), drafted, accepted, gammas,
        decode_tokens=decoded, verify_seconds=verifying, decode_seconds=end - prefilled,
    )  # fmt: skip


# --------------------------------------------------------------------------- workers
class JsonWorker:
    """A subprocess of this module (`auto_workers.py --FLAG SPEC`) that answers one JSON line
    per JSON line asked; its first line says it is ready (or why it cannot run)."""

    def __init__(self, python: str, flag: str, spec: dict[str, Any], name: str) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [python, str(Path(__file__).resolve()), flag, json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.ready = self._read()

    def _read(self) -> dict[str, Any]:
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line:
            raise RuntimeError(f"{self.name} exited (rc={self.proc.poll()}); its stderr is above")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"{self.name}: {answer['error']}")
        return answer

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


def reply_channel() -> Any:
    """A worker's answers go to the real stdout; whatever else writes there (native logs,
    prints) goes to stderr instead."""
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    return reply


class GenaiWorker(JsonWorker):
    """onnxruntime-genai in its own interpreter: one subprocess that loads the models once and
    runs one generation per request."""

    def __init__(self, python: str, spec: dict[str, Any]) -> None:
        super().__init__(python, "--genai-worker", spec, "genai worker")

    def run(self, config: str, ids: list[int], n_new: int, temperature: float, seed: int | None):
        a = self.ask(dict(config=config, ids=ids, n_new=n_new, temperature=temperature, seed=seed))
        return Sample(a["seconds"], a["tokens"], a["verifications"], a["drafted"], a["accepted"])


def genai_worker(spec_json: str) -> None:
    """Subprocess entry: load the genai models named in `spec`, then serve requests."""
    reply = reply_channel()
    spec = json.loads(spec_json)
    try:
        import onnxruntime_genai as og

        models = {name: og.Model(path) for name, path in spec["models"].items()}
        configs = {k: v for k, v in GENAI_CONFIGS.items() if v[0] in models}
        errors = {}
        for label, (name, options) in list(configs.items()):  # warm-up; drop what cannot run
            try:
                _genai_generate(og, models[name], options, [1, 2, 3, 4], 8, 0.0, None, 4096)
            except Exception as e:  # noqa: BLE001 - reported as the row's note
                errors[label] = f"{type(e).__name__}: {e}"
                del configs[label]
        reply.write(
            json.dumps({"configs": list(configs), "errors": errors, "version": og.__version__})
            + "\n"
        )
    except Exception as e:  # noqa: BLE001 - the parent reports it
        reply.write(json.dumps({"error": f"{type(e).__name__}: {e}"}) + "\n")
        return
    for line in sys.stdin:
        r = json.loads(line)
        name, options = configs[r["config"]]
        try:
            answer = _genai_generate(
                og, models[name], options, r["ids"], r["n_new"], r["temperature"], r["seed"],
                spec["vocab_size"],
            )  # fmt: skip
        except Exception as e:  # noqa: BLE001
            answer = {"error": f"{r['config']}: {type(e).__name__}: {e}"}
        reply.write(json.dumps(answer) + "\n")


def _genai_generate(og, model, options, ids, n_new, temperature, seed, vocab_size) -> dict:
    import numpy as np

    total = len(ids) + n_new
    params = og.GeneratorParams(model)
    search: dict[str, Any] = dict(max_length=total, min_length=total, do_sample=temperature > 0)
    if temperature > 0:  # the full distribution, as edgespec's top_k=0
        search.update(temperature=temperature, top_k=vocab_size, top_p=1.0, random_seed=seed)
    params.set_search_options(**search)
    if options:
        params.set_speculative_options(**options)
    start = time.perf_counter()
    generator = og.Generator(model, params)
    generator.append_tokens(np.asarray([ids], dtype=np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    seconds = time.perf_counter() - start
    tokens = [int(t) for t in generator.get_sequence(0)[len(ids) :]]
    stats = dict(generator.get_speculative_stats()) if options else {}
    del generator
    return {
        "seconds": seconds,
        "tokens": tokens,
        # every target call after the prefill: verify, re-anchor and plain (lookup miss) steps
        "verifications": (
            stats["target_forward_passes"] + stats["standard_fallback_steps"]
            if stats
            else len(tokens) - 1
        ),
        "drafted": int(stats.get("draft_tokens_evaluated", 0)),
        "accepted": int(stats.get("draft_tokens_accepted", 0)),
        "stats": {k: v for k, v in stats.items() if isinstance(v, int | float | bool)},
    }


# --------------------------------------------------------------------------- edgespec
# edgespec row options, not Model.load's: price the chain's members as one (before stop 27);
# other values of runtime/estimates.py's module constants (a row in a process of its own only)
ONE_POLICY = "one_policy"
ESTIMATES = "estimates"


def load_row(folder: Path, threads: int, options: dict[str, Any]) -> Any:
    """edgespec.load(folder, **options); with ONE_POLICY, a chain's adaptive policy without
    its per-member split (`PerSource.main` alone sees every round), for an A/B in one run."""
    import edgespec

    options = dict(options)
    one = options.pop(ONE_POLICY, False)
    if ESTIMATES in options:
        from common import set_estimates  # the row worker's interpreter, not genai's

        set_estimates(options.pop(ESTIMATES), "--ab-estimates")
    model = edgespec.load(folder, threads=threads, **options)
    if one:
        model.policy = model.policy.main
    return model


class RowWorker(JsonWorker):
    """One edgespec row in a process of its own (`--isolate`): it loads the row's model, and
    nothing else, then runs one generation per request. In one process holding all ~27 rows,
    the row loaded first ran 8-13% slower than in other runs (stops 27-28), whatever row it
    was; a process per row takes load order out."""

    def __init__(self, folder: Path, threads: int, options: dict[str, Any]) -> None:
        spec = {"folder": str(folder), "threads": threads, "options": options}
        super().__init__(sys.executable, "--row-worker", spec, "row worker")

    def run(self, ids: list[int], n_new: int, temperature: float, seed: int | None) -> Sample:
        a = self.ask(dict(ids=ids, n_new=n_new, temperature=temperature, seed=seed))
        a["gammas"] = Counter({int(g): n for g, n in a["gammas"].items()})
        return Sample(**a)


class LocalRow:
    """One edgespec row in this process (the default)."""

    def __init__(self, folder: Path, threads: int, options: dict[str, Any]) -> None:
        self.model = load_row(folder, threads, options)

    def run(self, ids: list[int], n_new: int, temperature: float, seed: int | None) -> Sample:
        return run_edgespec(self.model, ids, n_new, temperature, seed)

    def close(self) -> None:
        pass


def row_worker(spec_json: str) -> None:
    """Subprocess entry of `RowWorker`: load one row, then serve requests until stdin ends."""
    reply = reply_channel()
    spec = json.loads(spec_json)
    try:
        model = load_row(Path(spec["folder"]), spec["threads"], spec["options"])
    except Exception as e:  # noqa: BLE001 - the parent reports it
        reply.write(json.dumps({"error": f"{type(e).__name__}: {e}"}) + "\n")
        return
    reply.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        r = json.loads(line)
        sample = run_edgespec(model, r["ids"], r["n_new"], r["temperature"], r["seed"])
        # not asdict(): it rebuilds a Counter from its (key, count) pairs, counting the pairs
        fields = {f.name: getattr(sample, f.name) for f in dataclasses.fields(sample)}
        reply.write(json.dumps({**fields, "gammas": dict(sample.gammas)}) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description="a bench_auto worker process (see JsonWorker)")
    kind = ap.add_mutually_exclusive_group(required=True)
    kind.add_argument("--genai-worker", metavar="SPEC", help="serve onnxruntime-genai's rows")
    kind.add_argument("--row-worker", metavar="SPEC", help="serve one edgespec row")
    args = ap.parse_args()
    if args.genai_worker:
        genai_worker(args.genai_worker)
    else:
        row_worker(args.row_worker)


if __name__ == "__main__":
    main()
