"""Devices: weight formats and execution providers (`methods`), and static graphs (`static`).

    python -m benchmarks.devices methods --ov-python /work/venvs/ov/bin/python --json dev.json
    python -m benchmarks.devices static --shapes tiny-llama,smollm2-135m --widths 1 8 1,8
    python -m benchmarks.devices methods --models random --shape tiny-llama --prompts 1 \
        --new-tokens 8 --passes 1                                            # smoke runs
    python -m benchmarks.devices static --new-tokens 8 --repeats 1

`methods`: for each model — a random-weight model with a real shape (default SmolLM2-135M's,
`lib.models.checkpoint`) and, when present, the trained benchmark target
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

`static`: greedy `ar` of the same random-weight model from its dynamic graphs and from static
graphs of each verify-width set (`--widths 1 8 1,8`: W = 1 only, W = 8 only, and both — decode
steps on W = 1, the prefill on W = 8; max context 512), same prompt ids, runs interleaved per
repeat; medians; whether each static run's tokens equal the dynamic run's. The CPU is not what
static graphs are for (NPUs are): here they pay for fixed shapes (W logit rows and W positions
per decode step, a mask over the whole cache) where the dynamic graphs use fused kernels on
exactly the valid positions. This shows that cost, not NPU speed.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.lib import flags
from benchmarks.lib.machine import REPO, load_line, loadavg, log
from benchmarks.lib.models import CACHE, TRAINED, checkpoint, load_prompts, prompt_ids, shape_bundle
from benchmarks.lib.tables import table, write_result
from benchmarks.lib.timing import leading_match

METHODS = ("fp32", "fp16", "int8", "int4", "qdq-int8")
OV_METHODS = ("fp32", "int8", "int4", "qdq-int8")


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
    cmd = [python, "-m", "benchmarks.devices", "--ov-worker", f.name]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    os.unlink(f.name)
    if done.returncode != 0:
        log(f"OpenVINO worker failed:\n{done.stderr[-3000:]}")
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ main side
def models_to_run(args) -> list[tuple[str, Path, list]]:
    """(title, checkpoint folder, prompts) for each model asked for and present."""
    out = []
    if "random" in args.models:
        ckpt = checkpoint(args.shape, 0, args.cache)
        prompts = [prompt_ids(i, args.prompt_tokens) for i in range(args.prompts)]
        out.append((f"{args.shape} shape (random weights)", ckpt, prompts))
    target = TRAINED / "target"
    if "trained" in args.models:
        if (target / "config.json").exists():
            texts = load_prompts(TRAINED / "prompts_code.jsonl", args.prompts)
            out.append(("trained 8-layer target (code prompts)", target, texts))
        else:
            log(f"no trained target at {target}: run `python -m benchmarks.train_models`; skipped")
    return out


def bench_model(title: str, ckpt: Path, prompts: list, args) -> dict[str, Any]:
    import edgespec

    bundles = {m: shape_bundle(ckpt, m, verify=False) for m in args.methods}
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


def static(args: Any) -> list[dict[str, Any]]:
    import edgespec

    sets = [flags.listed(ws, int) for ws in args.widths]
    rows = []
    for shape in flags.listed(args.shapes):
        ckpt = checkpoint(shape, 0, args.cache)
        bundles = {"dynamic": (shape_bundle(ckpt, "fp32"), False)}
        for ws in sets:
            label = ",".join(map(str, ws))
            out = shape_bundle(ckpt, "fp32", static=True, max_context=args.max_context,
                               verify_width=ws, verify=False)  # fmt: skip
            bundles[f"static W={label}"] = (out, True)
        models = {k: edgespec.load(b, static=s, threads=args.threads)
                  for k, (b, s) in bundles.items()}  # fmt: skip
        prompt = prompt_ids(0, args.prompt_tokens)
        runs: dict[str, list[tuple[float, float, list[int]]]] = {k: [] for k in models}
        for _ in range(args.repeats + 1):  # the first pass warms up, not timed
            for k, m in models.items():
                g = m.generate(prompt, max_new_tokens=args.new_tokens, ignore_eos=True)
                s = g.stats
                runs[k].append((s.prefill_tokens_per_s, s.decode_tokens_per_s, g.tokens))
        ref_decode = statistics.median(r[1] for r in runs["dynamic"][1:])
        ref_tokens = runs["dynamic"][0][2]
        for k, rs in runs.items():
            decode = statistics.median(r[1] for r in rs[1:])
            rows.append({"shape": shape, "graphs": k,
                         "prefill_tok_s": statistics.median(r[0] for r in rs[1:]),
                         "decode_tok_s": decode, "vs_dynamic": decode / ref_decode,
                         "same_tokens": leading_match(rs[0][2], ref_tokens),
                         "new_tokens": len(ref_tokens)})  # fmt: skip
    print(table(
        ["shape", "graphs", "prefill tok/s", "decode tok/s", "decode vs dynamic", "same tokens"],
        "llrrrr",
        [[r["shape"], r["graphs"], f"{r['prefill_tok_s']:.0f}", f"{r['decode_tok_s']:.1f}",
          f"{r['vs_dynamic']:.2f}x", f"{r['same_tokens']}/{r['new_tokens']}"] for r in rows],
    ))  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> None:
    if argv is None and sys.argv[1:2] == ["--ov-worker"]:
        ov_worker(sys.argv[2])  # in the onnxruntime-openvino venv
        return
    p = flags.parser(__doc__)
    sub = p.add_subparsers(dest="scenario", required=True)
    m = sub.add_parser("methods", help="weight formats and execution providers")
    m.add_argument("--models", default="random,trained", help="random, trained or both")
    m.add_argument("--shape", default="smollm2-135m", help="the shape of 'random'")
    m.add_argument("--methods", default=",".join(METHODS))
    m.add_argument("--prompts", type=int, default=4)
    m.add_argument("--new-tokens", type=int, default=32)
    m.add_argument("--passes", type=int, default=3)
    m.add_argument("--ov-python", default=os.environ.get("EDGESPEC_OV_PYTHON"))
    s = sub.add_parser("static", help="static graphs against the dynamic ones on the CPU")
    s.add_argument("--shapes", default="tiny-llama")
    s.add_argument("--widths", nargs="+", default=["1", "8", "1,8"])
    s.add_argument("--max-context", type=int, default=512)
    s.add_argument("--new-tokens", type=int, default=64)
    s.add_argument("--repeats", type=int, default=3)
    for x in (m, s):
        flags.add_common(x)
        x.add_argument("--prompt-tokens", type=int, default=64, help="random prompts' length")
        x.add_argument("--cache", type=Path, default=CACHE)
    args = p.parse_args(argv)
    print(load_line(), flush=True)
    if args.scenario == "static":
        write_result(args.json, args, {"rows": static(args)})
        return
    args.models, args.methods = flags.listed(args.models), flags.listed(args.methods)
    bad = sorted(set(args.methods) - set(METHODS))
    if bad:
        p.error(f"unknown methods {bad}; choose from {', '.join(METHODS)}")
    t0 = time.time()
    results = [bench_model(*x, args) for x in models_to_run(args)]
    print(f"{args.threads} threads, {args.new_tokens} new tokens, {args.prompts} prompts, "
          f"median of {args.passes} passes; {time.time() - t0:.0f} s\n")  # fmt: skip
    for r in results:
        print(format_model(r, args) + "\n")
        for row in r["rows"].values():
            row.pop("tokens")
    print(load_line())
    write_result(args.json, args, {"results": results})


if __name__ == "__main__":
    main()
