"""What int8 / int4 weights cost in accuracy: each quantized bundle's next-token distribution
against the fp32 model's, on real text, next to llama.cpp's Q8_0 / Q4_0 of the same checkpoint.

Takes the trained target of `train_models.py` (`--models`, default
~/.cache/edgespec-bench/trained: real weights, so rounding errors meet the outliers and
correlations a trained model has, which random-weight shapes lack) and its held-out code and
text prompts. Guarantees:

* every configuration is a real exported bundle run by the runtime (`edgespec.load`), one
  teacher-forced prefill per prompt, logits at every position;
* `int8@32`-style names pick the block, plain `int8` / `int4` the export's default (a matrix
  whose K the block does not divide takes a smaller block, as the export does: the trained
  target's K = 320 takes 64 where 128 is asked);
* KL(fp32 || quantized) in nats, mean over positions, and the share of positions whose argmax
  equals fp32's; bits per weight as stored, read from the graph's MatMulNBits tensors (packed
  weights, fp32 scales, zero points) over the K x N weights they hold;
* with `--llamacpp-venv`: the same ids through llama.cpp's Q8_0 / Q4_0 (`llama-quantize --pure`
  from its own F32 conversion, as `lib.llamacpp` makes them), logits of every position through
  its bindings; its F32 row checks that the two engines agree before rounding.

A real model instead (`--target` a checkpoint folder, `--text` files to score, cut into
`--max-ids` pieces): SmolLM2-135M-Instruct as transformers dequantizes its Q4_1 GGUF, with
`--gguf` that file itself — imported by edgespec with its blocks kept (`gguf-blocks`: the
same weights as fp32, so only int8 activation rounding remains) and run by llama.cpp as it
is (`llama.cpp Q4_1`); `--gguf-levels 4,0` adds the kept blocks with float compute
(MatMulNBits accuracy level 0: no activation rounding, at the speed `benchmarks.gguf_import`'s
`blocks-fp32` row measures). `--gguf-files A.gguf B.gguf ...` scores each file against its own
float values (its exact `--gguf-weights float` import): edgespec's blocks and llama.cpp on it,
`--configs ''` to skip the checkpoint's own rows.

Speed is `benchmarks.decode`'s job (`--precisions int8,int4,int4@32`); this measures what
the rounding does.

    python -m benchmarks.quant --llamacpp-venv /work/venv-llamacpp --json out.json
    python -m benchmarks.quant --configs int8,int4 --prompts 1 --max-ids 32     # a smoke run
    python -m benchmarks.quant --target hf --gguf SmolLM2-135M-Instruct.Q4_1.gguf \
        --text /usr/share/common-licenses/Apache-2.0 --configs int8,int4 --llamacpp-venv V
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.lib import flags
from benchmarks.lib.llamacpp import BYTES_PER_WEIGHT, LlamaCppEnv, gguf_for
from benchmarks.lib.machine import load_line
from benchmarks.lib.models import TRAINED, load_prompts, trained_pair
from benchmarks.lib.tables import write_result

DEFAULT_CONFIGS = "int8@32,int8,int4@32,int4,int4@128"
GGUF_ROWS = {"F32": "fp32", "Q8_0": "int8", "Q4_0": "int4"}  # llama.cpp row -> gguf_for name

LLAMACPP_LOGITS = """
import json, sys
import numpy as np
from llama_cpp import Llama
gguf, ids_file, out = sys.argv[1:4]
prompts = json.load(open(ids_file))
llm = Llama(model_path=gguf, logits_all=True, n_ctx=max(map(len, prompts)) + 8,
            n_batch=512, n_threads=1, n_threads_batch=1, verbose=False)
rows = []
for ids in prompts:
    llm.reset()
    llm.eval(ids)
    rows.append(np.array(llm.scores[: len(ids)], np.float32))
np.save(out, np.concatenate(rows))
"""


def stored_bits_per_weight(graph_file: Path) -> float:
    """Bits the full graph's MatMulNBits tensors store per weight (padding included)."""
    import onnx

    graph = onnx.load(str(graph_file), load_external_data=False).graph
    shapes = {t.name: list(t.dims) for t in graph.initializer}
    stored = weights = 0
    for node in graph.node:
        if node.op_type != "MatMulNBits":
            continue
        attrs = {a.name: a.i for a in node.attribute}
        weights += attrs["K"] * attrs["N"]
        for i, name in enumerate(node.input[1:4], start=1):
            if name:
                stored += int(np.prod(shapes[name])) * (32 if i == 2 else 8)  # scales: fp32
    return stored / weights


def export_config(target: Path, out: Path, name: str) -> dict:
    """Export `name` ("fp32", "int8", "int4@64": a block) and describe it."""
    from edgespec.export import export_bundle

    method, _, block = name.partition("@")
    if method == "fp32":
        export_bundle(target, out, overwrite=True, verify=False)
        return {"bits_per_weight": 32.0}
    size = int(block) if block else None
    export_bundle(target, out, quantize=method, block_size=size, overwrite=True, verify=False)
    return {"bits_per_weight": stored_bits_per_weight(out / "full.onnx")}


def edgespec_logits(bundle: Path, prompts: list[list[int]]) -> np.ndarray:
    import edgespec

    target = edgespec.load(bundle, threads=2).target
    rows = []
    for ids in prompts:
        target.reset(len(ids) + 8)
        rows.append(target.forward(np.array(ids), keep=len(ids)))
    return np.concatenate(rows)


def llamacpp_logits(
    venv: Path, target: Path, ggml: str, prompts: list[list[int]], gguf: Path | None = None
) -> np.ndarray:
    """llama.cpp's logits on `target` converted to `ggml`, or on the file `gguf`."""
    env = LlamaCppEnv.from_venv(venv)
    gguf = gguf or gguf_for(target, GGUF_ROWS[ggml], env)
    with tempfile.TemporaryDirectory() as tmp:
        ids_file, out = Path(tmp) / "ids.json", Path(tmp) / "logits.npy"
        ids_file.write_text(json.dumps(prompts))
        cmd = [env.python, "-c", LLAMACPP_LOGITS, str(gguf), str(ids_file), str(out)]
        proc = subprocess.run(cmd, env=env.subprocess_env(), capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"llama.cpp logits of {gguf.name} failed:\n{proc.stderr[-2000:]}")
        return np.load(out)


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def compare(ref: np.ndarray, got: np.ndarray) -> dict[str, float]:
    lp = log_softmax(got.astype(np.float64))
    kl = (np.exp(ref) * (ref - lp)).sum(axis=-1)
    return {"kl": float(kl.mean()), "top1": float((ref.argmax(-1) == lp.argmax(-1)).mean())}


def per_file(gguf: Path, prompts: list[list[int]], args: Any, tmp: Path) -> list[dict]:
    """KL to the file's own float values (edgespec's exact float import of it, which agrees
    with llama.cpp's F32 before rounding) of edgespec's blocks and of llama.cpp on the file."""
    from edgespec.export import export_bundle

    export_bundle(gguf, tmp / f"{gguf.stem}-float", verify=False, gguf_weights="float")
    ref = log_softmax(edgespec_logits(tmp / f"{gguf.stem}-float", prompts).astype(np.float64))
    export_bundle(gguf, tmp / f"{gguf.stem}-blocks", verify=False)
    ours = edgespec_logits(tmp / f"{gguf.stem}-blocks", prompts)
    bits = stored_bits_per_weight(tmp / f"{gguf.stem}-blocks" / "full.onnx")
    rows = [{"engine": "edgespec", "config": f"{gguf.name} (own float)", "bits_per_weight": bits}
            | compare(ref, ours)]  # fmt: skip
    if args.llamacpp_venv is not None:
        got = llamacpp_logits(args.llamacpp_venv, Path(), "", prompts, gguf)
        rows.append({"engine": "llama.cpp", "config": f"{gguf.name} (own float)",
                     "bits_per_weight": math.nan} | compare(ref, got))  # fmt: skip
    for r in rows:
        print(f"{r['engine']} {r['config']}: KL {r['kl']:.5f}", file=sys.stderr)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = flags.parser(__doc__)
    ap.add_argument("--models", type=Path, default=TRAINED)
    ap.add_argument("--configs", default=DEFAULT_CONFIGS, help="comma list, e.g. int4@64")
    ap.add_argument("--prompts", type=int, default=16, help="per set (code, text)")
    ap.add_argument("--max-ids", type=int, default=256, help="ids per prompt")
    ap.add_argument("--llamacpp-venv", type=Path, default=None)
    ap.add_argument("--target", type=Path, default=None, help="a checkpoint (default: trained)")
    ap.add_argument("--text", type=Path, nargs="*", default=[], help="files to score")
    ap.add_argument("--gguf", type=Path, default=None, help="the target's own GGUF file")
    ap.add_argument(
        "--gguf-files",
        type=Path,
        nargs="*",
        default=[],
        help="GGUF files of the target's weights, each scored against its own float values "
        "(edgespec's `--gguf-weights float` import of it): edgespec's blocks and llama.cpp",
    )
    ap.add_argument(
        "--gguf-levels", default="4", help="accuracy levels of the kept blocks, e.g. 4,0"
    )
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    target = args.target or trained_pair(args.models) / "target"
    print(load_line(), flush=True)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)
    if args.text:
        ids = [i for f in args.text for i in tok(f.read_text())["input_ids"]]
        n = args.max_ids
        prompts = [ids[s : s + n] for s in range(0, len(ids) - n + 1, n)][: 2 * args.prompts]
    else:
        texts = [
            p
            for name in ("prompts_code.jsonl", "prompts_text.jsonl")
            for p in load_prompts(args.models / name, args.prompts)
        ]
        prompts = [tok(t)["input_ids"][: args.max_ids] for t in texts]
    print(f"{len(prompts)} prompts, {sum(map(len, prompts))} positions", file=sys.stderr)

    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        export_config(target, Path(tmp) / "fp32", "fp32")
        ref = log_softmax(edgespec_logits(Path(tmp) / "fp32", prompts).astype(np.float64))
        for name in [c for c in args.configs.split(",") if c]:
            info = export_config(target, Path(tmp) / name, name)
            got = edgespec_logits(Path(tmp) / name, prompts)
            rows.append({"engine": "edgespec", "config": name, **info, **compare(ref, got)})
            print(f"edgespec {name}: {rows[-1]}", file=sys.stderr)
        if args.gguf is not None:
            from edgespec.export import export_bundle

            for level in [int(v) for v in args.gguf_levels.split(",") if v]:
                out = Path(tmp) / f"gguf-{level}"
                export_bundle(args.gguf, out, overwrite=True, verify=False, accuracy_level=level)
                got = edgespec_logits(out, prompts)
                bits = stored_bits_per_weight(out / "full.onnx")
                name = f"gguf-blocks {args.gguf.name}" + (f" level {level}" if level != 4 else "")
                row = {"engine": "edgespec", "config": name, "accuracy_level": level}
                rows.append(row | {"bits_per_weight": bits} | compare(ref, got))
        rows += [r for f in args.gguf_files for r in per_file(f, prompts, args, Path(tmp))]
    if args.llamacpp_venv is not None and args.configs:
        for ggml, precision in GGUF_ROWS.items():
            got = llamacpp_logits(args.llamacpp_venv, target, ggml, prompts)
            bits = 8 * BYTES_PER_WEIGHT[precision]
            row = {"engine": "llama.cpp", "config": ggml, "bits_per_weight": bits}
            rows.append(row | compare(ref, got))
        if args.gguf is not None:
            got = llamacpp_logits(args.llamacpp_venv, target, "", prompts, args.gguf)
            row = {"engine": "llama.cpp", "config": args.gguf.name, "bits_per_weight": math.nan}
            rows.append(row | compare(ref, got))

    print(f"\n{'engine':<10}{'weights':<22}{'bits/weight':>12}{'KL to fp32':>12}{'top-1 =':>9}")
    for r in rows:
        print(
            f"{r['engine']:<10}{r['config']:<22}{r['bits_per_weight']:>12.3f}"
            f"{r['kl']:>12.5f}{100 * r['top1']:>8.1f}%"
        )
    print(load_line())
    write_result(args.json, args, {"positions": sum(map(len, prompts)), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
