"""Never slower than plain decoding: edgespec's `auto` draft policy against plain decoding, every
fixed draft length and onnxruntime-genai's own speculative decoding, in one run.

Takes the trained pair of `benchmarks/train_models.py` (`--models`, default
~/.cache/edgespec-bench/trained: an 8-layer target, a distilled 2-layer draft, held-out prompts)
and its edgespec bundle (`trained/bundle`, draft + exits 2 and 4, as bench_spec.py exports it),
and measures end-to-end tokens/s (prefill included, `--max-new-tokens` new tokens every time,
`--threads` threads for every engine, fp32 weights everywhere) on three prompt sets:

  code   held-out code prompts, greedy: the good case for speculation.
  words  the random-word prompts of prompts_text.jsonl, greedy: the bad case for the draft
         model (54% of γ = 1 drafts accepted; fixed γ between 0.98x and 1.25x ar).
  text   all high-entropy prompts (random words, identifiers, shuffled characters), sampled at
         `--temperature` (default 1.0, full vocabulary, seed 1000 + prompt index, the same
         seed for every engine and pass).
Why not the obvious bad sets: greedy decoding of random identifiers or shuffled characters
falls into loops the draft predicts (94-100% accepted), and sampling does not help either: the
draft was distilled on the target's temperature-1 distribution and matches it even on random
text or random token ids (77-84% accepted at T = 0.3-1.5). Speculation wins on `text`.

Rows, all on the same prompt ids (encoded once by edgespec's tokenizer):
  edgespec ar, spec auto (blind start), spec auto (calibrated: `calibrate()` of this device's
  round costs, as `edgespec bench --calibrate BUNDLE` stores them), spec fixed:1..8, lookup
  auto; onnxruntime-genai plain, draft-model speculative (fixed K and adaptive K) and n-gram
  speculative, all three from its model builder's fp32 CPU export of the same checkpoints.

Timing is interleaved: for each (pass, prompt) every row runs once, in a shuffled order, so a
burst of load from other tenants of a shared machine lands on all rows alike, with `--pause`
seconds between two generations. Each edgespec row lives in a worker process of its own that
holds only its model, as an app does (`--no-isolate`: all in this process, where the row
loaded first ran 8-13% slower in stops 27-28; the cause is not found). genai lives in
its own venv (`--genai-python`): one long-lived worker subprocess holds its models and runs each
generation when the main loop asks for it, so genai rows interleave with edgespec's like any
other row. Greedy rows are checked token for token against edgespec ar (`= ar`); sampled rows
have no such column (speculative sampling follows the target's distribution, but draws other
random numbers). Calibration and auto's blind start use private views of the bundle (symlinked
files), so the shared bundle's calibration.json is never written.

`decoding vs ar` (edgespec rows): decode tokens/s after the prompt's prefill over ar's, as
bench_ar.py splits prefill and decode; the prefill is the same target call in every mode.

`auto` against the best fixed γ in hindsight (the summary): the fixed row that the other
passes rank first, judged on the pass left out, averaged over passes (auto_table.py's
`held_out_ratio`): the best of six noisy rows judged on the runs that picked it reads high.
With `--fresh-processes` each pass starts every row in a new process, so that the passes are
independent draws of a process's own speed (identical rows in two processes differed by up to
6.6% in stop 30's A/A run, and the difference lasted the whole run).

`verify-bound` (edgespec's speculative rows, in the note): the row's decode speed-up over ar
if drafting and the decode loop cost nothing, at the tokens per verification it realized:
its decode tokens over the seconds its rounds spent in target calls, against ar's. No drafter
can take a mode past it; the summary checks the code set's best row against 2x beside it.

    python benchmarks/bench_auto.py --genai-python /work/venv-genai/bin/python \\
        --prompts 8 --passes 3 --json /tmp/bench_auto.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from auto_rows import (
    SETS,
    PromptSet,
    bundle_view,
    edgespec_configs,
    genai_export,
    genai_spec_dir,
    load_prompts,
    pair_bundle,
    row_of,
)
from auto_table import Row, Tally, check_targets, print_table, rows_for
from auto_workers import GenaiWorker, LocalRow, RowWorker, Sample, load_row
from common import DEFAULT_MODELS

# seconds between two timed generations (`--pause`). onnxruntime's pool threads spin for
# 20-40 ms after a generation ends (measured: CPU time per 25 ms window); an engine in another
# process (a row worker, genai, llama.cpp) started inside that window shares the 2 cores with
# them. With a process per row, 0.02 s read ar 558 tok/s and spec+lookup (int4 draft) 1.61x;
# 0.2 s, 7 minutes later, 623 and 1.96x (a third run at 0.2 s: 560 and 1.69x; the host drifts)
PAUSE = 0.2
LLAMACPP_CONFIGS = ("plain", "draft", "ngram-simple", "ngram-map-k", "ngram-mod")


# --------------------------------------------------------------------------- the run
class OtherCpu:
    """Mean cores that processes other than `pids` kept busy since construction (/proc)."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = list(pids)
        self.retired = 0.0  # CPU seconds of our processes that have exited since
        self.start = self._sample()

    def swap(self, old: int, new: int) -> None:
        """`old` is about to exit and `new` replaces it (--fresh-processes): what `old` used
        stays ours, and `new` is ours from its start."""
        self.retired += _cpu_seconds(old)
        self.pids = [new if p == old else p for p in self.pids]

    def _sample(self) -> tuple[float, float]:
        tick = os.sysconf("SC_CLK_TCK")
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
        busy = sum(int(f) for i, f in enumerate(fields) if i not in (3, 4)) / tick  # not idle
        ours = self.retired + sum(_cpu_seconds(pid) for pid in self.pids)
        return time.perf_counter(), busy - ours

    def other_cores(self) -> float:
        (t0, b0), (t1, b1) = self.start, self._sample()
        return max(0.0, (b1 - b0) / (t1 - t0))


def _cpu_seconds(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def bench_set(
    pset: PromptSet,
    models: dict[str, LocalRow | RowWorker],
    genai: GenaiWorker | None,
    genai_labels: list[str],
    n_new: int,
    passes: int,
    llamacpp: Any = None,
    pause: float = PAUSE,
    restart: Callable[[str], RowWorker] | None = None,
) -> dict[str, Tally]:
    """Every row on every prompt, `passes` times, interleaved: for each (pass, prompt) each row
    runs once, in a shuffled order. `restart(label)`: each pass after the first gets a new
    worker process per row (`--fresh-processes`), loaded in a shuffled order."""
    labels = [*models, *(f"genai {g}" for g in genai_labels)]
    if llamacpp is not None and pset.temperature == 0:  # its CLI rows run greedy only
        labels += [f"llama.cpp {c}" for c in LLAMACPP_CONFIGS]
    _warm_up(models.values(), pset)
    tallies = {label: Tally() for label in labels}
    workers = [r.proc.pid for r in models.values() if isinstance(r, RowWorker)]
    monitor = OtherCpu([os.getpid(), *workers, *([genai.proc.pid] if genai else [])])
    order = random.Random(0)
    for p in range(passes):
        if p and restart is not None:
            for label in order.sample(list(models), len(models)):
                old = models[label]
                assert isinstance(old, RowWorker)
                new = restart(label)
                monitor.swap(old.proc.pid, new.proc.pid)
                old.close()
                models[label] = new
            _warm_up(models.values(), pset)
        for t in tallies.values():
            t.samples.append([])
        for i, ids in enumerate(pset.ids):
            # a fresh random order per prompt: a fixed rotation would always run one row
            # right after genai's (or edgespec's) thread pool, still spinning, slowed down
            for label in order.sample(labels, len(labels)):
                time.sleep(pause)  # let the last engine's spinning threads go idle
                if label in models:
                    s = models[label].run(ids, n_new, pset.temperature, pset.seed(i))
                elif label.startswith("llama.cpp "):
                    s = run_llamacpp(llamacpp, label[10:], ids, pset.texts[i], n_new)
                else:
                    assert genai is not None
                    s = genai.run(label[6:], ids, n_new, pset.temperature, pset.seed(i))
                tallies[label].samples[p].append(s)
        ar = tallies["ar"].rate([p])
        print(
            f"{pset.name}: pass {p + 1}/{passes}: ar {ar:.1f} tok/s; "
            + ", ".join(f"{k} {t.rate([p]) / ar:.2f}x" for k, t in tallies.items() if k != "ar"),
            flush=True,
        )
    pset.other_cores = monitor.other_cores()
    return tallies


class RowRestarter:
    """A new worker process for a row label (`--fresh-processes`)."""

    def __init__(self, configs: list[tuple[str, Path, dict[str, Any]]], threads: int) -> None:
        self.where = {label: (folder, options) for label, folder, options in configs}
        self.threads = threads

    def __call__(self, label: str) -> RowWorker:
        folder, options = self.where[label]
        return RowWorker(folder, self.threads, options)


def _warm_up(rows: Iterable[LocalRow | RowWorker], pset: PromptSet) -> None:
    for row in rows:  # auto then starts each set blind, as a new user
        row.run(pset.ids[0], 8, pset.temperature, pset.seed(0))


def run_llamacpp(runner: Any, config: str, ids: list[int], text: str, n_new: int) -> Sample:
    a = runner.run(config, ids, text, n_new)
    verifications = a.n_tokens - 1 - a.accepted  # one target call per round after the prompt
    return Sample(a.seconds, a.tokens, verifications, a.drafted, a.accepted, count=a.n_tokens,
                  text=a.text)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models", type=Path, default=DEFAULT_MODELS / "trained")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per set")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--passes", type=int, default=2, help="interleaved passes over the prompts")
    ap.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (text)")
    ap.add_argument("--sets", default="code,words,text", help="of: " + ", ".join(SETS))
    ap.add_argument("--genai-python", default=None, help="interpreter of the genai venv")
    ap.add_argument(
        "--llamacpp-venv",
        type=Path,
        default=None,
        help="venv of benchmarks/setup_llamacpp.sh: adds llama.cpp plain, draft-model and n-gram "
        "speculative rows (greedy sets) on F32 GGUFs of the same pair",
    )
    ap.add_argument(
        "--fixed-modes",
        default="spec,self-spec@2",
        help="modes that get fixed:1..8 rows beside their auto row (comma list)",
    )
    ap.add_argument(
        "--draft-quantize",
        default="",
        help="comma list of int8/int4: also the fp32 target with its draft quantized apart "
        "(bundle-draft-int8, exported once); spec/spec+lookup auto rows, `--fixed-modes spec:int8`",
    )
    ap.add_argument(
        "--one-policy",
        action="store_true",
        help="also each spec+lookup auto row with one policy over the chain's two drafters "
        "(as before stop 27), for an A/B against pricing each apart",
    )
    ap.add_argument(
        "--rows",
        default=".*",
        help="regex: only the edgespec rows whose label matches it in full ('ar' always runs), "
        "e.g. 'spec (auto|fixed:.*)': fewer models loaded side by side",
    )
    ap.add_argument("--load-seed", type=int, default=0, help="seed of the rows' load order")
    ap.add_argument(
        "--ballast", type=int, default=1, help="untimed models loaded before the rows (0: none)"
    )
    ap.add_argument(
        "--isolate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="each edgespec row in a process of its own, holding only its model (as an app "
        "does), still timed in turns; --no-isolate: all rows in this process, where the row "
        "loaded first ran 8-13%% slower (stops 27-28)",
    )
    ap.add_argument(
        "--fresh-processes",
        action="store_true",
        help="with --isolate: every pass after the first runs each row in a new process "
        "(loaded in a shuffled order), so that passes are independent draws of what a "
        "process's placement in memory costs it; identical rows in separate processes differed "
        "by up to 6.6%% in one run (stop 30), a difference that stays with the process",
    )
    ap.add_argument(
        "--huge-pages",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="--no-huge-pages: every row loads with huge_pages=False (weights in 4 KiB pages)",
    )
    ap.add_argument(
        "--ab-estimates",
        default="",
        help="NAME=VALUE,...: each blind auto row also with these constants of "
        "runtime/estimates.py (e.g. SHRINK=3,STATE_PRIOR=2: the values before stop 29), an A/B "
        "in one run",
    )
    ap.add_argument(
        "--pause", type=float, default=PAUSE, help="seconds between two timed generations"
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    ab_estimates = {}
    for item in filter(None, args.ab_estimates.split(",")):
        name, _, value = item.partition("=")
        ab_estimates[name.strip()] = float(value)
    if args.fresh_processes and not args.isolate:
        raise SystemExit("--fresh-processes needs --isolate: only a row's own process can restart")
    if ab_estimates and not args.isolate:
        raise SystemExit("--ab-estimates needs --isolate: the constants are per process")
    from edgespec.runtime.calibrate import calibrate
    from edgespec.runtime.tokenizer import Tokenizer

    if not (args.models / "target" / "config.json").exists():
        raise SystemExit(f"no trained pair in {args.models}: run benchmarks/train_models.py")
    bundle = pair_bundle(args.models)
    work = Path(tempfile.mkdtemp(prefix="bench_auto_"))
    try:
        blind = bundle_view(bundle, work / "blind")
        calibrated = bundle_view(bundle, work / "calibrated")
        start = time.perf_counter()
        calibrate(calibrated, threads=args.threads)
        print(f"calibrated in {time.perf_counter() - start:.0f}s", flush=True)
        quantized = {}
        for q in [q for q in args.draft_quantize.split(",") if q]:
            quantized[q] = bundle_view(pair_bundle(args.models, q), work / f"draft-{q}")

        genai, genai_labels, notes = None, [], {}
        if args.genai_python:
            cache = args.models / "genai-fp32"
            genai_export(args.models / "target", cache / "target", args.genai_python, args.threads)
            genai_export(args.models / "draft", cache / "draft", args.genai_python, args.threads)
            spec = genai_spec_dir(cache / "target", cache / "draft", cache / "spec")
            genai = GenaiWorker(
                args.genai_python,
                {"models": {"plain": str(cache / "target"), "spec": str(spec)}, "vocab_size": 4096},
            )
            genai_labels = genai.ready["configs"]
            notes = {f"genai {k}": f"failed: {v}" for k, v in genai.ready["errors"].items()}
            for k, v in genai.ready["errors"].items():
                print(f"genai {k}: cannot run: {v}", flush=True)

        llamacpp = None
        if args.llamacpp_venv:
            from llamacpp_engine import LlamaCppEnv, SpeculativeRunner, gguf_for

            env = LlamaCppEnv.from_venv(args.llamacpp_venv)
            target, draft = (gguf_for(args.models / m, "fp32", env) for m in ("target", "draft"))
            llamacpp = SpeculativeRunner(env, target, draft, args.threads)
            print(f"llama.cpp: {env.version()}", flush=True)

        # what Model.encode does with text (no model loaded here for it: rows live in workers)
        tokenizer = Tokenizer.from_dir(blind)
        all_rows: list[Row] = []
        summary: list[str] = []
        for name in args.sets.split(","):
            texts = load_prompts(args.models, name, args.prompts)
            fixed_modes = [m for m in args.fixed_modes.split(",") if m]
            configs = edgespec_configs(
                blind, calibrated, fixed_modes, quantized, args.one_policy, ab_estimates
            )
            # an --ab-estimates row goes with its row
            configs = [c for c in configs if c[0] == "ar" or re.fullmatch(args.rows, row_of(c[0]))]
            if not args.huge_pages:
                configs = [(label, f, {**o, "huge_pages": False}) for label, f, o in configs]
            # loaded in a seeded shuffled order: on a host where the first-loaded model ran
            # up to 40% slower than the same model loaded later (stop 27), loading ar, then
            # the auto rows, then the fixed rows biased every comparison the same way. The
            # tables keep the configs' order.
            order = random.Random(args.load_seed).sample(configs, len(configs))
            # an untimed model loaded before the rows: in this benchmark the row loaded first
            # (after calibration freed its models) ran 8-13% slower (stop 28, three seeds)
            # (no ballast with --isolate: no row shares a process)
            ballast = 0 if args.isolate else args.ballast
            _ballast = [load_row(blind, args.threads, {}) for _ in range(ballast)]
            for model in _ballast:
                model.generate(texts[0], max_new_tokens=8, ignore_eos=True)
            row_kind = RowWorker if args.isolate else LocalRow
            loaded: dict[str, LocalRow | RowWorker] = {}
            models: dict[str, LocalRow | RowWorker] = {}
            restart = RowRestarter(configs, args.threads) if args.fresh_processes else None
            try:
                for label, folder, options in order:
                    loaded[label] = row_kind(folder, args.threads, options)
                print(f"{name}: load order: {', '.join(loaded)}", flush=True)
                models = {label: loaded[label] for label, _, _ in configs}
                ids = [tokenizer.encode(t) for t in texts]
                pset = PromptSet(name, ids, args.temperature if SETS[name][2] else 0.0, texts)
                tallies = bench_set(
                    pset, models, genai, genai_labels, args.max_new_tokens, args.passes, llamacpp,
                    args.pause, restart,
                )  # fmt: skip
            finally:
                for row in [*loaded.values(), *models.values()]:  # closing twice is harmless
                    row.close()
            rows = rows_for(pset, tallies, notes, tokenizer.decode)
            print_table(pset, rows, args.max_new_tokens, args.threads)
            summary += check_targets(pset, rows)
            all_rows += rows
        print("\n" + "\n".join(summary))
        if genai:
            genai.close()
        if args.json:
            args.json.write_text(json.dumps([asdict(r) for r in all_rows], indent=2))
            from plots import try_plot

            try_plot("auto", args.json)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
