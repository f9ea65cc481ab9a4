"""Static (fixed-shape, standard-op, NPU) graphs vs the dynamic graphs, on the CPU.

What it measures: greedy `ar` decoding of the same random-weight model from its dynamic
graphs and from static graphs of each verify-width set (`--widths 1 8 1,8`: W = 1 only,
W = 8 only, and both — decode steps on W = 1, the prefill on W = 8; max context C = 512),
same prompt ids (64), same new tokens (64), same threads, runs interleaved per repeat so
the ratios hold on a shared machine; medians of --repeats. prefill tok/s = prompt tokens /
(prompt pass + token 1); decode tok/s = the other tokens / their time (edgespec's stats).
Every static run's tokens are compared with the dynamic run's ("same tokens").

The CPU is not what static graphs are for (NPUs are): here they pay for fixed shapes — W
logit rows and W positions of compute per decode step, and a mask over the whole C-slot
cache — where the dynamic graphs use fused contrib kernels on exactly the valid positions.
This shows that cost, not NPU speed.

    python benchmarks/bench_static.py --shapes tiny-llama,smollm2-135m --widths 1 8 1,8
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

SHAPES = {
    "tiny-llama": ("builtin:tiny-llama", None),
    "smollm2-135m": (
        None,
        dict(
            model_type="llama",
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            max_position_embeddings=2048,
            vocab_size=49152,
        ),
    ),
}


def checkpoint(name: str, root: Path) -> str:
    builtin, dims = SHAPES[name]
    if builtin:
        return builtin
    from edgespec.export.builtin import write_checkpoint

    dims = dict(dims)
    return str(write_checkpoint(root / name, dims.pop("model_type"), **dims))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="tiny-llama")
    ap.add_argument("--widths", nargs="+", default=["1", "8", "1,8"])
    ap.add_argument("--max-context", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    import edgespec
    from edgespec.export import export_bundle

    root = Path(tempfile.mkdtemp(prefix="bench_static_"))
    sets = [[int(w) for w in ws.split(",")] for ws in args.widths]
    print("| shape | graphs | prefill tok/s | decode tok/s | decode vs dynamic | same tokens |")
    print("|---|---|---:|---:|---:|---:|")
    for shape in args.shapes.split(","):
        ckpt = checkpoint(shape, root)
        bundles = {}
        for ws in sets:
            label = ",".join(map(str, ws))
            out = root / f"{shape}-w{label}"
            export_bundle(
                ckpt,
                out,
                static=True,
                max_context=args.max_context,
                verify_width=ws,
                verify=False,
            )
            bundles.setdefault("dynamic", (out, False))
            bundles[f"static W={label}"] = (out, True)
        models = {
            k: edgespec.load(b, static=s, threads=args.threads) for k, (b, s) in bundles.items()
        }
        vocab = next(iter(models.values())).manifest.target.vocab_size
        prompt = [int(i) for i in np.random.default_rng(0).integers(1, vocab, args.prompt_tokens)]
        runs: dict[str, list[tuple[float, float, list[int]]]] = {k: [] for k in models}
        for _ in range(args.repeats + 1):  # the first pass warms up, not timed
            for k, m in models.items():
                g = m.generate(prompt, max_new_tokens=args.new_tokens, ignore_eos=True)
                s = g.stats
                runs[k].append((s.prefill_tokens_per_s, s.decode_tokens_per_s, g.tokens))
        ref_decode = statistics.median(r[1] for r in runs["dynamic"][1:])
        ref_tokens = runs["dynamic"][0][2]
        for k, rs in runs.items():
            timed = rs[1:]
            prefill = statistics.median(r[0] for r in timed)
            decode = statistics.median(r[1] for r in timed)
            same = sum(1 for a, b in zip(rs[0][2], ref_tokens, strict=True) if a == b)
            print(
                f"| {shape} | {k} | {prefill:.0f} | {decode:.1f} | {decode / ref_decode:.2f}x "
                f"| {same}/{len(ref_tokens)} |"
            )
        sys.stdout.flush()


if __name__ == "__main__":
    main()
