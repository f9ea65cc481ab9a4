"""Quantization and execution providers: bundle size, decode speed and greedy agreement.

For each model — a random-weight model with a real shape (default SmolLM2-135M's, built and
cached exactly as `bench_ar.py` does) and, when present, the trained benchmark target
(`~/.cache/edgespec-bench/trained/target`, made by `train_models.py`) — it exports one bundle
per method (fp32, fp16, int8, int4, qdq-int8; cached per exporter source) and reports:

* bundle size (weights file + graph files);
* decode tok/s (edgespec `ar`, greedy, prefill excluded), the median over passes; every
  method runs on each prompt in turn within a pass (interleaved), so the ratios between
  methods hold on a shared machine even when the absolute numbers move;
* greedy agreement with fp32 over the prompts: the mean fraction of new tokens before the
  first difference, and how many prompts' outputs are identical. (Random weights have small
  logit margins, so quantization flips tokens sooner there than on a trained model.)

Then the OpenVINO execution provider against onnxruntime's CPU provider, in a subprocess of
the venv that has onnxruntime-openvino (`--ov-python`, default `$EDGESPEC_OV_PYTHON`): both
devices in that one process (its onnxruntime), interleaved, same threads (OpenVINO's
`num_of_threads` set through a user device profile), decode tok/s and whether the tokens
equal the CPU provider's.

    python benchmarks/bench_devices.py --ov-python /work/venvs/ov/bin/python --json dev.json

`--models random,trained`, `--methods fp32,int4`, `--prompts 4 --new-tokens 32 --passes 3`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import REPO, loadavg

METHODS = ("fp32", "fp16", "int8", "int4", "qdq-int8")
OV_METHODS = ("fp32", "int8", "int4", "qdq-int8")
DEFAULT_CACHE = Path.home() / ".cache" / "edgespec-bench"


def export_options(method: str) -> dict[str, Any]:
    if method in ("fp32", "fp16"):
        return {"dtype": method}
    return {"dtype": "fp32", "quantize": method}


def bundle_for(checkpoint: Path, method: str, cache: Path) -> Path:
    """Export (once per exporter source) `checkpoint` with `method`."""
    from bench_ar import edgespec_exporter_digest

    from edgespec.export import export_bundle

    bundle = cache / f"{method}-{edgespec_exporter_digest()}"
    if not (bundle / "manifest.json").exists():
        log(f"exporting {checkpoint.name} as {method} ...")
        export_bundle(
            checkpoint,
            bundle,
            overwrite=True,
            verify=False,
            **export_options(method),
        )
    return bundle


def bundle_bytes(bundle: Path) -> int:
    return sum(p.stat().st_size for p in bundle.iterdir() if p.suffix in (".bin", ".onnx"))


def decode_pass(models: dict[str, Any], prompts: list, n_new: int) -> dict[str, dict]:
    """One interleaved pass: every model on each prompt in turn."""
    out: dict[str, dict] = {k: {"tokens": [], "decode_s": 0.0, "decoded": 0} for k in models}
    for prompt in prompts:
        for key, model in models.items():
            res = model.generate(prompt, max_new_tokens=n_new, ignore_eos=True)
            out[key]["tokens"].append([int(t) for t in res.tokens])
            out[key]["decode_s"] += res.stats.decode_seconds
            out[key]["decoded"] += res.stats.decode_tokens
    return out


def timed(models: dict[str, Any], prompts: list, n_new: int, passes: int) -> dict[str, dict]:
    """Median decode tok/s over `passes` interleaved passes (+ one warm-up) and the tokens."""
    first = next(iter(models.values()))
    decode_pass(models, prompts[:1], 4)  # warm-up: sessions, caches, OpenVINO compilation
    rates: dict[str, list[float]] = {k: [] for k in models}
    tokens: dict[str, list] = {}
    for _ in range(passes):
        result = decode_pass(models, prompts, n_new)
        for k, r in result.items():
            rates[k].append(r["decoded"] / r["decode_s"])
            tokens[k] = r["tokens"]
    del first
    return {k: {"tok_s": statistics.median(rates[k]), "tokens": tokens[k]} for k in models}


def agreement(tokens: list[list[int]], reference: list[list[int]]) -> tuple[float, int]:
    from bench_ar import leading_match

    fractions = [leading_match(a, b) / len(b) for a, b in zip(tokens, reference, strict=True)]
    return statistics.mean(fractions), sum(a == b for a, b in zip(tokens, reference, strict=True))


# ------------------------------------------------------------------ OpenVINO (worker side)
def ov_worker(spec_path: str) -> None:
    """Runs in the onnxruntime-openvino venv: cpu vs openvino for each bundle, interleaved."""
    spec = json.loads(Path(spec_path).read_text())
    import onnxruntime as ort

    import edgespec

    with tempfile.TemporaryDirectory() as profiles:
        # the built-in openvino profile plus the thread count, as a user profile
        profile = {
            "name": "openvino-bench",
            "providers": [
                {
                    "name": "OpenVINOExecutionProvider",
                    "options": {"device_type": "CPU", "num_of_threads": spec["threads"]},
                },
                "CPUExecutionProvider",
            ],
        }
        Path(profiles, "ov.json").write_text(json.dumps(profile))
        os.environ["EDGESPEC_DEVICES"] = profiles
        results = {"onnxruntime": ort.__version__, "rows": {}}
        for method, bundle in spec["bundles"].items():
            models = {
                device: edgespec.load(bundle, device=device, threads=spec["threads"])
                for device in ("cpu", "openvino-bench")
            }
            results["rows"][method] = timed(
                models, spec["prompts"], spec["new_tokens"], spec["passes"]
            )
            del models
    print(json.dumps(results))


def run_ov(python: str, bundles: dict[str, Path], prompts, args) -> dict | None:
    spec = {
        "bundles": {k: str(v) for k, v in bundles.items()},
        "prompts": prompts,
        "new_tokens": args.new_tokens,
        "passes": args.passes,
        "threads": args.threads,
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cmd = [python, str(Path(__file__).resolve()), "--ov-worker", f.name]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    os.unlink(f.name)
    if done.returncode != 0:
        log(f"OpenVINO worker failed:\n{done.stderr[-3000:]}")
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ main side
def models_to_run(args) -> list[tuple[str, Path, list]]:
    """(title, checkpoint folder, prompts) for each model asked for and present."""
    import bench_ar

    out = []
    if "random" in args.models:
        ckpt = bench_ar.build_checkpoint(args.shape, 0, args.cache, rebuild=False)
        prompts = [bench_ar.prompt_ids(i, args.prompt_tokens) for i in range(args.prompts)]
        title = f"{bench_ar.SHAPE_TITLES.get(args.shape, args.shape)} (random weights)"
        out.append((title, ckpt, prompts))
    target = args.cache / "trained" / "target"
    if "trained" in args.models:
        if (target / "config.json").exists():
            lines = (args.cache / "trained" / "prompts_code.jsonl").read_text().splitlines()
            texts = [json.loads(line)["prompt"] for line in lines[: args.prompts]]
            out.append(("trained 8-layer target (code prompts)", target, texts))
        else:
            log(f"no trained target at {target}: run benchmarks/train_models.py; skipping it")
    return out


def bench_model(title: str, ckpt: Path, prompts: list, args) -> dict[str, Any]:
    import edgespec

    cache = args.cache / "devices" / ckpt.parent.name / ckpt.name
    bundles = {m: bundle_for(ckpt, m, cache) for m in args.methods}
    models = {m: edgespec.load(b, threads=args.threads) for m, b in bundles.items()}
    # prompts as token ids, so every engine (and the OpenVINO worker) decodes the same ids
    first = next(iter(models.values()))
    ids = [first.encode(p) if isinstance(p, str) else p for p in prompts]
    log(f"{title}: timing {', '.join(models)} ...")
    load = loadavg()
    rows = timed(models, ids, args.new_tokens, args.passes)
    reference = rows.get("fp32", next(iter(rows.values())))["tokens"]
    for m, row in rows.items():
        row["bytes"] = bundle_bytes(bundles[m])
        row["agreement"], row["identical"] = agreement(row["tokens"], reference)
    ov = None
    if args.ov_python:
        log(f"{title}: OpenVINO vs CPU provider in {args.ov_python} ...")
        ov_bundles = {m: b for m, b in bundles.items() if m in OV_METHODS}
        ov = run_ov(args.ov_python, ov_bundles, ids, args)
    return {
        "title": title,
        "checkpoint": str(ckpt),
        "rows": rows,
        "openvino": ov,
        "loadavg": [load, loadavg()],
    }


def format_model(result: dict[str, Any], args) -> str:
    rows = result["rows"]
    base = rows.get("fp32", next(iter(rows.values())))
    n = len(base["tokens"])
    lines = [
        f"### {result['title']}",
        "",
        f"| method | bundle MiB | vs fp32 | decode tok/s | vs fp32 | greedy agreement with fp32 "
        f"(mean leading fraction; identical of {n}) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for m, r in rows.items():
        lines.append(
            f"| {m} | {r['bytes'] / 2**20:.1f} | {r['bytes'] / base['bytes']:.2f}x | "
            f"{r['tok_s']:.1f} | {r['tok_s'] / base['tok_s']:.2f}x | "
            f"{r['agreement']:.0%}; {r['identical']}/{n} |"
        )
    ov = result["openvino"]
    if ov:
        lines += [
            "",
            f"OpenVINO EP vs CPU EP (onnxruntime-openvino {ov['onnxruntime']}, same process):",
            "",
            "| method | CPU EP tok/s | OpenVINO EP tok/s | OpenVINO / CPU "
            "| same tokens as CPU EP |",
            "|---|---:|---:|---:|---|",
        ]
        for m, r in ov["rows"].items():
            cpu, vino = r["cpu"], r["openvino-bench"]
            same = sum(a == b for a, b in zip(cpu["tokens"], vino["tokens"], strict=True))
            lines.append(
                f"| {m} | {cpu['tok_s']:.1f} | {vino['tok_s']:.1f} | "
                f"{vino['tok_s'] / cpu['tok_s']:.2f}x | {same}/{len(cpu['tokens'])} |"
            )
    la = result["loadavg"]
    lines += ["", f"load average {la[0]:.1f} at the start, {la[1]:.1f} at the end."]
    return "\n".join(lines)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="random,trained", help="random, trained or both")
    ap.add_argument("--shape", default="smollm2-135m", help="bench_ar.py shape for 'random'")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=64, help="random model's prompt length")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ov-python", default=os.environ.get("EDGESPEC_OV_PYTHON"))
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--ov-worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.models = args.models.split(",")
    args.methods = [m for m in args.methods.split(",") if m]
    bad = sorted(set(args.methods) - set(METHODS))
    if bad:
        ap.error(f"unknown methods {bad}; choose from {', '.join(METHODS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.ov_worker:
        ov_worker(args.ov_worker)
        return 0
    t0 = time.time()
    results = [bench_model(*m, args) for m in models_to_run(args)]
    command = "python benchmarks/bench_devices.py " + " ".join(sys.argv[1:])
    print(
        f"`{command}` ({args.threads} threads, {args.new_tokens} new tokens, "
        f"{args.prompts} prompts, median of {args.passes} passes; {time.time() - t0:.0f} s)\n"
    )
    for r in results:
        print(format_model(r, args) + "\n")
    if args.json:
        for r in results:
            for row in r["rows"].values():
                row.pop("tokens")
        args.json.write_text(json.dumps({"command": command, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
